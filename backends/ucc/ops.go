package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import (
	"context"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/reduceop"
	"github.com/gocoll/gocoll/tensor"
)

// The dispatcher has checked the arguments against spec/ops.yaml; the
// checks here are what it cannot know (host memory) and what UCC needs.
// The common ones are backend.HostChecker's (b.args), which cpupool shares.
// Ops that only move data move bytes (UCC_DT_UINT8), so every dtype moves.

func cu(n int) C.uint64_t { return C.uint64_t(n) }

// Broadcast implements backend.Backend.
func (b *Backend) Broadcast(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.BroadcastOptions) (backend.Work, error) {
	bufs, err := b.args.Rooted(backend.OpBroadcast, m, tensors, opts.RootTensor)
	if err != nil {
		return nil, err
	}
	p := b.plan(backend.OpBroadcast, m, tensors)
	p.print(tensors[opts.RootTensor].DType(), nil, tensors[opts.RootTensor].Numel(), opts.RootRank)
	src := bufs[opts.RootTensor]
	if len(src) > 0 {
		p.add(C.gu_desc{coll_type: collBcast, root: cu(opts.RootRank), dt: C.uint64_t(dtBytes), src: p.buf(src), src_count: cu(len(src))})
	}
	p.after = func() {
		for _, d := range bufs {
			copy(d, src)
		}
	}
	return b.submit(ctx, p)
}

// allreduceDesc is an in-place allreduce of buf.
func (p *plan) allreduce(r reduction, buf []byte) {
	if len(buf) == 0 {
		return
	}
	a := p.buf(buf)
	p.add(C.gu_desc{coll_type: collAllreduce, op: C.int(r.op), dt: C.uint64_t(r.dt), flags: flagInPlace,
		src: a, dst: a, src_count: r.count(buf), dst_count: r.count(buf)})
}

// Allreduce implements backend.Backend. Several tensors are reduced
// together, as Gloo does: each gets the reduction of all of them on all
// ranks.
func (b *Backend) Allreduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceOptions) (backend.Work, error) {
	if len(tensors) == 1 {
		if w, err, ok := b.allreduceOne(ctx, m, tensors[0], opts); ok {
			return w, err
		}
	}
	bufs, r, err := b.args.ReduceList(backend.OpAllreduce, m, tensors, opts.ReduceOp)
	if err != nil {
		return nil, err
	}
	p := b.plan(backend.OpAllreduce, m, tensors)
	p.print(tensors[0].DType(), &opts.ReduceOp, tensors[0].Numel(), -1)
	buf := r.combineLocal(r.ins(bufs), 0)
	p.allreduce(r, buf)
	p.after = func() {
		r.post(buf, b.cfg.WorldSize*len(bufs))
		for _, o := range bufs {
			r.back(o, buf)
		}
	}
	return b.submit(ctx, p)
}

// allreduceOne is Allreduce of one host tensor whose reduction UCC does
// whole (no float32 widening, no AVG division, no PREMUL_SUM scaling), the
// common case, with nothing to do after UCC: the work is the op's only
// allocation. ok is false when t is not such a case.
func (b *Backend) allreduceOne(ctx context.Context, m backend.Meta, t *tensor.Tensor, opts backend.AllreduceOptions) (w backend.Work, err error, ok bool) {
	if t == nil || t.Device().Type != tensor.CPU || !t.IsContiguous() {
		return nil, nil, false // host's errors
	}
	// The table leaves out AVG and PREMUL_SUM (a kernel after or before
	// UCC), widened dtypes and invalid pairs (reductionOf's error).
	r, whole := b.wholeRed(t.DType(), opts.ReduceOp.Type)
	if !whole {
		return nil, nil, false
	}
	p := b.plan(backend.OpAllreduce, m, nil)
	p.print(t.DType(), &opts.ReduceOp, t.Numel(), -1)
	p.w.outv[0] = t
	p.outputs = p.w.outv[:]
	if buf := t.Bytes(); len(buf) > 0 && len(buf) <= smallBytes {
		// Through the backend's C slab (small.go) when submit finds a
		// slot: the address is set there.
		p.small = buf
		p.add(C.gu_desc{coll_type: collAllreduce, op: C.int(r.op), dt: C.uint64_t(r.dt), flags: flagInPlace,
			src_count: r.count(buf), dst_count: r.count(buf)})
	} else {
		p.allreduce(r, buf)
	}
	w, err = b.submit(ctx, p)
	return w, err, true
}

