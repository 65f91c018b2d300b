package conformance

// Keeping the ranks in step. Every rank runs the same specs in the same
// order, so spec n is spec n everywhere: every key of the suite's own
// synchronisation carries n, and a rank that misses a barrier, or fails
// half-way through a spec, cannot shift the keys of the specs after it.
//
//   - BeforeEach: barrier spec/n/begin, then a watcher waits on spec/n/failed.
//   - A rank whose spec fails sets spec/n/failed (naming itself) first thing
//     in its AfterEach. The watchers of the other ranks then cancel the
//     spec's context (Suite.Ctx, Sync and Done derive from it), so a rank
//     waiting for a collective, or at a Sync, that the failed rank will not
//     reach, gives up at once instead of after its timeout.
//   - AfterEach: barrier spec/n/end, which every rank reaches, passed or
//     failed; then each reads spec/n/failed, which every failing rank set
//     before it arrived, so all make the same choice: after a failure every
//     rank aborts its group and makes a fresh one.
//   - A rank that times out at a barrier sets spec/n/failed before reading it,
//     so the late rank, arriving later, makes the same choice.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive // Ginkgo's DSL
	"github.com/onsi/ginkgo/v2/types"
)

// peerFailed starts the cause of a spec's cancelled context: the spec
// failed on another rank first. Report merging prefers a rank's own failure
// to this consequence of it.
const peerFailed = "conformance: spec failed on rank "

// specRun is the spec running now on this rank.
type specRun struct {
	n      int
	syncN  int // Syncs so far in this spec
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   context.CancelFunc // ends the watcher
	done   chan struct{}      // closed when the watcher has ended
}

func stepKey(n int, what string) string { return fmt.Sprintf("spec/%d/%s", n, what) }

// barrierTimeout bounds the suite's barriers: long enough for a spec that
// one rank runs while the others wait (rank 0's child processes take up to
// a minute), since a failed spec does not wait for it (the watcher).
func (s *Suite) barrierTimeout() time.Duration { return s.Timeout + 90*time.Second }

// barrier returns once every rank has reached key, or with an error when
// ctx ends first. A rank that arrives after a peer gave up still passes.
func (s *Suite) barrier(ctx context.Context, key string) error {
	n, err := s.store.Add(ctx, key, 1)
	if err != nil {
		return fmt.Errorf("conformance: barrier %s: %w", key, err)
	}
	if n == int64(s.Size) {
		if err := s.store.Set(ctx, key+"/done", []byte("1")); err != nil {
			return fmt.Errorf("conformance: barrier %s: %w", key, err)
		}
		return nil
	}
	werr := s.store.Wait(ctx, key+"/done")
	if werr == nil {
		return nil
	}
	// The wait ended at the very moment the last rank came?
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n, err := s.store.Add(cctx, key, 0); err == nil && n >= int64(s.Size) {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.DeadlineExceeded) && !errors.Is(cause, context.Canceled) {
		return fmt.Errorf("conformance: barrier %s: %w", key, cause)
	}
	return fmt.Errorf("conformance: barrier %s: ranks did not all arrive: %w", key, werr)
}

// beginSpec is the suite's BeforeEach: the begin barrier, then the watcher.
func (s *Suite) beginSpec() error {
	s.specN++
	n := s.specN
	ctx, cancel := context.WithTimeout(context.Background(), s.barrierTimeout())
	err := s.barrier(ctx, stepKey(n, "begin"))
	cancel()
	sctx, scancel := context.WithCancelCause(context.Background())
	wctx, stop := context.WithCancel(context.Background())
	sp := &specRun{n: n, ctx: sctx, cancel: scancel, stop: stop, done: make(chan struct{})}
	s.spec = sp
	go func() {
		defer close(sp.done)
		if s.store.Wait(wctx, stepKey(n, "failed")) != nil {
			return // the spec ended, or the store's own timeout: stop watching
		}
		who, _ := s.store.Get(wctx, stepKey(n, "failed"))
		scancel(errors.New(peerFailed + string(who)))
	}()
	return err
}

