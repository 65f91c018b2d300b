package conformance

// The child side of the failure specs (spec_failures.go). A failure that
// must end a process, or that leaves a communicator whose kernels never
// finish, cannot run inside a rank of the suite: the spec starts fresh
// processes of the same executable with EnvChild set, and they run one
// scenario here and exit. Each child prints "RESULT key=value" lines that
// the spec reads, and its flight recorder dumps to the spec's directory.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// EnvChild, when set (to a JSON childConfig), makes the process a child of
// a failure spec. Programs that run the suite call RunChild first thing.
const EnvChild = "GOCOLL_CONFTEST_CHILD"

// childConfig tells a child what to run.
type childConfig struct {
	Scenario string
	Rank     int
	World    int
	Store    string // host:port of the spec's TCPStore
	Dir      string // where the flight recorder dumps go
	Backend  string
	GPU      int // CUDA device of this child; -1 puts tensors on the CPU
}

// Timeouts of the scenarios.
const (
	childOpTimeout   = time.Second     // the op that fails
	childSkipTimeout = 2 * time.Second // the op a peer skips
	childKillTimeout = 3 * time.Second // the op whose peer is killed
	childOKTimeout   = 10 * time.Second
)

// RunChild runs the failure scenario that EnvChild describes and exits the
// process. Without EnvChild it returns at once. cmd/conftest and the
// package's test binary call it before anything else.
func RunChild() {
	v := os.Getenv(EnvChild)
	if v == "" {
		return
	}
	var cfg childConfig
	if err := json.Unmarshal([]byte(v), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "conformance child: bad %s: %v\n", EnvChild, err)
		os.Exit(2)
	}
	if err := runChild(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "conformance child %s rank %d: %v\n", cfg.Scenario, cfg.Rank, err)
		os.Exit(2)
	}
	os.Exit(0)
}

// childEnv is a child's group and the tensor it reduces.
type childEnv struct {
	cfg  childConfig
	pg   *dispatcher.ProcessGroup
	st   store.Store
	ctx  context.Context // carries the current stream on a GPU
	x    *tensor.Tensor
	dev  *cuda.Device // nil on the CPU
	cur  *cuda.Stream
	opts *nccl.Options // nil unless the backend is nccl
}

func result(k string, v any) {
	fmt.Printf("RESULT %s=%s\n", k, strings.ReplaceAll(fmt.Sprint(v), "\n", " "))
}

func resultErr(prefix string, err error) {
	result(prefix, err)
	var oe *backend.OpError
	if errors.As(err, &oe) {
		result(prefix+"_ranks", fmt.Sprint(oe.Ranks))
	}
}

func runChild(cfg childConfig) error {
	bg := context.Background()
	st, err := store.DialTCPStore(bg, cfg.Store, store.ClientOptions{Timeout: time.Minute})
	if err != nil {
		return err
	}
	e := &childEnv{cfg: cfg, st: st, ctx: bg}
	dcfg := dispatcher.Config{Store: st, Rank: cfg.Rank, WorldSize: cfg.World, Backend: cfg.Backend, Timeout: 30 * time.Second,
		FlightRecorder: dispatcher.FlightRecorderOptions{DumpPrefix: filepath.Join(cfg.Dir, "fr_")},
		Monitor:        dispatcher.MonitorOptions{CoordCheck: 200 * time.Millisecond}}
	if cfg.GPU >= 0 {
		dev := tensor.CUDADevice(cfg.GPU)
		dcfg.Device = &dev
	}
	if names, err := backend.ParseBackendString(cfg.Backend); err == nil && names[tensor.CUDA] == nccl.Name {
		o, err := nccl.OptionsFromEnv()
		if err != nil {
			return err
		}
		o.AbortTimeout = 2 * time.Second
		o.HangWatchdogForTest = cfg.Scenario == "heartbeat"
		e.opts = &o
		dcfg.BackendOptions = map[string]any{nccl.Name: e.opts}
	}
	if e.pg, err = dispatcher.Init(bg, dcfg); err != nil {
		return err
	}
	if cfg.GPU >= 0 {
		if e.dev, err = cuda.GetDevice(cfg.GPU); err != nil {
			return err
		}
		if e.cur, err = e.dev.NewStream(cuda.StreamOptions{}); err != nil {
			return err
		}
		e.ctx = cuda.WithStream(bg, e.cur)
	}
	if e.x, err = e.tensor(1024, -1); err != nil {
		return err
	}
	// Collectives 1 and 2 complete on every rank before the scenario.
	warm := 2
	switch cfg.Scenario {
	case "heartbeat", "nan":
		warm = 0
	case "kill":
		warm = 1
	}
	for range warm {
		if _, err := e.allreduce(childOKTimeout); err != nil {
			return fmt.Errorf("warm-up allreduce: %w", err)
		}
	}
	switch {
	case strings.HasPrefix(cfg.Scenario, "policy-"):
		return e.policy()
	case cfg.Scenario == "skip":
		return e.skip()
	case cfg.Scenario == "kill":
		return e.kill()
	case cfg.Scenario == "remote":
		return e.remote()
	case cfg.Scenario == "abort":
		return e.abort()
	case cfg.Scenario == "heartbeat":
		time.Sleep(15 * time.Second) // the monitor ends the process first
		result("survived", true)
		return nil
	case cfg.Scenario == "nan":
		return e.nan()
	}
	return fmt.Errorf("unknown scenario %q", cfg.Scenario)
}

