package nccl

/*
#include "nccl_dl.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// call is one NCCL call of an op.
type call struct {
	kind   C.int
	send   uintptr
	recv   uintptr
	count  int
	dt     C.int
	op     C.int
	scalar uint64
	root   int // root, or peer for send/recv
}

// ncclType maps a dtype to ncclDataType_t. Bool moves as uint8, as in
// PyTorch.
func ncclType(dt tensor.DType) (C.int, error) {
	switch dt {
	case tensor.Int8:
		return 0, nil
	case tensor.Uint8, tensor.Bool:
		return 1, nil
	case tensor.Int32:
		return 2, nil
	case tensor.Int64:
		return 4, nil
	case tensor.Float16:
		return 6, nil
	case tensor.Float32:
		return 7, nil
	case tensor.Float64:
		return 8, nil
	case tensor.BFloat16:
		return 9, nil
	case tensor.Float8E4M3, tensor.Float8E5M2:
		if lib.version < 22400 {
			return 0, fmt.Errorf("%w: %v needs NCCL 2.24 or newer (loaded %s)", backend.ErrUnsupported, dt, VersionString(lib.version))
		}
		if dt == tensor.Float8E4M3 {
			return 10, nil
		}
		return 11, nil
	}
	return 0, fmt.Errorf("%w: NCCL cannot move dtype %v", backend.ErrUnsupported, dt)
}

// redOp maps a ReduceOp for dtype dt to ncclRedOp_t; -1 means PREMUL_SUM
// with the returned scalar (raw bits of dt).
func redOp(r backend.ReduceOp, dt tensor.DType, worldOne bool) (C.int, uint64, error) {
	if r.Bitwise() {
		return 0, 0, fmt.Errorf("%w: Cannot use ReduceOp.%v with NCCL", backend.ErrUnsupported, r.Type)
	}
	if dt == tensor.Bool {
		// PyTorch: bool SUM is a logical or (MAX), PRODUCT a logical and (MIN).
		switch r.Type {
		case backend.Sum:
			return 2, 0, nil
		case backend.Product:
			return 3, 0, nil
		case backend.Avg, backend.PreMulSum:
			return 0, 0, fmt.Errorf("%w: Cannot use ReduceOp.%v with boolean inputs", backend.ErrInvalidArgument, r.Type)
		}
	}
	switch r.Type {
	case backend.Sum:
		return 0, 0, nil
	case backend.Product:
		return 1, 0, nil
	case backend.Max:
		return 2, 0, nil
	case backend.Min:
		return 3, 0, nil
	case backend.Avg:
		if worldOne {
			// The average of one value is the value; NCCL 2.28 rejects
			// float8 AVG on a one-rank communicator.
			return 0, 0, nil
		}
		return 4, 0, nil
	case backend.PreMulSum:
		switch dt {
		case tensor.Float32:
			return -1, uint64(math.Float32bits(float32(r.Factor))), nil
		case tensor.Float64:
			return -1, math.Float64bits(r.Factor), nil
		case tensor.Float16, tensor.BFloat16, tensor.Float8E4M3, tensor.Float8E5M2:
			if worldOne && (dt == tensor.Float8E4M3 || dt == tensor.Float8E5M2) {
				// Seen on NCCL 2.28.3: ncclInvalidArgument for a float8
				// PREMUL_SUM on a one-rank communicator.
				return 0, 0, fmt.Errorf("%w: NCCL cannot do PREMUL_SUM on %v with a single rank", backend.ErrUnsupported, dt)
			}
			h, err := tensor.FromFloat64s(dt, []float64{r.Factor})
			if err != nil {
				return 0, 0, err
			}
			var b [8]byte
			copy(b[:], h.Bytes())
			return -1, binary.LittleEndian.Uint64(b[:]), nil
		}
		return 0, 0, fmt.Errorf("%w: Cannot use ReduceOp.PREMUL_SUM with dtype %v on NCCL (floating types only)", backend.ErrUnsupported, dt)
	}
	return 0, 0, fmt.Errorf("%w: unknown reduce op %v", backend.ErrInvalidArgument, r)
}

// device checks that every tensor is a contiguous CUDA tensor on one device
// and returns that device.
func device(op backend.Op, ts ...*tensor.Tensor) (int, error) { return deviceOf(op, ts) }

// deviceOf is device over the tensors of several lists, in order, without
// joining the lists into one.
func deviceOf(op backend.Op, lists ...[]*tensor.Tensor) (int, error) {
	dev := -1
	for _, ts := range lists {
		for _, t := range ts {
			if t == nil {
				return 0, fmt.Errorf("%w: nil tensor", backend.ErrInvalidArgument)
			}
			d := t.Device()
			if d.Type != tensor.CUDA {
				return 0, &backend.OpError{Op: op.String(), Backend: Name, Kind: backend.ErrInvalidArgument, Detail: fmt.Sprintf("tensor %v is not on a CUDA device", t)}
			}
			if !t.IsContiguous() {
				return 0, &backend.OpError{Op: op.String(), Backend: Name, Kind: backend.ErrInvalidArgument, Detail: fmt.Sprintf("tensor %v must be contiguous", t)}
			}
			if dev >= 0 && d.Index != dev {
				return 0, &backend.OpError{Op: op.String(), Backend: Name, Kind: backend.ErrInvalidArgument, Detail: fmt.Sprintf("tensors on devices %d and %d; NCCL takes one device per process", dev, d.Index)}
			}
			dev = d.Index
		}
	}
	if dev < 0 {
		return 0, fmt.Errorf("%w: no tensor", backend.ErrInvalidArgument)
	}
	return dev, nil
}

func flat(lists ...[]*tensor.Tensor) []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

func flat2(ll [][]*tensor.Tensor) []*tensor.Tensor { return flat(ll...) }

func (b *Backend) timeoutOf(m backend.Meta) time.Duration {
	if m.Timeout > 0 {
		return m.Timeout
	}
	return b.cfg.Timeout
}

func (b *Backend) opError(m backend.Meta, kind error, err error) error {
	return &backend.OpError{Op: m.Op.String(), Seq: m.Seq, Rank: b.rank, Backend: Name, Kind: kind, Err: err}
}

// wrapErr turns an internal error into an *OpError for op m.
func (b *Backend) wrapErr(m backend.Meta, err error) error {
	if err == nil {
		return nil
	}
	if oe, ok := err.(*backend.OpError); ok {
		if oe.Seq == 0 {
			oe.Seq = m.Seq
		}
		if oe.Op == "" || oe.Op == "init" {
			oe.Op = m.Op.String()
		}
		oe.Rank = b.rank
		return oe
	}
	kind := backend.ErrAborted
	for _, k := range []error{backend.ErrUnsupported, backend.ErrInvalidArgument, backend.ErrUnavailable, backend.ErrTimeout} {
		if errorsIs(err, k) {
			kind = k
		}
	}
	return b.opError(m, kind, err)
}

// issue runs a single-call op: the hot path. One cgo crossing (gn_issue)
// records the sync event, makes the stream wait, calls NCCL and records
// the end event. Its Go allocations are the Work and nothing per tensor.
func (b *Backend) issue(ctx context.Context, m backend.Meta, c *comm, async bool, ins, outs []*tensor.Tensor, k call) (backend.Work, error) {
	if k.count == 0 {
		// Nothing goes to NCCL with a count of 0 (see issueGroup): the
		// group path gives the op its events and Work without a call.
		return b.issueGroup(ctx, m, c, async, ins, outs, []call{k})
	}
	if err := b.usable(m.Op); err != nil {
		return nil, err
	}
	cur := cuda.StreamFor(ctx, c.dev)
	if c.nan != nil {
		if err := b.checkNaN(ctx, m, c, cur, []call{k}); err != nil {
			return nil, err
		}
	}
	w := &Work{b: b, c: c, op: m.Op, seq: m.Seq, timeout: b.timeoutOf(m), async: async, outputs: outs, timing: b.opts.EnableTiming}
	nstream, syncEv := cur, uintptr(0)
	if async {
		nstream, syncEv = c.stream, c.syncEv.Handle()
	}
	w.stream = nstream
	c.mu.Lock()
	end, err := c.event(w.timing) // cuEventElapsedTime needs both ends timed
	if err == nil && w.timing {
		w.start, err = c.event(true)
	}
	if err != nil {
		c.mu.Unlock()
		return nil, b.wrapErr(m, err)
	}
	w.end = end
	w.enq = time.Now()
	r := C.gn_issue(C.uintptr_t(c.ctx), C.uintptr_t(c.handle), C.uintptr_t(nstream.Handle()), C.uintptr_t(cur.Handle()),
		C.uintptr_t(syncEv), C.uintptr_t(eventHandle(w.start)), C.uintptr_t(end.Handle()), k.kind,
		C.uintptr_t(k.send), C.uintptr_t(k.recv), C.size_t(k.count), k.dt, k.op, C.uint64_t(k.scalar), C.int(k.root))
	c.mu.Unlock()
	if err := result(opCallName(k.kind), r); err != nil {
		return nil, b.wrapErr(m, err)
	}
	if r&^C.GN_CAPTURING == ncclInProgress {
		// Nonblocking communicator: the launch finishes in the background;
		// record the end event only once it has.
		if err := c.waitReady(ctx, opCallName(k.kind), w.timeout); err != nil {
			return nil, b.wrapErr(m, err)
		}
		if err := result("cuEventRecord", C.gn_post(C.uintptr_t(c.ctx), C.uintptr_t(nstream.Handle()), C.uintptr_t(end.Handle()))); err != nil {
			return nil, b.wrapErr(m, err)
		}
	}
	if async && !b.opts.DisableStash {
		w.stashTensors(ins)
		w.stashTensors(outs)
	}
	if r&C.GN_CAPTURING != 0 {
		// Captured into a graph: nothing ran, so the watchdog must not
		// watch it (ProcessGroupNCCL skips workEnqueue the same way).
		b.enqueueCaptured(w)
		return w, nil
	}
	b.enqueue(w)
	return w, nil
}

func eventHandle(e *cuda.Event) uintptr {
	if e == nil {
		return 0
	}
	return e.Handle()
}

func opCallName(kind C.int) string {
	switch kind {
	case C.GN_ALLREDUCE:
		return "ncclAllReduce"
	case C.GN_BROADCAST:
		return "ncclBroadcast"
	case C.GN_REDUCE:
		return "ncclReduce"
	case C.GN_ALLGATHER:
		return "ncclAllGather"
	case C.GN_REDUCESCATTER:
		return "ncclReduceScatter"
	case C.GN_SEND:
		return "ncclSend"
	case C.GN_RECV:
		return "ncclRecv"
	case C.GN_ALLTOALL:
		return "ncclAlltoAll"
	case C.GN_GATHER:
		return "ncclGather"
	case C.GN_SCATTER:
		return "ncclScatter"
	}
	return "nccl"
}

// issueGroup runs several calls as one NCCL group with one Work, one sync
// event and one end event (collectiveCoalesced). The group runs on one
// locked OS thread, since NCCL's group state is thread-local.
//
// Calls with a count of 0 never reach NCCL, as PyTorch's all2all skips
// them: every rank has the same count for a collective, and a send/recv
// pair has the same count on both sides, so every rank skips alike. In the
// conftest world-2 run on NCCL 2.28.3, the first grouped send/recv (an
// uneven list alltoall) after an ncclAlltoAll of count 0 on the same
// communicator never completed, while the same alltoall on a fresh
// communicator did.
func (b *Backend) issueGroup(ctx context.Context, m backend.Meta, c *comm, async bool, ins, outs []*tensor.Tensor, calls []call) (backend.Work, error) {
	if err := b.usable(m.Op); err != nil {
		return nil, err
	}
	if len(calls) == 1 && calls[0].count > 0 {
		return b.issue(ctx, m, c, async, ins, outs, calls[0])
	}
	cur := cuda.StreamFor(ctx, c.dev)
	if c.nan != nil {
		if err := b.checkNaN(ctx, m, c, cur, calls); err != nil {
			return nil, err
		}
	}
	w := &Work{b: b, c: c, op: m.Op, seq: m.Seq, timeout: b.timeoutOf(m), async: async, outputs: outs, timing: b.opts.EnableTiming}
	nstream, syncEv := cur, uintptr(0)
	if async {
		nstream, syncEv = c.stream, c.syncEv.Handle()
	}
	w.stream = nstream
	unlock := lockThread()
	c.mu.Lock()
	err := func() error {
		end, err := c.event(w.timing)
		if err != nil {
			return err
		}
		w.end = end
		if w.timing {
			if w.start, err = c.event(true); err != nil {
				return err
			}
		}
		w.enq = time.Now()
		r := C.gn_pre(C.uintptr_t(c.ctx), C.uintptr_t(nstream.Handle()), C.uintptr_t(cur.Handle()), C.uintptr_t(syncEv), C.uintptr_t(eventHandle(w.start)))
		capturing := r&C.GN_CAPTURING != 0
		if err := result("cuEventRecord", r); err != nil {
			return err
		}
		if err := result("ncclGroupStart", C.gn_group_start()); err != nil {
			return err
		}
		var callErr error
		for _, k := range calls {
			if k.count == 0 {
				continue
			}
			r := C.gn_issue_nosync(C.uintptr_t(c.handle), C.uintptr_t(nstream.Handle()), k.kind, C.uintptr_t(k.send), C.uintptr_t(k.recv),
				C.size_t(k.count), k.dt, k.op, C.uint64_t(k.scalar), C.int(k.root))
			if callErr = result(opCallName(k.kind), r); callErr != nil {
				break
			}
		}
		r = C.gn_group_end()
		if callErr != nil {
			return callErr
		}
		if err := result("ncclGroupEnd", r); err != nil {
			return err
		}
		if r == ncclInProgress {
			if err := c.waitReady(ctx, "ncclGroupEnd", w.timeout); err != nil {
				return err
			}
		}
		if err := result("cuEventRecord", C.gn_post(C.uintptr_t(c.ctx), C.uintptr_t(nstream.Handle()), C.uintptr_t(w.end.Handle()))); err != nil {
			return err
		}
		if capturing {
			w.stream = nil
		}
		return nil
	}()
	c.mu.Unlock()
	unlock()
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	if async && !b.opts.DisableStash {
		w.stashTensors(ins)
		w.stashTensors(outs)
	}
	if w.stream == nil { // captured
		w.stream = nstream
		b.enqueueCaptured(w)
		return w, nil
	}
	b.enqueue(w)
	return w, nil
}

// submit routes an op's calls: queued while coalescing, else issued.
func (b *Backend) submit(ctx context.Context, m backend.Meta, dev int, async bool, ins, outs []*tensor.Tensor, calls []call) (backend.Work, error) {
	if b.coalescing.Load() {
		return nil, b.queue(ctx, m, dev, async, ins, outs, calls)
	}
	c, err := b.getComm(ctx, dev)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	return b.issueGroup(ctx, m, c, async, ins, outs, calls)
}

// inPlace returns a reduction call of kind on t, in place, with r.
func (b *Backend) inPlace(kind C.int, t *tensor.Tensor, r backend.ReduceOp) (call, error) {
	dt, err := ncclType(t.DType())
	if err != nil {
		return call{}, err
	}
	op, scalar, err := redOp(r, t.DType(), b.size == 1)
	return call{kind: kind, send: t.Ptr(), recv: t.Ptr(), count: t.Numel(), dt: dt, op: op, scalar: scalar}, err
}

// Allreduce implements backend.Backend (in place).
func (b *Backend) Allreduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceOptions) (backend.Work, error) {
	if len(tensors) != 1 {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("NCCL takes one tensor per process, got %d", len(tensors)))
	}
	t := tensors[0]
	dev, err := device(m.Op, t)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	k, err := b.inPlace(C.GN_ALLREDUCE, t, opts.ReduceOp)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	if b.coalescing.Load() {
		return nil, b.queue(ctx, m, dev, opts.Async, tensors, nil, []call{k})
	}
	c := b.devComms[dev].Load()
	if c == nil {
		if c, err = b.getComm(ctx, dev); err != nil {
			return nil, b.wrapErr(m, err)
		}
	}
	return b.issue(ctx, m, c, opts.Async, tensors, nil, k)
}

// AllreduceCoalesced implements backend.Backend: one group of allreduces.
func (b *Backend) AllreduceCoalesced(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceCoalescedOptions) (backend.Work, error) {
	dev, err := device(m.Op, tensors...)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	calls := make([]call, len(tensors))
	for i, t := range tensors {
		if calls[i], err = b.inPlace(C.GN_ALLREDUCE, t, opts.ReduceOp); err != nil {
			return nil, b.wrapErr(m, err)
		}
	}
	return b.submit(ctx, m, dev, opts.Async, tensors, nil, calls)
}

// Broadcast implements backend.Backend (in place).
func (b *Backend) Broadcast(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.BroadcastOptions) (backend.Work, error) {
	if len(tensors) != 1 || opts.RootTensor != 0 {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("NCCL takes one tensor per process"))
	}
	t := tensors[0]
	dev, err := device(m.Op, t)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	dt, err := ncclType(t.DType())
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	return b.submit(ctx, m, dev, opts.Async, tensors, nil, []call{{kind: C.GN_BROADCAST, send: t.Ptr(), recv: t.Ptr(), count: t.Numel(), dt: dt, root: opts.RootRank}})
}

// Reduce implements backend.Backend (in place on the root).
func (b *Backend) Reduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.ReduceOptions) (backend.Work, error) {
	if len(tensors) != 1 || opts.RootTensor != 0 {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("NCCL takes one tensor per process"))
	}
	t := tensors[0]
	dev, err := device(m.Op, t)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	k, err := b.inPlace(C.GN_REDUCE, t, opts.ReduceOp)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	k.root = opts.RootRank
	return b.submit(ctx, m, dev, opts.Async, tensors, nil, []call{k})
}

// broadcastsInto gathers in (this rank's input) into outs (one per rank) as
// a group of broadcasts, one rooted at each rank: no staging buffer, and
// the sizes may differ per rank.
func (b *Backend) broadcastsInto(calls []call, in *tensor.Tensor, outs []*tensor.Tensor) ([]call, error) {
	if len(outs) != b.size {
		return nil, fmt.Errorf("%w: %d outputs for %d ranks", backend.ErrInvalidArgument, len(outs), b.size)
	}
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
	if len(inputs) != 1 || len(outputs) != 1 {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("NCCL takes one tensor per process"))
	}
	outs := outputs[0]
	dev, err := deviceOf(m.Op, inputs[:1], outs)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	calls, err := b.broadcastsInto(nil, inputs[0], outs)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	return b.submit(ctx, m, dev, opts.Async, inputs, outs, calls)
}

// AllgatherCoalesced implements backend.Backend.
func (b *Backend) AllgatherCoalesced(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherCoalescedOptions) (backend.Work, error) {
	dev, err := deviceOf(m.Op, append([][]*tensor.Tensor{inputs}, outputs...)...)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	if len(outputs) != len(inputs) {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("%d output lists for %d inputs", len(outputs), len(inputs)))
	}
	var calls []call
	for i, in := range inputs {
		if calls, err = b.broadcastsInto(calls, in, outputs[i]); err != nil {
			return nil, b.wrapErr(m, err)
		}
	}
	return b.submit(ctx, m, dev, opts.Async, inputs, flat2(outputs), calls)
}

func (b *Backend) allgatherCall(in, out *tensor.Tensor) (call, error) {
	if out.NBytes() != in.NBytes()*b.size {
		return call{}, fmt.Errorf("%w: output of %d bytes for %d ranks of %d", backend.ErrInvalidArgument, out.NBytes(), b.size, in.NBytes())
	}
	dt, err := ncclType(in.DType())
	return call{kind: C.GN_ALLGATHER, send: in.Ptr(), recv: out.Ptr(), count: in.Numel(), dt: dt}, err
}

// AllgatherIntoTensor implements backend.Backend.
func (b *Backend) AllgatherIntoTensor(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AllgatherIntoTensorOptions) (backend.Work, error) {
	return b.pairs(ctx, m, opts.Async, []*tensor.Tensor{input}, []*tensor.Tensor{output}, b.allgatherCall)
}

// AllgatherIntoTensorCoalesced implements backend.Backend.
func (b *Backend) AllgatherIntoTensorCoalesced(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherIntoTensorCoalescedOptions) (backend.Work, error) {
	return b.pairs(ctx, m, opts.Async, inputs, outputs, b.allgatherCall)
}

// pairs submits one call per input and output pair, made by mk: the
// tensor forms of allgather and reduce_scatter, single and coalesced.
func (b *Backend) pairs(ctx context.Context, m backend.Meta, async bool, inputs, outputs []*tensor.Tensor, mk func(in, out *tensor.Tensor) (call, error)) (backend.Work, error) {
	dev, err := deviceOf(m.Op, inputs, outputs)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	if len(outputs) != len(inputs) {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("%d outputs for %d inputs", len(outputs), len(inputs)))
	}
	calls := make([]call, len(inputs))
	for i := range inputs {
		if calls[i], err = mk(inputs[i], outputs[i]); err != nil {
			return nil, b.wrapErr(m, err)
		}
	}
	return b.submit(ctx, m, dev, async, inputs, outputs, calls)
}

// ReduceScatter implements backend.Backend: a group of reduces, one rooted
// at each rank, so the blocks may differ in size.
func (b *Backend) ReduceScatter(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs [][]*tensor.Tensor, opts backend.ReduceScatterOptions) (backend.Work, error) {
	if len(outputs) != 1 || len(inputs) != 1 || len(inputs[0]) != b.size {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("NCCL takes one output and one list of %d inputs", b.size))
	}
	out := outputs[0]
	dev, err := deviceOf(m.Op, outputs, inputs[0])
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
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
	return b.submit(ctx, m, dev, opts.Async, inputs[0], outputs, calls)
}

// reduceScatterCall returns the maker of one reduce_scatter call with r.
func (b *Backend) reduceScatterCall(r backend.ReduceOp) func(in, out *tensor.Tensor) (call, error) {
	return func(in, out *tensor.Tensor) (call, error) {
		if in.NBytes() != out.NBytes()*b.size {
			return call{}, fmt.Errorf("%w: input of %d bytes for %d ranks of %d", backend.ErrInvalidArgument, in.NBytes(), b.size, out.NBytes())
		}
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
	if len(outputs) != b.size || len(inputs) != b.size {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("alltoall needs %d inputs and outputs", b.size))
	}
	dev, err := deviceOf(m.Op, inputs, outputs)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	var calls []call
	for r := range b.size {
		dt, err := ncclType(inputs[r].DType())
		if err != nil {
			return nil, b.wrapErr(m, err)
		}
		calls = append(calls, call{kind: C.GN_SEND, send: inputs[r].Ptr(), count: inputs[r].Numel(), dt: dt, root: r},
			call{kind: C.GN_RECV, recv: outputs[r].Ptr(), count: outputs[r].Numel(), dt: dt, root: r})
	}
	return b.submit(ctx, m, dev, opts.Async, inputs, outputs, calls)
}

// AlltoallBase implements backend.Backend: ncclAlltoAll for equal parts
// when the library has it, else a group of sends and receives.
func (b *Backend) AlltoallBase(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AlltoallBaseOptions) (backend.Work, error) {
	dev, err := device(m.Op, input, output)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	dt, err := ncclType(input.DType())
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	ins, outs := []*tensor.Tensor{input}, []*tensor.Tensor{output}
	rowElems := func(t *tensor.Tensor) int {
		if t.Dim() == 0 || t.Shape()[0] == 0 {
			return 0
		}
		return t.Numel() / t.Shape()[0]
	}
	es := input.DType().Size()
	if len(opts.InputSplitSizes) == 0 && len(opts.OutputSplitSizes) == 0 {
		if input.Numel()%b.size != 0 || output.Numel() != input.Numel() {
			return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("alltoall_base of %v into %v over %d ranks", input, output, b.size))
		}
		n := input.Numel() / b.size
		if hasSymbol("ncclAlltoAll") {
			return b.submit(ctx, m, dev, opts.Async, ins, outs, []call{{kind: C.GN_ALLTOALL, send: input.Ptr(), recv: output.Ptr(), count: n, dt: dt}})
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

// rooted checks the tensors of gather and scatter: this rank's own single
// tensor (one) and, on the root, one list (lists[0], named listName in
// errors) of a tensor per rank. It returns them with their device and NCCL
// type; the list is nil off the root.
func (b *Backend) rooted(m backend.Meta, one []*tensor.Tensor, lists [][]*tensor.Tensor, root int, listName string) (*tensor.Tensor, []*tensor.Tensor, int, C.int, error) {
	if len(one) != 1 {
		return nil, nil, 0, 0, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("NCCL takes one tensor per process"))
	}
	own := one[0]
	var list []*tensor.Tensor
	if b.rank == root {
		if len(lists) != 1 || len(lists[0]) != b.size {
			return nil, nil, 0, 0, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("the root needs one list of %d %s", b.size, listName))
		}
		list = lists[0]
	}
	dev, err := deviceOf(m.Op, one[:1], list)
	if err != nil {
		return nil, nil, 0, 0, b.wrapErr(m, err)
	}
	dt, err := ncclType(own.DType())
	if err != nil {
		return nil, nil, 0, 0, b.wrapErr(m, err)
	}
	return own, list, dev, dt, nil
}

// Gather implements backend.Backend: sends to the root, which receives one
// per rank (sizes may differ).
func (b *Backend) Gather(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.GatherOptions) (backend.Work, error) {
	in, outs, dev, dt, err := b.rooted(m, inputs, outputs, opts.RootRank, "outputs")
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
	out, ins, dev, dt, err := b.rooted(m, outputs, inputs, opts.RootRank, "inputs")
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

// p2p runs a send or receive on the pair communicator "lo:hi", or, inside a
// coalescing block, on the device communicator (batch_isend_irecv).
func (b *Backend) pointToPoint(ctx context.Context, m backend.Meta, kind C.int, t *tensor.Tensor, peer int, async bool) (backend.Work, error) {
	dev, err := device(m.Op, t)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	if peer < 0 || peer >= b.size || peer == b.rank {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("peer rank %d (this is rank %d of %d)", peer, b.rank, b.size))
	}
	dt, err := ncclType(t.DType())
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	k := call{kind: kind, send: t.Ptr(), recv: t.Ptr(), count: t.Numel(), dt: dt, root: peer}
	ts := []*tensor.Tensor{t}
	if b.coalescing.Load() {
		return nil, b.queue(ctx, m, dev, async, ts, nil, []call{k})
	}
	if err := b.usable(m.Op); err != nil {
		return nil, err
	}
	c, pairPeer, err := b.getP2PComm(ctx, dev, peer)
	if err != nil {
		return nil, b.wrapErr(m, err)
	}
	k.root = pairPeer
	return b.issue(ctx, m, c, async, ts, nil, k)
}

// Send implements backend.Backend. The tag is ignored, as NCCL has none.
func (b *Backend) Send(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, dst int, opts backend.SendOptions) (backend.Work, error) {
	if len(tensors) != 1 {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("NCCL takes one tensor per process"))
	}
	return b.pointToPoint(ctx, m, C.GN_SEND, tensors[0], dst, opts.Async)
}

// Recv implements backend.Backend. The tag is ignored, as NCCL has none.
func (b *Backend) Recv(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, src int, opts backend.RecvOptions) (backend.Work, error) {
	if len(tensors) != 1 {
		return nil, b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("NCCL takes one tensor per process"))
	}
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
	w, err := b.issue(ctx, m, c, true, nil, nil, call{kind: C.GN_ALLREDUCE, send: c.scratch.Ptr(), recv: c.scratch.Ptr(), count: 1, dt: 7})
	if err != nil {
		return nil, err
	}
	w.(*Work).barrier = true
	return w, nil
}
