package cpupool

import (
	"context"
	"math"
	"slices"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/opcheck"
	"github.com/gocoll/gocoll/internal/reduce"
	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/tensor"
)

// The dispatcher has checked the arguments against spec/ops.yaml; the
// checks here are the ones it cannot make (host memory, this rank's block
// matching its input) and guard against direct callers. The common ones
// are backend.HostChecker's (b.args), which ucc shares.

// hostChecker is cpupool's argument checker for rank: reductions are
// internal/reduce's kernels, and a device tensor is an invalid argument.
func hostChecker(rank int) backend.HostChecker[reduce.Kernel] {
	return backend.HostChecker[reduce.Kernel]{Backend: Name, Rank: rank, Lookup: reduce.For}
}

func flat(lists [][]*tensor.Tensor) []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

func (b *Backend) post(k reduce.Kernel, buf []byte, contributions int) {
	if k.Post != nil {
		k.Post(buf, contributions)
	}
}

// Broadcast implements backend.Backend.
func (b *Backend) Broadcast(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.BroadcastOptions) (backend.Work, error) {
	bufs, err := b.args.Rooted(backend.OpBroadcast, m, tensors, opts.RootTensor)
	if err != nil {
		return nil, err
	}
	src := bufs[opts.RootTensor]
	fp := fingerprint(backend.OpBroadcast, tensors[opts.RootTensor].DType(), nil, tensors[opts.RootTensor].Numel())
	return b.collective(ctx, backend.OpBroadcast, m, fp, tensors, func(ctx context.Context, tag uint64) error {
		if err := coll.Broadcast(ctx, b.comm, tag, src, opts.RootRank); err != nil {
			return err
		}
		for _, d := range bufs {
			copy(d, src)
		}
		return nil
	})
}

// Allreduce implements backend.Backend. Several tensors in the list are
// reduced together, as Gloo does: every one of them gets the reduction of
// all of them on all ranks.
func (b *Backend) Allreduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceOptions) (backend.Work, error) {
	// The buffers of a one-tensor list go in local, which does not
	// escape: a lane op copies them into its job, the others clone them.
	var local [1][]byte
	bufs, k, err := b.args.ReduceListInto(local[:0], backend.OpAllreduce, m, tensors, opts.ReduceOp)
	if err != nil {
		return nil, err
	}
	fp := fingerprint(backend.OpAllreduce, tensors[0].DType(), &opts.ReduceOp, tensors[0].Numel())
	if b.lanesFor(len(bufs[0])) {
		return b.allreduceLanes(ctx, m, fp, tensors, bufs, k)
	}
	own := slices.Clone(bufs)
	if b.directFor(len(own[0])) {
		return b.allreduceDirect(ctx, m, fp, tensors, own, k)
	}
	return b.collective(ctx, backend.OpAllreduce, m, fp, tensors, func(ctx context.Context, tag uint64) error {
		buf := combineLocal(k, own, 0)
		if err := coll.Allreduce(ctx, b.comm, tag, buf, k); err != nil {
			return err
		}
		b.post(k, buf, b.cfg.WorldSize*len(own))
		for _, o := range own[1:] {
			copy(o, buf)
		}
		return nil
	})
}

// combineLocal reduces this rank's tensors into bufs[into] and returns it:
// the step allreduce and reduce take before they go over the wire.
func combineLocal(k reduce.Kernel, bufs [][]byte, into int) []byte {
	if k.Pre != nil {
		for _, o := range bufs {
			k.Pre(o)
		}
	}
	buf := bufs[into]
	for i, o := range bufs {
		if i != into {
			k.Combine(buf, o)
		}
	}
	return buf
}

// pack concatenates bufs into one pooled buffer.
func (b *Backend) pack(bufs [][]byte) []byte {
	n := 0
	for _, x := range bufs {
		n += len(x)
	}
	out := b.pool.Get(n)
	off := 0
	for _, x := range bufs {
		off += copy(out[off:], x)
	}
	return out
}

func unpack(packed []byte, bufs [][]byte) {
	off := 0
	for _, x := range bufs {
		off += copy(x, packed[off:])
	}
}

