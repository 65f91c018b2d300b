package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/store"
)

// joinedPrefix is where each rank of a group announces, first thing in
// Init, that it has joined: the init barrier's error then names the ranks
// that never started, not the ranks still busy building a backend.
const joinedPrefix = "init/joined/"

// announce records this rank's arrival in the group (joinedPrefix).
func (pg *ProcessGroup) announce(ctx context.Context) error {
	if err := pg.store.Set(ctx, joinedPrefix+strconv.Itoa(pg.rank), []byte{1}); err != nil {
		return fmt.Errorf("dispatcher: group %s: announcing rank %d in the store: %w", pg.desc, pg.rank, err)
	}
	return nil
}

// lookBeforeDeadline records, a tenth of the timeout (at most a second)
// before deadline, which ranks have not joined yet (pg.joinedEarly), for
// the init barrier's error. It returns the function that cancels the look.
func (pg *ProcessGroup) lookBeforeDeadline(deadline time.Time) (stop func()) {
	lead := min(time.Second, pg.timeout/10)
	t := time.AfterFunc(time.Until(deadline.Add(-lead)), func() {
		ctx, cancel := context.WithTimeout(context.Background(), lead)
		defer cancel()
		missing, unknown, _ := pg.absent(ctx, pg.joinedKeys())
		if len(unknown) == 0 {
			pg.joinedEarly.Store(&missing)
		}
	})
	return func() { t.Stop() }
}

// joinedKeys are the group's announce keys, one per rank.
func (pg *ProcessGroup) joinedKeys() []string {
	keys := make([]string, pg.size)
	for r := range keys {
		keys[r] = joinedPrefix + strconv.Itoa(r)
	}
	return keys
}

// storeBarrier waits until every rank of the group has reached the barrier
// called name, through the store, until deadline. Each rank sets its own
// key, so that on timeout the error can name the ranks that never arrived
// (and, of those, the ranks that never even joined: announce); PyTorch's
// counter-based barrier can only say how many. A key that cannot be
// checked (the store is gone) is never counted as an arrival.
func (pg *ProcessGroup) storeBarrier(ctx context.Context, name string, deadline time.Time) error {
	prefix := "barrier/" + name + "/"
	start := time.Now()
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	keys := make([]string, pg.size)
	for r := range keys {
		keys[r] = prefix + strconv.Itoa(r)
	}
	err := pg.store.Set(wctx, keys[pg.rank], []byte{1})
	arrived := err == nil // else the deadline passed before this rank came (its backends' wire-up took it)
	if err == nil {
		if err = pg.store.Wait(wctx, keys...); err == nil {
			return nil
		}
	}
	if !errors.Is(err, store.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) && time.Now().Before(deadline) {
		// A store failure before the deadline; past it, whatever the store
		// says, the barrier has run out of time.
		return fmt.Errorf("dispatcher: store barrier %q: %w", name, err)
	}
	// Ask which keys are missing, with a fresh, short context: ctx may be
	// the one that expired. Short, so that the error comes within a tenth
	// of the timeout past it.
	bound := min(5*time.Second, max(100*time.Millisecond, pg.timeout/20))
	cctx, ccancel := context.WithTimeout(context.Background(), bound)
	defer ccancel()
	missing, unknown, cerr := pg.absent(cctx, keys)
	e := &backend.OpError{Op: "store_barrier", Rank: pg.rank, Kind: backend.ErrTimeout, Timeout: time.Since(start).Round(time.Millisecond), Err: err}
	if name == "init" {
		e.Timeout = pg.timeout // the deadline Init's waits share
	}
	e.Detail = fmt.Sprintf("Timed out initializing process group %q in store based barrier: %d of %d ranks arrived; never arrived",
		pg.desc, pg.size-len(missing)-len(unknown), pg.size)
	e.Ranks = missing
	if name == "init" && len(missing)+len(unknown) > 0 {
		// Of the ranks that did not arrive, name those that never joined:
		// the others joined and are only late (building their backends).
		// When the store cannot be asked any more, what it said shortly
		// before the deadline.
		never, unsure, _ := pg.absent(cctx, pg.joinedKeys())
		seen := ""
		if early := pg.joinedEarly.Load(); len(unsure) > 0 && early != nil {
			never, unknown = *early, nil
			seen = fmt.Sprintf(" (seen %v before the deadline; the store could not be asked at it: %v)", min(time.Second, pg.timeout/10), cerr)
		}
		if len(never) > 0 {
			e.Ranks = never
			late := ""
			if l := without(missing, never); len(l) > 0 && arrived {
				late = fmt.Sprintf(" (ranks %v joined but did not reach the barrier in time)", l)
			}
			e.Detail = fmt.Sprintf("Timed out initializing process group %q: %d of %d ranks joined%s%s; never joined",
				pg.desc, pg.size-len(never), pg.size, late, seen)
		}
	}
	if len(unknown) > 0 {
		e.Detail += fmt.Sprintf(" (not counted as arrived: could not check ranks %v: %v)", unknown, cerr)
		if len(e.Ranks) == 0 {
			e.Ranks = unknown
		}
	}
	return e
}

// absent checks keys (one per rank) and returns the ranks whose key is
// missing, and those whose check failed, with the first failure.
func (pg *ProcessGroup) absent(ctx context.Context, keys []string) (missing, unknown []int, first error) {
	for r, k := range keys {
		ok, err := pg.store.Check(ctx, k)
		switch {
		case err != nil:
			unknown = append(unknown, r)
			if first == nil {
				first = err
			}
		case !ok:
			missing = append(missing, r)
		}
	}
	return missing, unknown, first
}

// without returns the ranks of a that are not in b.
func without(a, b []int) []int {
	out := []int{}
	for _, r := range a {
		found := false
		for _, x := range b {
			found = found || x == r
		}
		if !found {
			out = append(out, r)
		}
	}
	return out
}
