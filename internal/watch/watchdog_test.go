package watch

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func strs[W comparable](acts []Action[W]) []string {
	out := []string{}
	for _, a := range acts {
		out = append(out, a.String())
	}
	return out
}

// setup is the backend every case starts from: w1 and w2 on communicator
// c0 (timeout 1 s, w2 enqueued 100 ms after w1), w3 on c1 (timeout 5 s).
func setup(p Policy, blocking bool) *Watchdog[string] {
	u := NewWatchdog[string](Config{Policy: p, BlockingWait: blocking, Rank: 0, Dump: true, Signal: true, DumpGrace: 2 * time.Second})
	u.Enqueue("w1", "c0", t0, time.Second)
	u.Enqueue("w2", "c0", at(100*time.Millisecond), time.Second)
	u.Enqueue("w3", "c1", t0, 5*time.Second)
	return u
}

var policies = []Policy{NoHandling, TearDown, CleanUpOnly, SkipCleanUp}

// after appends what each policy adds to a failure's own actions: the
// abort, the fatal line and the exit (with the dump grace when dumped).
func after(p Policy, f string, dumped bool) []string {
	grace := "0s"
	if dumped {
		grace = "2s"
	}
	exit := "exit(1, grace " + grace + ")"
	switch p {
	case CleanUpOnly:
		return []string{"abort(" + f + ")"}
	case TearDown:
		return []string{"abort(" + f + ")", "fatal(" + f + ")", exit}
	case SkipCleanUp:
		return []string{"fatal(" + f + ")", exit}
	}
	return nil
}