// wholeReds is the table of wholeRed: for each dtype and reduce op type,
// UCC's datatype and op when UCC reduces it whole (uccReduction with no
// widening), worked out once at New. Why: uccReduction's switches and its
// 64-byte result were ~2 % of a 2-rank 8 B allreduce's samples.
type wholeReds []wholeRedEntry

type wholeRedEntry struct {
	dt      uint64
	op      int32
	elemLen int32
	ok      bool
}

func newWholeReds() wholeReds {
	dts := tensor.DTypes()
	t := make(wholeReds, len(dts)*numReduceTypes)
	for _, dt := range dts {
		for o := range numReduceTypes {
			op := backend.ReduceOp{Type: reduceop.Type(o)}
			if op.Type == backend.Avg || op.Type == backend.PreMulSum || op.ValidFor(dt) != nil {
				continue // a kernel before or after UCC, or no such reduction
			}
			if r, err := uccReduction(dt, op); err == nil && r.ratio == 1 {
				t[int(dt)*numReduceTypes+o] = wholeRedEntry{dt: r.dt, op: int32(r.op), elemLen: int32(r.elemLen), ok: true}
			}
		}
	}
	return t
}

// numReduceTypes bounds the reduce op types wholeReds covers (Sum to
// PreMulSum); a type beyond it takes the general path.
const numReduceTypes = int(backend.PreMulSum) + 1

// wholeRed is uccReduction(dt, op) for allreduceOne, from the table: ok is
// false where UCC does not reduce dt whole (widened, unsupported, or AVG
// and PREMUL_SUM, which need a kernel), and the caller takes the general
// path. The reduce op's validity for dt is
// the caller's to check.
func (b *Backend) wholeRed(dt tensor.DType, op reduceop.Type) (reduction, bool) {
	i := int(dt)*numReduceTypes + int(op)
	if int(op) >= numReduceTypes || i >= len(b.reds) || !b.reds[i].ok {
		return reduction{}, false
	}
	e := &b.reds[i]
	return reduction{dt: e.dt, op: uint64(e.op), elemLen: int(e.elemLen), ratio: 1}, true
}

// AllreduceCoalesced implements backend.Backend: one UCC allreduce per
// tensor, one Work.
func (b *Backend) AllreduceCoalesced(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceCoalescedOptions) (backend.Work, error) {
	bufs, r, err := b.args.ReduceList(backend.OpAllreduceCoalesced, m, tensors, opts.ReduceOp)
	if err != nil {
		return nil, err
	}
	p := b.plan(backend.OpAllreduceCoalesced, m, tensors)
	p.print(tensors[0].DType(), &opts.ReduceOp, fpCount(tensors), -1)
	ws := r.ins(bufs)
	for _, buf := range ws {
		if r.k.Pre != nil {
			r.k.Pre(buf)
		}
		p.allreduce(r, buf)
	}
	p.after = func() {
		for i, buf := range ws {
			r.post(buf, b.cfg.WorldSize)
			r.back(bufs[i], buf)
		}
	}
	return b.submit(ctx, p)
}

