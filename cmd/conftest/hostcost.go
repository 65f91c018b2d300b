package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/python"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// hcFlags are the flags of `conftest bench hostcost`.
type hcFlags struct {
	backend    string
	ops        int
	batch      int
	reps       int
	python     string
	torchRuns  int
	jsonPath   string
	cpuProfile string
	profileHz  int
	only       string
}

func parseHostCostFlags(args []string) (*hcFlags, error) {
	fs := flag.NewFlagSet("conftest bench hostcost", flag.ContinueOnError)
	f := &hcFlags{}
	fs.StringVar(&f.backend, "backend", nccl.Name, "the backend measured: nccl (one GPU), cpupool or ucc (ucc needs libucc: run it under scripts/ucc-run.sh --)")
	fs.IntVar(&f.ops, "ops", 20000, "calls per mode and round")
	fs.IntVar(&f.batch, "batch", 256, "calls per timed batch; the launch (or work) queue is drained between batches, untimed, so that issue cost and not queue back-pressure is measured")
	fs.IntVar(&f.reps, "reps", 5, "rounds; the modes take turns inside each round, and a round of the peer runs between rounds")
	fs.StringVar(&f.python, "python", defaultPython(), "python with torch for the peer (python/hostcost_torch.py); empty: no peer")
	fs.IntVar(&f.torchRuns, "torch-runs", 2, "how many times the torch peer runs (between Go rounds), each with its modes taking turns")
	fs.StringVar(&f.jsonPath, "json", "", "write every sample to FILE as JSON")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured Go rounds to FILE (go tool pprof; each sample is labelled with its mode: -tagfocus mode=NAME)")
	fs.IntVar(&f.profileHz, "cpuprofile-hz", 100, "samples per second of --cpuprofile: pprof's 100 gives ~100 samples over a second of calls, too few to split a microsecond call; 1000-4000 resolve it")
	fs.StringVar(&f.only, "only", "", "run only the modes whose names contain one of these comma-separated words (nccl raw always runs), e.g. to profile one mode")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: conftest bench hostcost [flags]

Host cost per op call, world 1, a 1-element float32 SUM allreduce: the wall
time and the issuing thread's CPU time (CLOCK_THREAD_CPUTIME_ID, the goroutine locked
to its thread) per call, in batches of --batch, for each layer and mode:
  nccl raw          ncclAllReduce called from a C loop (NCCL's own call, no events)
  nccl + CUDA calls the driver calls of an async allreduce + Wait, from a C loop:
                    the floor of the backend's design (nccl.Backend.FloorAllreduce)
  backend ...       the backend's Allreduce called directly
  dispatcher ...    ProcessGroup.Allreduce, flight recorder on (the default) or off
  sync              nccl: on the current stream (Wait is a no-op); host backends: the op, then Wait
  async+Wait        nccl: Async, on the internal stream, then Wait; host backends: as sync
  ..., current stream  nccl: Async with nccl.Options.AsyncOnCurrentStream: the op on the
                    current stream, no sync event, Wait on the same stream orders nothing;
                    its C floor is "nccl + CUDA calls, current stream" (the context check,
                    the capture query, ncclAllReduce and the end event's record);
                    "..., one cgo call each" makes those calls from a Go loop, one
                    cgo call per op and nothing else: over the C loop, the crossing
  issue             the call alone; the Waits come after the batch, untimed
and beside them torch's (python/hostcost_torch.py: dist.all_reduce sync,
async + wait(), and issue alone; nccl for --backend nccl, gloo otherwise).

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("bench hostcost: unexpected argument %q", fs.Arg(0))
	case f.backend != nccl.Name && f.backend != cpupool.Name && f.backend != "ucc":
		return nil, fmt.Errorf("bench hostcost: bad --backend %q (nccl, cpupool or ucc)", f.backend)
	case f.ops < 1 || f.batch < 1 || f.reps < 1:
		return nil, fmt.Errorf("bench hostcost: --ops %d, --batch %d and --reps %d must be at least 1", f.ops, f.batch, f.reps)
	case f.profileHz < 1 || f.profileHz > 10000:
		return nil, fmt.Errorf("bench hostcost: --cpuprofile-hz %d must be in 1..10000", f.profileHz)
	case f.torchRuns < 0:
		return nil, fmt.Errorf("bench hostcost: --torch-runs %d must not be negative", f.torchRuns)
	}
	return f, nil
}

