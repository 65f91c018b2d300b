package dispatcher

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// debugRanks starts world ranks of the recording backend with Debug set.
func debugRanks(t *testing.T, world int, debug string) []*ProcessGroup {
	t.Helper()
	return initGroups(t, world, Config{Backend: "reccpu", Timeout: 2 * time.Second, Debug: debug,
		BackendOptions: map[string]any{"reccpu": &callLog{}}})
}

// Under "detail", ranks that pass one allreduce different dtypes of one
// size, or different reduce ops, fail on every rank with
// ErrInvalidArgument in the same words, before the backend sees the op;
// the ranks that agree go on to the next op.
func TestDebugDetailCatchesMismatch(t *testing.T) {
	pgs := debugRanks(t, 3, "DETAIL")
	ctx := context.Background()
	run := func(op func(r int, pg *ProcessGroup) error) []error {
		errs := make([]error, len(pgs))
		var wg sync.WaitGroup
		for r, pg := range pgs {
			wg.Go(func() { errs[r] = op(r, pg) })
		}
		wg.Wait()
		return errs
	}
	errs := run(func(r int, pg *ProcessGroup) error {
		dt := tensor.Float32
		if r == 2 {
			dt = tensor.Int32
		}
		_, err := pg.Allreduce(ctx, []*tensor.Tensor{tensor.New(dt, 16)}, backend.AllreduceOptions{})
		return err
	})
	var first string
	for r, err := range errs {
		var oe *backend.OpError
		if !errors.Is(err, backend.ErrInvalidArgument) || !errors.As(err, &oe) || !slices.Equal(oe.Ranks, []int{2}) {
			t.Fatalf("rank %d: want ErrInvalidArgument naming rank 2, got %v", r, err)
		}
		if !strings.Contains(oe.Detail, "ranks [0 1] allreduce float32 x 16 (SUM), rank 2 allreduce int32 x 16 (SUM)") {
			t.Fatalf("rank %d: detail %q", r, oe.Detail)
		}
		if r == 0 {
			first = oe.Detail
		} else if oe.Detail != first {
			t.Fatalf("rank %d says %q, rank 0 %q", r, oe.Detail, first)
		}
	}
	// The backend never saw the refused op; matching ops go through.
	errs = run(func(r int, pg *ProcessGroup) error {
		_, err := pg.Allreduce(ctx, []*tensor.Tensor{tensor.New(tensor.Float32, 16)}, backend.AllreduceOptions{ReduceOp: backend.MAX})
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: matching op: %v", r, err)
		}
	}
}

// A rank that never issues the op is named by the others' check at the
// op's timeout.
func TestDebugDetailNamesMissingRank(t *testing.T) {
	pgs := debugRanks(t, 2, "detail")
	_, err := pgs[0].Allreduce(context.Background(), []*tensor.Tensor{tensor.New(tensor.Float32, 4)}, backend.AllreduceOptions{Timeout: 200 * time.Millisecond})
	var oe *backend.OpError
	if !errors.Is(err, backend.ErrTimeout) || !errors.As(err, &oe) || !slices.Equal(oe.Ranks, []int{1}) {
		t.Fatalf("want ErrTimeout naming rank 1, got %v", err)
	}
}

// GOCOLL_DEBUG and its alias TORCH_DISTRIBUTED_DEBUG set the level, case
// aside; a bad value fails with the variable named; the field wins.
func TestDebugKnob(t *testing.T) {
	for _, c := range []struct {
		env   map[string]string
		field string
		want  string
		bad   string
	}{
		{map[string]string{}, "", DebugOff, ""},
		{map[string]string{"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, "", DebugDetail, ""},
		{map[string]string{"GOCOLL_DEBUG": "Info", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, "", DebugInfo, ""},
		{map[string]string{"GOCOLL_DEBUG": "detail"}, "off", DebugOff, ""},
		{map[string]string{"GOCOLL_DEBUG": "loud"}, "", "", `GOCOLL_DEBUG="loud": want off, info or detail`},
	} {
		cfg, err := resolveConfig(Config{Debug: c.field}, knob.Map(c.env))
		if c.bad != "" {
			if err == nil || !strings.Contains(err.Error(), c.bad) || !errors.Is(err, backend.ErrInvalidArgument) {
				t.Fatalf("%v: want %q, got %v", c.env, c.bad, err)
			}
			continue
		}
		if err != nil || cfg.Debug != c.want {
			t.Fatalf("%v field %q: got %q, %v; want %q", c.env, c.field, cfg.Debug, err, c.want)
		}
	}
}

// BenchmarkDebugDetail is the check's cost per collective at 2 ranks over
// a real TCPStore (the recording backend does no communication: this is
// the check alone), beside the same op with the check off.
func BenchmarkDebugDetail(b *testing.B) {
	for _, debug := range []string{"off", "detail"} {
		b.Run(debug, func(b *testing.B) {
			srv, err := store.NewTCPServer(context.Background(), store.ServerOptions{Addr: "127.0.0.1:0"})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			pgs := make([]*ProcessGroup, 2)
			var wg sync.WaitGroup
			for r := range pgs {
				wg.Go(func() {
					st, err := store.DialTCPStore(context.Background(), srv.Addr().String(), store.ClientOptions{})
					if err != nil {
						b.Error(err)
						return
					}
					pgs[r], err = Init(context.Background(), Config{Store: st, Rank: r, WorldSize: 2, Backend: "reccpu", Debug: debug,
						BackendOptions: map[string]any{"reccpu": &callLog{}}, Monitor: MonitorOptions{Disable: true}})
					if err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
			if b.Failed() {
				return
			}
			x := []*tensor.Tensor{tensor.New(tensor.Float32, 1024), tensor.New(tensor.Float32, 1024)}
			done := make(chan error, 1)
			if debug == "detail" {
				// Rank 1 issues as many ops: the check waits for both ranks.
				go func() {
					for range b.N {
						if _, err := pgs[1].Allreduce(context.Background(), x[1:], backend.AllreduceOptions{}); err != nil {
							done <- err
							return
						}
					}
					done <- nil
				}()
			} else {
				done <- nil
			}
			b.ResetTimer()
			for range b.N {
				if _, err := pgs[0].Allreduce(context.Background(), x[:1], backend.AllreduceOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			for _, pg := range pgs {
				_ = pg.Close(context.Background())
			}
		})
	}
}
