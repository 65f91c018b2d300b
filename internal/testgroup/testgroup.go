// Package testgroup starts the ranks of an in-process group for tests. The
// ranks of a group must start together (each one's Init or New waits for
// the others in the store), so each starts on a goroutine of its own; the
// test goes on once all have, or fails with every rank's error.
//
// It imports neither the dispatcher nor a backend, so that their own
// in-package tests can use it too: the caller's start function makes rank
// r's group (dispatcher.Init, cpupool.New, …) over whatever store it likes.
package testgroup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// Start runs start(r) for every rank r of world, each on its own
// goroutine, and returns the results in rank order. If any rank fails, t
// fails with their errors, each prefixed by its rank.
func Start[G any](t testing.TB, world int, start func(rank int) (G, error)) []G {
	t.Helper()
	gs := make([]G, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			var err error
			if gs[r], err = start(r); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return gs
}

// Closer is a group that StartClosed closes: a *dispatcher.ProcessGroup or
// a backend.
type Closer interface {
	Close(ctx context.Context) error
}

// StartClosed is Start for groups that are closed, in rank order, when
// the test ends (t.Cleanup; a cleanup the caller registers afterwards runs
// before it).
func StartClosed[G Closer](t testing.TB, world int, start func(rank int) (G, error)) []G {
	t.Helper()
	gs := Start(t, world, start)
	t.Cleanup(func() {
		for _, g := range gs {
			_ = g.Close(context.Background())
		}
	})
	return gs
}