// TestPolicyByEvent is the table of policy × event: each event is fed to a
// fresh watchdog under each policy, and the actions must be exactly these.
func TestPolicyByEvent(t *testing.T) {
	cause := errors.New("ncclRemoteError: peer gone")
	type step struct {
		feed func(u *Watchdog[string]) []Action[string]
		want func(p Policy) []string
	}
	cat := func(a []string, b ...[]string) []string {
		for _, x := range b {
			a = append(a, x...)
		}
		return a
	}
	events := []struct {
		name     string
		blocking bool
		steps    []step
		pending  []string // the pending works at the end
	}{
		{
			name: "timeout",
			steps: []step{
				{ // w1 is 1.05 s old, w2 0.95 s: only w1 timed out.
					feed: func(u *Watchdog[string]) []Action[string] { return u.Tick(at(1050 * time.Millisecond)) },
					want: func(p Policy) []string {
						f := "timeout w1 1.05s"
						return cat([]string{"dump(" + f + ")", "fail(" + f + ")", "signal(" + f + ")"}, after(p, f, true))
					},
				},
				{ // w2 times out next; the dump and the signal were the first's.
					feed: func(u *Watchdog[string]) []Action[string] { return u.Tick(at(1200 * time.Millisecond)) },
					want: func(p Policy) []string {
						if p == NoHandling {
							return []string{"fail(timeout w2 1.1s)"}
						}
						return nil // aborted (every work failed) or exiting
					},
				},
			},
			pending: []string{"w1", "w2", "w3"},
		},
		{
			name: "completion before the timeout",
			steps: []step{{
				feed: func(u *Watchdog[string]) []Action[string] {
					u.Retire(func(w string) bool { return w == "w1" || w == "w2" || w == "nobody" }) // unknown works are ignored
					return u.Tick(at(1500 * time.Millisecond))
				},
				want: func(Policy) []string { return nil },
			}},
			pending: []string{"w3"},
		},
		{
			name: "async error",
			steps: []step{{
				feed: func(u *Watchdog[string]) []Action[string] { return u.AsyncError("c0", false, cause) },
				want: func(p Policy) []string {
					f := "async w1 on c0"
					return cat([]string{"dump(" + f + ")", "fail(" + f + ")", "fail(async w2 on c0)", "signal(" + f + ")"}, after(p, f, true))
				},
			}, { // the error is sticky: asked again, nothing is left to fail on c0
				feed: func(u *Watchdog[string]) []Action[string] { return u.AsyncError("c0", false, cause) },
				want: func(Policy) []string { return nil },
			}},
			pending: []string{"w1", "w2", "w3"},
		},
		{
			name: "async error blamed on a peer",
			steps: []step{{
				feed: func(u *Watchdog[string]) []Action[string] { return u.AsyncError("c0", true, cause) },
				want: func(p Policy) []string {
					f := "async-remote w1 on c0"
					return cat([]string{"dump(" + f + ")", "fail(" + f + ")", "fail(async-remote w2 on c0)"}, after(p, f, true))
				},
			}},
			pending: []string{"w1", "w2", "w3"},
		},
		{
			name: "remote error through the store",
			steps: []step{{
				feed: func(u *Watchdog[string]) []Action[string] {
					return u.RemoteSignal(SignalValue(1, at(time.Second), "nccl allreduce seq 3 on rank 1: timeout"))
				},
				want: func(p Policy) []string {
					f := "remote w1 from rank 1"
					return cat([]string{"fail(" + f + ")", "fail(remote w2 from rank 1)", "fail(remote w3 from rank 1)"}, after(p, f, false))
				},
			}, { // the same value again is not a new failure
				feed: func(u *Watchdog[string]) []Action[string] {
					u.Enqueue("w4", "c0", at(2*time.Second), time.Second)
					return u.RemoteSignal(SignalValue(1, at(time.Second), "nccl allreduce seq 3 on rank 1: timeout"))
				},
				want: func(Policy) []string { return nil },
			}},
			pending: []string{"w1", "w2", "w3", "w4"},
		},
		{
			name: "own signal read back",
			steps: []step{{
				feed: func(u *Watchdog[string]) []Action[string] { return u.RemoteSignal(SignalValue(0, t0, "mine")) },
				want: func(Policy) []string { return nil },
			}},
			pending: []string{"w1", "w2", "w3"},
		},
		{
			name: "Abort",
			steps: []step{{
				feed: func(u *Watchdog[string]) []Action[string] { return u.Abort() },
				want: func(Policy) []string { return []string{"abort(user)"} },
			}, { // the aborted works do not time out later
				feed: func(u *Watchdog[string]) []Action[string] { return u.Tick(at(10 * time.Second)) },
				want: func(Policy) []string { return nil },
			}},
			pending: []string{"w1", "w2", "w3"},
		},
		{
			name:     "blocking wait",
			blocking: true,
			steps: []step{{ // the watchdog leaves timeouts to the waiter
				feed: func(u *Watchdog[string]) []Action[string] { return u.Tick(at(1050 * time.Millisecond)) },
				want: func(Policy) []string { return nil },
			}, {
				feed: func(u *Watchdog[string]) []Action[string] { return u.BlockingWait("w1", at(900*time.Millisecond)) },
				want: func(Policy) []string { return nil },
			}, { // past the timeout: the policy does not apply, the abort goes on in the background
				feed: func(u *Watchdog[string]) []Action[string] { return u.BlockingWait("w1", at(1050*time.Millisecond)) },
				want: func(Policy) []string {
					f := "timeout w1 1.05s (blocking wait)"
					return []string{"dump(" + f + ")", "fail(" + f + ")", "signal(" + f + ")", "abort(" + f + ", background)"}
				},
			}, { // w2 was failed by that abort
				feed: func(u *Watchdog[string]) []Action[string] { return u.BlockingWait("w2", at(1200*time.Millisecond)) },
				want: func(Policy) []string { return nil },
			}},
			pending: []string{"w1", "w2", "w3"},
		},
		{
			name:     "blocking wait sees an async error",
			blocking: true,
			steps: []step{{
				feed: func(u *Watchdog[string]) []Action[string] {
					return u.Report(Failure[string]{Kind: AsyncRemote, Work: "w2", Comm: "c0", Cause: cause, Blocking: true})
				},
				want: func(Policy) []string {
					f := "async-remote w2 on c0 (blocking wait)"
					return []string{"dump(" + f + ")", "fail(" + f + ")", "abort(" + f + ", background)"}
				},
			}},
			pending: []string{"w1", "w2", "w3"},
		},
	}
	for _, ev := range events {
		for _, p := range policies {
			t.Run(ev.name+"/"+p.String(), func(t *testing.T) {
				u := setup(p, ev.blocking)
				for i, s := range ev.steps {
					got, want := strs(s.feed(u)), s.want(p)
					if want == nil {
						want = []string{}
					}
					if !slices.Equal(got, want) {
						t.Errorf("step %d:\n got  %s\n want %s", i, strings.Join(got, ", "), strings.Join(want, ", "))
					}
				}
				if got := u.AppendPending(nil); !slices.Equal(got, ev.pending) {
					t.Errorf("pending %v, want %v", got, ev.pending)
				}
			})
		}
	}
}

// The actions point at one Failure per work, carrying what the driver
// needs to build the error.
func TestFailureCarriesTheFacts(t *testing.T) {
	cause := errors.New("unhandled cuda error")
	u := setup(NoHandling, false)
	acts := u.AsyncError("c0", false, cause)
	if len(acts) != 4 || acts[0].Failure != acts[1].Failure || acts[3].Failure != acts[0].Failure {
		t.Fatalf("dump, fail and signal must share the first failure: %v", strs(acts))
	}
	if f := acts[0].Failure; f.Work != "w1" || f.Comm != "c0" || f.Cause != cause || f.Kind != Async {
		t.Fatalf("failure %+v", f)
	}
	u = setup(CleanUpOnly, false)
	acts = u.RemoteSignal(SignalValue(3, t0, "line one\nline two"))
	if f := acts[0].Failure; f.Peer != 3 || f.Message != "line one line two" {
		t.Fatalf("remote failure %+v", f)
	}
}

