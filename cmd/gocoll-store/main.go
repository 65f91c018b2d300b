// Command gocoll-store runs gocoll's TCPStore server on its own, so that a Go
// process can host the rendezvous of PyTorch (or gocoll) ranks, and
// benchmarks it against PyTorch's server.
//
//	gocoll-store serve --addr 0.0.0.0:29500 [--secret S] [--max-value-bytes N]
//	gocoll-store bench [--duration 2s] [--conns 1,8,64,256] [--torch /usr/bin/python3]
//
// serve runs until SIGINT or SIGTERM. With torch ranks, set MASTER_ADDR and
// MASTER_PORT to the server and TORCHELASTIC_USE_AGENT_STORE=1 so that every
// rank is a client (torch 1.13 also needs TORCHELASTIC_RESTART_COUNT=0).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/store"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "bench":
		err = bench(os.Args[2:])
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "gocoll-store: unknown command %q\n", os.Args[1])
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gocoll-store:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  gocoll-store serve --addr HOST:PORT [--secret S] [--max-value-bytes N]
  gocoll-store bench [--duration D] [--conns 1,8,64,256] [--torch PYTHON]
`)
	os.Exit(2)
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", ":29500", "address to listen on, HOST:PORT")
	secret := fs.String("secret", "", "shared secret clients must prove (default $"+store.SecretEnv+"; PyTorch clients cannot)")
	maxVal := fs.Int("max-value-bytes", store.DefaultMaxValueLen, "largest value accepted")
	_ = fs.Parse(args)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := store.ServerOptions{Addr: *addr, MaxValueLen: *maxVal, Logger: log}
	if *secret != "" {
		o.Secret = []byte(*secret)
	}
	srv, err := store.NewTCPServer(ctx, o)
	if err != nil {
		return err
	}
	auth := "off"
	if *secret != "" || os.Getenv(store.SecretEnv) != "" {
		auth = "on"
	}
	log.Info("gocoll-store serving", "addr", srv.Addr().String(), "auth", auth)
	// Scripts read the port from this line.
	fmt.Printf("LISTENING %s\n", srv.Addr().String())
	<-ctx.Done()
	log.Info("gocoll-store shutting down")
	return srv.Close()
}

// result is one benchmark row.
type result struct {
	target   string
	conns    int
	ops      int
	dur      time.Duration
	p50, p99 time.Duration
	errs     int
}

func bench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	dur := fs.Duration("duration", 2*time.Second, "measuring time per row")
	connsFlag := fs.String("conns", "1,8,64,256", "connection counts")
	py := fs.String("torch", "/usr/bin/python3", "python with torch, for the torch server (empty: skip)")
	_ = fs.Parse(args)
	var conns []int
	for _, s := range strings.Split(*connsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("bad --conns entry %q", s)
		}
		conns = append(conns, n)
	}
	ctx := context.Background()
	// Our server runs in its own process, as torch's does, so that neither
	// shares a Go runtime with the benchmark's clients.
	gaddr, gstop, err := startOurServer()
	if err != nil {
		return err
	}
	defer gstop()
	type target struct {
		name    string
		addr    string
		dialect store.Dialect
	}
	targets := []target{
		{"gocoll (v1 client)", gaddr, store.DialectV1},
		{"gocoll (v2 client)", gaddr, store.DialectV2},
	}
	torchVer := ""
	if *py != "" {
		addr, ver, stop, err := startTorchServer(*py)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gocoll-store bench: no torch server:", err)
		} else {
			defer stop()
			torchVer = ver
			targets = append(targets, target{"torch " + ver + " (v1 client)", addr, store.DialectV1})
		}
	}
	fmt.Printf("# gocoll-store bench: %s, GOMAXPROCS=%d, %v per row, op = set + get (get = WAIT + GET) of a 16-byte value\n",
		time.Now().UTC().Format("2006-01-02"), numCPU(), *dur)
	fmt.Println("| server | conns | ops/s | p50 µs | p99 µs | errors |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	var rows []result
	for _, n := range conns {
		for _, tg := range targets {
			r, err := runRow(ctx, tg.addr, tg.dialect, n, *dur)
			if err != nil {
				return fmt.Errorf("%s with %d connections: %w", tg.name, n, err)
			}
			r.target = tg.name
			rows = append(rows, r)
			fmt.Printf("| %s | %d | %.0f | %.0f | %.0f | %d |\n", r.target, r.conns, float64(r.ops)/r.dur.Seconds(),
				us(r.p50), us(r.p99), r.errs)
		}
	}
	if torchVer != "" {
		fmt.Println()
		for _, n := range conns {
			var g, tt float64
			for _, r := range rows {
				rate := float64(r.ops) / r.dur.Seconds()
				if r.conns == n && r.target == "gocoll (v1 client)" {
					g = rate
				}
				if r.conns == n && strings.HasPrefix(r.target, "torch") {
					tt = rate
				}
			}
			if tt > 0 {
				fmt.Printf("- %d connections: gocoll/torch throughput = %.2f×\n", n, g/tt)
			}
		}
	}
	return nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func numCPU() int { return runtimeGOMAXPROCS() }

// runRow runs n clients doing set+get for d, after a short warm-up.
func runRow(ctx context.Context, addr string, dialect store.Dialect, n int, d time.Duration) (result, error) {
	clients := make([]*store.TCPStore, n)
	for i := range clients {
		c, err := store.DialTCPStore(ctx, addr, store.ClientOptions{Dialect: dialect, Timeout: time.Minute, NoEnvSecret: true})
		if err != nil {
			for _, c := range clients[:i] {
				c.Close()
			}
			return result{}, err
		}
		clients[i] = c
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	val := []byte("0123456789abcdef")
	var mu sync.Mutex
	var lats []time.Duration
	errs := 0
	warm := 200 * time.Millisecond
	start := time.Now()
	measureFrom, end := start.Add(warm), start.Add(warm+d)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			key := "bench/" + strconv.Itoa(i)
			local := make([]time.Duration, 0, 4096)
			e := 0
			for {
				t0 := time.Now()
				if t0.After(end) {
					break
				}
				err := c.Set(ctx, key, val)
				if err == nil {
					_, err = c.Get(ctx, key)
				}
				if err != nil {
					e++
					continue
				}
				if t0.After(measureFrom) {
					local = append(local, time.Since(t0))
				}
			}
			mu.Lock()
			lats = append(lats, local...)
			errs += e
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(lats)
	r := result{conns: n, ops: len(lats), dur: d, errs: errs}
	if len(lats) > 0 {
		r.p50 = lats[len(lats)/2]
		r.p99 = lats[min(len(lats)-1, len(lats)*99/100)]
	}
	return r, nil
}

const torchServerPy = `
import sys, datetime, torch, torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=300), wait_for_workers=False)
print("PORT", s.port, torch.__version__, flush=True)
sys.stdin.read()
`

// startTorchServer runs PyTorch's TCPStore server in python.
func startTorchServer(py string) (addr, version string, stop func(), err error) {
	cmd := exec.Command(py, "-c", torchServerPy)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", "", nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", "", nil, err
	}
	stop = func() { stdin.Close(); _ = cmd.Wait() }
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		stop()
		return "", "", nil, errors.New("torch server printed nothing")
	}
	f := strings.Fields(sc.Text())
	if len(f) != 3 || f[0] != "PORT" {
		stop()
		return "", "", nil, fmt.Errorf("torch server said %q", sc.Text())
	}
	return "127.0.0.1:" + f[1], f[2], stop, nil
}

// startOurServer runs "gocoll-store serve" on a free loopback port.
func startOurServer() (addr string, stop func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(exe, "serve", "--addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), store.SecretEnv+"=")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "LISTENING "); ok {
			return a, stop, nil
		}
	}
	stop()
	return "", nil, errors.New("gocoll-store serve printed no LISTENING line")
}
