package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// "waitwire" is a backend whose wire-up waits for every rank, as cpupool's
// mesh does: it blocks until ctx ends when a rank never comes.
func init() {
	backend.Register(backend.Driver{Name: "waitwire", Devices: []tensor.DeviceType{tensor.CPU}, New: func(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
		keys := make([]string, cfg.WorldSize)
		for r := range keys {
			keys[r] = fmt.Sprintf("waitwire/%d", r)
		}
		if err := cfg.Store.Set(ctx, keys[cfg.Rank], []byte{1}); err != nil {
			return nil, err
		}
		if err := cfg.Store.Wait(ctx, keys...); err != nil {
			return nil, &backend.OpError{Op: "init", Rank: cfg.Rank, Backend: "waitwire", Kind: backend.ErrUnavailable, Err: err}
		}
		return nil, errors.New("waitwire: not meant to succeed")
	}})
}

// A rank that never calls Init is named by every other rank once the Init
// timeout has passed, although the backend's wire-up waited for it first:
// the wire-up and the barrier share one deadline. The bound is 1.5x the
// timeout, not the goal's +10 %: it still fails when each phase has a
// deadline of its own (2x), and a loaded CI machine's scheduling does not
// fail it. scripts/faults.sh measures the +10 % goal at a 10 s timeout.
func TestInitOneDeadlineNamesRankThatNeverJoined(t *testing.T) {
	st := store.NewHashStore()
	const timeout = time.Second
	var wg sync.WaitGroup
	errs := make([]error, 4)
	took := make([]time.Duration, 4)
	for r := range 3 { // rank 3 never comes
		wg.Go(func() {
			t0 := time.Now()
			_, errs[r] = Init(context.Background(), Config{Store: st, Rank: r, WorldSize: 4, Backend: "waitwire", Timeout: timeout})
			took[r] = time.Since(t0)
		})
	}
	wg.Wait()
	for r := range 3 {
		var oe *backend.OpError
		if !errors.Is(errs[r], backend.ErrTimeout) || !errors.As(errs[r], &oe) || !slices.Equal(oe.Ranks, []int{3}) {
			t.Fatalf("rank %d: want ErrTimeout naming rank 3, got %v", r, errs[r])
		}
		if !strings.Contains(errs[r].Error(), "3 of 4 ranks joined") {
			t.Fatalf("rank %d message: %v", r, errs[r])
		}
		if took[r] > timeout*3/2 {
			t.Fatalf("rank %d failed after %v, past 1.5x the timeout %v: the phases do not share one deadline", r, took[r], timeout)
		}
	}
}

// failingCheck is a store whose Check fails for the keys of one rank.
type failingCheck struct {
	store.Store
	bad string
}

func (s failingCheck) Check(ctx context.Context, keys ...string) (bool, error) {
	for _, k := range keys {
		if strings.HasSuffix(k, s.bad) {
			return false, errors.New("connection reset")
		}
	}
	return s.Store.Check(ctx, keys...)
}

// A barrier key that cannot be checked is never counted as an arrival:
// the rank is named, and the message says why.
func TestBarrierFailedCheckIsNotAnArrival(t *testing.T) {
	st := failingCheck{Store: store.NewHashStore(), bad: "/1"}
	_, err := Init(context.Background(), Config{Store: st, Rank: 0, WorldSize: 2, Backend: "reccpu", Timeout: 200 * time.Millisecond})
	var oe *backend.OpError
	if !errors.As(err, &oe) || !slices.Equal(oe.Ranks, []int{1}) {
		t.Fatalf("want rank 1 named, got %v", err)
	}
	if strings.Contains(err.Error(), "2 of 2") || !strings.Contains(err.Error(), "could not check ranks [1]: connection reset") {
		t.Fatalf("message: %v", err)
	}
}

// goneStore is a store that stops answering once it has answered a Check
// of a key ending in last (its host, rank 0 of InitFromEnv, gave up first and closed
// it): keyed on the early look's last question rather than on a time, so
// that a late timer on a loaded machine cannot make the look find the
// store gone already.
type goneStore struct {
	store.Store
	last string
	gone *atomic.Bool
}

func (s goneStore) Check(ctx context.Context, keys ...string) (bool, error) {
	if s.gone.Load() {
		return false, errors.New("connection refused")
	}
	ok, err := s.Store.Check(ctx, keys...)
	if slices.ContainsFunc(keys, func(k string) bool { return strings.HasSuffix(k, s.last) }) {
		s.gone.Store(true)
	}
	return ok, err
}

func (s goneStore) Set(ctx context.Context, key string, v []byte) error {
	if s.gone.Load() {
		return errors.New("connection refused")
	}
	return s.Store.Set(ctx, key, v)
}

// When the store is gone by the deadline, the rank that never joined is
// still named, from the look taken shortly before the deadline.
func TestInitNamesMissingRankWhenStoreIsGone(t *testing.T) {
	const timeout = 500 * time.Millisecond
	st := goneStore{Store: store.NewHashStore(), last: joinedPrefix + "1", gone: new(atomic.Bool)}
	_, err := Init(context.Background(), Config{Store: st, Rank: 0, WorldSize: 2, Backend: "waitwire", Timeout: timeout})
	var oe *backend.OpError
	if !errors.As(err, &oe) || !slices.Equal(oe.Ranks, []int{1}) || !strings.Contains(err.Error(), "1 of 2 ranks joined") ||
		!strings.Contains(err.Error(), "before the deadline") {
		t.Fatalf("want rank 1 named from the early look, got %v", err)
	}
}
