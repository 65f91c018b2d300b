package coll

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// LateRanksError is the monitored barrier's failure on rank 0: the ranks
// that did not reach the barrier within the timeout.
type LateRanksError struct {
	Ranks   []int
	Timeout time.Duration
}

func (e *LateRanksError) Error() string {
	ms := e.Timeout.Milliseconds()
	if len(e.Ranks) == 1 {
		return fmt.Sprintf("[Rank 0]: Rank %d failed to pass monitoredBarrier in %d ms", e.Ranks[0], ms)
	}
	s := make([]string, len(e.Ranks))
	for i, r := range e.Ranks {
		s[i] = fmt.Sprint(r)
	}
	return fmt.Sprintf("[Rank 0]: Ranks %s failed to pass monitoredBarrier in %d ms", strings.Join(s, ", "), ms)
}

// ArbiterError is a non-zero rank's monitored-barrier failure: rank 0
// reported that another rank failed, or could not be heard from.
type ArbiterError struct {
	Rank int
	Err  error
}

func (e *ArbiterError) Error() string {
	msg := fmt.Sprintf("Rank %d successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.", e.Rank)
	if e.Err != nil {
		msg += " " + e.Err.Error()
	}
	return msg
}

func (e *ArbiterError) Unwrap() error { return e.Err }

// barrierArbiter is MonitoredBarrier with rank 0 as the arbiter: every
// other rank reports to it and waits for its verdict; rank 0 waits at most
// timeout for the reports, then sends each rank the verdict, best effort.
func barrierArbiter(ctx context.Context, c *Comm, tag uint64, timeout time.Duration, waitAll bool) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	if r != 0 {
		var verdict [1]byte
		q := t.Irecv(0, tag, verdict[:])
		if err := t.Send(ctx, 0, tag, []byte{0}); err != nil {
			q.Cancel()
			return &ArbiterError{Rank: r, Err: err}
		}
		if err := q.Wait(ctx); err != nil {
			return &ArbiterError{Rank: r, Err: err}
		}
		if verdict[0] != 0 {
			return &ArbiterError{Rank: r}
		}
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	bufs := make([]byte, n)
	qs := make([]Request, n)
	for i := 1; i < n; i++ {
		qs[i] = t.Irecv(i, tag, bufs[i:i+1])
	}
	var late []int
	var firstErr error
	for i := 1; i < n; i++ {
		if err := qs[i].Wait(dctx); err != nil {
			late = append(late, i)
			if firstErr == nil && ctx.Err() == nil && dctx.Err() == nil {
				firstErr = err // the transport failed, not the clock
			}
		}
	}
	sort.Ints(late)
	verdict := []byte{0}
	if len(late) > 0 {
		verdict[0] = 1
	}
	for i := 1; i < n; i++ {
		_ = t.Send(ctx, i, tag, verdict) // best effort: a late rank may be gone
	}
	if len(late) == 0 {
		return nil
	}
	if !waitAll {
		late = late[:1]
	}
	le := &LateRanksError{Ranks: late, Timeout: timeout}
	if firstErr != nil {
		return fmt.Errorf("%w: %w", le, firstErr)
	}
	return le
}