// AllreduceCoalesced implements backend.Backend: the tensors travel as one
// packed buffer.
func (b *Backend) AllreduceCoalesced(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceCoalescedOptions) (backend.Work, error) {
	bufs, k, err := b.args.ReduceList(backend.OpAllreduceCoalesced, m, tensors, opts.ReduceOp)
	if err != nil {
		return nil, err
	}
	fp := fingerprint(backend.OpAllreduceCoalesced, tensors[0].DType(), &opts.ReduceOp, numel(tensors))
	return b.collective(ctx, backend.OpAllreduceCoalesced, m, fp, tensors, func(ctx context.Context, tag uint64) error {
		packed := b.pack(bufs)
		defer b.pool.Put(packed)
		if k.Pre != nil {
			k.Pre(packed)
		}
		if err := coll.Allreduce(ctx, b.comm, tag, packed, k); err != nil {
			return err
		}
		b.post(k, packed, b.cfg.WorldSize)
		unpack(packed, bufs)
		return nil
	})
}

// Reduce implements backend.Backend.
func (b *Backend) Reduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.ReduceOptions) (backend.Work, error) {
	bufs, k, err := b.args.ReduceRooted(backend.OpReduce, m, tensors, opts.RootTensor, opts.ReduceOp)
	if err != nil {
		return nil, err
	}
	fp := fingerprint(backend.OpReduce, tensors[0].DType(), &opts.ReduceOp, tensors[opts.RootTensor].Numel())
	return b.collective(ctx, backend.OpReduce, m, fp, tensors, func(ctx context.Context, tag uint64) error {
		buf := combineLocal(k, bufs, opts.RootTensor)
		if err := coll.Reduce(ctx, b.comm, tag, buf, k, opts.RootRank); err != nil {
			return err
		}
		if b.cfg.Rank == opts.RootRank {
			b.post(k, buf, b.cfg.WorldSize*len(bufs))
		}
		return nil
	})
}

// Allgather implements backend.Backend; output sizes may differ per rank
// (uneven all-gather) as long as every rank passes the same ones.
func (b *Backend) Allgather(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherOptions) (backend.Work, error) {
	op := backend.OpAllgather
	in, blocks, err := b.blockBuffers(op, m, inputs, outputs, "input", "output")
	if err != nil {
		return nil, err
	}
	fp := fingerprint(op, inputs[0].DType(), nil, numel(outputs[0]))
	return b.collective(ctx, op, m, fp, outputs[0], func(ctx context.Context, tag uint64) error {
		copy(blocks[b.cfg.Rank], in[0])
		return coll.Allgather(ctx, b.comm, tag, blocks)
	})
}

// AllgatherIntoTensor implements backend.Backend.
func (b *Backend) AllgatherIntoTensor(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AllgatherIntoTensorOptions) (backend.Work, error) {
	op := backend.OpAllgatherIntoTensor
	bs, err := b.args.Host(op, m, output, input)
	if err != nil {
		return nil, err
	}
	out, in := bs[0], bs[1]
	if len(out) != len(in)*b.cfg.WorldSize {
		return nil, b.args.Invalid(op, m, "output tensor size must be equal to world_size times input tensor size")
	}
	blocks := make([][]byte, b.cfg.WorldSize)
	for i := range blocks {
		blocks[i] = out[i*len(in) : (i+1)*len(in)]
	}
	fp := fingerprint(op, input.DType(), nil, output.Numel())
	return b.collective(ctx, op, m, fp, []*tensor.Tensor{output}, func(ctx context.Context, tag uint64) error {
		copy(blocks[b.cfg.Rank], in)
		return coll.Allgather(ctx, b.comm, tag, blocks)
	})
}

// gatherPacked all-gathers the concatenation of ins from every rank and
// hands unpack each rank's packed block.
func (b *Backend) gatherPacked(ctx context.Context, tag uint64, ins [][]byte, each func(rank int, block []byte)) error {
	n := b.cfg.WorldSize
	own := b.pack(ins)
	defer b.pool.Put(own)
	S := len(own)
	all := b.pool.Get(n * S)
	defer b.pool.Put(all)
	blocks := make([][]byte, n)
	for i := range blocks {
		blocks[i] = all[i*S : (i+1)*S]
	}
	copy(blocks[b.cfg.Rank], own)
	if err := coll.Allgather(ctx, b.comm, tag, blocks); err != nil {
		return err
	}
	for r, blk := range blocks {
		each(r, blk)
	}
	return nil
}