// Reduce implements backend.Backend.
func (b *Backend) Reduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.ReduceOptions) (backend.Work, error) {
	bufs, r, err := b.args.ReduceRooted(backend.OpReduce, m, tensors, opts.RootTensor, opts.ReduceOp)
	if err != nil {
		return nil, err
	}
	p := b.plan(backend.OpReduce, m, tensors)
	p.print(tensors[0].DType(), &opts.ReduceOp, tensors[opts.RootTensor].Numel(), opts.RootRank)
	buf := r.combineLocal(r.ins(bufs), opts.RootTensor)
	root := b.cfg.Rank == opts.RootRank
	if len(buf) > 0 {
		a := p.buf(buf)
		d := C.gu_desc{coll_type: collReduce, op: C.int(r.op), dt: C.uint64_t(r.dt), root: cu(opts.RootRank),
			src: a, dst: a, src_count: r.count(buf), dst_count: r.count(buf)}
		if root {
			d.flags = flagInPlace
		} else {
			// The non-root's result is unspecified; UCC gets scratch.
			s := make([]byte, len(buf))
			d.dst = p.buf(s)
		}
		p.add(d)
	}
	p.after = func() {
		if root {
			r.post(buf, b.cfg.WorldSize*len(bufs))
			r.back(bufs[opts.RootTensor], buf)
		}
	}
	return b.submit(ctx, p)
}

// allgather gathers in into the blocks of outs (one per rank): straight
// into out when one contiguous buffer holds them all, else through
// scratch; uneven blocks take UCC's allgatherv.
func (p *plan) allgather(in []byte, outs [][]byte) (after func()) {
	packed, sizes := pack(outs)
	if len(packed) == 0 {
		return nil
	}
	if allEqual(sizes) {
		p.add(C.gu_desc{coll_type: collAllgather, dt: C.uint64_t(dtBytes), src: p.buf(in), src_count: cu(len(in)),
			dst: p.buf(packed), dst_count: cu(len(packed))})
	} else {
		counts, displs := p.vec(sizes)
		p.add(C.gu_desc{coll_type: collAllgatherv, dt: C.uint64_t(dtBytes), flags: flag64, src: p.buf(in), src_count: cu(len(in)),
			v_dst: 1, dst: p.buf(packed), dst_counts: counts, dst_displs: displs})
	}
	return func() { unpack(packed, outs) }
}

// Allgather implements backend.Backend.
func (b *Backend) Allgather(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherOptions) (backend.Work, error) {
	ins, err := b.args.Host(backend.OpAllgather, m, inputs...)
	if err != nil {
		return nil, err
	}
	if len(ins) != 1 || len(outputs) != 1 {
		return nil, b.args.Invalid(backend.OpAllgather, m, "requires a single-element input and output list")
	}
	outs, err := b.args.Host(backend.OpAllgather, m, outputs[0]...)
	if err != nil {
		return nil, err
	}
	p := b.plan(backend.OpAllgather, m, outputs[0])
	p.print(inputs[0].DType(), nil, fpCount(outputs[0]), -1)
	p.after = p.allgather(ins[0], outs)
	return b.submit(ctx, p)
}

// AllgatherIntoTensor implements backend.Backend.
func (b *Backend) AllgatherIntoTensor(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AllgatherIntoTensorOptions) (backend.Work, error) {
	bufs, err := b.args.Host(backend.OpAllgatherIntoTensor, m, output, input)
	if err != nil {
		return nil, err
	}
	p := b.plan(backend.OpAllgatherIntoTensor, m, []*tensor.Tensor{output})
	p.print(input.DType(), nil, output.Numel(), -1)
	p.intoTensor(bufs[1], bufs[0])
	return b.submit(ctx, p)
}

func (p *plan) intoTensor(in, out []byte) {
	if len(out) > 0 {
		p.add(C.gu_desc{coll_type: collAllgather, dt: C.uint64_t(dtBytes), src: p.buf(in), src_count: cu(len(in)),
			dst: p.buf(out), dst_count: cu(len(out))})
	}
}

// AllgatherCoalesced implements backend.Backend: one UCC allgather per
// input, one Work.
func (b *Backend) AllgatherCoalesced(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherCoalescedOptions) (backend.Work, error) {
	ins, err := b.args.Host(backend.OpAllgatherCoalesced, m, inputs...)
	if err != nil {
		return nil, err
	}
	if len(outputs) != len(ins) {
		return nil, b.args.Invalid(backend.OpAllgatherCoalesced, m, "one output list per input")
	}
	p := b.plan(backend.OpAllgatherCoalesced, m, flat(outputs))
	p.print(fpDType(inputs), nil, fpCount(flat(outputs)), -1)
	var afters []func()
	for i, in := range ins {
		outs, err := b.args.Host(backend.OpAllgatherCoalesced, m, outputs[i]...)
		if err != nil {
			return nil, err
		}
		if a := p.allgather(in, outs); a != nil {
			afters = append(afters, a)
		}
	}
	p.after = func() {
		for _, a := range afters {
			a()
		}
	}
	return b.submit(ctx, p)
}

