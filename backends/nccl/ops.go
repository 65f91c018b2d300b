package nccl

/*
#include "nccl_dl.h"
*/
import "C"

import (
	"context"
	"fmt"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// The op methods. Each checks what only NCCL imposes (one tensor per
// process, the dtypes and reduce ops NCCL has, the sizes the dispatcher
// leaves free), builds its calls and submits them (launch.go). What the
// dispatcher validated (nil and non-contiguous tensors, one device, list
// lengths, roots and peers in range, sizes that the spec ties together) is
// not checked again.

// inPlace returns a reduction call of kind on t, in place, with r.
func (b *Backend) inPlace(kind C.int, t *tensor.Tensor, r backend.ReduceOp) (call, error) {
	var k call
	err := b.inPlaceTo(&k, kind, t, r)
	return k, err
}

// inPlaceTo is inPlace writing the call into k (the hot path's array on
// its stack), reading the tensor's address once.
func (b *Backend) inPlaceTo(k *call, kind C.int, t *tensor.Tensor, r backend.ReduceOp) error {
	dt, err := ncclType(t.DType())
	if err != nil {
		return err
	}
	op, scalar, err := redOp(r, t.DType(), b.size == 1)
	p := t.Ptr()
	*k = call{kind: kind, send: p, recv: p, count: t.Numel(), dt: dt, op: op, scalar: scalar}
	return err
}

// Allreduce implements backend.Backend (in place).
func (b *Backend) Allreduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceOptions) (backend.Work, error) {
	if len(tensors) != 1 {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("NCCL takes one tensor per process, got %d", len(tensors)))
	}
	t := tensors[0]
	var calls [1]call // on the stack: the hot path allocates only its Work
	if err := b.inPlaceTo(&calls[0], C.GN_ALLREDUCE, t, opts.ReduceOp); err != nil {
		return nil, b.wrapErr(m, err)
	}
	o := opLaunch{m: m, async: opts.Async, ins: tensors}
	return b.submitOp(ctx, devOf(t), &o, calls[:])
}

// AllreduceCoalesced implements backend.Backend: one group of allreduces.
func (b *Backend) AllreduceCoalesced(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceCoalescedOptions) (backend.Work, error) {
	calls := make([]call, len(tensors))
	for i, t := range tensors {
		var err error
		if calls[i], err = b.inPlace(C.GN_ALLREDUCE, t, opts.ReduceOp); err != nil {
			return nil, b.wrapErr(m, err)
		}
	}
	return b.submit(ctx, m, devOf(tensors[0]), opts.Async, tensors, nil, calls)
}

// Broadcast implements backend.Backend (in place).
func (b *Backend) Broadcast(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.BroadcastOptions) (backend.Work, error) {
	if len(tensors) != 1 || opts.RootTensor != 0 {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("NCCL takes one tensor per process"))
	}
	t := tensors[0]
	dt, err := ncclType(t.DType())
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	calls := [1]call{{kind: C.GN_BROADCAST, send: t.Ptr(), recv: t.Ptr(), count: t.Numel(), dt: dt, root: opts.RootRank}}
	return b.submit(ctx, m, devOf(t), opts.Async, tensors, nil, calls[:])
}

// Reduce implements backend.Backend (in place on the root).
func (b *Backend) Reduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.ReduceOptions) (backend.Work, error) {
	if len(tensors) != 1 || opts.RootTensor != 0 {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("NCCL takes one tensor per process"))
	}
	t := tensors[0]
	k, err := b.inPlace(C.GN_REDUCE, t, opts.ReduceOp)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	k.root = opts.RootRank
	calls := [1]call{k}
	return b.submit(ctx, m, devOf(t), opts.Async, tensors, nil, calls[:])
}

// broadcastsInto gathers in (this rank's input) into outs (one per rank) as
// a group of broadcasts, one rooted at each rank: no staging buffer, and
// the sizes may differ per rank, but this rank's own block must be the
// size of its input (which the dispatcher does not check for allgather).
func (b *Backend) broadcastsInto(calls []call, in *tensor.Tensor, outs []*tensor.Tensor) ([]call, error) {
	for r, o := range outs {
		dt, err := ncclType(o.DType())
		if err != nil {
			return nil, err
		}
		send := o.Ptr()
		if r == b.rank {
			if in.NBytes() != o.NBytes() {
				return nil, fmt.Errorf("%w: input of %d bytes for an output of %d", backend.ErrInvalidArgument, in.NBytes(), o.NBytes())
			}
			send = in.Ptr()
		}
		calls = append(calls, call{kind: C.GN_BROADCAST, send: send, recv: o.Ptr(), count: o.Numel(), dt: dt, root: r})
	}
	return calls, nil
}

