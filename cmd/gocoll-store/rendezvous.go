package main

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/store"
)

// The rendezvous benchmark: N clients do against one server what
// init_process_group does with a TCPStore (torch 1.13's client, one
// connection each, 1.x codes):
//
//	SET rank/R (and, on rank 0, SET unique_id: the ncclUniqueId pattern)
//	ADD joined 1; the client that makes it N sets all_joined
//	WAIT all_joined                     (each waits until all have joined)
//	WAIT unique_id, GET unique_id       (torch's get: a wait, then a get)
//	ADD barrier 1; the last one sets barrier_done; WAIT barrier_done (a store barrier)
//
// The clients run in several processes of this program (rendezvous-client),
// a few hundred goroutines each, which connect when the parent says go; a
// run lasts from then to the last client's completion.

// 1.x codes (store/wire.go, reference/tcpstore-protocol.md).
const (
	rvSet  = 0
	rvGet  = 2
	rvAdd  = 3
	rvWait = 5
)

func benchRendezvous(args []string) error {
	fs := flag.NewFlagSet("bench rendezvous", flag.ExitOnError)
	nFlag := fs.String("n", "1024,4096,8192", "client counts")
	perProc := fs.Int("per-proc", 512, "clients per client process")
	py := fs.String("torch", "/usr/bin/python3", "python with torch, for torch's server (empty: skip)")
	enginesFlag := fs.String("engines", "ring", "engines of our server, each measured in its own process: auto, ring, goroutines")
	repeat := fs.Int("repeat", 3, "runs of each row, the servers taking turns; the median is reported with the range")
	timeout := fs.Duration("timeout", 120*time.Second, "a client that has not finished by then counts as an error")
	serverCPU := fs.String("server-cpu", "", "CPU list the servers are pinned to with taskset (empty: not pinned)")
	_ = fs.Parse(args)
	ns, err := intList(*nFlag)
	if err != nil {
		return err
	}
	if *perProc < 1 {
		return fmt.Errorf("--per-proc %d: want at least 1", *perProc)
	}
	nofile, err := store.RaiseNofile()
	if err != nil {
		return fmt.Errorf("raise RLIMIT_NOFILE: %w", err)
	}
	if *perProc+64 > nofile {
		return fmt.Errorf("--per-proc %d needs more descriptors than RLIMIT_NOFILE allows (%d)", *perProc, nofile)
	}
	type server struct {
		name  string
		start func() (addr string, stop func(), err error)
	}
	var servers []server
	for e := range strings.SplitSeq(*enginesFlag, ",") {
		if _, err := store.ParseEngine(e); err != nil {
			return err
		}
		servers = append(servers, server{"gocoll " + e, func() (string, func(), error) {
			a, _, stop, err := startOurServer("", *serverCPU, 0, e)
			return a, stop, err
		}})
	}
	torchName := ""
	if *py != "" {
		_, ver, _, stop, err := startTorchServer(*py, "")
		if err != nil {
			fmt.Fprintln(os.Stderr, "gocoll-store bench rendezvous: no torch server:", err)
		} else {
			stop()
			torchName = "torch " + ver
			servers = append(servers, server{torchName, func() (string, func(), error) {
				a, _, _, stop, err := startTorchServer(*py, *serverCPU)
				return a, stop, err
			}})
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("# gocoll-store bench rendezvous: %s, %d CPUs, servers pinned to %q, nofile %d, %d clients per process, loadavg %s",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), *serverCPU, nofile, *perProc, load)
	fmt.Println("# per client, one connection, 1.x codes: SET rank/R (+ unique_id on rank 0), ADD joined, WAIT all_joined, WAIT+GET unique_id, ADD barrier, WAIT barrier_done")
	fmt.Println()
	fmt.Printf("Each row: the median of %d runs (the servers took turns, a fresh server each run), from the first connect to the last completion.\n\n", *repeat)
	fmt.Println("| server | clients | processes | seconds | range | errors | connect retries |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	type run struct {
		dur           time.Duration
		errs, retries int
		firstErr      string
	}
	medians := map[string]map[int]time.Duration{}
	for _, n := range ns {
		procs := (n + *perProc - 1) / *perProc
		runs := map[string][]run{}
		for range max(*repeat, 1) {
			for _, sv := range servers {
				addr, stop, err := sv.start()
				if err != nil {
					return fmt.Errorf("%s: %w", sv.name, err)
				}
				d, errs, retries, first, err := rendezvousOnce(addr, n, *perProc, *timeout)
				stop()
				if err != nil {
					return fmt.Errorf("%s, %d clients: %w", sv.name, n, err)
				}
				runs[sv.name] = append(runs[sv.name], run{d, errs, retries, first})
			}
		}
		for _, sv := range servers {
			rs := runs[sv.name]
			slices.SortFunc(rs, func(a, b run) int { return cmp.Compare(a.dur, b.dur) })
			med := rs[len(rs)/2]
			errs, retries := 0, 0
			first := ""
			for _, r := range rs {
				errs += r.errs
				retries += r.retries
				if first == "" {
					first = r.firstErr
				}
			}
			if medians[sv.name] == nil {
				medians[sv.name] = map[int]time.Duration{}
			}
			medians[sv.name][n] = med.dur
			fmt.Printf("| %s | %d | %d | %.2f | %.2f–%.2f | %d | %d |\n", sv.name, n, procs, med.dur.Seconds(),
				rs[0].dur.Seconds(), rs[len(rs)-1].dur.Seconds(), errs, retries)
			if first != "" {
				fmt.Printf("|  | first error: %s | | | | | |\n", first)
			}
		}
	}
	if torchName != "" {
		fmt.Println()
		for _, n := range ns {
			var rs []string
			for _, sv := range servers {
				if sv.name != torchName {
					rs = append(rs, fmt.Sprintf("%s %.2f×", sv.name, medians[torchName][n].Seconds()/medians[sv.name][n].Seconds()))
				}
			}
			fmt.Printf("- %d clients, torch's time over ours: %s\n", n, strings.Join(rs, ", "))
		}
	}
	load, _ = os.ReadFile("/proc/loadavg")
	fmt.Printf("\n# loadavg at the end: %s", load)
	return nil
}

// rendezvousOnce runs n clients against addr in processes of perProc
// clients and returns the time from go to the last completion.
func rendezvousOnce(addr string, n, perProc int, timeout time.Duration) (d time.Duration, errs, retries int, firstErr string, err error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, 0, 0, "", err
	}
	type child struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Scanner
	}
	var kids []child
	defer func() {
		for _, k := range kids {
			_ = k.in.Close()
			_ = k.cmd.Process.Kill()
			_ = k.cmd.Wait()
		}
	}()
	for first := 0; first < n; first += perProc {
		cnt := min(perProc, n-first)
		cmd := exec.Command(exe, "rendezvous-client", addr, strconv.Itoa(n), strconv.Itoa(first), strconv.Itoa(cnt), timeout.String())
		cmd.Stderr = os.Stderr
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			return 0, 0, 0, "", err
		}
		k := child{cmd, in, bufio.NewScanner(out)}
		kids = append(kids, k)
		if !k.out.Scan() || k.out.Text() != "READY" {
			return 0, 0, 0, "", fmt.Errorf("client process %d did not start: %q", len(kids)-1, k.out.Text())
		}
	}
	t0 := time.Now()
	for _, k := range kids {
		if _, err := io.WriteString(k.in, "GO\n"); err != nil {
			return 0, 0, 0, "", err
		}
	}
	for i, k := range kids {
		if !k.out.Scan() {
			return 0, 0, 0, "", fmt.Errorf("client process %d ended without a result", i)
		}
		f := strings.SplitN(k.out.Text(), " ", 4)
		if len(f) < 3 || f[0] != "DONE" {
			return 0, 0, 0, "", fmt.Errorf("client process %d said %q", i, k.out.Text())
		}
		e, _ := strconv.Atoi(f[1])
		r, _ := strconv.Atoi(f[2])
		errs, retries = errs+e, retries+r
		if len(f) == 4 && firstErr == "" {
			firstErr = f[3]
		}
	}
	return time.Since(t0), errs, retries, firstErr, nil
}