// tensor makes n float32 ones on the child's device, NaN at index bad
// (none when bad < 0).
func (e *childEnv) tensor(n, bad int) (*tensor.Tensor, error) {
	v := make([]float64, n)
	for i := range v {
		v[i] = 1
	}
	if bad >= 0 {
		v[bad] = math.NaN()
	}
	h, err := tensor.FromFloat64s(tensor.Float32, v)
	if err != nil || e.dev == nil {
		return h, err
	}
	return cuda.FromHost(e.ctx, e.cfg.GPU, h)
}

// allreduce runs one allreduce with the given timeout and waits for it as
// the backend's mode asks (the host for async works, the caller under
// blocking wait), returning the time from issue to the error.
func (e *childEnv) allreduce(timeout time.Duration) (time.Duration, error) {
	t0 := time.Now()
	w, err := e.pg.Allreduce(e.ctx, []*tensor.Tensor{e.x}, backend.AllreduceOptions{Timeout: timeout})
	if err != nil {
		return time.Since(t0), err
	}
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	if e.opts != nil && e.opts.BlockingWait {
		err = w.Wait(ctx)
	} else {
		err = w.WaitHost(ctx)
	}
	return time.Since(t0), err
}

// hold closes a stream gate on the current stream, so that what is queued
// after it never starts. Unless a scenario opens it, the gate stays closed
// until the process ends.
func (e *childEnv) hold() (*cuda.Gate, error) {
	if e.dev == nil {
		return nil, errors.New("this scenario gates a CUDA stream and needs a GPU")
	}
	g, err := e.dev.NewGate()
	if err != nil {
		return nil, err
	}
	return g, g.Hold(e.cur)
}

// policy: a gated allreduce times out; what follows is the policy's.
func (e *childEnv) policy() error {
	g, err := e.hold()
	if err != nil {
		return err
	}
	el, err := e.allreduce(childOpTimeout)
	result("elapsed", el.Seconds())
	resultErr("err", err)
	result("timeout", errors.Is(err, backend.ErrTimeout))
	switch e.cfg.Scenario {
	case "policy-TearDown", "policy-SkipCleanUp":
		time.Sleep(15 * time.Second) // the watchdog ends the process first
		result("survived", true)
	case "policy-NoHandling":
		// Nothing was done to the communicator: once the gate opens, the
		// late op runs and the next one works.
		g.Open()
		if err := e.cur.SynchronizeContext(context.Background()); err != nil {
			return err
		}
		_, err := e.allreduce(childOKTimeout)
		resultErr("next", err)
	default:
		// CleanUpOnly and blocking wait: the communicators were aborted;
		// the next op must fail, keeping the reason.
		_, err := e.allreduce(childOKTimeout)
		resultErr("next", err)
	}
	return nil
}

// skip: rank 1 never issues collective 3; rank 0 times out naming it.
func (e *childEnv) skip() error {
	if e.cfg.Rank != 0 {
		time.Sleep(childSkipTimeout + 3*time.Second) // dumps when rank 0 asks
		_, err := os.Stat(filepath.Join(e.cfg.Dir, fmt.Sprintf("fr_%d", e.cfg.Rank)))
		result("dumped", err == nil)
		return nil
	}
	el, err := e.allreduce(childSkipTimeout)
	result("elapsed", el.Seconds())
	resultErr("err", err)
	result("timeout", errors.Is(err, backend.ErrTimeout))
	time.Sleep(time.Second) // lets rank 1 write its dump before the spec reads
	return nil
}

