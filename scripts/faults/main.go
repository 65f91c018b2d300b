// Command faults runs the fault experiments of issue 15 on one host and
// counts what the ranks said: kill -9 of one rank during an allreduce loop
// (do the survivors name the killed rank, and how fast), a rank that never
// joins (is it named, within the Init timeout + 10 %), a dtype mismatch
// (float32 against int32 of one size) and a size mismatch (is the error
// the same in every run). Every rank is a child process of this program
// running the cpupool backend over a TCPStore the parent hosts (or, for
// "nojoin -via env", rank 0 hosts, as InitFromEnv does).
//
//	go run ./scripts/faults kill -world 4 -runs 40 -transport tcp
//	go run ./scripts/faults nojoin -world 4 -timeout 10s -via env
//	go run ./scripts/faults dtype -runs 5
//	go run ./scripts/faults size -runs 20 -mib 4 -transport tcp
//
// scripts/faults.sh runs the whole table. Each run prints one line; the
// last line is the count. The exit status is 1 when a goal was missed.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// envChild carries a child's config (JSON); its presence makes the
// process a rank.
const envChild = "GOCOLL_FAULTS_CHILD"

// config is what a child runs.
type config struct {
	Mode      string
	Rank      int
	World     int
	Store     string // host:port of the parent's store ("" for nojoin via env)
	Transport string
	Victim    int // the rank that kills itself (kill)
	Timeout   time.Duration
	Via       string // nojoin: "env" or "store"
	Elems     int    // size: this rank's element count
	DType     string // dtype: this rank's dtype
	Debug     string // GOCOLL_DEBUG for the children, when set
}

// result is one child's report, one JSON line after "RESULT ".
type result struct {
	Rank    int
	Err     string
	Kind    string // the sentinel the error wraps
	Ranks   []int  // the OpError's ranks
	At      int64  // unix nanoseconds of the error
	Elapsed float64
	Values  []float64 // dtype: the first values of the output
}