// Allgather implements backend.Backend.
func (b *Backend) Allgather(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherOptions) (backend.Work, error) {
	outs := outputs[0]
	calls, err := b.broadcastsInto(nil, inputs[0], outs)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	return b.submit(ctx, m, devOf(inputs[0]), opts.Async, inputs, outs, calls)
}

// AllgatherCoalesced implements backend.Backend.
func (b *Backend) AllgatherCoalesced(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherCoalescedOptions) (backend.Work, error) {
	var calls []call
	for i, in := range inputs {
		var err error
		if calls, err = b.broadcastsInto(calls, in, outputs[i]); err != nil {
			return nil, b.wrapErr(m, err)
		}
	}
	return b.submit(ctx, m, devOf(inputs[0]), opts.Async, inputs, flat(outputs), calls)
}

// allgatherCall is one allgather_into_tensor call.
func allgatherCall(in, out *tensor.Tensor) (call, error) {
	dt, err := ncclType(in.DType())
	return call{kind: C.GN_ALLGATHER, send: in.Ptr(), recv: out.Ptr(), count: in.Numel(), dt: dt}, err
}

// AllgatherIntoTensor implements backend.Backend.
func (b *Backend) AllgatherIntoTensor(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AllgatherIntoTensorOptions) (backend.Work, error) {
	return b.pairs(ctx, m, opts.Async, []*tensor.Tensor{input}, []*tensor.Tensor{output}, allgatherCall)
}

// AllgatherIntoTensorCoalesced implements backend.Backend.
func (b *Backend) AllgatherIntoTensorCoalesced(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherIntoTensorCoalescedOptions) (backend.Work, error) {
	return b.pairs(ctx, m, opts.Async, inputs, outputs, allgatherCall)
}

// pairs submits one call per input and output pair, made by mk: the
// tensor forms of allgather and reduce_scatter, single and coalesced.
func (b *Backend) pairs(ctx context.Context, m backend.Meta, async bool, inputs, outputs []*tensor.Tensor, mk func(in, out *tensor.Tensor) (call, error)) (backend.Work, error) {
	calls := make([]call, len(inputs))
	for i := range inputs {
		var err error
		if calls[i], err = mk(inputs[i], outputs[i]); err != nil {
			return nil, b.wrapErr(m, err)
		}
	}
	return b.submit(ctx, m, devOf(inputs[0]), async, inputs, outputs, calls)
}

// ReduceScatter implements backend.Backend: a group of reduces, one rooted
// at each rank, so the blocks may differ in size.
func (b *Backend) ReduceScatter(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs [][]*tensor.Tensor, opts backend.ReduceScatterOptions) (backend.Work, error) {
	out := outputs[0]
	var calls []call
	for r, in := range inputs[0] {
		dt, err := ncclType(in.DType())
		if err != nil {
			return nil, b.wrapErr(m, err)
		}
		op, scalar, err := redOp(opts.ReduceOp, in.DType(), b.size == 1)
		if err != nil {
			return nil, b.wrapErr(m, err)
		}
		recv := uintptr(0) // NCCL ignores recvbuff off the root
		if r == b.rank {
			if out.NBytes() != in.NBytes() {
				return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("output of %d bytes for a block of %d", out.NBytes(), in.NBytes()))
			}
			recv = out.Ptr()
		}
		calls = append(calls, call{kind: C.GN_REDUCE, send: in.Ptr(), recv: recv, count: in.Numel(), dt: dt, op: op, scalar: scalar, root: r})
	}
	return b.submit(ctx, m, devOf(out), opts.Async, inputs[0], outputs, calls)
}

// reduceScatterCall returns the maker of one reduce_scatter call with r.
func (b *Backend) reduceScatterCall(r backend.ReduceOp) func(in, out *tensor.Tensor) (call, error) {
	return func(in, out *tensor.Tensor) (call, error) {
		dt, err := ncclType(in.DType())
		if err != nil {
			return call{}, err
		}
		op, scalar, err := redOp(r, in.DType(), b.size == 1)
		return call{kind: C.GN_REDUCESCATTER, send: in.Ptr(), recv: out.Ptr(), count: out.Numel(), dt: dt, op: op, scalar: scalar}, err
	}
}

// ReduceScatterTensor implements backend.Backend.
func (b *Backend) ReduceScatterTensor(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.ReduceScatterTensorOptions) (backend.Work, error) {
	return b.pairs(ctx, m, opts.Async, []*tensor.Tensor{input}, []*tensor.Tensor{output}, b.reduceScatterCall(opts.ReduceOp))
}