// AllgatherIntoTensorCoalesced implements backend.Backend.
func (b *Backend) AllgatherIntoTensorCoalesced(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherIntoTensorCoalescedOptions) (backend.Work, error) {
	outs, err := b.args.Host(backend.OpAllgatherIntoTensorCoalesced, m, outputs...)
	if err != nil {
		return nil, err
	}
	ins, err := b.args.Host(backend.OpAllgatherIntoTensorCoalesced, m, inputs...)
	if err != nil {
		return nil, err
	}
	if len(outs) != len(ins) {
		return nil, b.args.Invalid(backend.OpAllgatherIntoTensorCoalesced, m, "as many outputs as inputs")
	}
	p := b.plan(backend.OpAllgatherIntoTensorCoalesced, m, outputs)
	p.print(fpDType(inputs), nil, fpCount(outputs), -1)
	for i := range ins {
		p.intoTensor(ins[i], outs[i])
	}
	return b.submit(ctx, p)
}

// reduceScatter reduces src (every rank's blocks, in rank order) and
// leaves this rank's block in out. Even blocks take UCC's reduce_scatter;
// uneven ones an allreduce of the whole, of which this rank keeps its
// block.
func (p *plan) reduceScatter(r reduction, src []byte, sizes []int, out []byte) (after func()) {
	world, rank := p.b.cfg.WorldSize, p.b.cfg.Rank
	if len(src) == 0 {
		return nil
	}
	if allEqual(sizes) {
		p.add(C.gu_desc{coll_type: collReduceScatter, op: C.int(r.op), dt: C.uint64_t(r.dt),
			src: p.buf(src), src_count: r.count(src), dst: p.buf(out), dst_count: r.count(out)})
		return func() { r.post(out, world) }
	}
	p.allreduce(r, src)
	off := 0
	for _, s := range sizes[:rank] {
		off += s
	}
	return func() {
		copy(out, src[off:off+sizes[rank]])
		r.post(out, world)
	}
}

// ReduceScatter implements backend.Backend.
func (b *Backend) ReduceScatter(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs [][]*tensor.Tensor, opts backend.ReduceScatterOptions) (backend.Work, error) {
	if len(outputs) != 1 || len(inputs) != 1 {
		return nil, b.args.Invalid(backend.OpReduceScatter, m, "requires a single-element output and input list")
	}
	outs, err := b.args.Host(backend.OpReduceScatter, m, outputs...)
	if err != nil {
		return nil, err
	}
	ins, err := b.args.Host(backend.OpReduceScatter, m, inputs[0]...)
	if err != nil {
		return nil, err
	}
	r, err := b.args.Reduction(backend.OpReduceScatter, m, outputs[0].DType(), opts.ReduceOp)
	if err != nil {
		return nil, err
	}
	p := b.plan(backend.OpReduceScatter, m, outputs)
	p.print(outputs[0].DType(), &opts.ReduceOp, fpCount(inputs[0]), -1)
	src, sizes := pack(ins)
	src = r.in(src)
	for i := range sizes {
		sizes[i] *= r.ratio
	}
	if r.k.Pre != nil {
		r.k.Pre(src)
	}
	out := r.scratch(outs[0])
	if after := p.reduceScatter(r, src, sizes, out); after != nil {
		p.after = func() {
			after()
			r.back(outs[0], out)
		}
	}
	return b.submit(ctx, p)
}

// ReduceScatterTensor implements backend.Backend.
func (b *Backend) ReduceScatterTensor(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.ReduceScatterTensorOptions) (backend.Work, error) {
	return b.reduceScatterTensors(ctx, backend.OpReduceScatterTensor, m, []*tensor.Tensor{output}, []*tensor.Tensor{input}, opts.ReduceOp)
}