// rendezvousClient is the client process: args are the server's address,
// N, the first rank and the count of its clients, and the timeout.
func rendezvousClient(args []string) error {
	if len(args) != 5 {
		return errors.New("rendezvous-client ADDR N FIRST COUNT TIMEOUT")
	}
	addr := args[0]
	n, _ := strconv.Atoi(args[1])
	first, _ := strconv.Atoi(args[2])
	cnt, _ := strconv.Atoi(args[3])
	timeout, err := time.ParseDuration(args[4])
	if err != nil || n < 1 || cnt < 1 {
		return fmt.Errorf("rendezvous-client: bad arguments %q", args)
	}
	if _, err := store.RaiseNofile(); err != nil {
		return err
	}
	fmt.Println("READY")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	var wg sync.WaitGroup
	var errs, retries atomic.Int64
	var firstErr atomic.Value
	for r := first; r < first+cnt; r++ {
		wg.Go(func() {
			rt, err := rendezvousRank(addr, r, n, deadline)
			retries.Add(int64(rt))
			if err != nil {
				errs.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Sprintf("rank %d: %v", r, err))
			}
		})
	}
	wg.Wait()
	line := fmt.Sprintf("DONE %d %d", errs.Load(), retries.Load())
	if e, ok := firstErr.Load().(string); ok {
		line += " " + strings.ReplaceAll(e, "\n", " ")
	}
	fmt.Println(line)
	return nil
}

