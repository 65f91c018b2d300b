package shm

import (
	"context"
	"testing"
	"time"
)

// TestSpinBudget: a sleep that ended within the ceiling doubles the
// budget (or twice the wait, when longer), up to the ceiling; one past
// the ceiling sets it back to the floor.
func TestSpinBudget(t *testing.T) {
	const us = time.Microsecond
	s := NewSpinBudget(50*us, 800*us)
	steps := []struct {
		slept, want time.Duration
	}{
		{0, 50 * us}, // the start: the floor
		{60 * us, 120 * us},
		{10 * us, 240 * us},
		{300 * us, 600 * us},
		{100 * us, 800 * us}, // capped
		{800 * us, 800 * us},
		{801 * us, 50 * us}, // the peer was busy elsewhere
	}
	for i, st := range steps {
		if i > 0 {
			s.Slept(st.slept)
		}
		if got := s.Budget(); got != st.want {
			t.Fatalf("step %d (slept %v): budget %v, want %v", i, st.slept, got, st.want)
		}
	}
	if got := NewSpinBudget(50*us, 10*us); got.ceil != 50*us {
		t.Fatalf("a ceiling below the floor: %v, want the floor", got.ceil)
	}
}

// TestAwaitFeedsBudget: a board wait and a lane ring wait with a budget
// spin for it and, once they have slept and been woken, tell it so (it
// grows); without a spin (ranks outnumber cores) the budget is left
// alone.
func TestAwaitFeedsBudget(t *testing.T) {
	ctx := context.Background()
	const floor = 20 * time.Microsecond
	// sleptUntilWoken starts wait, posts with post once it sleeps (on
	// sleepers), and returns wait's error.
	sleptUntilWoken := func(sleepers func() bool, wait func() error, post func()) error {
		done := make(chan error, 1)
		go func() { done <- wait() }()
		for !sleepers() {
			time.Sleep(50 * time.Microsecond)
		}
		post()
		return <-done
	}

	bs := boards(t, 2)
	budget := NewSpinBudget(floor, time.Minute)
	bs[1].Budget = budget
	err := sleptUntilWoken(func() bool { return bs[1].sleepers(0).Load() > 0 },
		func() error { _, _, err := bs[1].Await(ctx, 0, 1, time.Nanosecond, time.Second, nil); return err },
		func() { bs[0].Post(1) })
	if err != nil {
		t.Fatal(err)
	}
	if got := budget.Budget(); got <= floor {
		t.Fatalf("board: budget %v after a wait that slept, want more than %v", got, floor)
	}

	a, b := pair(t, 1<<12)
	ring := NewSpinBudget(floor, time.Minute)
	b.In.Budget = ring
	err = sleptUntilWoken(func() bool { return b.In.consWait.Load() != 0 },
		func() error { return b.In.AwaitStamped(ctx, time.Nanosecond, time.Second, nil) },
		func() {
			if err := a.Out.WriteStamped(ctx, make([]byte, 16), nil, -16&(StampAlign-1), nil); err != nil {
				t.Error(err)
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	if got := ring.Budget(); got <= floor {
		t.Fatalf("ring: budget %v after a wait that slept, want more than %v", got, floor)
	}

	idle := NewSpinBudget(floor, time.Minute)
	bs[0].Budget = idle
	err = sleptUntilWoken(func() bool { return bs[0].sleepers(1).Load() > 0 },
		func() error { _, _, err := bs[0].Await(ctx, 1, 1, -1, time.Second, nil); return err },
		func() { bs[1].Post(1) })
	if err != nil {
		t.Fatal(err)
	}
	if got := idle.Budget(); got != floor {
		t.Fatalf("no spin: budget %v, want it left at %v", got, floor)
	}
}