// defaultPython is the GPU machine's torch 2.11 when it is there, else the
// system python3 (Debian's torch 1.13).
func defaultPython() string {
	if _, err := os.Stat("/opt/torch/.venv/bin/python3"); err == nil {
		return "/opt/torch/.venv/bin/python3"
	}
	return "/usr/bin/python3"
}

// hcMode is one measured way of calling allreduce: run issues n calls and
// settle then drains what they queued, untimed.
type hcMode struct {
	name   string
	run    func(n int) error
	settle func() error
	// self, when set, is the host time the calls measured themselves (the
	// raw C loop's clock), which replaces the Go clock's.
	self *time.Duration
}

// hcSample is one round of one mode.
type hcSample struct {
	Mode   string  `json:"mode"`
	Round  int     `json:"round"`
	WallNs float64 `json:"wall_ns_per_call"`
	CPUNs  float64 `json:"cpu_ns_per_call"`
}

// threadCPU is the calling thread's CPU time, from
// clock_gettime(CLOCK_THREAD_CPUTIME_ID): exact, where getrusage's
// RUSAGE_THREAD figures are split at scheduler ticks and read 0 for a
// batch shorter than a tick.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}

// measure runs m for ops calls in batches and returns the wall and thread
// CPU time per call. The caller has locked the goroutine to its thread.
func (f *hcFlags) measure(m hcMode) (float64, float64, error) {
	var wall, cpu time.Duration
	for done := 0; done < f.ops; {
		n := min(f.batch, f.ops-done)
		if m.self != nil {
			*m.self = 0
		}
		c0, t0 := threadCPU(), time.Now()
		if err := m.run(n); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", m.name, err)
		}
		w := time.Since(t0)
		cpu += threadCPU() - c0
		if m.self != nil {
			w = *m.self
		}
		wall += w
		if err := m.settle(); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", m.name, err)
		}
		done += n
	}
	return float64(wall.Nanoseconds()) / float64(f.ops), float64(cpu.Nanoseconds()) / float64(f.ops), nil
}

