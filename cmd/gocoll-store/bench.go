package main

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gocoll/gocoll/store"
)

// result is one benchmark row.
type result struct {
	conns    int
	rate     int // offered ops/s; 0 for closed loop
	ops      int
	dur      time.Duration
	p50, p99 time.Duration
	errs     int
	// CPU time of the client loop's thread and of the server process
	// during the row (warm-up included), over the row's wall time.
	clientCPU, serverCPU float64
}

func (r result) opsPerSec() float64 { return float64(r.ops) / r.dur.Seconds() }

// benchTarget is one server under test.
type benchTarget struct {
	name string
	addr string
	pid  int
}

func bench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	dur := fs.Duration("duration", 3*time.Second, "measuring time per row")
	connsFlag := fs.String("conns", "1,8,64,256", "connection counts of the closed-loop rows")
	ratesFlag := fs.String("rates", "5000,10000", "offered loads (ops/s, all connections together) of the open-loop rows; empty: none")
	openConns := fs.Int("open-conns", 64, "connections of the open-loop rows")
	py := fs.String("torch", "/usr/bin/python3", "python with torch, for the torch server (empty: skip)")
	baseline := fs.String("baseline", "", "another gocoll-store binary whose server is measured too (e.g. one built from an older commit)")
	baselineEngines := fs.String("baseline-engines", "auto", "engines of the baseline server, each in its own process")
	clientCPU := fs.Int("client-cpu", 0, "CPU the client's event-loop thread is pinned to (-1: not pinned)")
	serverCPU := fs.String("server-cpu", "1", "CPU list the server processes are pinned to with taskset (empty: not pinned)")
	serverProcs := fs.Int("server-procs", 1, "GOMAXPROCS of our server processes (0: Go's default)")
	repeat := fs.Int("repeat", 1, "measure each row this many times, the servers taking turns, and report the median one (by ops/s closed loop, by p99 open loop) with the range")
	extAddr := fs.String("addr", "", "measure the server already listening here instead of starting ours (for profiling it)")
	enginesFlag := fs.String("engines", "auto", "engines of our server to measure, each in its own process: auto, ring, goroutines (comma-separated)")
	clientKind := fs.String("client", "ring", "closed-loop client: ring (io_uring, one system call per batch) or epoll (a read or write per request); open-loop rows always use epoll")
	_ = fs.Parse(args)
	conns, err := intList(*connsFlag)
	if err != nil {
		return err
	}
	rates, err := intList(*ratesFlag)
	if err != nil {
		return err
	}
	if *serverCPU != "" {
		if _, err := exec.LookPath("taskset"); err != nil {
			return fmt.Errorf("--server-cpu needs taskset: %w", err)
		}
	}
	// Each server runs in its own process, pinned apart from the client, so
	// that neither shares a Go runtime or a core with the client.
	if *clientKind != "ring" && *clientKind != "epoll" {
		return fmt.Errorf("--client %q: want ring or epoll", *clientKind)
	}
	var targets []benchTarget
	if *extAddr != "" {
		targets = append(targets, benchTarget{"gocoll", *extAddr, 0})
	} else {
		for e := range strings.SplitSeq(*enginesFlag, ",") {
			if _, err := store.ParseEngine(e); err != nil {
				return err
			}
			gaddr, gpid, gstop, err := startOurServer("", *serverCPU, *serverProcs, e)
			if err != nil {
				return fmt.Errorf("our server, engine %s: %w", e, err)
			}
			defer gstop()
			name := "gocoll"
			if e != "auto" {
				name += " " + e
			}
			targets = append(targets, benchTarget{name, gaddr, gpid})
		}
	}
	if *baseline != "" {
		for e := range strings.SplitSeq(*baselineEngines, ",") {
			addr, pid, stop, err := startOurServer(*baseline, *serverCPU, *serverProcs, e)
			if err != nil {
				return fmt.Errorf("baseline server, engine %s: %w", e, err)
			}
			defer stop()
			name := "gocoll baseline"
			if e != "auto" {
				name += " " + e
			}
			targets = append(targets, benchTarget{name, addr, pid})
		}
	}
	torchName := ""
	if *py != "" {
		addr, ver, pid, stop, err := startTorchServer(*py, *serverCPU)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gocoll-store bench: no torch server:", err)
		} else {
			defer stop()
			torchName = "torch " + ver
			targets = append(targets, benchTarget{torchName, addr, pid})
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	pin := "client and servers not pinned"
	if *serverCPU != "" || *clientCPU >= 0 {
		pin = fmt.Sprintf("client loop pinned to CPU %d, servers to CPU %s", *clientCPU, *serverCPU)
	}
	fmt.Printf("# gocoll-store bench: %s, %d CPUs, %s, our server GOMAXPROCS=%d, %v per row, %s closed-loop client, loadavg %s",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), pin, *serverProcs, *dur, *clientKind, load)
	fmt.Println("# op = set + get of a 16-byte value, as a PyTorch 1.x client sends it: SET+WAIT in one write, read STOP_WAITING, GET, read the value")
	fmt.Println()
	run := func(tg benchTarget, n, rate int) (result, error) {
		cpu0, t0 := procCPU(tg.pid), time.Now()
		r, err := runLoop(loopConfig{addr: tg.addr, conns: n, rate: rate, dur: *dur, cpu: *clientCPU, ring: *clientKind == "ring"})
		if err != nil {
			return r, fmt.Errorf("%s with %d connections: %w", tg.name, n, err)
		}
		r.serverCPU = (procCPU(tg.pid) - cpu0).Seconds() / time.Since(t0).Seconds()
		return r, nil
	}
	// measure runs one row for every target, *repeat times round robin, and
	// returns each target's median rep and the range of key over the reps.
	measure := func(n, rate int, key func(result) float64) (map[string]result, map[string][2]float64, error) {
		reps := map[string][]result{}
		for range max(*repeat, 1) {
			for _, tg := range targets {
				r, err := run(tg, n, rate)
				if err != nil {
					return nil, nil, err
				}
				reps[tg.name] = append(reps[tg.name], r)
			}
		}
		med, rng := map[string]result{}, map[string][2]float64{}
		for name, rs := range reps {
			slices.SortFunc(rs, func(a, b result) int { return cmp.Compare(key(a), key(b)) })
			med[name] = rs[len(rs)/2]
			rng[name] = [2]float64{key(rs[0]), key(rs[len(rs)-1])}
		}
		return med, rng, nil
	}
	rangeCol := func(r [2]float64, f func(float64) string) string {
		if *repeat <= 1 {
			return ""
		}
		return " " + f(r[0]) + "–" + f(r[1]) + " |"
	}
	k0 := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	repHead, repSep := "", ""
	if *repeat > 1 {
		repHead, repSep = " range over the reps |", "---:|"
		fmt.Printf("Each row is the median of %d reps (closed loop: by ops/s; open loop: by p99 µs); the servers took turns.\n\n", *repeat)
	}
	closed := map[string]map[int]result{}
	fmt.Println("Closed loop (each connection starts its next op when the last one ends); latency per op:")
	fmt.Println()
	fmt.Println("| server | conns | ops/s | p50 µs | p99 µs | errors | server CPU | client CPU |" + repHead)
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|" + repSep)
	for _, n := range conns {
		med, rng, err := measure(n, 0, result.opsPerSec)
		if err != nil {
			return err
		}
		for _, tg := range targets {
			r := med[tg.name]
			if closed[tg.name] == nil {
				closed[tg.name] = map[int]result{}
			}
			closed[tg.name][n] = r
			fmt.Printf("| %s | %d | %.0f | %.0f | %.0f | %d | %.0f%% | %.0f%% |%s\n", tg.name, n, r.opsPerSec(), us(r.p50), us(r.p99), r.errs,
				100*r.serverCPU, 100*r.clientCPU, rangeCol(rng[tg.name], k0))
		}
	}
	if len(rates) > 0 {
		fmt.Println()
		fmt.Printf("Open loop, %d connections, fixed offered load (ops start on a schedule, round robin over the connections;\n", *openConns)
		fmt.Println("latency is from the scheduled start, so time queued behind a late op counts):")
		fmt.Println()
		fmt.Println("| server | offered ops/s | achieved ops/s | p50 µs | p99 µs | errors | server CPU | client CPU |" + repHead)
		fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|" + repSep)
		for _, rate := range rates {
			med, rng, err := measure(*openConns, rate, func(r result) float64 { return us(r.p99) })
			if err != nil {
				return err
			}
			for _, tg := range targets {
				r := med[tg.name]
				fmt.Printf("| %s | %d | %.0f | %.0f | %.0f | %d | %.0f%% | %.0f%% |%s\n", tg.name, rate, r.opsPerSec(), us(r.p50), us(r.p99), r.errs,
					100*r.serverCPU, 100*r.clientCPU, rangeCol(rng[tg.name], k0))
			}
		}
	}
	if torchName != "" {
		fmt.Println()
		for _, n := range conns {
			t := closed[torchName][n]
			var ratios []string
			for _, tg := range targets {
				if tg.name != torchName {
					ratios = append(ratios, fmt.Sprintf("%s %.2f×", tg.name, closed[tg.name][n].opsPerSec()/t.opsPerSec()))
				}
			}
			fmt.Printf("- %d connections, throughput over torch's: %s\n", n, strings.Join(ratios, ", "))
		}
	}
	load, _ = os.ReadFile("/proc/loadavg")
	fmt.Printf("\n# loadavg at the end: %s", load)
	return nil
}

