package stage

import (
	"context"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// args collects an op's tensors for do: which it reads, which it writes.
type args struct {
	ts   []*tensor.Tensor
	back []bool
}

func (a *args) add(back bool, ts ...*tensor.Tensor) *args {
	for _, t := range ts {
		a.ts, a.back = append(a.ts, t), append(a.back, back)
	}
	return a
}

func (a *args) in(ts ...*tensor.Tensor) *args  { return a.add(false, ts...) }
func (a *args) out(ts ...*tensor.Tensor) *args { return a.add(true, ts...) }

func (a *args) outLists(ls [][]*tensor.Tensor) *args {
	for _, l := range ls {
		a.out(l...)
	}
	return a
}

func (a *args) inLists(ls [][]*tensor.Tensor) *args {
	for _, l := range ls {
		a.in(l...)
	}
	return a
}

type subFunc = func(*tensor.Tensor) *tensor.Tensor

func list(sub subFunc, ts []*tensor.Tensor) []*tensor.Tensor {
	if ts == nil {
		return nil
	}
	out := make([]*tensor.Tensor, len(ts))
	for i, t := range ts {
		out[i] = sub(t)
	}
	return out
}

func lists(sub subFunc, ls [][]*tensor.Tensor) [][]*tensor.Tensor {
	if ls == nil {
		return nil
	}
	out := make([][]*tensor.Tensor, len(ls))
	for i, l := range ls {
		out[i] = list(sub, l)
	}
	return out
}

// Broadcast implements backend.Backend.
func (b *Backend) Broadcast(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.BroadcastOptions) (backend.Work, error) {
	a := new(args).out(tensors...)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.Broadcast(ctx, m, list(sub, tensors), opts)
	})
}

// Allreduce implements backend.Backend.
func (b *Backend) Allreduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceOptions) (backend.Work, error) {
	a := new(args).out(tensors...)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.Allreduce(ctx, m, list(sub, tensors), opts)
	})
}

// AllreduceCoalesced implements backend.Backend.
func (b *Backend) AllreduceCoalesced(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceCoalescedOptions) (backend.Work, error) {
	a := new(args).out(tensors...)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.AllreduceCoalesced(ctx, m, list(sub, tensors), opts)
	})
}

// Reduce implements backend.Backend.
func (b *Backend) Reduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.ReduceOptions) (backend.Work, error) {
	a := new(args).out(tensors...)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.Reduce(ctx, m, list(sub, tensors), opts)
	})
}

// Allgather implements backend.Backend.
func (b *Backend) Allgather(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherOptions) (backend.Work, error) {
	a := new(args).in(inputs...).outLists(outputs)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.Allgather(ctx, m, lists(sub, outputs), list(sub, inputs), opts)
	})
}

// AllgatherIntoTensor implements backend.Backend.
func (b *Backend) AllgatherIntoTensor(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AllgatherIntoTensorOptions) (backend.Work, error) {
	a := new(args).in(input).out(output)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.AllgatherIntoTensor(ctx, m, sub(output), sub(input), opts)
	})
}

// AllgatherCoalesced implements backend.Backend.
func (b *Backend) AllgatherCoalesced(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherCoalescedOptions) (backend.Work, error) {
	a := new(args).in(inputs...).outLists(outputs)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.AllgatherCoalesced(ctx, m, lists(sub, outputs), list(sub, inputs), opts)
	})
}

// AllgatherIntoTensorCoalesced implements backend.Backend.
func (b *Backend) AllgatherIntoTensorCoalesced(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherIntoTensorCoalescedOptions) (backend.Work, error) {
	a := new(args).in(inputs...).out(outputs...)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.AllgatherIntoTensorCoalesced(ctx, m, list(sub, outputs), list(sub, inputs), opts)
	})
}

// ReduceScatter implements backend.Backend.
func (b *Backend) ReduceScatter(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs [][]*tensor.Tensor, opts backend.ReduceScatterOptions) (backend.Work, error) {
	a := new(args).inLists(inputs).out(outputs...)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.ReduceScatter(ctx, m, list(sub, outputs), lists(sub, inputs), opts)
	})
}

// ReduceScatterTensor implements backend.Backend.
func (b *Backend) ReduceScatterTensor(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.ReduceScatterTensorOptions) (backend.Work, error) {
	a := new(args).in(input).out(output)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.ReduceScatterTensor(ctx, m, sub(output), sub(input), opts)
	})
}