// AllgatherCoalesced implements backend.Backend.
func (b *Backend) AllgatherCoalesced(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherCoalescedOptions) (backend.Work, error) {
	op := backend.OpAllgatherCoalesced
	ins, err := b.args.Host(op, m, inputs...)
	if err != nil {
		return nil, err
	}
	if len(outputs) != len(inputs) {
		return nil, b.args.Invalid(op, m, "output list must have one entry per input tensor")
	}
	outs := make([][][]byte, len(outputs))
	for i, l := range outputs {
		if len(l) != b.cfg.WorldSize {
			return nil, b.args.Invalid(op, m, "invalid output tensor list: each entry needs world_size tensors of its input's size")
		}
		if outs[i], err = b.args.Host(op, m, l...); err != nil {
			return nil, err
		}
		for _, o := range outs[i] {
			if len(o) != len(ins[i]) {
				return nil, b.args.Invalid(op, m, "invalid output tensor list: each entry needs world_size tensors of its input's size")
			}
		}
	}
	fp := fingerprint(op, inputs[0].DType(), nil, numel(flat(outputs)))
	return b.collective(ctx, op, m, fp, flat(outputs), func(ctx context.Context, tag uint64) error {
		return b.gatherPacked(ctx, tag, ins, func(r int, blk []byte) {
			off := 0
			for i := range outs {
				off += copy(outs[i][r], blk[off:])
			}
		})
	})
}

// AllgatherIntoTensorCoalesced implements backend.Backend.
func (b *Backend) AllgatherIntoTensorCoalesced(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherIntoTensorCoalescedOptions) (backend.Work, error) {
	op := backend.OpAllgatherIntoTensorCoalesced
	ins, err := b.args.Host(op, m, inputs...)
	if err != nil {
		return nil, err
	}
	outs, err := b.args.Host(op, m, outputs...)
	if err != nil {
		return nil, err
	}
	if len(outs) != len(ins) {
		return nil, b.args.Invalid(op, m, "output and input lists must have the same length")
	}
	for i := range outs {
		if len(outs[i]) != len(ins[i])*b.cfg.WorldSize {
			return nil, b.args.Invalid(op, m, "output tensor size must be equal to world_size times input tensor size")
		}
	}
	fp := fingerprint(op, inputs[0].DType(), nil, numel(outputs))
	return b.collective(ctx, op, m, fp, outputs, func(ctx context.Context, tag uint64) error {
		return b.gatherPacked(ctx, tag, ins, func(r int, blk []byte) {
			off := 0
			for i := range outs {
				l := len(ins[i])
				off += copy(outs[i][r*l:(r+1)*l], blk[off:])
			}
		})
	})
}

// reduceScatterPacked reduce-scatters a packed buffer of n blocks with the
// given sizes and returns this rank's reduced block (valid until free).
func (b *Backend) reduceScatterPacked(ctx context.Context, tag uint64, k reduce.Kernel, sizes []int, fill func(packed []byte)) ([]byte, func(), error) {
	total := 0
	for _, s := range sizes {
		total += s
	}
	packed := b.pool.Get(total)
	free := func() { b.pool.Put(packed) }
	fill(packed)
	if k.Pre != nil {
		k.Pre(packed)
	}
	blocks := make([][]byte, len(sizes))
	off := 0
	for i, s := range sizes {
		blocks[i] = packed[off : off+s]
		off += s
	}
	if err := coll.ReduceScatter(ctx, b.comm, tag, blocks, k); err != nil {
		free()
		return nil, nil, err
	}
	own := blocks[b.cfg.Rank]
	b.post(k, own, b.cfg.WorldSize)
	return own, free, nil
}

