package stage

import (
	"context"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// Every op's delegation to the host backend is generated from
// spec/ops.yaml (zz_generated_ops.go): its tensors are collected with args
// (inputs, then what it writes) and do runs the host op on their host
// copies. The ops marked "stage: manual" there are written here.

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

// hostNow reports whether an op whose tensors are all on the host (ok)
// may go to the host backend at once, as do's direct path does. Why beside
// do: do's collection of the tensors, its closure and the host list's copy
// are four allocations and most of a microsecond's fifth per op (ucc's 8 B
// allreduce on a CUDA host, where every ucc and cpupool group is wrapped),
// for the host ops that stage nothing. Why no lock: b.mu and the lock that
// was held around the call were 4 % of that op's samples on nvidia-h200
// (docs/perf.md, ucc's nineteenth round); direct says why the call needs
// none.
func (b *Backend) hostNow(ok bool) bool { return ok && b.idle.Load() }

// hostTensor reports whether t is not a device tensor (nil counts as
// host: the host backend reports it).
func hostTensor(t *tensor.Tensor) bool { return t == nil || t.Device().Type != tensor.CUDA }

// hostTensors is hostTensor of every tensor of ts.
func hostTensors(ts []*tensor.Tensor) bool {
	for _, t := range ts {
		if !hostTensor(t) {
			return false
		}
	}
	return true
}

// hostLists is hostTensor of every tensor of ls.
func hostLists(ls [][]*tensor.Tensor) bool {
	for _, l := range ls {
		if !hostTensors(l) {
			return false
		}
	}
	return true
}
