package dispatcher

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/frtrace"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// lateBackend's allreduce returns a host work that a goroutine of its own
// completes a little later, or, for every third op, a work that is not a
// host work (the poll's to notice), so that the recorder sees works
// retired on issue, by the poll and overwritten while pending.
type lateBackend struct {
	recorder
	mu sync.Mutex
	n  int
}

func (b *lateBackend) Allreduce(_ context.Context, m backend.Meta, _ []*tensor.Tensor, _ backend.AllreduceOptions) (backend.Work, error) {
	b.mu.Lock()
	b.n++
	n := b.n
	b.mu.Unlock()
	w := backend.NewHostWork(m.Seq, true, nil)
	go func() {
		time.Sleep(time.Duration(n%5) * 20 * time.Microsecond)
		w.MarkStarted()
		w.Complete(nil, nil)
	}()
	if n%3 == 0 {
		return struct{ backend.Work }{w}, nil // no Outcome: not retired on issue
	}
	return w, nil
}

// TestRecorderConcurrentIssueAndSnapshot: four goroutines issue on two
// groups at once (the recorder is the process's, one ring for both) while
// snapshots and a 1 ms poll read the ring, under the race detector in
// check.sh. Every snapshot is consistent (record ids consecutive, each
// entry's shape the one its issuer uses, its group the issuer's, a
// completed entry retired), and once the works are done the ring holds
// only completed entries, none pending, and each group's last enqueued
// and completed collectives are within its counter (two issuers share a
// group, so the last recorded need not be the last numbered).
func TestRecorderConcurrentIssueAndSnapshot(t *testing.T) {
	ctx := context.Background()
	pg, err := Init(ctx, Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "reccpu",
		FlightRecorder: FlightRecorderOptions{Entries: 37, DumpPrefix: t.TempDir() + "/r", Poll: time.Millisecond, NoDumpOnError: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(ctx)
	sub, err := pg.NewGroup(ctx, nil, GroupOptions{Desc: "sub"})
	if err != nil {
		t.Fatal(err)
	}
	groups := []*ProcessGroup{pg, sub}
	for _, g := range groups {
		swapBackend(g, tensor.CPU, &lateBackend{})
	}
	const issuers, ops = 4, 500
	shapeOf := func(i int) int { return 10 + i }
	issuerOf := map[int]int{}
	for i := range issuers {
		issuerOf[shapeOf(i)] = i
	}
	fr := pg.FlightRecorder()
	check := func(d frtrace.Dump) error {
		for k, e := range d.Entries {
			if k > 0 && e.RecordID != d.Entries[k-1].RecordID+1 {
				return fmt.Errorf("entry %d: record %d after %d", k, e.RecordID, d.Entries[k-1].RecordID)
			}
			if len(e.InputSizes) != 1 || len(e.InputSizes[0]) != 1 || len(e.OutputSizes) != 1 || e.OutputSizes[0][0] != e.InputSizes[0][0] {
				return fmt.Errorf("entry %d: sizes %v -> %v", k, e.InputSizes, e.OutputSizes)
			}
			i, ok := issuerOf[e.InputSizes[0][0]]
			if !ok || e.PGID != groups[i%2].name {
				return fmt.Errorf("entry %d: shape %v in group %s, not its issuer's", k, e.InputSizes, e.PGID)
			}
			if e.State == frtrace.StateCompleted && !e.Retired {
				return fmt.Errorf("entry %d: completed, not retired", k)
			}
		}
		return nil
	}
	stop := make(chan struct{})
	var snaps sync.WaitGroup
	snapErr := make(chan error, 1)
	snaps.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := check(fr.Snapshot("race")); err != nil {
				select {
				case snapErr <- err:
				default:
				}
				return
			}
		}
	})
	var issue sync.WaitGroup
	for i := range issuers {
		issue.Go(func() {
			g, x := groups[i%2], []*tensor.Tensor{tensor.New(tensor.Float32, shapeOf(i))}
			for range ops {
				w, err := g.Allreduce(ctx, x, backend.AllreduceOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				if i == 0 {
					_ = w.Wait(ctx) // one issuer waits, the others run ahead
				}
			}
		})
	}
	issue.Wait()
	close(stop)
	snaps.Wait()
	select {
	case err := <-snapErr:
		t.Fatal(err)
	default:
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		d := fr.Snapshot("final")
		if err := check(d); err != nil {
			t.Fatal(err)
		}
		done := len(d.Entries) == 37
		for _, e := range d.Entries {
			done = done && e.State == frtrace.StateCompleted
		}
		if done {
			for _, g := range groups {
				if st := d.PGStatus[g.name]; st.LastEnqueued <= 0 || st.LastEnqueued > int64(g.SeqNum()) || st.LastCompleted > int64(g.SeqNum()) {
					t.Errorf("group %s: status %+v, counter %d", g.name, st, g.SeqNum())
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("entries not all completed after the works were: %+v", d.Entries)
		}
		time.Sleep(5 * time.Millisecond)
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fr.pending != 0 {
		t.Errorf("%d pending", fr.pending)
	}
}