// ReduceScatter implements backend.Backend; block sizes may differ per
// rank (uneven reduce-scatter) as long as every rank passes the same ones.
func (b *Backend) ReduceScatter(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs [][]*tensor.Tensor, opts backend.ReduceScatterOptions) (backend.Work, error) {
	op := backend.OpReduceScatter
	out, ins, err := b.blockBuffers(op, m, outputs, inputs, "output", "input")
	if err != nil {
		return nil, err
	}
	k, err := b.args.Reduction(op, m, outputs[0].DType(), opts.ReduceOp)
	if err != nil {
		return nil, err
	}
	sizes := make([]int, len(ins))
	for i, x := range ins {
		sizes[i] = len(x)
	}
	fp := fingerprint(op, outputs[0].DType(), &opts.ReduceOp, numel(inputs[0]))
	return b.collective(ctx, op, m, fp, outputs, func(ctx context.Context, tag uint64) error {
		own, free, err := b.reduceScatterPacked(ctx, tag, k, sizes, func(p []byte) { unpackInto(p, ins) })
		if err != nil {
			return err
		}
		defer free()
		copy(out[0], own)
		return nil
	})
}

// unpackInto is pack into an existing buffer.
func unpackInto(dst []byte, srcs [][]byte) {
	off := 0
	for _, s := range srcs {
		off += copy(dst[off:], s)
	}
}

// ReduceScatterTensor implements backend.Backend.
func (b *Backend) ReduceScatterTensor(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.ReduceScatterTensorOptions) (backend.Work, error) {
	op := backend.OpReduceScatterTensor
	bs, err := b.args.Host(op, m, output, input)
	if err != nil {
		return nil, err
	}
	out, in := bs[0], bs[1]
	if len(in) != len(out)*b.cfg.WorldSize {
		return nil, b.args.Invalid(op, m, "input tensor must be the same size as output size times world size")
	}
	k, err := b.args.Reduction(op, m, output.DType(), opts.ReduceOp)
	if err != nil {
		return nil, err
	}
	sizes := make([]int, b.cfg.WorldSize)
	for i := range sizes {
		sizes[i] = len(out)
	}
	fp := fingerprint(op, output.DType(), &opts.ReduceOp, input.Numel())
	return b.collective(ctx, op, m, fp, []*tensor.Tensor{output}, func(ctx context.Context, tag uint64) error {
		own, free, err := b.reduceScatterPacked(ctx, tag, k, sizes, func(p []byte) { copy(p, in) })
		if err != nil {
			return err
		}
		defer free()
		copy(out, own)
		return nil
	})
}

// ReduceScatterTensorCoalesced implements backend.Backend: block r of the
// packed buffer is the concatenation of every input's block r.
func (b *Backend) ReduceScatterTensorCoalesced(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.ReduceScatterTensorCoalescedOptions) (backend.Work, error) {
	op := backend.OpReduceScatterTensorCoalesced
	outs, err := b.args.Host(op, m, outputs...)
	if err != nil {
		return nil, err
	}
	ins, err := b.args.Host(op, m, inputs...)
	if err != nil {
		return nil, err
	}
	if len(outs) != len(ins) || len(ins) == 0 {
		return nil, b.args.Invalid(op, m, "output and input lists must have the same length")
	}
	S := 0
	for i := range outs {
		if len(ins[i]) != len(outs[i])*b.cfg.WorldSize {
			return nil, b.args.Invalid(op, m, "input tensor must be the same size as output size times world size")
		}
		S += len(outs[i])
	}
	k, err := b.args.Reduction(op, m, inputs[0].DType(), opts.ReduceOp)
	if err != nil {
		return nil, err
	}
	n := b.cfg.WorldSize
	sizes := make([]int, n)
	for i := range sizes {
		sizes[i] = S
	}
	fp := fingerprint(op, inputs[0].DType(), &opts.ReduceOp, numel(inputs))
	return b.collective(ctx, op, m, fp, outputs, func(ctx context.Context, tag uint64) error {
		own, free, err := b.reduceScatterPacked(ctx, tag, k, sizes, func(p []byte) {
			off := 0
			for r := range n {
				for i := range ins {
					l := len(outs[i])
					off += copy(p[off:], ins[i][r*l:(r+1)*l])
				}
			}
		})
		if err != nil {
			return err
		}
		defer free()
		unpack(own, outs)
		return nil
	})
}

