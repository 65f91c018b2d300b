package shm

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// lockedAffinity runs f on a goroutine locked to its thread, whose
// affinity is set to mask first (nil: left as is); the thread is
// discarded after (its affinity would leak to others).
func lockedAffinity(t *testing.T, mask *unix.CPUSet, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if mask != nil {
			if err := unix.SchedSetaffinity(0, mask); err != nil {
				t.Errorf("sched_setaffinity: %v", err)
				return
			}
		}
		f()
	}()
	<-done
}

// twoCPUs returns two CPUs this test may run on, or skips.
func twoCPUs(t *testing.T) (int, int) {
	var m unix.CPUSet
	if err := unix.SchedGetaffinity(0, &m); err != nil {
		t.Skipf("sched_getaffinity: %v", err)
	}
	var cpus []int
	for c := 0; c < len(m)*64 && len(cpus) < 2; c++ {
		if m.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < 2 {
		t.Skip("needs two CPUs")
	}
	return cpus[0], cpus[1]
}

// affinity is the calling thread's affinity (empty, with the test
// failed, when it cannot be read). It may run off the test's goroutine.
func affinity(t *testing.T) unix.CPUSet {
	t.Helper()
	var m unix.CPUSet
	if err := unix.SchedGetaffinity(0, &m); err != nil {
		t.Error(err)
	}
	return m
}

// TestKeepHomeSpreadsRanks: with KeepHome, a rank's posting thread ends
// up bound to its home CPU, the ranks two and two over two CPUs; Close
// gives it the affinity it had back.
func TestKeepHomeSpreadsRanks(t *testing.T) {
	c0, c1 := twoCPUs(t)
	var both unix.CPUSet
	both.Set(c0)
	both.Set(c1)
	bs := boards(t, 4)
	for r, b := range bs {
		home := []int{c0, c1}[r%2]
		lockedAffinity(t, &both, func() {
			b.KeepHome()
			for k := uint64(1); k <= 2*spreadEvery; k++ {
				b.Post(k)
			}
			if got := affinity(t); got.Count() != 1 || !got.IsSet(home) {
				t.Errorf("rank %d: bound to %d CPUs (home %d set: %v), want its home alone", r, got.Count(), home, got.IsSet(home))
			}
			b.Close()
			if got := affinity(t); got != both {
				t.Errorf("rank %d: after Close, affinity of %d CPUs, want the two it had", r, got.Count())
			}
		})
	}
}

// TestKeepHomeLeavesBoundThreads: a thread bound already (by the user)
// stays where it was put, and Close does not touch it.
func TestKeepHomeLeavesBoundThreads(t *testing.T) {
	c0, c1 := twoCPUs(t)
	var both, user unix.CPUSet
	both.Set(c0)
	both.Set(c1)
	user.Set(c1) // rank 0's home is c0
	b := boards(t, 2)[0]
	lockedAffinity(t, &both, func() {
		b.KeepHome()
		if err := unix.SchedSetaffinity(0, &user); err != nil {
			t.Error(err)
			return
		}
		for k := uint64(1); k <= 2*spreadEvery; k++ {
			b.Post(k)
		}
		b.Close()
		if got := affinity(t); got != user {
			t.Errorf("a thread the user bound to CPU %d was moved (%d CPUs, CPU %d set: %v)", c1, got.Count(), c1, got.IsSet(c1))
		}
	})
}

// TestSpreaderHomes: rank r's home is the (r mod n)-th CPU of the mask;
// with one CPU there is none.
func TestSpreaderHomes(t *testing.T) {
	c0, c1 := twoCPUs(t)
	var both, one unix.CPUSet
	both.Set(c0)
	both.Set(c1)
	one.Set(c1)
	lockedAffinity(t, &both, func() {
		for r, want := range []int{c0, c1, c0, c1, c0} {
			if got := newSpreader(r).home; got != want {
				t.Errorf("rank %d: home %d, want %d", r, got, want)
			}
		}
	})
	lockedAffinity(t, &one, func() {
		if got := newSpreader(1).home; got != -1 {
			t.Errorf("one CPU allowed: home %d, want none", got)
		}
	})
}