// ReduceScatterTensorCoalesced implements backend.Backend.
func (b *Backend) ReduceScatterTensorCoalesced(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.ReduceScatterTensorCoalescedOptions) (backend.Work, error) {
	return b.pairs(ctx, m, opts.Async, inputs, outputs, b.reduceScatterCall(opts.ReduceOp))
}

// Alltoall implements backend.Backend: a group of sends and receives.
func (b *Backend) Alltoall(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AlltoallOptions) (backend.Work, error) {
	var calls []call
	for r := range b.size {
		dt, err := ncclType(inputs[r].DType())
		if err != nil {
			return nil, b.wrapErr(m, err)
		}
		calls = append(calls, call{kind: C.GN_SEND, send: inputs[r].Ptr(), count: inputs[r].Numel(), dt: dt, root: r},
			call{kind: C.GN_RECV, recv: outputs[r].Ptr(), count: outputs[r].Numel(), dt: dt, root: r})
	}
	return b.submit(ctx, m, devOf(inputs[0]), opts.Async, inputs, outputs, calls)
}

// AlltoallBase implements backend.Backend: ncclAlltoAll for equal parts
// when the library has it, else a group of sends and receives.
func (b *Backend) AlltoallBase(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AlltoallBaseOptions) (backend.Work, error) {
	dt, err := ncclType(input.DType())
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	dev := devOf(input)
	ins, outs := []*tensor.Tensor{input}, []*tensor.Tensor{output}
	rowElems := func(t *tensor.Tensor) int {
		if t.Dim() == 0 || t.Shape()[0] == 0 {
			return 0
		}
		return t.Numel() / t.Shape()[0]
	}
	es := input.DType().Size()
	if len(opts.InputSplitSizes) == 0 && len(opts.OutputSplitSizes) == 0 {
		// Equal parts: the dispatcher checks split sizes only when given.
		if input.Numel()%b.size != 0 || output.Numel() != input.Numel() {
			return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("alltoall_base of %v into %v over %d ranks", input, output, b.size))
		}
		n := input.Numel() / b.size
		if hasSymbol("ncclAlltoAll") {
			calls := [1]call{{kind: C.GN_ALLTOALL, send: input.Ptr(), recv: output.Ptr(), count: n, dt: dt}}
			return b.submit(ctx, m, dev, opts.Async, ins, outs, calls[:])
		}
		var calls []call
		for r := range b.size {
			calls = append(calls, call{kind: C.GN_SEND, send: input.Ptr() + uintptr(r*n*es), count: n, dt: dt, root: r},
				call{kind: C.GN_RECV, recv: output.Ptr() + uintptr(r*n*es), count: n, dt: dt, root: r})
		}
		return b.submit(ctx, m, dev, opts.Async, ins, outs, calls)
	}
	split := func(s []int, t *tensor.Tensor) []int {
		if len(s) != 0 {
			return s
		}
		rows := 0
		if t.Dim() > 0 {
			rows = t.Shape()[0]
		}
		eq := make([]int, b.size)
		for i := range eq {
			eq[i] = rows / b.size
		}
		return eq
	}
	inS, outS := split(opts.InputSplitSizes, input), split(opts.OutputSplitSizes, output)
	inRow, outRow := rowElems(input), rowElems(output)
	var calls []call
	inOff, outOff := 0, 0
	for r := range b.size {
		calls = append(calls, call{kind: C.GN_SEND, send: input.Ptr() + uintptr(inOff*inRow*es), count: inS[r] * inRow, dt: dt, root: r},
			call{kind: C.GN_RECV, recv: output.Ptr() + uintptr(outOff*outRow*es), count: outS[r] * outRow, dt: dt, root: r})
		inOff += inS[r]
		outOff += outS[r]
	}
	return b.submit(ctx, m, dev, opts.Async, ins, outs, calls)
}

// rooted returns the tensors of gather and scatter: this rank's own
// tensor (one[0]) and, on the root, the list of a tensor per rank
// (lists[0]; nil off the root), with their device and NCCL type.
func (b *Backend) rooted(m backend.Meta, one []*tensor.Tensor, lists [][]*tensor.Tensor, root int) (*tensor.Tensor, []*tensor.Tensor, int, C.int, error) {
	own := one[0]
	var list []*tensor.Tensor
	if b.rank == root {
		list = lists[0]
	}
	dt, err := ncclType(own.DType())
	if err != nil {
		return nil, nil, 0, 0, b.wrapErr(m, err)
	}
	return own, list, devOf(own), dt, nil
}

