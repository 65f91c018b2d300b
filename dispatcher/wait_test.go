package dispatcher

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// relBackend is a test backend whose Works count their Release calls.
// Allreduce completes at once, failing when the tensor's first element is
// negative; Broadcast completes 200 ms after the call, on its own
// goroutine.
type relBackend struct {
	recorder
	released *atomic.Int32
}

type relWork struct {
	backend.HostWork
	released *atomic.Int32
}

func (w *relWork) Release() { w.released.Add(1) }

func (r *relBackend) Allreduce(ctx context.Context, m backend.Meta, ts []*tensor.Tensor, _ backend.AllreduceOptions) (backend.Work, error) {
	w := &relWork{released: r.released}
	w.Init(m.Seq, true, nil)
	var err error
	if ts[0].At(0) < 0 {
		err = &backend.OpError{Op: "allreduce", Seq: m.Seq, Kind: backend.ErrRemote, Detail: "a negative value"}
	}
	w.Complete(ts, err)
	return w, nil
}

func (r *relBackend) Broadcast(ctx context.Context, m backend.Meta, ts []*tensor.Tensor, _ backend.BroadcastOptions) (backend.Work, error) {
	w := &relWork{released: r.released}
	w.Init(m.Seq, true, nil)
	time.AfterFunc(200*time.Millisecond, func() { w.Complete(ts, nil) })
	return w, nil
}

func init() {
	backend.Register(backend.Driver{Name: "relcpu", Devices: []tensor.DeviceType{tensor.CPU}, New: func(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
		n, _ := cfg.Options.(*atomic.Int32)
		if n == nil {
			n = new(atomic.Int32)
		}
		return &relBackend{recorder: recorder{name: "relcpu", cfg: cfg, log: &callLog{}}, released: n}, nil
	}})
}

// TestWaitFormReleases: the blocking forms (AllreduceWait, ...) hand the
// Work of an op that succeeded back to its backend once Wait returned,
// after the flight recorder retired it, and only when nothing else may
// hold it: not with post hooks, not for a failed op, never for the async
// form. The recorder's entry is retired at once (completed, nothing
// pending), so that it does not hold the Work either.
func TestWaitFormReleases(t *testing.T) {
	ctx := context.Background()
	for _, rec := range []bool{true, false} {
		var n atomic.Int32
		cfg := Config{Backend: "relcpu", Timeout: 5 * time.Second, BackendOptions: map[string]any{"relcpu": &n}}
		if !rec {
			cfg.FlightRecorder.Entries = -1
		}
		// No poll during the test: while a refresh queries the works, a
		// blocking form keeps its Work rather than wait for it
		// (FlightRecorder.retire), and the default poll's tick at 200 ms
		// met BroadcastWait's completion at 200 ms in a CI run.
		cfg.FlightRecorder.Poll = time.Hour
		pg := initGroups(t, 1, cfg)[0]
		x := tensor.New(tensor.Float32, 2)
		want := int32(0)
		check := func(what string) {
			t.Helper()
			if got := n.Load(); got != want {
				t.Fatalf("recorder %v, %s: %d releases, want %d", rec, what, got, want)
			}
			if fr := pg.recorder; fr != nil {
				fr.mu.Lock()
				pending := fr.pending
				fr.mu.Unlock()
				if pending != 0 {
					t.Fatalf("%s: %d recorder entries pending, want 0", what, pending)
				}
			}
		}

		for range 3 {
			if err := pg.AllreduceWait(ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{}); err != nil {
				t.Fatal(err)
			}
			want++
			check("AllreduceWait")
		}
		// Completing after the call: Wait blocks, then the work goes back.
		if err := pg.BroadcastWait(ctx, []*tensor.Tensor{x}, backend.BroadcastOptions{}); err != nil {
			t.Fatal(err)
		}
		want++
		check("BroadcastWait")

		w, err := pg.Allreduce(ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{})
		if err != nil || w.Wait(ctx) != nil {
			t.Fatal(err)
		}
		check("Allreduce, async form")

		x.Fill(-1)
		err = pg.AllreduceWait(ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{})
		if !errors.Is(err, backend.ErrRemote) {
			t.Fatalf("failing AllreduceWait: %v, want ErrRemote", err)
		}
		check("a failed AllreduceWait")
		x.Fill(1)

		var seen backend.Work
		pg.AddHooks(Hooks{Post: func(_ context.Context, _ OpInfo, w backend.Work, _ error) { seen = w }})
		if err := pg.AllreduceWait(ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{}); err != nil {
			t.Fatal(err)
		}
		if seen == nil || !seen.IsCompleted() {
			t.Fatalf("the post hook saw %v", seen)
		}
		check("AllreduceWait with a post hook")
	}
}

// TestWaitFormRecorded: a blocking op is in the flight recorder while it
// runs (scheduled), as an async op is, and completed after it, with its
// sequence number and duration.
func TestWaitFormRecorded(t *testing.T) {
	ctx := context.Background()
	pg := initGroups(t, 1, Config{Backend: "relcpu", Timeout: 5 * time.Second})[0]
	x := tensor.New(tensor.Float32, 2)
	done := make(chan error, 1)
	go func() { done <- pg.BroadcastWait(ctx, []*tensor.Tensor{x}, backend.BroadcastOptions{}) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pg.recorder.mu.Lock()
		n := len(pg.recorder.ring)
		var st frState
		if n == 1 {
			st = pg.recorder.ring[0].m.state()
		}
		pg.recorder.mu.Unlock()
		if n == 1 {
			if st != frScheduled && st != frStarted {
				t.Fatalf("while the op runs, its entry is in state %v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the blocking op was not recorded while it ran")
		}
		time.Sleep(time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	pg.recorder.mu.Lock()
	fe := pg.recorder.ring[0]
	pg.recorder.mu.Unlock()
	if fe.m.state() != frCompleted || fe.seq != 1 || !fe.m.has(frHasDur) || fe.ho != nil {
		t.Fatalf("entry: state %v seq %d has dur %v holds work %v", fe.m.state(), fe.seq, fe.m.has(frHasDur), fe.ho != nil)
	}
}