// ReduceScatterTensorCoalesced implements backend.Backend.
func (b *Backend) ReduceScatterTensorCoalesced(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.ReduceScatterTensorCoalescedOptions) (backend.Work, error) {
	return b.reduceScatterTensors(ctx, backend.OpReduceScatterTensorCoalesced, m, outputs, inputs, opts.ReduceOp)
}

func (b *Backend) reduceScatterTensors(ctx context.Context, op backend.Op, m backend.Meta, outputs, inputs []*tensor.Tensor, rop backend.ReduceOp) (backend.Work, error) {
	outs, err := b.args.Host(op, m, outputs...)
	if err != nil {
		return nil, err
	}
	ins, err := b.args.Host(op, m, inputs...)
	if err != nil {
		return nil, err
	}
	if len(outs) != len(ins) || len(outs) == 0 {
		return nil, b.args.Invalid(op, m, "as many outputs as inputs")
	}
	r, err := b.args.Reduction(op, m, outputs[0].DType(), rop)
	if err != nil {
		return nil, err
	}
	p := b.plan(op, m, outputs)
	var afters []func()
	p.print(fpDType(outputs), &rop, fpCount(inputs), -1)
	for i := range ins {
		sizes := make([]int, b.cfg.WorldSize)
		for j := range sizes {
			sizes[j] = len(outs[i]) * r.ratio
		}
		out, dst := r.scratch(outs[i]), outs[i]
		if a := p.reduceScatter(r, r.scaled(ins[i]), sizes, out); a != nil {
			afters = append(afters, func() {
				a()
				r.back(dst, out)
			})
		}
	}
	p.after = func() {
		for _, a := range afters {
			a()
		}
	}
	return b.submit(ctx, p)
}

// Alltoall implements backend.Backend: UCC's alltoallv over packed
// buffers.
func (b *Backend) Alltoall(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AlltoallOptions) (backend.Work, error) {
	outs, err := b.args.Host(backend.OpAlltoall, m, outputs...)
	if err != nil {
		return nil, err
	}
	ins, err := b.args.Host(backend.OpAlltoall, m, inputs...)
	if err != nil {
		return nil, err
	}
	p := b.plan(backend.OpAlltoall, m, outputs)
	p.print(fpDType(inputs), nil, -1, -1) // the ranks' counts differ legitimately
	src, inSizes := pack(ins)
	dst, outSizes := pack(outs)
	p.alltoallv(src, inSizes, dst, outSizes)
	p.after = func() { unpack(dst, outs) }
	return b.submit(ctx, p)
}

func (p *plan) alltoallv(src []byte, inSizes []int, dst []byte, outSizes []int) {
	sc, sd := p.vec(inSizes)
	dc, dd := p.vec(outSizes)
	p.add(C.gu_desc{coll_type: collAlltoallv, dt: C.uint64_t(dtBytes), flags: flag64,
		v_src: 1, src: p.buf(src), src_counts: sc, src_displs: sd,
		v_dst: 1, dst: p.buf(dst), dst_counts: dc, dst_displs: dd})
}

// AlltoallBase implements backend.Backend: UCC's alltoall for equal parts,
// alltoallv for split sizes, straight on the tensors.
func (b *Backend) AlltoallBase(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AlltoallBaseOptions) (backend.Work, error) {
	bufs, err := b.args.Host(backend.OpAlltoallBase, m, output, input)
	if err != nil {
		return nil, err
	}
	out, in := bufs[0], bufs[1]
	p := b.plan(backend.OpAlltoallBase, m, []*tensor.Tensor{output})
	p.print(input.DType(), nil, -1, -1)
	if opts.InputSplitSizes == nil && opts.OutputSplitSizes == nil {
		if len(in) > 0 || len(out) > 0 {
			p.add(C.gu_desc{coll_type: collAlltoall, dt: C.uint64_t(dtBytes), src: p.buf(in), src_count: cu(len(in)),
				dst: p.buf(out), dst_count: cu(len(out))})
		}
		return b.submit(ctx, p)
	}
	world := b.cfg.WorldSize
	sizes := func(t *tensor.Tensor, buf []byte, split []int) []int {
		rows := 0
		if sh := t.Shape(); len(sh) > 0 {
			rows = sh[0]
		}
		row := 0
		if rows > 0 {
			row = len(buf) / rows
		}
		out := make([]int, world)
		for r := range out {
			if split == nil {
				out[r] = rows / world * row
			} else {
				out[r] = split[r] * row
			}
		}
		return out
	}
	p.alltoallv(in, sizes(input, in, opts.InputSplitSizes), out, sizes(output, out, opts.OutputSplitSizes))
	return b.submit(ctx, p)
}