func main() {
	if v := os.Getenv(envChild); v != "" {
		var cfg config
		if err := json.Unmarshal([]byte(v), &cfg); err != nil {
			fmt.Fprintln(os.Stderr, "faults child:", err)
			os.Exit(2)
		}
		if err := child(cfg); err != nil {
			fmt.Fprintf(os.Stderr, "faults child rank %d: %v\n", cfg.Rank, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: faults kill|nojoin|dtype|size [flags]")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	world := fs.Int("world", 4, "ranks")
	runs := fs.Int("runs", 40, "runs")
	transport := fs.String("transport", "tcp", "cpupool transport: tcp or shm")
	timeout := fs.Duration("timeout", 10*time.Second, "nojoin: the Init timeout")
	via := fs.String("via", "store", "nojoin: env (InitFromEnv, rank 0 hosts the store) or store (Init on the parent's store)")
	mib := fs.Int("mib", 4, "size: the tensor size of rank 0, MiB")
	debug := fs.String("debug", "", "GOCOLL_DEBUG of the children")
	_ = fs.Parse(os.Args[2:])
	var ok bool
	var err error
	switch mode {
	case "kill":
		ok, err = runKill(*world, *runs, *transport)
	case "nojoin":
		ok, err = runNoJoin(*world, *runs, *timeout, *via)
	case "dtype":
		ok, err = runMismatch("dtype", *runs, *transport, 0, *debug)
	case "size":
		ok, err = runMismatch("size", *runs, *transport, *mib, *debug)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// proc is a running child.
type proc struct {
	cmd      *exec.Cmd
	out, err bytes.Buffer
}

// start launches one child with cfg.
func start(ctx context.Context, cfg config, env ...string) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	js, _ := json.Marshal(cfg)
	p := &proc{cmd: exec.CommandContext(ctx, exe)}
	p.cmd.Env = append(append(os.Environ(), envChild+"="+string(js), "GOCOLL_ENABLE_MONITORING=0", "GOCOLL_TRACE_BUFFER_SIZE=0"), env...)
	if cfg.Debug != "" {
		p.cmd.Env = append(p.cmd.Env, "GOCOLL_DEBUG="+cfg.Debug)
	}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.err
	return p, p.cmd.Start()
}

// finish waits for p and returns its result line, if it printed one.
func (p *proc) finish() (*result, string) {
	_ = p.cmd.Wait()
	sc := bufio.NewScanner(bytes.NewReader(p.out.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
			var r result
			if json.Unmarshal([]byte(line), &r) == nil {
				return &r, ""
			}
		}
	}
	return nil, fmt.Sprintf("exit %v; stderr: %s", p.cmd.ProcessState, strings.TrimSpace(p.err.String()))
}

// server starts the parent's store.
func server() (*store.TCPServer, error) {
	return store.NewTCPServer(context.Background(), store.ServerOptions{Addr: "127.0.0.1:0"})
}

func runKill(world, runs int, transport string) (bool, error) {
	survivors, right := 0, 0
	var worst float64
	hung := 0
	for run := 1; run <= runs; run++ {
		srv, err := server()
		if err != nil {
			return false, err
		}
		victim := rand.IntN(world)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		procs := make([]*proc, world)
		for r := range world {
			cfg := config{Mode: "kill", Rank: r, World: world, Store: fmt.Sprintf("127.0.0.1:%d", srv.Port()), Transport: transport, Victim: victim}
			if procs[r], err = start(ctx, cfg); err != nil {
				cancel()
				srv.Close()
				return false, err
			}
		}
		results := make([]*result, world)
		var why []string
		for r, p := range procs {
			res, w := p.finish()
			results[r] = res
			if r != victim && res == nil {
				why = append(why, fmt.Sprintf("rank %d: %s", r, w))
			}
		}
		if ctx.Err() != nil {
			hung++
		}
		cancel()
		st, err := store.DialTCPStore(context.Background(), fmt.Sprintf("127.0.0.1:%d", srv.Port()), store.ClientOptions{Timeout: 5 * time.Second})
		var killedAt int64
		if err == nil {
			if v, ok := store.TryGet(context.Background(), st, "faults/killed_at"); ok {
				killedAt, _ = strconv.ParseInt(string(v), 10, 64)
			}
			st.Close()
		}
		srv.Close()
		line := fmt.Sprintf("run %d: world %d, %s, killed rank %d:", run, world, transport, victim)
		for r, res := range results {
			if r == victim {
				continue
			}
			survivors++
			if res == nil {
				line += fmt.Sprintf(" rank %d no result;", r)
				continue
			}
			d := float64(res.At-killedAt) / 1e6
			worst = max(worst, d)
			good := slices.Equal(res.Ranks, []int{victim})
			if good {
				right++
			}
			line += fmt.Sprintf(" rank %d names %v after %.1f ms;", r, res.Ranks, d)
			if !good {
				line += fmt.Sprintf(" (%s)", res.Err)
			}
		}
		fmt.Println(line)
		for _, w := range why {
			fmt.Println("  ", w)
		}
	}
	fmt.Printf("kill world %d %s: %d of %d survivors named the killed rank; slowest detection %.1f ms; %d runs hung\n",
		world, transport, right, survivors, worst, hung)
	return right == survivors && worst < 1000 && hung == 0, nil
}

func runNoJoin(world, runs int, timeout time.Duration, via string) (bool, error) {
	good, total := 0, 0
	var worst float64
	for run := 1; run <= runs; run++ {
		var srv *store.TCPServer
		addr := ""
		if via == "store" {
			var err error
			if srv, err = server(); err != nil {
				return false, err
			}
			addr = fmt.Sprintf("127.0.0.1:%d", srv.Port())
		} else {
			addr = fmt.Sprintf("127.0.0.1:%d", freePort())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*timeout+30*time.Second)
		missing := world - 1
		var procs []*proc
		for r := range world - 1 {
			cfg := config{Mode: "nojoin", Rank: r, World: world, Store: addr, Via: via, Timeout: timeout, Transport: "tcp"}
			p, err := start(ctx, cfg)
			if err != nil {
				cancel()
				return false, err
			}
			procs = append(procs, p)
		}
		line := fmt.Sprintf("run %d: world %d via %s, timeout %v, rank %d never starts:", run, world, via, timeout, missing)
		for r, p := range procs {
			res, w := p.finish()
			total++
			if res == nil {
				line += fmt.Sprintf(" rank %d no result (%s);", r, w)
				continue
			}
			worst = max(worst, res.Elapsed)
			ok := slices.Equal(res.Ranks, []int{missing}) && res.Elapsed <= 1.1*timeout.Seconds()
			if ok {
				good++
			}
			line += fmt.Sprintf(" rank %d after %.2f s names %v;", r, res.Elapsed, res.Ranks)
			if !ok || r == 0 {
				line += fmt.Sprintf(" (%s)", res.Err)
			}
		}
		cancel()
		if srv != nil {
			srv.Close()
		}
		fmt.Println(line)
	}
	fmt.Printf("nojoin world %d via %s: %d of %d ranks named the missing rank within %v + 10%%; slowest %.2f s\n", world, via, good, total, timeout, worst)
	return good == total, nil
}

// runMismatch runs 2 ranks that disagree: on the dtype (float32 against
// int32 of one size) or on the size (rank 1 has 1 KiB more).
func runMismatch(mode string, runs int, transport string, mib int, debug string) (bool, error) {
	errs := map[string]int{}
	silent, total := 0, 0
	for run := 1; run <= runs; run++ {
		srv, err := server()
		if err != nil {
			return false, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		var procs []*proc
		for r := range 2 {
			cfg := config{Mode: mode, Rank: r, World: 2, Store: fmt.Sprintf("127.0.0.1:%d", srv.Port()), Transport: transport, Debug: debug,
				Elems: mib << 18, DType: "float32"}
			if r == 1 {
				cfg.Elems += 256
				if mode == "dtype" {
					cfg.Elems, cfg.DType = mib<<18, "int32"
				}
			}
			if mode == "dtype" {
				cfg.Elems = 1024
			}
			p, err := start(ctx, cfg)
			if err != nil {
				cancel()
				return false, err
			}
			procs = append(procs, p)
		}
		line := fmt.Sprintf("run %d: %s mismatch, %s:", run, mode, transport)
		for r, p := range procs {
			res, w := p.finish()
			total++
			if res == nil {
				line += fmt.Sprintf(" rank %d no result (%s);", r, w)
				errs["no result"]++
				continue
			}
			if res.Err == "" {
				silent++
				line += fmt.Sprintf(" rank %d: no error, values %v;", r, res.Values)
				continue
			}
			// The same error in every run: compare the text without the
			// reporting rank's own number.
			norm := strings.Replace(res.Err, fmt.Sprintf("on rank %d", r), "on rank R", 1)
			errs[fmt.Sprintf("rank %d: %s %v: %s", r, res.Kind, res.Ranks, norm)]++
			line += fmt.Sprintf(" rank %d: %s %v: %s;", r, res.Kind, res.Ranks, res.Err)
		}
		cancel()
		srv.Close()
		fmt.Println(line)
	}
	keys := make([]string, 0, len(errs))
	for k := range errs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fmt.Printf("%s mismatch %s: %d of %d ranks saw no error; %d distinct errors:\n", mode, transport, silent, total, len(keys))
	for _, k := range keys {
		fmt.Printf("  %d× %s\n", errs[k], k)
	}
	return silent == 0 && len(keys) <= 2, nil
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 29500 + rand.IntN(1000)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// child is one rank.
func child(cfg config) error {
	bg := context.Background()
	report := func(r result) {
		r.Rank = cfg.Rank
		js, _ := json.Marshal(r)
		fmt.Printf("RESULT %s\n", js)
	}
	failed := func(t0 time.Time, err error) result {
		r := result{Err: err.Error(), At: time.Now().UnixNano(), Elapsed: time.Since(t0).Seconds()}
		var oe *backend.OpError
		if errors.As(err, &oe) {
			r.Ranks = oe.Ranks
			if oe.Kind != nil {
				r.Kind = oe.Kind.Error()
			}
		}
		return r
	}
	timeout := 30 * time.Second
	if cfg.Timeout > 0 {
		timeout = cfg.Timeout
	}
	dcfg := dispatcher.Config{Rank: cfg.Rank, WorldSize: cfg.World, Backend: "cpupool", Timeout: timeout,
		BackendOptions: map[string]any{"cpupool": &cpupool.Options{Transport: cfg.Transport}}}
	t0 := time.Now()
	var pg *dispatcher.ProcessGroup
	var st store.Store
	var err error
	if cfg.Mode == "nojoin" && cfg.Via == "env" {
		host, port, _ := net.SplitHostPort(cfg.Store)
		for k, v := range map[string]string{"RANK": strconv.Itoa(cfg.Rank), "WORLD_SIZE": strconv.Itoa(cfg.World),
			"MASTER_ADDR": host, "MASTER_PORT": port} {
			os.Setenv(k, v)
		}
		pg, err = dispatcher.InitFromEnv(bg, dcfg)
	} else {
		if st, err = store.DialTCPStore(bg, cfg.Store, store.ClientOptions{Timeout: time.Minute}); err != nil {
			return err
		}
		dcfg.Store = st
		t0 = time.Now()
		pg, err = dispatcher.Init(bg, dcfg)
	}
	if cfg.Mode == "nojoin" {
		if err == nil {
			report(result{Err: "", Elapsed: time.Since(t0).Seconds()})
			return nil
		}
		report(failed(t0, err))
		return nil
	}
	if err != nil {
		return err
	}
	switch cfg.Mode {
	case "kill":
		x, _ := tensor.FromSlice(make([]float32, 16<<10))
		for i := 0; ; i++ {
			if cfg.Rank == cfg.Victim && i == 50 {
				_ = st.Set(bg, "faults/killed_at", []byte(strconv.FormatInt(time.Now().UnixNano(), 10)))
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
			t := time.Now()
			w, err := pg.Allreduce(bg, []*tensor.Tensor{x}, backend.AllreduceOptions{Timeout: 10 * time.Second})
			if err == nil {
				err = w.WaitHost(bg)
			}
			if err != nil {
				res := failed(t, err)
				// What a training script does: give the group up. The
				// peers must still blame the killed rank, not this one.
				_ = pg.Abort(bg, err)
				report(res)
				_ = pg.Close(bg)
				return nil
			}
		}
	case "dtype", "size":
		var x *tensor.Tensor
		if cfg.DType == "int32" {
			v := make([]int32, cfg.Elems)
			for i := range v {
				v[i] = -2147483648 + int32(i%7)
			}
			x, _ = tensor.FromSlice(v)
		} else {
			v := make([]float32, cfg.Elems)
			for i := range v {
				v[i] = 4.5
			}
			x, _ = tensor.FromSlice(v)
		}
		w, err := pg.Allreduce(bg, []*tensor.Tensor{x}, backend.AllreduceOptions{Timeout: 10 * time.Second})
		if err == nil {
			err = w.WaitHost(bg)
		}
		if err != nil {
			report(failed(t0, err))
		} else {
			f, _ := x.Float64s()
			report(result{Values: f[:min(4, len(f))]})
		}
		// Close bounded: a peer may be gone.
		ctx, cancel := context.WithTimeout(bg, 5*time.Second)
		_ = pg.Close(ctx)
		cancel()
	}
	return nil
}
