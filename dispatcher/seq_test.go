package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	_ "github.com/gocoll/gocoll/backends/cpupool" // a real backend: the numbers must survive the whole path
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/internal/testgroup"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// seqCase issues one op on rank r of a world of 2 with valid arguments.
type seqCase struct {
	op    backend.Op
	issue func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error)
}

func f32(n int) *tensor.Tensor { return tensor.New(tensor.Float32, n) }

func f32s(k, n int) []*tensor.Tensor {
	ts := make([]*tensor.Tensor, k)
	for i := range ts {
		ts[i] = f32(n)
	}
	return ts
}

// seqCases lists every op of spec/ops.yaml; TestEveryOpIsNumbered fails
// when an op is added without a case here.
var seqCases = []seqCase{
	{backend.OpBroadcast, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.Broadcast(ctx, f32s(1, 2), backend.BroadcastOptions{RootRank: 1})
	}},
	{backend.OpAllreduce, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.Allreduce(ctx, f32s(1, 2), backend.AllreduceOptions{})
	}},
	{backend.OpAllreduceCoalesced, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.AllreduceCoalesced(ctx, f32s(2, 2), backend.AllreduceCoalescedOptions{})
	}},
	{backend.OpReduce, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.Reduce(ctx, f32s(1, 2), backend.ReduceOptions{RootRank: 1})
	}},
	{backend.OpAllgather, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.Allgather(ctx, [][]*tensor.Tensor{f32s(2, 2)}, f32s(1, 2), backend.AllgatherOptions{})
	}},
	{backend.OpAllgatherIntoTensor, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.AllgatherIntoTensor(ctx, f32(4), f32(2), backend.AllgatherIntoTensorOptions{})
	}},
	{backend.OpAllgatherCoalesced, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.AllgatherCoalesced(ctx, [][]*tensor.Tensor{f32s(2, 1), f32s(2, 3)}, []*tensor.Tensor{f32(1), f32(3)}, backend.AllgatherCoalescedOptions{})
	}},
	{backend.OpAllgatherIntoTensorCoalesced, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.AllgatherIntoTensorCoalesced(ctx, []*tensor.Tensor{f32(2), f32(6)}, []*tensor.Tensor{f32(1), f32(3)}, backend.AllgatherIntoTensorCoalescedOptions{})
	}},
	{backend.OpReduceScatter, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.ReduceScatter(ctx, f32s(1, 2), [][]*tensor.Tensor{f32s(2, 2)}, backend.ReduceScatterOptions{})
	}},
	{backend.OpReduceScatterTensor, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.ReduceScatterTensor(ctx, f32(2), f32(4), backend.ReduceScatterTensorOptions{})
	}},
	{backend.OpReduceScatterTensorCoalesced, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.ReduceScatterTensorCoalesced(ctx, []*tensor.Tensor{f32(1), f32(3)}, []*tensor.Tensor{f32(2), f32(6)}, backend.ReduceScatterTensorCoalescedOptions{})
	}},
	{backend.OpAlltoall, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.Alltoall(ctx, f32s(2, 2), f32s(2, 2), backend.AlltoallOptions{})
	}},
	{backend.OpAlltoallBase, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.AlltoallBase(ctx, f32(4), f32(4), backend.AlltoallBaseOptions{})
	}},
	{backend.OpGather, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		var outs [][]*tensor.Tensor
		if r == 0 {
			outs = [][]*tensor.Tensor{f32s(2, 2)}
		}
		return pg.Gather(ctx, outs, f32s(1, 2), backend.GatherOptions{})
	}},
	{backend.OpScatter, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		var ins [][]*tensor.Tensor
		if r == 0 {
			ins = [][]*tensor.Tensor{f32s(2, 2)}
		}
		return pg.Scatter(ctx, f32s(1, 2), ins, backend.ScatterOptions{})
	}},
	{backend.OpSend, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		if r == 0 {
			return pg.Send(ctx, f32s(1, 2), 1, backend.SendOptions{})
		}
		return pg.Recv(ctx, f32s(1, 2), 0, backend.RecvOptions{})
	}},
	{backend.OpRecv, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		if r == 0 {
			return pg.Recv(ctx, f32s(1, 2), 1, backend.RecvOptions{})
		}
		return pg.Send(ctx, f32s(1, 2), 0, backend.SendOptions{})
	}},
	{backend.OpRecvAnysource, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		if r == 0 {
			return pg.RecvAnysource(ctx, f32s(1, 2), backend.RecvAnysourceOptions{})
		}
		return pg.Send(ctx, f32s(1, 2), 0, backend.SendOptions{})
	}},
	{backend.OpBarrier, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.Barrier(ctx, backend.BarrierOptions{})
	}},
	{backend.OpMonitoredBarrier, func(ctx context.Context, pg *dispatcher.ProcessGroup, r int) (backend.Work, error) {
		return pg.MonitoredBarrier(ctx, backend.MonitoredBarrierOptions{})
	}},
}

// TestEveryOpIsNumbered issues every op, twice over, on two cpupool ranks
// and checks that each takes the next number of its own counter
// (collective or p2p), that the Work, the hooks and the group's counters
// agree on it, and that the op completed. A generated method that reused
// or skipped a number fails here, naming the op.
func TestEveryOpIsNumbered(t *testing.T) {
	covered := map[backend.Op]bool{}
	for _, c := range seqCases {
		covered[c.op] = true
	}
	for _, op := range backend.Ops() {
		if !covered[op] {
			t.Fatalf("op %v has no case in seqCases", op)
		}
	}

	const world = 2
	st := store.NewHashStore()
	pgs := testgroup.StartClosed(t, world, func(r int) (*dispatcher.ProcessGroup, error) {
		return dispatcher.Init(context.Background(), dispatcher.Config{Backend: "cpupool", Store: st, Rank: r, WorldSize: world, Timeout: 20 * time.Second})
	})

	errs := make([]error, world)
	var wg sync.WaitGroup
	for r, pg := range pgs {
		wg.Go(func() {
			errs[r] = issueAll(pg, r)
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("ops did not complete in 30 s")
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func issueAll(pg *dispatcher.ProcessGroup, r int) error {
	ctx := context.Background()
	var hooked []uint64
	pg.AddHooks(dispatcher.Hooks{Pre: func(_ context.Context, i dispatcher.OpInfo) { hooked = append(hooked, i.Seq) }})
	var coll, p2p uint64
	for round := range 2 {
		for _, c := range seqCases {
			w, err := c.issue(ctx, pg, r)
			if err != nil {
				return fmt.Errorf("rank %d: %v: %w", r, c.op, err)
			}
			if err := w.Wait(ctx); err != nil {
				return fmt.Errorf("rank %d: %v: %w", r, c.op, err)
			}
			want := &coll
			if c.op.Info().Kind == backend.P2P {
				want = &p2p
			}
			*want++
			if got := w.SeqNum(); got != *want {
				return fmt.Errorf("rank %d round %d: %v: Work.SeqNum %d, want %d", r, round, c.op, got, *want)
			}
			if got := hooked[len(hooked)-1]; got != *want {
				return fmt.Errorf("rank %d round %d: %v: hook saw seq %d, want %d", r, round, c.op, got, *want)
			}
			if pg.SeqNum() != coll || pg.P2PSeqNum() != p2p {
				return fmt.Errorf("rank %d round %d: after %v: counters coll %d p2p %d, want %d %d", r, round, c.op, pg.SeqNum(), pg.P2PSeqNum(), coll, p2p)
			}
		}
	}
	return nil
}