func benchHostCost(args []string) error {
	f, err := parseHostCostFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	ctx := context.Background()
	modes, desc, closeAll, err := hostCostModes(ctx, f)
	if err != nil {
		return err
	}
	defer closeAll()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Warm up: a whole round, then a pause of three watchdog periods so
	// that the event pool holds what a round needs (the watchdog returns
	// events as it retires works), as in a training loop's steady state.
	for _, m := range modes {
		if _, _, err := f.measure(m); err != nil {
			return err
		}
	}
	time.Sleep(300 * time.Millisecond)
	if f.cpuProfile != "" {
		if f.profileHz != 100 {
			// Set before pprof starts the profile: its own 100 Hz then
			// loses (the runtime keeps the first rate and prints a note).
			runtime.SetCPUProfileRate(f.profileHz)
		}
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	var samples []hcSample
	torchAfter := map[int]bool{}
	for i := range f.torchRuns {
		torchAfter[(i*f.reps)/max(1, f.torchRuns)] = true
	}
	for r := range f.reps {
		for _, m := range modes {
			if f.cpuProfile != "" {
				// Each mode's samples carry its name (pprof -tagfocus
				// mode=...), so that one profile splits the modes apart.
				pprof.SetGoroutineLabels(pprof.WithLabels(ctx, pprof.Labels("mode", m.name)))
			}
			w, c, err := f.measure(m)
			if err != nil {
				return err
			}
			samples = append(samples, hcSample{Mode: m.name, Round: r, WallNs: w, CPUNs: c})
		}
		if f.python != "" && torchAfter[r] {
			ts, err := f.torchRound(r)
			if err != nil {
				return fmt.Errorf("torch peer: %w", err)
			}
			samples = append(samples, ts...)
		}
	}
	fmt.Print(hostCostTable(desc, f, samples))
	if f.jsonPath != "" {
		b, _ := json.MarshalIndent(map[string]any{"setup": desc, "backend": f.backend, "ops": f.ops, "batch": f.batch, "samples": samples}, "", " ")
		if err := os.WriteFile(f.jsonPath, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// torchRound runs the torch peer once and returns its samples.
func (f *hcFlags) torchRound(round int) ([]hcSample, error) {
	dir, err := os.MkdirTemp("", "conftest-hostcost-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	script, err := python.Write(dir, "hostcost_torch.py")
	if err != nil {
		return nil, err
	}
	be := "gloo"
	if f.backend == nccl.Name {
		be = "nccl"
	}
	cmd := exec.Command(f.python, script, "--backend", be, "--ops", strconv.Itoa(f.ops), "--batch", strconv.Itoa(f.batch), "--reps", "2")
	cmd.Env = append(os.Environ(), "MASTER_ADDR=127.0.0.1", "MASTER_PORT=0")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", f.python, script, err)
	}
	var res []hcSample
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var mode string
		var w, c float64
		if n, _ := fmt.Sscanf(sc.Text(), "HOSTCOST %s %g %g", &mode, &w, &c); n == 3 {
			res = append(res, hcSample{Mode: "torch " + be + " " + mode, Round: round, WallNs: w, CPUNs: c})
		}
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("no HOSTCOST lines in its output: %q", out)
	}
	return res, nil
}

// hostCostModes sets up the groups of f.backend at world 1 and returns
// the modes in the order they take turns.
func hostCostModes(ctx context.Context, f *hcFlags) ([]hcMode, string, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	fail := func(err error) ([]hcMode, string, func(), error) {
		closeAll()
		return nil, "", nil, err
	}
	isGPU := f.backend == nccl.Name
	var dev tensor.Device
	var cfgDev *tensor.Device
	if isGPU {
		dev = tensor.CUDADevice(0)
		cfgDev = &dev
	}
	newPG := func(entries int) (*dispatcher.ProcessGroup, error) {
		pg, err := dispatcher.Init(ctx, dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1, Backend: f.backend, Device: cfgDev,
			FlightRecorder: dispatcher.FlightRecorderOptions{Entries: entries, DumpPrefix: os.TempDir() + "/gocoll_hostcost_rank_"}})
		if err == nil {
			closers = append(closers, func() { pg.Close(ctx) })
		}
		return pg, err
	}
	on, err := newPG(0)
	if err != nil {
		return fail(err)
	}
	off, err := newPG(-1)
	if err != nil {
		return fail(err)
	}
	// nccl: groups whose async ops run on the current stream, recorder on
	// and off.
	var cs, csOff *dispatcher.ProcessGroup
	if isGPU {
		for _, e := range []struct {
			pg      **dispatcher.ProcessGroup
			entries int
		}{{&cs, 0}, {&csOff, -1}} {
			pg, err := dispatcher.Init(ctx, dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1, Backend: f.backend, Device: cfgDev,
				BackendOptions: map[string]any{nccl.Name: &nccl.Options{AsyncOnCurrentStream: true}},
				FlightRecorder: dispatcher.FlightRecorderOptions{Entries: e.entries, DumpPrefix: os.TempDir() + "/gocoll_hostcost_rank_"}})
			if err != nil {
				return fail(err)
			}
			closers = append(closers, func() { pg.Close(ctx) })
			*e.pg = pg
		}
	}
	opctx := ctx
	var x *tensor.Tensor
	var cur *cuda.Stream
	desc := fmt.Sprintf("%s, world 1, 1-element float32 SUM allreduce, %s calls per mode and round in batches of %d", f.backend, strconv.Itoa(f.ops), f.batch)
	if isGPU {
		d, err := cuda.GetDevice(0)
		if err != nil {
			return fail(err)
		}
		if cur, err = d.NewStream(cuda.StreamOptions{}); err != nil {
			return fail(err)
		}
		closers = append(closers, func() { cur.Destroy() })
		opctx = cuda.WithStream(ctx, cur)
		if x, err = cuda.Zeros(opctx, 0, tensor.Float32, 1); err != nil {
			return fail(err)
		}
		name, _ := d.Name()
		v, _ := nccl.Version()
		desc += fmt.Sprintf("; %s, NCCL %s (%s)", name, nccl.VersionString(v), nccl.LibraryPath())
	} else {
		x = tensor.New(tensor.Float32, 1)
	}
	closers = append(closers, func() { x.Free() })
	xs := []*tensor.Tensor{x}
	b, err := on.Backend(dev.Type)
	if err != nil {
		return fail(err)
	}
	var pending []backend.Work
	var seq uint64 = 1 << 40 // the backend-level calls' own numbers, apart from the dispatcher's
	drain := func() error {
		for _, w := range pending {
			if err := w.Wait(opctx); err != nil {
				return err
			}
		}
		pending = pending[:0]
		if cur != nil {
			return cur.Synchronize()
		}
		return nil
	}
	meta := func() backend.Meta {
		seq++
		return backend.Meta{Op: backend.OpAllreduce, Seq: seq, Timeout: time.Minute}
	}
	loop := func(call func() (backend.Work, error), wait, keep bool) func(int) error {
		return func(n int) error {
			for range n {
				w, err := call()
				if err != nil {
					return err
				}
				switch {
				case keep:
					pending = append(pending, w)
				case wait:
					if err := w.Wait(opctx); err != nil {
						return err
					}
				}
			}
			return nil
		}
	}
	async := backend.AllreduceOptions{Async: isGPU}
	be := func(o backend.AllreduceOptions) func() (backend.Work, error) {
		return func() (backend.Work, error) { return b.Allreduce(opctx, meta(), xs, o) }
	}
	disp := func(pg *dispatcher.ProcessGroup, o backend.AllreduceOptions) func() (backend.Work, error) {
		return func() (backend.Work, error) { return pg.Allreduce(opctx, xs, o) }
	}
	var modes []hcMode
	add := func(name string, run func(int) error) {
		modes = append(modes, hcMode{name: name, run: run, settle: drain})
	}
	if isGPU {
		nb, ok := b.(*nccl.Backend)
		if !ok {
			return fail(fmt.Errorf("bench hostcost: the nccl backend is a %T", b))
		}
		var self time.Duration
		modes = append(modes, hcMode{name: "nccl raw", self: &self, settle: drain, run: func(n int) error {
			d, err := nb.RawAllreduce(opctx, x, cur, n)
			self = d
			return err
		}})
		var fself time.Duration
		modes = append(modes, hcMode{name: hcFloorMode, self: &fself, settle: drain, run: func(n int) error {
			d, err := nb.FloorAllreduce(opctx, x, cur, n)
			fself = d
			return err
		}})
		var cself time.Duration
		modes = append(modes, hcMode{name: hcFloorCurMode, self: &cself, settle: drain, run: func(n int) error {
			d, err := nb.FloorAllreduceCurrentStream(opctx, x, cur, n)
			cself = d
			return err
		}})
		modes = append(modes, hcMode{name: hcCrossCurMode, settle: drain, run: func(n int) error {
			return nb.CrossingAllreduceCurrentStream(opctx, x, cur, n)
		}})
		csb, err := cs.Backend(dev.Type)
		if err != nil {
			return fail(err)
		}
		add("backend sync", loop(be(backend.AllreduceOptions{}), false, false))
		add("backend async+Wait", loop(be(async), true, false))
		add(hcBackendCurMode, loop(func() (backend.Work, error) { return csb.Allreduce(opctx, meta(), xs, async) }, true, false))
		add("dispatcher sync, recorder on", loop(disp(on, backend.AllreduceOptions{}), false, false))
		add(hcGoalMode, loop(disp(on, async), true, false))
		add("dispatcher async issue, recorder on", loop(disp(on, async), false, true))
		add("dispatcher async+Wait, recorder off", loop(disp(off, async), true, false))
		add(hcGoalCurMode, loop(disp(cs, async), true, false))
		add("dispatcher async+Wait, recorder off, current stream", loop(disp(csOff, async), true, false))
	} else {
		add("backend op+Wait", loop(be(async), true, false))
		add("backend issue", loop(be(async), false, true))
		add("dispatcher op+Wait, recorder on", loop(disp(on, async), true, false))
		add("dispatcher issue, recorder on", loop(disp(on, async), false, true))
		add("dispatcher op+Wait, recorder off", loop(disp(off, async), true, false))
	}
	if f.only != "" {
		kept := modes[:0]
		for _, m := range modes {
			keep := m.name == hcRawMode
			for _, w := range strings.Split(f.only, ",") {
				keep = keep || (w != "" && strings.Contains(m.name, w))
			}
			if keep {
				kept = append(kept, m)
			}
		}
		modes = kept
		desc += "; modes matching --only " + strconv.Quote(f.only)
	}
	return modes, desc, closeAll, nil
}
