package nccl

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/watch"
	"github.com/gocoll/gocoll/store"
)

// The options' policies map to the unit's by name, and a value that names
// none (a zero value that means "default") is the default, SkipCleanUp.
func TestPolicyOf(t *testing.T) {
	for p, want := range map[ErrorPolicy]watch.Policy{
		NoHandling: watch.NoHandling, TearDown: watch.TearDown, CleanUpOnly: watch.CleanUpOnly,
		SkipCleanUp: watch.SkipCleanUp, DefaultPolicy: watch.SkipCleanUp, ErrorPolicy(42): watch.SkipCleanUp,
	} {
		if got := policyOf(p); got != want {
			t.Errorf("policyOf(%v) = %v, want %v", p, got, want)
		}
	}
}

// fakeEdge records the sleeps and the exit instead of doing them.
type fakeEdge struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
	exits  []int
}

func (f *fakeEdge) edge() edge {
	return edge{
		now: func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now },
		sleep: func(d time.Duration) {
			f.mu.Lock()
			f.sleeps = append(f.sleeps, d)
			f.mu.Unlock()
		},
		exit: func(code int) {
			f.mu.Lock()
			f.exits = append(f.exits, code)
			f.mu.Unlock()
		},
	}
}

// hostBackend is a Backend with no communicator and no library: enough to
// drive the watchdog's decisions and their actions on works that never
// reach a device (every action below fails a work before any would query
// its event).
func hostBackend(t *testing.T, policy ErrorPolicy, blocking bool) (*Backend, *fakeEdge, *[]string, store.Store) {
	t.Helper()
	st := store.NewHashStore()
	var dumps []string
	fe := &fakeEdge{now: time.Unix(1000, 0)}
	cfg := backend.Config{Rank: 0, WorldSize: 2, Store: st, GroupDesc: "default_pg",
		DumpAll: func(reason string) string { dumps = append(dumps, reason); return "/tmp/fr_0" }}
	opts := DefaultOptions()
	opts.ErrorPolicy, opts.BlockingWait = policy, blocking
	b := &Backend{cfg: cfg, opts: opts, rank: 0, size: 2, wd: newWatchdog(cfg, opts), edge: fe.edge(),
		stop: make(chan struct{}), wdDone: make(chan struct{})}
	return b, fe, &dumps, st
}

func (b *Backend) hostWork(seq uint64, enq time.Time) *Work {
	w := &Work{b: b, c: &comm{key: "0"}, op: backend.OpAllreduce, seq: seq, timeout: time.Second, enq: backend.MonoOf(enq)}
	b.enqueue(w)
	return w
}

// A timeout under TearDown, through the real driver: the error names the
// dump file, the peers are told through the store, the backend refuses
// later ops with the reason, one fatal line, then exit 1 after the grace.
func TestDriverTimeoutTearDown(t *testing.T) {
	b, fe, dumps, st := hostBackend(t, TearDown, false)
	w := b.hostWork(3, fe.now)
	b.mu.Lock()
	acts := b.wd.Tick(fe.now.Add(1500 * time.Millisecond))
	b.mu.Unlock()
	b.perform(context.Background(), acts, nil)

	err := w.Exception()
	if !errors.Is(err, backend.ErrTimeout) || !strings.Contains(err.Error(), "the watchdog saw it still running 1.5s after enqueue (group default_pg)") ||
		!strings.HasSuffix(err.Error(), "; flight recorder dump: /tmp/fr_0") {
		t.Fatalf("work error: %v", err)
	}
	if len(*dumps) != 1 || !strings.HasPrefix((*dumps)[0], "nccl allreduce seq 3 on rank 0: timeout after 1s") {
		t.Fatalf("dumps: %q", *dumps)
	}
	v, gerr := st.Get(context.Background(), remoteErrorKey)
	if gerr != nil || !strings.HasPrefix(string(v), "0\n") || !strings.Contains(string(v), "timeout after 1s") {
		t.Fatalf("remote-error key: %q %v", v, gerr)
	}
	if uerr := b.usable(backend.OpAllreduce); !errors.Is(uerr, backend.ErrAborted) || !errors.Is(uerr, backend.ErrTimeout) {
		t.Fatalf("next op: %v", uerr)
	}
	if !slices.Equal(fe.sleeps, []time.Duration{dumpGrace}) || !slices.Equal(fe.exits, []int{1}) {
		t.Fatalf("sleeps %v exits %v, want [%v] [1]", fe.sleeps, fe.exits, dumpGrace)
	}
}