// Gather implements backend.Backend: sends to the root, which receives one
// per rank (sizes may differ).
func (b *Backend) Gather(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.GatherOptions) (backend.Work, error) {
	in, outs, dev, dt, err := b.rooted(m, inputs, outputs, opts.RootRank)
	if err != nil {
		return nil, err
	}
	calls := []call{{kind: C.GN_SEND, send: in.Ptr(), count: in.Numel(), dt: dt, root: opts.RootRank}}
	for r, o := range outs {
		calls = append(calls, call{kind: C.GN_RECV, recv: o.Ptr(), count: o.Numel(), dt: dt, root: r})
	}
	return b.submit(ctx, m, dev, opts.Async, inputs, outs, calls)
}

// Scatter implements backend.Backend: the root sends one block per rank,
// every rank receives its own.
func (b *Backend) Scatter(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs [][]*tensor.Tensor, opts backend.ScatterOptions) (backend.Work, error) {
	out, ins, dev, dt, err := b.rooted(m, outputs, inputs, opts.RootRank)
	if err != nil {
		return nil, err
	}
	var calls []call
	for r, in := range ins {
		calls = append(calls, call{kind: C.GN_SEND, send: in.Ptr(), count: in.Numel(), dt: dt, root: r})
	}
	calls = append(calls, call{kind: C.GN_RECV, recv: out.Ptr(), count: out.Numel(), dt: dt, root: opts.RootRank})
	return b.submit(ctx, m, dev, opts.Async, ins, outputs, calls)
}

// pointToPoint runs a send or receive on the pair communicator "lo:hi",
// or, inside a coalescing block, on the device communicator
// (batch_isend_irecv).
func (b *Backend) pointToPoint(ctx context.Context, m backend.Meta, kind C.int, t *tensor.Tensor, peer int, async bool) (backend.Work, error) {
	dt, err := ncclType(t.DType())
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	dev := devOf(t)
	calls := [1]call{{kind: kind, send: t.Ptr(), recv: t.Ptr(), count: t.Numel(), dt: dt, root: peer}}
	ts := []*tensor.Tensor{t}
	if b.coalescing.Load() {
		return nil, b.queue(ctx, m, dev, async, ts, nil, calls[:])
	}
	// Checked before launch does, so that a closed or aborted group does
	// not bootstrap a pair communicator first.
	if err := b.usable(m.Op); err != nil {
		return nil, err
	}
	c, pairPeer, err := b.getP2PComm(ctx, dev, peer)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	calls[0].root = pairPeer
	w, err := b.launch(ctx, m, c, async, ts, nil, calls[:])
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Send implements backend.Backend. The tag is ignored, as NCCL has none.
func (b *Backend) Send(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, dst int, opts backend.SendOptions) (backend.Work, error) {
	return b.pointToPoint(ctx, m, C.GN_SEND, tensors[0], dst, opts.Async)
}

// Recv implements backend.Backend. The tag is ignored, as NCCL has none.
func (b *Backend) Recv(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, src int, opts backend.RecvOptions) (backend.Work, error) {
	return b.pointToPoint(ctx, m, C.GN_RECV, tensors[0], src, opts.Async)
}

// Barrier implements backend.Backend: a one-element allreduce on the
// internal stream, which orders it after this group's earlier async ops
// and, through the sync event, after the current stream's work. Its Wait
// blocks the host on the current stream, as PyTorch's barrier does.
func (b *Backend) Barrier(ctx context.Context, m backend.Meta, opts backend.BarrierOptions) (backend.Work, error) {
	if b.coalescing.Load() {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("barrier inside a coalescing block"))
	}
	dev := -1
	if len(opts.DeviceIDs) > 0 {
		dev = opts.DeviceIDs[0]
	} else if b.cfg.Device != nil {
		dev = b.cfg.Device.Index
	} else {
		for i := range b.devComms {
			if b.devComms[i].Load() != nil {
				dev = i
				break
			}
		}
	}
	if dev < 0 {
		// PyTorch guesses rank % device count when nothing says.
		n, err := cuda.DeviceCount()
		if err != nil || n == 0 {
			return nil, b.opError(m, backend.ErrUnavailable, fmt.Errorf("no CUDA device for barrier: %v", err))
		}
		dev = b.rank % n
	}
	c, err := b.getComm(ctx, dev)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	calls := [1]call{{kind: C.GN_ALLREDUCE, send: c.scratch.Ptr(), recv: c.scratch.Ptr(), count: 1, dt: 7}}
	w, err := b.launch(ctx, m, c, true, nil, nil, calls[:])
	if err != nil {
		return nil, err
	}
	w.barrier = true
	return w, nil
}

// flat joins lists of tensors into one, for the stash.
func flat(ll [][]*tensor.Tensor) []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, l := range ll {
		out = append(out, l...)
	}
	return out
}