// Alltoall implements backend.Backend.
func (b *Backend) Alltoall(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AlltoallOptions) (backend.Work, error) {
	op := backend.OpAlltoall
	if len(outputs) != b.cfg.WorldSize || len(inputs) != b.cfg.WorldSize {
		return nil, b.args.Invalid(op, m, "Incorrect input or output list size. List sizes should be the world size")
	}
	outs, err := b.args.Host(op, m, outputs...)
	if err != nil {
		return nil, err
	}
	ins, err := b.args.Host(op, m, inputs...)
	if err != nil {
		return nil, err
	}
	if len(outs[b.cfg.Rank]) != len(ins[b.cfg.Rank]) {
		return nil, b.args.Invalid(op, m, "invalid tensor size: this rank's input and output pieces differ")
	}
	// The ranks' counts differ legitimately: only the op and dtype are compared.
	fp := fingerprint(op, inputs[0].DType(), nil, -1)
	return b.collective(ctx, op, m, fp, outputs, func(ctx context.Context, tag uint64) error {
		return coll.Alltoall(ctx, b.comm, tag, outs, ins)
	})
}

// splitRows cuts buf into world-size parts of sizes[i] rows (equal parts
// when sizes is empty).
func splitRows(buf []byte, t *tensor.Tensor, sizes []int, n int) ([][]byte, bool) {
	out := make([][]byte, n)
	if len(sizes) == 0 {
		if len(buf)%n != 0 {
			return nil, false
		}
		p := len(buf) / n
		for i := range out {
			out[i] = buf[i*p : (i+1)*p]
		}
		return out, true
	}
	if len(sizes) != n {
		return nil, false
	}
	rows := 1
	if t.Dim() > 0 {
		rows = t.Shape()[0]
	}
	row := 0
	if rows > 0 {
		row = len(buf) / rows
	}
	off := 0
	for i, s := range sizes {
		if s < 0 || off+s*row > len(buf) {
			return nil, false
		}
		out[i] = buf[off : off+s*row]
		off += s * row
	}
	return out, off == len(buf)
}

// AlltoallBase implements backend.Backend.
func (b *Backend) AlltoallBase(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AlltoallBaseOptions) (backend.Work, error) {
	op := backend.OpAlltoallBase
	bs, err := b.args.Host(op, m, output, input)
	if err != nil {
		return nil, err
	}
	n := b.cfg.WorldSize
	outs, ok := splitRows(bs[0], output, opts.OutputSplitSizes, n)
	if !ok {
		return nil, b.args.Invalid(op, m, "invalid output split sizes")
	}
	ins, ok := splitRows(bs[1], input, opts.InputSplitSizes, n)
	if !ok {
		return nil, b.args.Invalid(op, m, "invalid input split sizes")
	}
	if len(outs[b.cfg.Rank]) != len(ins[b.cfg.Rank]) {
		return nil, b.args.Invalid(op, m, "invalid split sizes: this rank's input and output parts differ")
	}
	fp := fingerprint(op, input.DType(), nil, -1)
	return b.collective(ctx, op, m, fp, []*tensor.Tensor{output}, func(ctx context.Context, tag uint64) error {
		return coll.Alltoall(ctx, b.comm, tag, outs, ins)
	})
}

// blockBuffers checks and maps the tensors of allgather (one input, one
// list of world-size outputs) and of reduce_scatter (the mirror image): one
// is this rank's single tensor, lists the list of blocks. Blocks may differ
// in size across ranks (uneven collectives); this rank's own block must be
// one's size. It returns one's buffer as a one-element slice and the
// blocks' buffers.
func (b *Backend) blockBuffers(op backend.Op, m backend.Meta, one []*tensor.Tensor, lists [][]*tensor.Tensor, oneName, listName string) ([][]byte, [][]byte, error) {
	if len(one) != 1 || len(lists) != 1 || len(lists[0]) != b.cfg.WorldSize {
		return nil, nil, b.args.Invalid(op, m, "requires one %s and one %s list of world_size tensors", oneName, listName)
	}
	single, err := b.args.Host(op, m, one...)
	if err != nil {
		return nil, nil, err
	}
	blocks, err := b.args.Host(op, m, lists[0]...)
	if err != nil {
		return nil, nil, err
	}
	if own := blocks[b.cfg.Rank]; len(own) != len(single[0]) {
		return nil, nil, b.args.Invalid(op, m, "invalid tensor size: %s %d has %d bytes, the %s %d", listName, b.cfg.Rank, len(own), oneName, len(single[0]))
	}
	return single, blocks, nil
}