// A peer's error through the store fails the pending work with ErrRemote
// naming the peer; under NoHandling nothing else happens.
func TestDriverRemoteNoHandling(t *testing.T) {
	b, fe, dumps, st := hostBackend(t, NoHandling, false)
	w := b.hostWork(5, fe.now)
	v := watch.SignalValue(1, fe.now, "nccl allreduce seq 5 on rank 1: timeout after 1s")
	if err := st.Set(context.Background(), remoteErrorKey, []byte(v)); err != nil {
		t.Fatal(err)
	}
	b.checkRemoteError()
	err := w.Exception()
	var oe *backend.OpError
	if !errors.As(err, &oe) || !errors.Is(err, backend.ErrRemote) || !slices.Equal(oe.Ranks, []int{1}) ||
		!strings.Contains(err.Error(), "rank 1 failed: nccl allreduce seq 5 on rank 1: timeout after 1s") {
		t.Fatalf("work error: %v", err)
	}
	if len(*dumps) != 0 || b.usable(backend.OpAllreduce) != nil || len(fe.exits) != 0 {
		t.Fatalf("NoHandling did more than fail the work: dumps %q, usable %v, exits %v", *dumps, b.usable(backend.OpAllreduce), fe.exits)
	}
	b.mu.Lock()
	b.retireLocked()
	n := b.wd.Len()
	b.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d works still pending after the failure", n)
	}
}

// A user's Abort goes through the unit whatever the policy: the backend
// keeps the user's reason and nothing exits.
func TestDriverUserAbort(t *testing.T) {
	b, fe, _, _ := hostBackend(t, SkipCleanUp, false)
	reason := errors.New("user abort")
	if err := b.Abort(context.Background(), reason); err != nil {
		t.Fatal(err)
	}
	if uerr := b.usable(backend.OpAllreduce); !errors.Is(uerr, backend.ErrAborted) || !errors.Is(uerr, reason) {
		t.Fatalf("next op: %v", uerr)
	}
	if len(fe.exits) != 0 {
		t.Fatalf("exits %v", fe.exits)
	}
}

// The caller's deadline is not the op's timeout: WaitHost's error says
// which fired, and still wraps ErrTimeout and the context's error.
func TestWaitErrorNamesTheCallersDeadline(t *testing.T) {
	b, fe, _, _ := hostBackend(t, NoHandling, false)
	w := &Work{b: b, c: &comm{key: "0"}, op: backend.OpAllreduce, seq: 4, timeout: 30 * time.Second, enq: backend.MonoOf(fe.now)}
	start := fe.now.Add(10 * time.Millisecond)
	fe.now = start.Add(300 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now())
	defer cancel()
	<-ctx.Done()
	err := w.waitErr(ctx, start)
	want := "wait for nccl allreduce seq 4 on rank 0: caller's context deadline exceeded after 300ms (op timeout 30s not reached)"
	if err.Error() != want {
		t.Fatalf("got  %q\nwant %q", err, want)
	}
	if !errors.Is(err, backend.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v does not wrap ErrTimeout and the deadline", err)
	}
	fe.now = fe.now.Add(40 * time.Second)
	if got := w.waitErr(ctx, start).Error(); !strings.HasSuffix(got, "(op timeout 30s passed too, not yet reported)") {
		t.Fatalf("past the op's timeout: %q", got)
	}
}

// A captured op's Work is neither pending nor failed, and is never queried
// (its end event is nil here: a query would crash).
func TestCapturedWork(t *testing.T) {
	b, fe, _, _ := hostBackend(t, NoHandling, false)
	w := &Work{b: b, c: &comm{key: "0"}, op: backend.OpAllgatherIntoTensor, seq: 7, timeout: time.Second, enq: backend.MonoOf(fe.now), timing: true}
	b.enqueueCaptured(w)
	if !w.Captured() || b.wd.Len() != 0 {
		t.Fatalf("captured %v, pending %d", w.Captured(), b.wd.Len())
	}
	if !w.IsCompleted() || w.Exception() != nil || w.WaitHost(context.Background()) != nil || w.Wait(context.Background()) != nil {
		t.Fatal("a captured op's waits must return at once, without error")
	}
	if st, err := w.IsStarted(); !st || err != nil {
		t.Fatalf("IsStarted %v %v", st, err)
	}
	if _, err := w.Duration(); err == nil {
		t.Fatal("a captured op has no duration of its own")
	}
	if vals, err := w.Future().Value(); err != nil || vals != nil {
		t.Fatalf("future %v %v", vals, err)
	}
	w.Abort(errors.New("x")) // nothing to abort: it did not run
	if w.Exception() != nil {
		t.Fatal("Abort failed a captured op")
	}
}

// A timeout that blames one late peer publishes that peer as the cause in
// the remote-error key, so the ranks that read it name the late rank and
// not this one, which only found it.
func TestDriverTimeoutPublishesRootCause(t *testing.T) {
	b, fe, _, st := hostBackend(t, NoHandling, false)
	b.cfg.Desync = func(context.Context, backend.Op, uint64) ([]int, string) {
		return []int{1}, "rank 1 never enqueued allreduce seq 3"
	}
	b.hostWork(3, fe.now)
	b.mu.Lock()
	acts := b.wd.Tick(fe.now.Add(1500 * time.Millisecond))
	b.mu.Unlock()
	b.perform(context.Background(), acts, nil)
	v, err := st.Get(context.Background(), remoteErrorKey)
	if err != nil || !strings.HasPrefix(string(v), "1\n") || !strings.Contains(string(v), "rank 0 failed because of rank 1") {
		t.Fatalf("remote-error key: %q %v", v, err)
	}
}