// A peer's signal that arrives while nothing is pending is not consumed:
// it fails the next work (the driver reads the store only when
// WantsRemote).
func TestRemoteSignalWhileIdle(t *testing.T) {
	u := NewWatchdog[string](Config{Policy: NoHandling, Rank: 0})
	v := SignalValue(1, t0, "boom")
	if u.WantsRemote() || u.RemoteSignal(v) != nil {
		t.Fatal("nothing pending: nothing to fail")
	}
	u.Enqueue("w1", "c0", t0, time.Second)
	if got := strs(u.RemoteSignal(v)); !slices.Equal(got, []string{"fail(remote w1 from rank 1)"}) {
		t.Fatalf("got %v", got)
	}
	for _, bad := range []string{"garbage", "x\n1\nmsg"} {
		u.Enqueue("w2", "c0", t0, time.Second)
		if acts := u.RemoteSignal(bad); acts != nil {
			t.Fatalf("%q: %v", bad, strs(acts))
		}
	}
}

// Without a flight recorder there is no dump, and the exit does not wait
// for peers to dump; without a store, no signal.
func TestNoDumperNoStore(t *testing.T) {
	u := NewWatchdog[string](Config{Policy: SkipCleanUp, DumpGrace: 2 * time.Second})
	u.Enqueue("w1", "c0", t0, time.Second)
	got := strs(u.Tick(at(2 * time.Second)))
	want := []string{"fail(timeout w1 2s)", "fatal(timeout w1 2s)", "exit(1, grace 0s)"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if acts := u.AsyncError("c0", false, nil); acts != nil {
		t.Fatalf("after the exit: %v", strs(acts))
	}
}

// A host backend (cpupool) reports the deadlines its ops ran out of: the
// first dumps, every one fails, nothing else under NoHandling.
func TestReportHostTimeouts(t *testing.T) {
	u := NewWatchdog[int](Config{Policy: NoHandling, Dump: true})
	got := strs(u.Report(Failure[int]{Kind: Timeout, Work: 7, Elapsed: time.Second}))
	if want := []string{"dump(timeout 7 1s)", "fail(timeout 7 1s)"}; !slices.Equal(got, want) {
		t.Fatalf("first: %v, want %v", got, want)
	}
	got = strs(u.Report(Failure[int]{Kind: Timeout, Work: 8, Elapsed: time.Second}))
	if want := []string{"fail(timeout 8 1s)"}; !slices.Equal(got, want) {
		t.Fatalf("second: %v, want %v", got, want)
	}
}

// Many works, completed out of order, leave no trace: Retire compacts,
// and the order of the rest is kept.
func TestRetireCompacts(t *testing.T) {
	u := NewWatchdog[int](Config{})
	for i := range 1000 {
		u.Enqueue(i, "c", t0, time.Hour)
	}
	u.Retire(func(i int) bool { return i%2 == 0 })
	u.Tick(t0)
	got := u.AppendPending(nil)
	if len(got) != 500 || u.Len() != 500 || got[0] != 1 || got[499] != 999 || len(u.pending) != 500 {
		t.Fatalf("len %d (%d in the slice), first %d, last %d", len(got), len(u.pending), got[0], got[len(got)-1])
	}
	u.Retire(func(int) bool { return true })
	if u.Len() != 0 || len(u.AppendPending(nil)) != 0 {
		t.Fatal("not empty")
	}
	u.Enqueue(5, "c", t0, time.Second)
	if got := strs(u.Tick(at(2 * time.Second))); !slices.Equal(got, []string{"fail(timeout 5 2s)"}) {
		t.Fatalf("after reuse: %v", got)
	}
}

// TestRetireFront: RetireFront drops the finished works at the front, in
// order, stops at the first unfinished one (a finished work behind it
// stays), resumes after the holes it left, and Len and AppendPending agree
// with what is left, across compactions.
func TestRetireFront(t *testing.T) {
	u := NewWatchdog[int](Config{})
	fin := map[int]bool{}
	finished := func(w int) bool { return fin[w] }
	for w := range 200 {
		u.Enqueue(w, "c0", t0, time.Second)
	}
	for w := range 50 {
		fin[w] = true
	}
	fin[60] = true // behind an unfinished one: stays
	got := u.RetireFront(finished, nil)
	if len(got) != 50 || got[0] != 0 || got[49] != 49 {
		t.Fatalf("dropped %v, want 0..49", got)
	}
	if n := u.Len(); n != 150 {
		t.Fatalf("Len %d after dropping 50 of 200, want 150", n)
	}
	if got := u.RetireFront(finished, nil); len(got) != 0 {
		t.Fatalf("a second call dropped %v with work 50 unfinished", got)
	}
	for w := 50; w < 180; w++ {
		fin[w] = true
	}
	got = u.RetireFront(finished, got[:0])
	if len(got) != 130 || got[0] != 50 || got[129] != 179 {
		t.Fatalf("dropped %d works (%v...), want 50..179", len(got), got[:min(3, len(got))])
	}
	left := u.AppendPending(nil)
	if len(left) != 20 || left[0] != 180 || u.Len() != 20 {
		t.Fatalf("left %v (Len %d), want 180..199", left, u.Len())
	}
	u.Enqueue(200, "c0", t0, time.Second)
	for w := 180; w <= 200; w++ {
		fin[w] = true
	}
	if got := u.RetireFront(finished, nil); len(got) != 21 || got[20] != 200 {
		t.Fatalf("dropped %v after a compaction, want 180..200", got)
	}
	if u.Len() != 0 {
		t.Fatalf("Len %d, want 0", u.Len())
	}
}