// ReduceScatterTensorCoalesced implements backend.Backend.
func (b *Backend) ReduceScatterTensorCoalesced(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.ReduceScatterTensorCoalescedOptions) (backend.Work, error) {
	a := new(args).in(inputs...).out(outputs...)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.ReduceScatterTensorCoalesced(ctx, m, list(sub, outputs), list(sub, inputs), opts)
	})
}

// Alltoall implements backend.Backend.
func (b *Backend) Alltoall(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AlltoallOptions) (backend.Work, error) {
	a := new(args).in(inputs...).out(outputs...)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.Alltoall(ctx, m, list(sub, outputs), list(sub, inputs), opts)
	})
}

// AlltoallBase implements backend.Backend.
func (b *Backend) AlltoallBase(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AlltoallBaseOptions) (backend.Work, error) {
	a := new(args).in(input).out(output)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.AlltoallBase(ctx, m, sub(output), sub(input), opts)
	})
}

// Gather implements backend.Backend.
func (b *Backend) Gather(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.GatherOptions) (backend.Work, error) {
	a := new(args).in(inputs...).outLists(outputs)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.Gather(ctx, m, lists(sub, outputs), list(sub, inputs), opts)
	})
}

// Scatter implements backend.Backend.
func (b *Backend) Scatter(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs [][]*tensor.Tensor, opts backend.ScatterOptions) (backend.Work, error) {
	a := new(args).inLists(inputs).out(outputs...)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.Scatter(ctx, m, list(sub, outputs), lists(sub, inputs), opts)
	})
}

// Send implements backend.Backend.
func (b *Backend) Send(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, dst int, opts backend.SendOptions) (backend.Work, error) {
	a := new(args).in(tensors...)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.Send(ctx, m, list(sub, tensors), dst, opts)
	})
}

// Recv implements backend.Backend.
func (b *Backend) Recv(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, src int, opts backend.RecvOptions) (backend.Work, error) {
	a := new(args).out(tensors...)
	return b.do(ctx, m, a.ts, a.back, func(ctx context.Context, m backend.Meta, sub subFunc) (backend.Work, error) {
		return b.inner.Recv(ctx, m, list(sub, tensors), src, opts)
	})
}

// RecvAnysource implements backend.Backend. On CUDA tensors it is
// ErrUnsupported, as on every stream backend (NCCL has none either): the
// staged receive would hold the internal stream until some peer sent.
func (b *Backend) RecvAnysource(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.RecvAnysourceOptions) (backend.Work, error) {
	for _, t := range tensors {
		if t != nil && t.Device().Type == tensor.CUDA {
			return nil, &backend.OpError{Op: m.Op.String(), Seq: m.Seq, Rank: b.inner.Rank(), Backend: b.inner.Name(), Kind: backend.ErrUnsupported,
				Detail: "recv_anysource of CUDA tensors: stream backends have none"}
		}
	}
	return b.do(ctx, m, nil, nil, func(ctx context.Context, m backend.Meta, _ subFunc) (backend.Work, error) {
		return b.inner.RecvAnysource(ctx, m, tensors, opts)
	})
}

// Barrier implements backend.Backend: the host backend's barrier, whose
// Work also waits for the staged ops issued before it to be back on the
// device.
func (b *Backend) Barrier(ctx context.Context, m backend.Meta, opts backend.BarrierOptions) (backend.Work, error) {
	b.mu.Lock()
	deps := b.liveLocked()
	b.mu.Unlock()
	w, err := b.do(ctx, m, nil, nil, func(ctx context.Context, m backend.Meta, _ subFunc) (backend.Work, error) {
		return b.inner.Barrier(ctx, m, opts)
	})
	if err != nil || len(deps) == 0 {
		return w, err
	}
	return &barrierWork{Work: w, m: m, deps: deps}, nil
}

// MonitoredBarrier implements backend.Backend: the host backend's.
func (b *Backend) MonitoredBarrier(ctx context.Context, m backend.Meta, opts backend.MonitoredBarrierOptions) (backend.Work, error) {
	return b.do(ctx, m, nil, nil, func(ctx context.Context, m backend.Meta, _ subFunc) (backend.Work, error) {
		return b.inner.MonitoredBarrier(ctx, m, opts)
	})
}