// rootedBuffers checks and maps the tensors of gather (one input, and on
// the root one list of world-size outputs) and of scatter (the mirror
// image): one is this rank's single tensor, lists the root's list of lists.
// It returns one's buffer as a one-element slice, and on the root the
// buffers of lists[0], each of one's size.
func (b *Backend) rootedBuffers(op backend.Op, m backend.Meta, one []*tensor.Tensor, lists [][]*tensor.Tensor, root bool, oneName, listName string) ([][]byte, [][]byte, error) {
	if len(one) != 1 {
		return nil, nil, b.args.Invalid(op, m, "requires a single-element %s tensor list", oneName)
	}
	single, err := b.args.Host(op, m, one...)
	if err != nil {
		return nil, nil, err
	}
	if !root {
		return single, nil, nil
	}
	if len(lists) != 1 || len(lists[0]) != b.cfg.WorldSize {
		return nil, nil, b.args.Invalid(op, m, "requires a single-element %s list of world_size tensors on the root", listName)
	}
	bufs, err := b.args.Host(op, m, lists[0]...)
	if err != nil {
		return nil, nil, err
	}
	for _, x := range bufs {
		if len(x) != len(single[0]) {
			return nil, nil, b.args.Invalid(op, m, "invalid tensor size")
		}
	}
	return single, bufs, nil
}

// Gather implements backend.Backend.
func (b *Backend) Gather(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.GatherOptions) (backend.Work, error) {
	op := backend.OpGather
	root := b.cfg.Rank == opts.RootRank
	in, outs, err := b.rootedBuffers(op, m, inputs, outputs, root, "input", "output")
	if err != nil {
		return nil, err
	}
	var result []*tensor.Tensor
	if root {
		result = outputs[0]
	}
	B := len(in[0])
	fp := fingerprint(op, inputs[0].DType(), nil, inputs[0].Numel())
	return b.collective(ctx, op, m, fp, result, func(ctx context.Context, tag uint64) error {
		var all []byte
		if root {
			all = b.pool.Get(B * b.cfg.WorldSize)
			defer b.pool.Put(all)
		}
		if err := coll.Gather(ctx, b.comm, tag, in[0], all, opts.RootRank); err != nil {
			return err
		}
		for i, o := range outs {
			copy(o, all[i*B:])
		}
		return nil
	})
}

// Scatter implements backend.Backend.
func (b *Backend) Scatter(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs [][]*tensor.Tensor, opts backend.ScatterOptions) (backend.Work, error) {
	op := backend.OpScatter
	root := b.cfg.Rank == opts.RootRank
	out, ins, err := b.rootedBuffers(op, m, outputs, inputs, root, "output", "input")
	if err != nil {
		return nil, err
	}
	fp := fingerprint(op, outputs[0].DType(), nil, outputs[0].Numel())
	return b.collective(ctx, op, m, fp, outputs, func(ctx context.Context, tag uint64) error {
		var all []byte
		if root {
			all = b.pack(ins)
			defer b.pool.Put(all)
		}
		return coll.Scatter(ctx, b.comm, tag, all, out[0], opts.RootRank)
	})
}

// Barrier implements backend.Backend: it waits for every work this rank
// issued before it, then for every rank.
func (b *Backend) Barrier(ctx context.Context, m backend.Meta, opts backend.BarrierOptions) (backend.Work, error) {
	op := backend.OpBarrier
	if err := b.usable(op, m.Seq); err != nil {
		return nil, err
	}
	if b.cfg.WorldSize > 1 && b.mesh.Lanes() {
		return b.barrierLanes(ctx, m)
	}
	j := b.newJob(ctx, op, m, nil, nil)
	j.fp = fingerprint(op, 0, nil, 0)
	j.tag = b.issued.Add(1)
	earlier := b.trackEarlier(j.w)
	j.run = func(ctx context.Context, tag uint64) error {
		if err := b.awaitEarlier(ctx, earlier); err != nil {
			return err
		}
		return coll.Barrier(ctx, b.comm, tag)
	}
	h := j.h // read before the push: once queued, the job may run, complete and be reused
	if !b.q.push(j) {
		j.cancel()
		b.unhold()
		return nil, b.usable(op, m.Seq)
	}
	return h, nil
}