// rendezvousRank is one client: connect (retrying, as torch's client
// does, while the server's backlog is full), then the init sequence.
func rendezvousRank(addr string, rank, n int, deadline time.Time) (retries int, err error) {
	var c net.Conn
	backoff := 10 * time.Millisecond
	for {
		c, err = net.DialTimeout("tcp", addr, min(time.Until(deadline), 30*time.Second))
		if err == nil {
			break
		}
		if time.Now().Add(backoff).After(deadline) {
			return retries, fmt.Errorf("connect: %w", err)
		}
		retries++
		time.Sleep(time.Duration(float64(backoff) * (0.5 + rand.Float64())))
		backoff = min(2*backoff, time.Second)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetNoDelay(true)
	_ = c.SetDeadline(deadline)
	br := bufio.NewReaderSize(c, 512)
	var b []byte
	str := func(s []byte) { b = binary.LittleEndian.AppendUint64(b, uint64(len(s))); b = append(b, s...) }
	send := func() error { _, err := c.Write(b); b = b[:0]; return err }
	set := func(k string, v []byte) { b = append(b, rvSet); str([]byte(k)); str(v) }
	add := func(k string) (int64, error) {
		b = append(b, rvAdd)
		str([]byte(k))
		b = binary.LittleEndian.AppendUint64(b, 1)
		if err := send(); err != nil {
			return 0, err
		}
		var r [8]byte
		_, err := io.ReadFull(br, r[:])
		return int64(binary.LittleEndian.Uint64(r[:])), err
	}
	wait := func(k string) error {
		b = append(b, rvWait)
		b = binary.LittleEndian.AppendUint64(b, 1)
		str([]byte(k))
		if err := send(); err != nil {
			return err
		}
		r, err := br.ReadByte()
		if err == nil && r != 0 {
			err = fmt.Errorf("WAIT %s: reply %d", k, r)
		}
		return err
	}
	set("/rank/"+strconv.Itoa(rank), []byte("0123456789abcdef"))
	if rank == 0 {
		set("/unique_id", make([]byte, 128))
	}
	joined, err := add("/joined")
	if err != nil {
		return retries, fmt.Errorf("ADD joined: %w", err)
	}
	if joined == int64(n) {
		set("/all_joined", []byte("1"))
	}
	if err := wait("/all_joined"); err != nil {
		return retries, err
	}
	if err := wait("/unique_id"); err != nil {
		return retries, err
	}
	b = append(b, rvGet)
	str([]byte("/unique_id"))
	if err := send(); err != nil {
		return retries, err
	}
	var l [8]byte
	if _, err := io.ReadFull(br, l[:]); err != nil {
		return retries, fmt.Errorf("GET unique_id: %w", err)
	}
	if m := binary.LittleEndian.Uint64(l[:]); m != 128 {
		return retries, fmt.Errorf("GET unique_id: %d bytes, want 128", m)
	}
	if _, err := br.Discard(128); err != nil {
		return retries, fmt.Errorf("GET unique_id: %w", err)
	}
	arrived, err := add("/barrier")
	if err != nil {
		return retries, fmt.Errorf("ADD barrier: %w", err)
	}
	if arrived == int64(n) {
		set("/barrier_done", []byte("1"))
	}
	return retries, wait("/barrier_done")
}