// Gather implements backend.Backend.
func (b *Backend) Gather(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.GatherOptions) (backend.Work, error) {
	ins, err := b.args.Host(backend.OpGather, m, inputs...)
	if err != nil {
		return nil, err
	}
	if len(ins) != 1 {
		return nil, b.args.Invalid(backend.OpGather, m, "requires a single-element input list")
	}
	root := b.cfg.Rank == opts.RootRank
	var outs [][]byte
	var outTs []*tensor.Tensor
	if root {
		if len(outputs) != 1 {
			return nil, b.args.Invalid(backend.OpGather, m, "requires a single-element output list on the root")
		}
		if outs, err = b.args.Host(backend.OpGather, m, outputs[0]...); err != nil {
			return nil, err
		}
		outTs = outputs[0]
	}
	p := b.plan(backend.OpGather, m, outTs)
	p.print(inputs[0].DType(), nil, inputs[0].Numel(), opts.RootRank)
	in := ins[0]
	if len(in) > 0 {
		// Every rank gives UCC a full-size destination: the tree's inner
		// ranks use it on their way to the root.
		scratch := make([]byte, len(in)*b.cfg.WorldSize)
		p.add(C.gu_desc{coll_type: collGather, dt: C.uint64_t(dtBytes), root: cu(opts.RootRank), src: p.buf(in), src_count: cu(len(in)),
			dst: p.buf(scratch), dst_count: cu(len(scratch))})
		if root {
			p.after = func() { unpack(scratch, outs) }
		}
	}
	return b.submit(ctx, p)
}

// Scatter implements backend.Backend.
func (b *Backend) Scatter(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs [][]*tensor.Tensor, opts backend.ScatterOptions) (backend.Work, error) {
	outs, err := b.args.Host(backend.OpScatter, m, outputs...)
	if err != nil {
		return nil, err
	}
	if len(outs) != 1 {
		return nil, b.args.Invalid(backend.OpScatter, m, "requires a single-element output list")
	}
	out := outs[0]
	p := b.plan(backend.OpScatter, m, outputs)
	p.print(outputs[0].DType(), nil, outputs[0].Numel(), opts.RootRank)
	if len(out) == 0 {
		return b.submit(ctx, p)
	}
	// UCC 1.9 has no scatter algorithm on the CPU (ucc_collective_init:
	// not supported): an alltoallv in which only the root sends does it.
	world := b.cfg.WorldSize
	inSizes, outSizes := make([]int, world), make([]int, world)
	outSizes[opts.RootRank] = len(out)
	var src []byte
	if b.cfg.Rank == opts.RootRank {
		if len(inputs) != 1 {
			return nil, b.args.Invalid(backend.OpScatter, m, "requires a single-element input list on the root")
		}
		ins, err := b.args.Host(backend.OpScatter, m, inputs[0]...)
		if err != nil {
			return nil, err
		}
		src, inSizes = pack(ins)
	}
	p.alltoallv(src, inSizes, out, outSizes)
	return b.submit(ctx, p)
}

// Barrier implements backend.Backend: UCC's barrier, whose Work completes
// only once every work issued before it has completed too.
func (b *Backend) Barrier(ctx context.Context, m backend.Meta, opts backend.BarrierOptions) (backend.Work, error) {
	p := b.plan(backend.OpBarrier, m, nil)
	p.print(0, nil, 0, -1)
	p.barrier = true
	p.add(C.gu_desc{coll_type: collBarrier})
	return b.submit(ctx, p)
}