// procCPU returns the user+system CPU time of process pid, all threads
// (/proc/PID/stat, clock ticks of 10 ms), or 0.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the ")" closing the command name: state is field 3,
	// utime 14 and stime 15.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

func intList(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad list entry %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// percentiles sorts lats and returns its p50 and p99.
func percentiles(lats []time.Duration) (p50, p99 time.Duration) {
	if len(lats) == 0 {
		return 0, 0
	}
	slices.Sort(lats)
	return lats[len(lats)/2], lats[min(len(lats)-1, len(lats)*99/100)]
}

// benchOp is the pre-encoded byte stream of one op with 1.x codes: first
// is SET(key, value) + WAIT([key]), get is GET(key).
func benchOp(key string, val []byte) (first, get []byte) {
	str := func(b []byte, s []byte) []byte {
		b = appendU64(b, uint64(len(s)))
		return append(b, s...)
	}
	// 1.x codes (reference/tcpstore-protocol.md §3): SET 0, GET 2, WAIT 5.
	first = str(str([]byte{0}, []byte(key)), val)
	first = append(first, 5)
	first = str(appendU64(first, 1), []byte(key))
	get = str([]byte{2}, []byte(key))
	return first, get
}

func appendU64(b []byte, v uint64) []byte {
	for i := range 8 {
		b = append(b, byte(v>>(8*i)))
	}
	return b
}
