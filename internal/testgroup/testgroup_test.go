package testgroup

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fatalTB records what Fatal is called with and ends the goroutine, as
// testing's Fatal does, without failing the real test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

// rendezvous is a start function whose ranks return only once all world of
// them have started, as a group's Init does.
func rendezvous(world int, fail map[int]bool) func(int) (*group, error) {
	var arrived sync.WaitGroup
	arrived.Add(world)
	return func(r int) (*group, error) {
		arrived.Done()
		arrived.Wait()
		if fail[r] {
			return nil, fmt.Errorf("no store for %d", r)
		}
		return &group{rank: r}, nil
	}
}

type group struct {
	rank   int
	closed atomic.Bool
}

func (g *group) Close(context.Context) error {
	g.closed.Store(true)
	return nil
}

func TestStartTogether(t *testing.T) {
	var gs []*group
	t.Run("world 4", func(t *testing.T) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			gs = StartClosed(t, 4, rendezvous(4, nil))
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the ranks did not start together")
		}
		for r, g := range gs {
			if g == nil || g.rank != r || g.closed.Load() {
				t.Fatalf("rank %d: %+v", r, g)
			}
		}
	})
	// The subtest's cleanup has closed every group.
	for r, g := range gs {
		if !g.closed.Load() {
			t.Fatalf("rank %d not closed at the end of its test", r)
		}
	}
}

func TestStartFails(t *testing.T) {
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(f, 3, rendezvous(3, map[int]bool{0: true, 2: true}))
	}()
	<-done
	if !strings.Contains(f.msg, "rank 0: no store for 0") || !strings.Contains(f.msg, "rank 2: no store for 2") || strings.Contains(f.msg, "rank 1") {
		t.Fatalf("Fatal got %q, want ranks 0 and 2's errors", f.msg)
	}
}