// kill: rank 1 is killed while rank 0 is in collective 2. On a GPU rank
// 1's own allreduce is queued behind a gate first, so that it dies
// mid-collective with its kernel pending.
func (e *childEnv) kill() error {
	bg := context.Background()
	if e.cfg.Rank != 0 {
		if e.dev != nil {
			if _, err := e.hold(); err != nil {
				return err
			}
			if _, err := e.pg.Allreduce(e.ctx, []*tensor.Tensor{e.x}, backend.AllreduceOptions{Timeout: 30 * time.Second}); err != nil {
				return err
			}
		}
		if err := e.st.Wait(bg, "test/r0issued"); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond)
		fmt.Println("rank 1: killing myself mid-collective")
		return syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = e.st.Set(bg, "test/r0issued", []byte("1"))
	}()
	el, err := e.allreduce(childKillTimeout)
	result("elapsed", el.Seconds())
	resultErr("err", err)
	_, err = e.allreduce(childOKTimeout)
	resultErr("next", err)
	return nil
}

// abort: rank 0 aborts its group while an allreduce waits for rank 1,
// which never issues it. The abort must not wait for the peer.
func (e *childEnv) abort() error {
	if e.cfg.Rank != 0 {
		time.Sleep(3 * time.Second)
		return nil
	}
	w, err := e.pg.Allreduce(e.ctx, []*tensor.Tensor{e.x}, backend.AllreduceOptions{Timeout: 30 * time.Second})
	if err != nil {
		return err
	}
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	err = e.pg.Abort(context.Background(), errors.New("conformance: user abort"))
	result("abort_elapsed", time.Since(t0).Seconds())
	resultErr("abort", err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = w.WaitHost(ctx)
	cancel()
	resultErr("pending", err)
	result("pending_aborted", errors.Is(err, backend.ErrAborted))
	_, err = e.pg.Allreduce(e.ctx, []*tensor.Tensor{e.x}, backend.AllreduceOptions{})
	resultErr("next", err)
	result("next_aborted", errors.Is(err, backend.ErrAborted))
	return nil
}

// remote: rank 0's allreduce never starts and times out after 1 s; rank
// 1's, with a 30 s timeout, must learn of it from the store.
func (e *childEnv) remote() error {
	timeout := 30 * time.Second
	if e.cfg.Rank == 0 {
		if _, err := e.hold(); err != nil {
			return err
		}
		timeout = childOpTimeout
	}
	el, err := e.allreduce(timeout)
	result("elapsed", el.Seconds())
	resultErr("err", err)
	result("remote", errors.Is(err, backend.ErrRemote))
	time.Sleep(500 * time.Millisecond)
	return nil
}

// nan: with the NaN check on, an input holding a NaN fails the op on every
// rank before it is issued; a NaN in a receive buffer does not count.
func (e *childEnv) nan() error {
	bad, err := e.tensor(1<<20, 1<<20-3) // past the kernel's first grid pass
	if err != nil {
		return err
	}
	_, err = e.pg.Allreduce(e.ctx, []*tensor.Tensor{bad}, backend.AllreduceOptions{})
	resultErr("input", err)
	result("input_invalid", errors.Is(err, backend.ErrInvalidArgument))
	// Every rank receives into a buffer with a NaN; rank 0's input is clean.
	recv, err := e.tensor(1024, 5)
	if err != nil {
		return err
	}
	in, err := e.tensor(1024, -1)
	if err != nil {
		return err
	}
	out := make([]*tensor.Tensor, e.cfg.World)
	out[e.cfg.Rank] = recv
	for r := range out {
		if out[r] == nil {
			if out[r], err = e.tensor(1024, -1); err != nil {
				return err
			}
		}
	}
	w, err := e.pg.Allgather(e.ctx, [][]*tensor.Tensor{out}, []*tensor.Tensor{in}, backend.AllgatherOptions{})
	if err == nil {
		ctx, cancel := context.WithTimeout(e.ctx, childOKTimeout)
		err = w.WaitHost(ctx)
		cancel()
	}
	resultErr("recv", err)
	if err == nil {
		h, err := cuda.ToHost(context.Background(), recv)
		if err != nil {
			return err
		}
		result("recv_value", h.At(5))
	}
	return nil
}
