package ucc

import (
	"context"
	"errors"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// oneRank is a backend of one rank with the given fingerprint mode; it
// skips where libucc cannot be loaded.
func oneRank(t testing.TB, fingerprints string) *Backend {
	t.Helper()
	if err := Load(); err != nil {
		t.Skipf("libucc cannot be loaded here (%v); the ucc conformance run in the sid root covers the backend", err)
	}
	ctx := context.Background()
	be, err := New(ctx, backend.Config{Store: store.NewHashStore(), Rank: 0, WorldSize: 1, GroupName: "0", GroupDesc: "work-test",
		Timeout: time.Minute, Options: &Options{Fingerprints: fingerprints}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = be.Close(ctx)
	})
	return be.(*Backend)
}

func allreduce(t testing.TB, b *Backend, seq uint64, x *tensor.Tensor) *handle {
	t.Helper()
	w, err := b.Allreduce(context.Background(), backend.Meta{Op: backend.OpAllreduce, Seq: seq}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	return w.(*handle)
}

// snapshot is everything a caller can read from a completed Work.
type snapshot struct {
	seq  uint64
	exc  error
	dur  time.Duration
	outs []*tensor.Tensor
	ferr error
}

func snap(t testing.TB, w backend.Work) snapshot {
	t.Helper()
	if !w.IsCompleted() {
		t.Fatalf("op %d not completed", w.SeqNum())
	}
	d, err := w.Duration()
	if err != nil {
		t.Fatalf("op %d: Duration: %v", w.SeqNum(), err)
	}
	outs, ferr := w.Future().Value()
	return snapshot{seq: w.SeqNum(), exc: w.Exception(), dur: d, outs: outs, ferr: ferr}
}

func same(a, b snapshot) bool {
	if a.seq != b.seq || a.exc != b.exc || a.dur != b.dur || a.ferr != b.ferr || len(a.outs) != len(b.outs) {
		return false
	}
	for i := range a.outs {
		if a.outs[i] != b.outs[i] {
			return false
		}
	}
	return true
}

// steadyPool keeps a sync.Pool from losing track of an item for the rest
// of t: a garbage collection empties the pools, and an item Put on one P
// sits in that P's private slot, which a Get on another P never looks at.
// A test that asks whether a record came back needs both held still; in
// CI's loaded runs either made "never found" a flake.
func steadyPool(t *testing.T) {
	procs := runtime.GOMAXPROCS(1)
	gc := debug.SetGCPercent(-1)
	t.Cleanup(func() {
		debug.SetGCPercent(gc)
		runtime.GOMAXPROCS(procs)
	})
}

// TestRecycledRecords: an op's record goes back to the pool once the op
// has left UCC, the next ops take it over, and what the caller reads from
// an old handle (SeqNum, Exception, Duration, the Future's tensors and
// error, Wait) stays what it was: a succeeded op keeps its own tensor, a
// failed one its error. Both fingerprint settings, since they take
// different paths to UCC.
func TestRecycledRecords(t *testing.T) {
	for _, mode := range []string{FingerprintsAuto, FingerprintsOff} {
		t.Run(mode, func(t *testing.T) {
			steadyPool(t)
			b := oneRank(t, mode)
			// The record op 1 takes from the pool (without the race
			// detector, which drops pool items at random).
			rec := new(work)
			b.recs.Put(rec)
			a := tensor.New(tensor.Float32, 2)
			ha := allreduce(t, b, 1, a)
			b.mu.Lock()
			left := ha.rec
			b.mu.Unlock()
			if left != nil {
				t.Fatalf("op 1 completed, but its handle still holds its record")
			}
			want := snap(t, ha)
			if len(want.outs) != 1 || want.outs[0] != a || want.exc != nil {
				t.Fatalf("op 1: Future gave %v, Exception %v; want its own tensor and no error", want.outs, want.exc)
			}

			// A failed op whose record is recycled: as the watchdog or
			// Abort fails an op still held for its peers (not watched),
			// then the op leaves the check.
			failed := errors.New("failed before UCC saw it")
			w := b.newWork(backend.OpAllreduce, backend.Meta{Op: backend.OpAllreduce, Seq: 2}, nil)
			hf := w.h
			hf.enq = b.now()
			b.mu.Lock()
			w.fail(failed)
			if !w.testLocked(false) {
				b.mu.Unlock()
				t.Fatal("a failed op with nothing in UCC did not leave")
			}
			b.mu.Unlock()
			wantF := snap(t, hf)
			if wantF.exc != failed || wantF.ferr != failed {
				t.Fatalf("failed op: Exception %v, Future error %v; want %v", wantF.exc, wantF.ferr, failed)
			}

			// Later ops take the records over: each gets its own tensor
			// back, and the old handles do not move.
			reused := 0
			for i := range 500 {
				x := tensor.New(tensor.Float32, 2)
				if w, _ := b.recs.Get().(*work); w != nil {
					if w == rec {
						reused++
					}
					b.recs.Put(w) // back: the next op takes it
				}
				h := allreduce(t, b, uint64(3+i), x)
				if s := snap(t, h); len(s.outs) != 1 || s.outs[0] != x {
					t.Fatalf("op %d: Future gave %v, not its own tensor", 3+i, s.outs)
				}
			}
			if reused == 0 && !raceOn {
				t.Fatalf("500 ops never found op 1's record back in the pool")
			}
			if got := snap(t, ha); !same(got, want) {
				t.Fatalf("op 1 after its record was reused: %+v, was %+v", got, want)
			}
			if got := snap(t, hf); !same(got, wantF) {
				t.Fatalf("failed op after its record was reused: %+v, was %+v", got, wantF)
			}
			if err := hf.Wait(context.Background()); err != failed {
				t.Fatalf("failed op's Wait after reuse: %v", err)
			}
		})
	}
}

// TestRecycledRecordsConcurrent: goroutines issue and wait for ops on one
// backend while others read their old handles, under -race: a record
// that goes back to the pool is never touched through a handle.
func TestRecycledRecordsConcurrent(t *testing.T) {
	b := oneRank(t, FingerprintsAuto)
	const issuers, ops = 4, 300
	type done struct {
		h    *handle
		want snapshot
	}
	ch := make(chan done, issuers*ops)
	var wg sync.WaitGroup
	for g := range issuers {
		wg.Go(func() {
			x := tensor.New(tensor.Float32, 2)
			ctx := context.Background()
			for i := range ops {
				w, err := b.Allreduce(ctx, backend.Meta{Op: backend.OpAllreduce, Seq: uint64(g*ops + i + 1)}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
				if err == nil {
					err = w.Wait(ctx)
				}
				if err != nil {
					t.Error(err)
					return
				}
				d, _ := w.Duration()
				outs, ferr := w.Future().Value()
				ch <- done{w.(*handle), snapshot{seq: w.SeqNum(), exc: w.Exception(), dur: d, outs: outs, ferr: ferr}}
			}
		})
	}
	var readers sync.WaitGroup
	var mu sync.Mutex
	var kept []done
	readers.Go(func() {
		for d := range ch {
			mu.Lock()
			kept = append(kept, d)
			// Read a few old handles again while new ops run.
			for _, k := range kept[max(0, len(kept)-8):] {
				d, _ := k.h.Duration()
				outs, ferr := k.h.Future().Value()
				if got := (snapshot{seq: k.h.SeqNum(), exc: k.h.Exception(), dur: d, outs: outs, ferr: ferr}); !same(got, k.want) {
					t.Errorf("op %d changed: %+v, was %+v", k.want.seq, got, k.want)
				}
			}
			mu.Unlock()
		}
	})
	wg.Wait()
	close(ch)
	readers.Wait()
	for _, k := range kept {
		if got := snap(t, k.h); !same(got, k.want) {
			t.Fatalf("op %d changed at the end: %+v, was %+v", k.want.seq, got, k.want)
		}
	}
}

// TestAllreduceAllocs: an 8 B allreduce and its Wait allocate nothing of
// their own but a share of a chunk of handles (one allocation per
// handleChunk ops; the record comes back from the pool). Not under
// -race, which allocates on its own and empties pools at random.
func TestAllreduceAllocs(t *testing.T) {
	if raceOn {
		t.Skip("the race detector allocates and drops pool items")
	}
	for _, mode := range []string{FingerprintsAuto, FingerprintsOff} {
		t.Run(mode, func(t *testing.T) {
			steadyPool(t) // the byte count below runs outside AllocsPerRun's one P
			b := oneRank(t, mode)
			// The group's timeout, as the dispatcher passes it: an op with
			// one of its own carries it in an extra (handle.setTimeout).
			x := []*tensor.Tensor{tensor.New(tensor.Float32, 2)}
			ctx := context.Background()
			n := testing.AllocsPerRun(1000, func() {
				w, err := b.Allreduce(ctx, backend.Meta{Op: backend.OpAllreduce, Timeout: b.cfg.Timeout}, x, backend.AllreduceOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if err := w.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			})
			// AllocsPerRun's average is whole allocations: a chunk per 63
			// ops reads 0, a handle per op 1.
			if n > 0 {
				t.Fatalf("%v allocations per 8 B allreduce and Wait; want 0 (a chunk of %d handles per %d ops)", n, handleChunk, handleChunk)
			}
			// And the bytes: a chunk in the 4096-byte class is 65 bytes
			// per op; in the next class up (a header past 4096) 77.
			const ops = handleChunk * 200
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range ops {
				w, err := b.Allreduce(ctx, backend.Meta{Op: backend.OpAllreduce, Timeout: b.cfg.Timeout}, x, backend.AllreduceOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if err := w.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
			runtime.ReadMemStats(&after)
			if per := (after.TotalAlloc - before.TotalAlloc) / ops; per > 4096/handleChunk {
				t.Fatalf("%d bytes allocated per 8 B allreduce and Wait; want 4096/%d = %d (a chunk of handles)", per, handleChunk, 4096/handleChunk)
			}
		})
	}
}

// TestSmallSlab: a small in-place allreduce goes through the C slab and
// gives its slot back; with every slot taken it pins the tensor instead.
// One rank's sum is the tensor itself, so the values show that the bytes
// went in and came back (a MAX over a second tensor would not tell more
// at one rank). The 2- and 4-rank sums are the conformance run's.
func TestSmallSlab(t *testing.T) {
	b := oneRank(t, FingerprintsAuto)
	check := func(label string, x *tensor.Tensor, want []float64) {
		t.Helper()
		got, _ := x.Float64s()
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: allreduce gave %v, want %v", label, got, want)
			}
		}
	}
	vals := []float64{1.5, -2, 3, 4e6}
	x, _ := tensor.FromFloat64s(tensor.Float32, vals)
	allreduce(t, b, 1, x)
	check("through the slab", x, vals)
	b.mu.Lock()
	free := len(b.small.free)
	// Every slot taken: the next op pins.
	taken := b.small.free
	b.small.free = nil
	b.mu.Unlock()
	if free != smallSlots {
		t.Fatalf("%d of %d slots free after the op; it did not give its slot back", free, smallSlots)
	}
	allreduce(t, b, 2, x)
	check("pinned (no slot free)", x, vals)
	b.mu.Lock()
	b.small.free = taken
	b.mu.Unlock()
	// Past smallBytes: pinned.
	big := tensor.New(tensor.Float32, smallBytes/4+1)
	big.Fill(7)
	allreduce(t, b, 3, big)
	if v, _ := big.Float64s(); v[0] != 7 || v[len(v)-1] != 7 {
		t.Fatalf("allreduce of %d bytes gave %v...", smallBytes+4, v[:2])
	}
}

// TestIssuedIsTheOrigin: an op whose Meta carries the dispatcher's clock
// reading (Issued) counts its Duration, and so its timeout, from there,
// not from a second reading in submit; without Issued the backend reads
// the clock itself. An Issued a second back shows which origin was used.
func TestIssuedIsTheOrigin(t *testing.T) {
	for _, mode := range []string{FingerprintsAuto, FingerprintsOff} {
		t.Run(mode, func(t *testing.T) {
			b := oneRank(t, mode)
			x := []*tensor.Tensor{tensor.New(tensor.Float32, 2)}
			ctx := context.Background()
			for _, issued := range []time.Duration{backend.Mono() - time.Second, 0} {
				w, err := b.Allreduce(ctx, backend.Meta{Op: backend.OpAllreduce, Seq: 1, Issued: issued}, x, backend.AllreduceOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if err := w.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				d, err := w.Duration()
				if err != nil {
					t.Fatal(err)
				}
				if issued != 0 && d < time.Second {
					t.Fatalf("Duration %v with Issued a second before the op; want it counted from Issued", d)
				}
				if issued == 0 && (d <= 0 || d >= time.Second) {
					t.Fatalf("Duration %v without Issued; want the op's own short time", d)
				}
			}
		})
	}
}

// TestDriveSliceEnds: a long C slice of the drive loop (driveSlice; here
// ten minutes) on an op that stays in progress ends early, with the op
// still in progress, for what it would otherwise hold up: a goroutine
// that takes b.mu through lockOut (a submit, the watchdog, Abort, Close)
// gets the lock, and a second goroutine in Wait (b.driving above 1) ends
// it after driveSpin. Without lockOut's raise of b.posting, or without
// gu_drive's look at b.driving, the slice runs its ten minutes and the
// test fails at its minute.
func TestDriveSliceEnds(t *testing.T) {
	b := oneRank(t, "off")
	for _, c := range []struct {
		name string
		act  func() // while the slice runs
	}{
		{"lockOut", func() { b.lockOut(); b.mu.Unlock() }},
		{"second waiter", func() { b.driving.Add(2) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			b.driving.Store(1) // the slice's own driver, as drive counts itself
			defer b.driving.Store(0)
			done := make(chan int, 1)
			go func() { done <- b.driveStuck(10 * time.Minute) }()
			for b.mu.TryLock() { // until the slice holds b.mu
				b.mu.Unlock()
				runtime.Gosched()
			}
			acted := make(chan struct{})
			go func() { c.act(); close(acted) }()
			select {
			case n := <-done:
				if n != 1 {
					t.Errorf("gu_drive left %d requests in progress, want 1", n)
				}
			case <-time.After(time.Minute):
				t.Fatal("the slice did not end within a minute")
			}
			<-acted
		})
	}
}
