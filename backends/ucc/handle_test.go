package ucc

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// TestHandleCompletion races a handle's completers against the goroutines
// that wait on it, ask for its Future and read its outcome (handle.complete
// says why one of completer and waiter closes the channel, and exactly
// one): under -race, with no UCC (the handles are made by hand).
func TestHandleCompletion(t *testing.T) {
	b := &Backend{cfg: backend.Config{Timeout: time.Minute}}
	one := tensor.New(tensor.Float32, 2)
	two := []*tensor.Tensor{tensor.New(tensor.Float32, 1), tensor.New(tensor.Float32, 3)}
	boom := errors.New("boom")
	cases := []struct {
		name string
		res  []*tensor.Tensor
		err  error
	}{
		{"one result", []*tensor.Tensor{one}, nil},
		{"two results", two, nil},
		{"error", nil, boom},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for range 200 {
				h := b.newHandle(backend.OpAllreduce, backend.Meta{Seq: 7, Timeout: time.Minute})
				var wg sync.WaitGroup
				wins := make(chan bool, 2)
				for range 2 { // two completers; one wins
					wg.Go(func() { wins <- h.complete(tc.res, tc.err) })
				}
				errs := make(chan error, 2)
				wg.Go(func() { <-h.doneCh(); errs <- h.Exception() })
				wg.Go(func() {
					res, err := h.Future().Wait(context.Background())
					if err == nil && len(res) != len(tc.res) {
						err = errors.New("wrong results")
					}
					errs <- err
				})
				wg.Wait()
				if w1, w2 := <-wins, <-wins; w1 == w2 {
					t.Fatalf("complete won %v and %v; want exactly one", w1, w2)
				}
				for range 2 {
					if err := <-errs; !errors.Is(err, tc.err) && err != tc.err {
						t.Fatalf("a waiter saw %v; want %v", err, tc.err)
					}
				}
				res, err := h.Future().Value()
				if !errors.Is(err, tc.err) && err != tc.err || len(res) != len(tc.res) {
					t.Fatalf("Future after completion: %v, %v; want %d results and %v", res, err, len(tc.res), tc.err)
				}
				for i := range res {
					if res[i] != tc.res[i] {
						t.Fatalf("result %d is %p; want %p", i, res[i], tc.res[i])
					}
				}
				if _, _, timed, oerr := h.Outcome(); !timed || oerr != tc.err {
					t.Fatalf("Outcome: timed %v, %v; want true, %v", timed, oerr, tc.err)
				}
			}
		})
	}
}

// TestHandleTimeout: a handle keeps the op's timeout, in its extra only
// when it is not the group's, and a wait that ctx ends reports it.
func TestHandleTimeout(t *testing.T) {
	b := &Backend{cfg: backend.Config{Timeout: time.Minute}}
	for _, d := range []time.Duration{time.Minute, 3 * time.Second, 0} {
		h := b.newHandle(backend.OpAllreduce, backend.Meta{Seq: 1, Timeout: d})
		if got := h.timeout(); got != d {
			t.Fatalf("timeout %v; want %v", got, d)
		}
		if extra := h.x.Load() != nil; extra != (d != time.Minute) {
			t.Fatalf("timeout %v: an extra %v; want one only for a timeout not the group's", d, extra)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		h.enq = b.now()
		var we *backend.WaitError
		// Not completed, nothing pending: the drive returns at once and
		// WaitHost waits on ctx, which has ended.
		if err := h.WaitHost(ctx); !errors.As(err, &we) || we.Timeout != d {
			t.Fatalf("a cancelled wait: %v; want a WaitError with timeout %v", err, d)
		}
	}
}
