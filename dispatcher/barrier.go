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

// storeBarrier waits until every rank of the group has reached the barrier
// called name, through the store. Each rank sets its own key, so that on
// timeout the error can name the ranks that never arrived; PyTorch's
// counter-based barrier can only say how many.
func (pg *ProcessGroup) storeBarrier(ctx context.Context, name string, timeout time.Duration) error {
	prefix := "barrier/" + name + "/"
	if err := pg.store.Set(ctx, prefix+strconv.Itoa(pg.rank), []byte{1}); err != nil {
		return fmt.Errorf("dispatcher: store barrier %q: %w", name, err)
	}
	keys := make([]string, pg.size)
	for r := range keys {
		keys[r] = prefix + strconv.Itoa(r)
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	err := pg.store.Wait(wctx, keys...)
	if err == nil {
		return nil
	}
	if !errors.Is(err, store.ErrTimeout) {
		return fmt.Errorf("dispatcher: store barrier %q: %w", name, err)
	}
	// Ask which keys are missing, with a fresh, short context: ctx may be
	// the one that expired.
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	var missing []int
	for r, k := range keys {
		if ok, cerr := pg.store.Check(cctx, k); cerr == nil && !ok {
			missing = append(missing, r)
		}
	}
	return &backend.OpError{Op: "store_barrier", Rank: pg.rank, Kind: backend.ErrTimeout, Timeout: time.Since(start).Round(time.Millisecond),
		Ranks: missing, Err: err,
		Detail: fmt.Sprintf("Timed out initializing process group %q in store based barrier: %d of %d ranks arrived; never arrived", pg.desc, pg.size-len(missing), pg.size)}
}
