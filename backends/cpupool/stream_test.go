package cpupool

import (
	"slices"
	"testing"
	"time"
)

// runStream plays ops of n bytes through c, each costing what cost says
// for its mode and op index, and returns the modes picked.
func runStream(c *streamChooser, n, ops int, cost func(i int, stream bool) time.Duration) []bool {
	modes := make([]bool, ops)
	for i := range modes {
		k, s := c.pick(n)
		modes[i] = s
		c.observe(k, s, cost(i, s))
	}
	return modes
}

// streamed counts the streamed picks among modes.
func streamed(modes []bool) int {
	n := 0
	for _, s := range modes {
		if s {
			n++
		}
	}
	return n
}

// TestStreamChooser: the chooser tries each mode for two ops, then keeps
// to the cheaper one but for two ops in streamExplore, follows a change
// of phase within a few tries, shrugs off one slow op and the cost of a
// change of way, and keeps size classes apart.
func TestStreamChooser(t *testing.T) {
	const n = 1 << 20
	fast, slow := 70*time.Microsecond, 190*time.Microsecond
	streamFaster := func(_ int, s bool) time.Duration {
		if s {
			return fast
		}
		return slow
	}
	var c streamChooser
	modes := runStream(&c, n, 6+10*streamExplore, streamFaster)
	// Each way until two of its ops are timed: the first op of a size,
	// and the first after a change of way, are not.
	if want := []bool{false, false, false, true, true, true}; !slices.Equal(modes[:6], want) {
		t.Fatalf("first six ops: streamed %v; want %v", modes[:6], want)
	}
	if got, want := len(modes)-6-streamed(modes[6:]), 20; got != want {
		t.Fatalf("cached %d of %d ops after the first six, want %d (two in %d)", got, len(modes)-6, want, streamExplore)
	}

	// A slow second op (its pages still faulting in) does not make the
	// first choice: cached copies, cheaper from then on, are kept.
	var w streamChooser
	modes = runStream(&w, n, 4*streamExplore, func(i int, s bool) time.Duration {
		if i == 1 {
			return 3 * slow
		}
		if s {
			return slow
		}
		return fast
	})
	if got := streamed(modes[6:]); got > 8 {
		t.Fatalf("with op 2 slow, %d of %d ops after the first six streamed, want only the tries", got, len(modes)-6)
	}

	// The phase changes: cached copies become the faster way. Within a
	// few tries (one op in streamExplore each) the chooser turns.
	cachedFaster := func(i int, s bool) time.Duration { return streamFaster(i, !s) }
	modes = runStream(&c, n, 12*streamExplore, cachedFaster)
	if last := modes[len(modes)-4*streamExplore:]; streamed(last) > 8 {
		t.Fatalf("after the change, %d of the last %d ops streamed, want at most 8 (the tries)", streamed(last), len(last))
	}

	// The first op after a change of way pays for the change (here three
	// times the other way's cost): that does not make the tried way look
	// dearer than it is, and the chooser still turns to it.
	var f streamChooser
	var prev bool
	modes = runStream(&f, n, 20*streamExplore, func(i int, s bool) time.Duration {
		defer func() { prev = s }()
		if i > 0 && s != prev {
			return 3 * slow
		}
		if i < 8*streamExplore {
			return cachedFaster(i, s)
		}
		return streamFaster(i, s)
	})
	if last := modes[len(modes)-4*streamExplore:]; streamed(last) < len(last)-8 {
		t.Fatalf("with a change of way costing 3x, %d of the last %d ops streamed, want all but the tries", streamed(last), len(last))
	}

	// One op a hundred times slower does not turn a clear preference,
	// nor does a slow first op each way (a cold one).
	var d streamChooser
	runStream(&d, n, 4*streamExplore, func(i int, s bool) time.Duration {
		if i < 2 {
			return 100 * slow
		}
		return streamFaster(i, s)
	})
	modes = runStream(&d, n, 2*streamExplore, func(i int, s bool) time.Duration {
		if i == 0 {
			return 100 * slow
		}
		return streamFaster(i, s)
	})
	if streamed(modes) < 2*streamExplore-4 {
		t.Fatalf("one slow op: %d of %d ops streamed, want all but the tries", streamed(modes), len(modes))
	}

	// Each size class learns on its own: here small buffers are cheaper
	// cached, large ones streamed.
	var e streamChooser
	for range 8 * streamExplore {
		for _, size := range []int{streamMin, 64 << 20} {
			k, s := e.pick(size)
			d := streamFaster(0, s)
			if size == streamMin {
				d = cachedFaster(0, s)
			}
			e.observe(k, s, d)
		}
	}
	// Ways within the margin: cached copies keep the tie.
	var g streamChooser
	modes = runStream(&g, n, 8*streamExplore, func(i int, s bool) time.Duration {
		if s {
			return fast - fast/20 // 5 % cheaper streamed
		}
		return fast
	})
	if got := streamed(modes[4:]); got != 7*2 && got != 8*2 {
		t.Fatalf("streamed copies 5 %% cheaper: %d of %d ops streamed, want only the tries", got, len(modes)-4)
	}

	small, large := &e.cls[streamClassOf(streamMin)], &e.cls[streamClassOf(64<<20)]
	if small.cost(0) >= small.cost(1) {
		t.Fatalf("small buffers: cached %v, streamed %v; cached copies were the cheaper", small.cost(0), small.cost(1))
	}
	if large.cost(1) >= large.cost(0) {
		t.Fatalf("large buffers: cached %v, streamed %v; streamed copies were the cheaper", large.cost(0), large.cost(1))
	}
	if a, b := streamClassOf(streamMin), streamClassOf(64<<20); a == b {
		t.Fatalf("32 KiB and 64 MiB share class %d", a)
	}
	if got := streamClassOf(1 << 40); got != streamClasses-1 {
		t.Fatalf("class of 1 TiB = %d, want the last, %d", got, streamClasses-1)
	}
}
