package conformance

// The child side of the failure specs (spec_failures.go). A failure that
// must end a process, or that leaves a communicator whose kernels never
// finish, cannot run inside a rank of the suite: the spec starts fresh
// processes of the same executable with EnvChild set, and they run one
// scenario here and exit. Each child prints "RESULT key=value" lines that
// the spec reads, and its flight recorder dumps to the spec's directory.
// The generic scenarios are here; a backend's own ones come from its
// Extension.

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
	GPU      int  // CUDA device of this child; -1 puts tensors on the CPU
	Gate     bool // a collective that never starts is held by a stream gate
}

// Timeouts of the scenarios.
const (
	// ChildOpTimeout is the timeout of the op that fails.
	ChildOpTimeout   = time.Second
	childSkipTimeout = 2 * time.Second // the op a peer skips
	childKillTimeout = 3 * time.Second // the op whose peer is killed
	// ChildOKTimeout is the timeout of the ops that should succeed.
	ChildOKTimeout = 10 * time.Second
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

// Child is one child process of a failure spec, as its scenario sees it:
// its group and the tensor it reduces.
type Child struct {
	// Scenario is the scenario's name; Rank and World place the child in
	// the children's world; Dir is where the flight recorder dumps go.
	Scenario    string
	Rank, World int
	Dir         string
	// GPU is the child's CUDA device, -1 on the CPU.
	GPU int
	// PG is the children's default group, over Store.
	PG    *dispatcher.ProcessGroup
	Store store.Store
	// Ctx carries the current stream Cur on a GPU.
	Ctx context.Context
	// X is 1024 float32 ones on the child's device.
	X *tensor.Tensor
	// Dev and Cur are the child's device and current stream; nil on the
	// CPU.
	Dev *cuda.Device
	Cur *cuda.Stream
	// BlockingWait makes Allreduce wait with Work.Wait (the caller's wait
	// under blocking-wait mode) instead of WaitHost.
	BlockingWait bool

	gate bool
	ext  []Extension // those of the backends the child's backend string names
}

// Result prints one "RESULT k=v" line for the spec to read.
func (c *Child) Result(k string, v any) {
	fmt.Printf("RESULT %s=%s\n", k, strings.ReplaceAll(fmt.Sprint(v), "\n", " "))
}

// ResultErr prints err under prefix and, for an *OpError, its ranks under
// prefix_ranks.
func (c *Child) ResultErr(prefix string, err error) {
	c.Result(prefix, err)
	var oe *backend.OpError
	if errors.As(err, &oe) {
		c.Result(prefix+"_ranks", fmt.Sprint(oe.Ranks))
	}
}

func runChild(cfg childConfig) error {
	bg := context.Background()
	st, err := store.DialTCPStore(bg, cfg.Store, store.ClientOptions{Timeout: time.Minute})
	if err != nil {
		return err
	}
	c := &Child{Scenario: cfg.Scenario, Rank: cfg.Rank, World: cfg.World, Dir: cfg.Dir, GPU: cfg.GPU,
		Store: st, Ctx: bg, gate: cfg.Gate, BlockingWait: cfg.Scenario == "policy-BlockingWait"}
	dcfg := dispatcher.Config{Store: st, Rank: cfg.Rank, WorldSize: cfg.World, Backend: cfg.Backend, Timeout: 30 * time.Second,
		FlightRecorder: dispatcher.FlightRecorderOptions{DumpPrefix: filepath.Join(cfg.Dir, "fr_")},
		Monitor:        dispatcher.MonitorOptions{CoordCheck: 200 * time.Millisecond}}
	if cfg.GPU >= 0 {
		dev := tensor.CUDADevice(cfg.GPU)
		dcfg.Device = &dev
	}
	if names, err := backend.ParseBackendString(cfg.Backend); err == nil {
		seen := map[string]bool{}
		for _, name := range names {
			if ext, ok := extension(name); ok && !seen[name] {
				seen[name] = true
				c.ext = append(c.ext, ext)
				if ext.Child != nil {
					if err := ext.Child(c, &dcfg); err != nil {
						return err
					}
				}
			}
		}
	}
	if cfg.Scenario == "nojoin" {
		return c.noJoin(dcfg) // child_faults.go: one rank never calls Init
	}
	if c.PG, err = dispatcher.Init(bg, dcfg); err != nil {
		return err
	}
	if cfg.GPU >= 0 {
		if c.Dev, err = cuda.GetDevice(cfg.GPU); err != nil {
			return err
		}
		if c.Cur, err = c.Dev.NewStream(cuda.StreamOptions{}); err != nil {
			return err
		}
		c.Ctx = cuda.WithStream(bg, c.Cur)
	}
	if c.X, err = c.Tensor(1024, -1); err != nil {
		return err
	}
	// Collectives 1 and 2 complete on every rank before the scenario.
	warm, run := 2, func() error { return fmt.Errorf("unknown scenario %q", cfg.Scenario) }
	switch {
	case strings.HasPrefix(cfg.Scenario, "policy-"):
		run = c.policy
	case cfg.Scenario == "skip":
		run = c.skip
	case cfg.Scenario == "kill":
		warm, run = 1, c.kill
	case cfg.Scenario == "abort":
		run = c.abort
	case strings.HasPrefix(cfg.Scenario, "killone-"):
		warm, run = 1, c.killOne // child_faults.go
	case strings.HasPrefix(cfg.Scenario, "mismatch-"):
		run = c.mismatch // child_faults.go
	default:
		for _, ext := range c.ext {
			if sc, ok := ext.Scenarios[cfg.Scenario]; ok {
				warm, run = sc.Warm, func() error { return sc.Run(c) }
			}
		}
	}
	for range warm {
		if _, err := c.Allreduce(ChildOKTimeout); err != nil {
			return fmt.Errorf("warm-up allreduce: %w", err)
		}
	}
	return run()
}

// Tensor makes n float32 ones on the child's device, NaN at index bad
// (none when bad < 0).
func (c *Child) Tensor(n, bad int) (*tensor.Tensor, error) {
	v := make([]float64, n)
	for i := range v {
		v[i] = 1
	}
	if bad >= 0 {
		v[bad] = math.NaN()
	}
	h, err := tensor.FromFloat64s(tensor.Float32, v)
	if err != nil || c.Dev == nil {
		return h, err
	}
	return cuda.FromHost(c.Ctx, c.GPU, h)
}

// Allreduce runs one allreduce of X with the given timeout and waits for
// it (the host for async works, the caller under BlockingWait), returning
// the time from issue to the error.
func (c *Child) Allreduce(timeout time.Duration) (time.Duration, error) {
	t0 := time.Now()
	w, err := c.PG.Allreduce(c.Ctx, []*tensor.Tensor{c.X}, backend.AllreduceOptions{Timeout: timeout})
	if err != nil {
		return time.Since(t0), err
	}
	ctx, cancel := context.WithTimeout(c.Ctx, 20*time.Second)
	defer cancel()
	if c.BlockingWait {
		err = w.Wait(ctx)
	} else {
		err = w.WaitHost(ctx)
	}
	return time.Since(t0), err
}

// Hold closes a stream gate on the current stream, so that what is queued
// after it never starts. Unless a scenario opens it, the gate stays closed
// until the process ends.
func (c *Child) Hold() (*cuda.Gate, error) {
	if c.Dev == nil {
		return nil, errors.New("this scenario gates a CUDA stream and needs a GPU")
	}
	g, err := c.Dev.NewGate()
	if err != nil {
		return nil, err
	}
	return g, g.Hold(c.Cur)
}

// policy: collective 3 never starts on rank 0 (its stream is gated, or
// rank 1 withholds it) and times out; what follows is the backend's error
// policy's, or, for a backend without policies, the group works on once
// the late op can run.
func (c *Child) policy() error {
	bg := context.Background()
	if c.Rank != 0 {
		// Rank 1 of two: the op that never starts on rank 0 is the one this
		// rank issues only once rank 0 has timed out.
		if err := c.Store.Wait(bg, "test/timedout"); err != nil {
			return err
		}
		_, err := c.Allreduce(ChildOKTimeout)
		c.ResultErr("late", err)
		_, err = c.Allreduce(ChildOKTimeout)
		c.ResultErr("next", err)
		return nil
	}
	var g *cuda.Gate
	if c.gate {
		var err error
		if g, err = c.Hold(); err != nil {
			return err
		}
	}
	el, err := c.Allreduce(ChildOpTimeout)
	c.Result("elapsed", el.Seconds())
	c.ResultErr("err", err)
	c.Result("timeout", errors.Is(err, backend.ErrTimeout))
	policy := strings.TrimPrefix(c.Scenario, "policy-")
	for _, ext := range c.ext {
		if ext.Policies != nil && ext.Policies.After != nil {
			return ext.Policies.After(c, policy, g)
		}
	}
	if g != nil {
		g.Open()
		if err := c.Cur.SynchronizeContext(bg); err != nil {
			return err
		}
	}
	if err := c.Store.Set(bg, "test/timedout", []byte("1")); err != nil {
		return err
	}
	_, err = c.Allreduce(ChildOKTimeout)
	c.ResultErr("next", err)
	return nil
}

// skip: rank 1 never issues collective 3; rank 0 times out naming it.
func (c *Child) skip() error {
	if c.Rank != 0 {
		time.Sleep(childSkipTimeout + 3*time.Second) // dumps when rank 0 asks
		_, err := os.Stat(filepath.Join(c.Dir, fmt.Sprintf("fr_%d", c.Rank)))
		c.Result("dumped", err == nil)
		return nil
	}
	el, err := c.Allreduce(childSkipTimeout)
	c.Result("elapsed", el.Seconds())
	c.ResultErr("err", err)
	c.Result("timeout", errors.Is(err, backend.ErrTimeout))
	time.Sleep(time.Second) // lets rank 1 write its dump before the spec reads
	return nil
}

// kill: rank 1 is killed while rank 0 is in collective 2. On a GPU rank
// 1's own allreduce is queued behind a gate first, so that it dies
// mid-collective with its kernel pending.
func (c *Child) kill() error {
	bg := context.Background()
	if c.Rank != 0 {
		if c.Dev != nil {
			if _, err := c.Hold(); err != nil {
				return err
			}
			if _, err := c.PG.Allreduce(c.Ctx, []*tensor.Tensor{c.X}, backend.AllreduceOptions{Timeout: 30 * time.Second}); err != nil {
				return err
			}
		}
		if err := c.Store.Wait(bg, "test/r0issued"); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond)
		fmt.Println("rank 1: killing myself mid-collective")
		return syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = c.Store.Set(bg, "test/r0issued", []byte("1"))
	}()
	el, err := c.Allreduce(childKillTimeout)
	c.Result("elapsed", el.Seconds())
	c.ResultErr("err", err)
	_, err = c.Allreduce(ChildOKTimeout)
	c.ResultErr("next", err)
	return nil
}

// abort: rank 0 aborts its group while an allreduce waits for rank 1,
// which never issues it. The abort must not wait for the peer.
func (c *Child) abort() error {
	if c.Rank != 0 {
		time.Sleep(3 * time.Second)
		return nil
	}
	w, err := c.PG.Allreduce(c.Ctx, []*tensor.Tensor{c.X}, backend.AllreduceOptions{Timeout: 30 * time.Second})
	if err != nil {
		return err
	}
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	err = c.PG.Abort(context.Background(), errors.New("conformance: user abort"))
	c.Result("abort_elapsed", time.Since(t0).Seconds())
	c.ResultErr("abort", err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = w.WaitHost(ctx)
	cancel()
	c.ResultErr("pending", err)
	c.Result("pending_aborted", errors.Is(err, backend.ErrAborted))
	_, err = c.PG.Allreduce(c.Ctx, []*tensor.Tensor{c.X}, backend.AllreduceOptions{})
	c.ResultErr("next", err)
	c.Result("next_aborted", errors.Is(err, backend.ErrAborted))
	return nil
}