// endSpec is the suite's AfterEach, given whether the spec failed on this
// rank. It returns the errors it met; the suite fails the spec with them
// only after the barrier, so that this rank never misses it.
func (s *Suite) endSpec(failed bool) []string {
	sp := s.spec
	s.spec = nil
	sp.stop()
	<-sp.done
	var errs []string
	bg := context.Background()
	if failed {
		// Tell the others before anything else: they stop waiting for
		// this rank's collectives.
		first, err := s.markFailed(sp.n)
		if err != nil {
			errs = append(errs, err.Error())
		} else if first != s.Rank {
			// Another rank failed first; this failure most likely follows
			// from it (its group broke under this rank's collective).
			AddReportEntry(secondaryEntry, fmt.Sprintf("rank %d failed this spec first", first))
		}
	}
	errs = append(errs, s.runOnEnd()...)
	sp.cancel(errors.New("conformance: spec over"))
	if failed {
		// Break the group now, so that peers blocked on this rank fail fast.
		actx, cancel := context.WithTimeout(bg, 10*time.Second)
		_ = s.PG.Abort(actx, fmt.Errorf("conformance: spec failed on rank %d", s.Rank))
		cancel()
	}
	ctx, cancel := context.WithTimeout(bg, s.barrierTimeout())
	defer cancel()
	if err := s.barrier(ctx, stepKey(sp.n, "end")); err != nil {
		errs = append(errs, err.Error())
		if _, err := s.markFailed(sp.n); err != nil { // the late rank will agree
			errs = append(errs, err.Error())
		}
	}
	anyFailed, err := s.store.Check(ctx, stepKey(sp.n, "failed"))
	if err != nil {
		errs = append(errs, err.Error())
		anyFailed = true
	}
	if anyFailed { // the group may be out of step: every rank starts afresh
		if !failed {
			actx, cancel := context.WithTimeout(bg, 10*time.Second)
			_ = s.PG.Abort(actx, errors.New("conformance: spec failed on another rank"))
			cancel()
		}
		pg, err := s.NewGroup(ctx, s.Timeout)
		if err != nil {
			errs = append(errs, "conformance: replacing the spec group: "+err.Error())
		} else {
			s.PG = pg
		}
	}
	return errs
}

// markFailed records that spec n failed on this rank, unless another rank
// did first, and returns the rank that did.
func (s *Suite) markFailed(n int) (first int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	me := strconv.Itoa(s.Rank)
	cur, err := s.store.CompareSet(ctx, stepKey(n, "failed"), nil, []byte(me))
	if err != nil {
		return s.Rank, fmt.Errorf("conformance: marking spec %d failed: %w", n, err)
	}
	if first, err = strconv.Atoi(string(cur)); err != nil {
		return s.Rank, nil
	}
	return first, nil
}

// runOnEnd runs the OnSpecEnd functions, last first; one that fails (a
// Ginkgo failure panics) does not stop the others or the suite's steps.
func (s *Suite) runOnEnd() (errs []string) {
	for len(s.onEnd) > 0 {
		f := s.onEnd[len(s.onEnd)-1]
		s.onEnd = s.onEnd[:len(s.onEnd)-1]
		func() {
			defer func() {
				if r := recover(); r != nil {
					errs = append(errs, fmt.Sprintf("conformance: an OnSpecEnd function failed: %v", r))
				}
			}()
			f()
		}()
	}
	return errs
}

// secondaryEntry names the report entry of a failure that came after
// another rank's failure of the same spec.
const secondaryEntry = "conformance: failed after another rank"

// secondary reports whether a rank's failure of a spec is only the
// consequence of another rank's failure of it.
func secondary(sp types.SpecReport) bool {
	if strings.Contains(sp.Failure.Message, peerFailed) {
		return true
	}
	for _, e := range sp.ReportEntries {
		if e.Name == secondaryEntry {
			return true
		}
	}
	return false
}