// barrierLanes is Barrier when every peer shares this host: a lane op
// (its caller's Wait runs it, polling shared memory), that waits for the
// earlier works and then allreduces one byte over the lanes. Why: the
// dissemination barrier's messages go through the mesh's ring readers,
// a goroutine and a thread wake-up per message on each rank, and with
// more ranks than cores each wake-up waits for a core that spinning
// ranks hold: 4 ranks on 2 cores left one rank 8-18 ms behind the others
// at most barriers, where a one-byte lane allreduce took tens of
// microseconds (docs/perf.md, issue 17, fourteenth pass).
func (b *Backend) barrierLanes(ctx context.Context, m backend.Meta) (backend.Work, error) {
	earlier := b.trackEarlier(nil)
	w, err := b.collectiveLane(ctx, backend.OpBarrier, m, fingerprint(backend.OpBarrier, 0, nil, 0), nil, func(ctx context.Context, lo *laneOp) error {
		if err := b.awaitEarlier(ctx, earlier); err != nil {
			return err
		}
		k, err := reduce.For(tensor.Uint8, backend.MAX)
		if err != nil {
			return err
		}
		var one [1]byte
		return b.laneAlgo(ctx, lo, one[:], k)
	}, nil, reduce.Kernel{})
	if err != nil {
		b.unhold() // the run never runs
	}
	return w, err
}

// awaitEarlier is a barrier's run up to its exchange: it waits for the
// earlier works (trackEarlier's list), then ends the barrier's hold on
// them.
func (b *Backend) awaitEarlier(ctx context.Context, earlier []backend.Work) error {
	resume := tcpmesh.Blocking(ctx) // the earlier works may need this rank's ring readers
	err := waitEarlier(ctx, earlier)
	resume()
	b.unhold()
	return err
}

// waitEarlier waits for a barrier's earlier works; it fails only when
// ctx, the barrier's, ends.
func waitEarlier(ctx context.Context, earlier []backend.Work) error {
	for _, w := range earlier {
		if err := w.WaitHost(ctx); err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// MonitoredBarrier implements backend.Backend with Gloo's scheme (rank 0
// arbitrates). It runs on its own goroutine, not the pool, so that a hung
// collective cannot hold it back: finding hung ranks is its purpose.
func (b *Backend) MonitoredBarrier(ctx context.Context, m backend.Meta, opts backend.MonitoredBarrierOptions) (backend.Work, error) {
	op := backend.OpMonitoredBarrier
	if err := b.usable(op, m.Seq); err != nil {
		return nil, err
	}
	// Rank 0 waits up to the op's timeout for the others (zero: no limit).
	// Non-zero ranks wait for rank 0's verdict, which comes after that.
	to := m.Timeout
	mm := m
	mm.Timeout = 2 * to
	if to == 0 {
		to = math.MaxInt64
	}
	j := b.newJob(ctx, op, mm, nil, nil)
	j.tag = b.issued.Add(1)
	b.track(j.w)
	j.run = func(ctx context.Context, tag uint64) error {
		return coll.MonitoredBarrier(ctx, b.comm, tag, to, opts.WaitAllRanks)
	}
	w := j.w // read before the run starts: see collective
	go b.runJob(j)
	return w, nil
}

// fingerprint describes an op in its frames' headers (tcpmesh.Fingerprint),
// so that a rank whose peers passed another op, dtype, reduce op or
// element count finds out at the first message, before it reduces bits of
// the wrong type. count is the op's element count, the same on every rank
// (negative: the ranks' counts may differ, as in all-to-all).
func fingerprint(op backend.Op, dt tensor.DType, r *backend.ReduceOp, count int) tcpmesh.Fingerprint {
	return opcheck.Of(op, dt, r, count)
}

// numel is the element count of a list of tensors.
func numel(ts []*tensor.Tensor) int {
	n := 0
	for _, t := range ts {
		n += t.Numel()
	}
	return n
}
