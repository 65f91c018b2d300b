package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/reduce"
	"github.com/gocoll/gocoll/tensor"
)

// UCC collective types (ucc_coll_type_t).
const (
	collAllgather     = 1 << 0
	collAllgatherv    = 1 << 1
	collAllreduce     = 1 << 2
	collAlltoall      = 1 << 3
	collAlltoallv     = 1 << 4
	collBarrier       = 1 << 5
	collBcast         = 1 << 6
	collGather        = 1 << 9
	collReduce        = 1 << 11
	collReduceScatter = 1 << 12
	collScatter       = 1 << 14
)

// ucc_coll_args_flags_t.
const (
	flagInPlace = 1 << 0
	flag64      = 1<<2 | 1<<3 // COUNT_64BIT | DISPLACEMENTS_64BIT: the _v arrays are uint64
)

// UCC datatypes: UCC_PREDEFINED_DT(id) is id << 3.
func predefined(id uint64) uint64 { return id << 3 }

var dtBytes = predefined(5) // UCC_DT_UINT8: ops that only move data move bytes

// ucc_reduction_op_t.
const (
	opSum  = 0
	opProd = 1
	opMax  = 2
	opMin  = 3
	opBAnd = 7
	opBOr  = 8
	opBXor = 9
)

// dummy stands in for the buffer of an empty tensor: UCC gets a valid
// address with a count of zero.
var dummy [64]byte

// plan is an op being turned into UCC collectives; it lives in its work
// (newWork), so that planning an op allocates nothing of its own.
type plan struct {
	b       *Backend
	w       *work // the work this plan is part of
	op      backend.Op
	m       backend.Meta
	descs   []C.gu_desc
	pins    [][]byte   // host buffers UCC will point into
	arrs    [][]uint64 // counts and displacements arrays
	after   func()
	outputs []*tensor.Tensor
	barrier bool
	// small is the tensor of an in-place allreduce that goes through the
	// backend's C slab (small.go); descs[0] gets its slot's address.
	small []byte
}

func (b *Backend) plan(op backend.Op, m backend.Meta, outputs []*tensor.Tensor) *plan {
	return &b.newWork(op, m, outputs).plan
}

// buf is the address of bs for UCC; it is pinned until UCC is done.
func (p *plan) buf(bs []byte) C.uintptr_t {
	if len(bs) == 0 {
		return C.uintptr_t(uintptr(unsafe.Pointer(&dummy[0])))
	}
	p.pins = append(p.pins, bs)
	return C.uintptr_t(uintptr(unsafe.Pointer(&bs[0])))
}

// arr is the address of a counts or displacements array.
func (p *plan) arr(v []uint64) C.uintptr_t {
	if len(v) == 0 {
		return C.uintptr_t(uintptr(unsafe.Pointer(&dummy[0])))
	}
	p.arrs = append(p.arrs, v)
	return C.uintptr_t(uintptr(unsafe.Pointer(&v[0])))
}

// vec makes the counts and displacements (prefix sums) of sizes.
func (p *plan) vec(sizes []int) (counts, displs C.uintptr_t) {
	c, d := make([]uint64, len(sizes)), make([]uint64, len(sizes))
	off := 0
	for i, s := range sizes {
		c[i], d[i] = uint64(s), uint64(off)
		off += s
	}
	return p.arr(c), p.arr(d)
}

func (p *plan) add(d C.gu_desc) { p.descs = append(p.descs, d) }

// inlineBytes bounds the ops that submit progresses once at issue: UCC's
// small-message range (its allreduce switches algorithms at 4 KiB), where a
// progress round is a few hundred nanoseconds; a larger op's round can be
// a copy or reduction that an asynchronous caller would rather not wait
// for at issue.
const inlineBytes = 4 << 10

// inline reports whether the op is small enough for submit to progress
// it at issue (inlineBytes over its host buffers).
func (p *plan) inline() bool {
	n := 0
	for _, bs := range p.pins {
		n += len(bs)
	}
	return n <= inlineBytes
}

// errKind maps a UCC init or post failure to the sentinel it wraps.
func errKind(err error) error {
	var ue *Error
	if errors.As(err, &ue) {
		switch {
		case ue.unsupported():
			return backend.ErrUnsupported
		case ue.Status == -3: // UCC_ERR_INVALID_PARAM
			return backend.ErrInvalidArgument
		}
	}
	return backend.ErrUnavailable
}

// submit initialises and posts the plan's collectives, in order, under
// b.mu (so every rank posts in issue order), and returns the op's work.
// An init that fails finalises the ones before it: nothing is posted and
// the error (ErrUnsupported when UCC has no algorithm) comes back now.
func (b *Backend) submit(ctx context.Context, p *plan) (backend.Work, error) {
	_ = ctx
	// A caller in the backend, as a drive is: the progress goroutine
	// keeps out of UCC while callers come (backend.go's progress). Why
	// here too: UCC's post of a large op runs for milliseconds (1.4 ms at
	// 16 MiB), long enough for the progress goroutine to see no drive
	// for a nap, take b.mu for a progress round of milliseconds more and
	// leave the next Wait spinning on TryLock: a third busy thread.
	b.drives.Add(1)
	b.lockOut() // a goroutine driving progress in Wait lets this in (drive.go)
	h, err := b.submitLocked(p)
	resched := b.reschedDueLocked()
	b.mu.Unlock()
	if resched {
		runtime.Gosched()
	}
	return h, err
}

// submitLocked is submit's body, under b.mu. It returns a nil Work with
// an error.
func (b *Backend) submitLocked(p *plan) (backend.Work, error) {
	w := p.w
	if err := b.usableLocked(p.op, p.m.Seq); err != nil {
		return nil, err
	}
	if p.small != nil && !b.smallLocked(w) {
		// No slot free: UCC gets the tensor itself, pinned.
		p.descs[0].src = p.buf(p.small)
		p.descs[0].dst = p.descs[0].src
		p.small = nil
	}
	for _, bs := range p.pins {
		w.pin.Pin(&bs[0])
	}
	for _, a := range p.arrs {
		w.pin.Pin(&a[0])
	}
	if len(p.descs) <= len(w.reqv) {
		w.reqs = w.reqv[:len(p.descs)]
	} else {
		w.reqs = make([]C.uintptr_t, len(p.descs))
	}
	if p.barrier {
		for _, o := range b.pending {
			if !o.IsCompleted() {
				w.deps = append(w.deps, o.h)
			}
		}
		if w.deps != nil {
			b.holds.Add(1) // until testLocked lets them go
		}
	}
	w.h.enq = b.issued(p.m)
	if b.fp != nil && (w.fpw.on || len(b.fp.q) > 0) {
		return b.fpSubmitLocked(p)
	}
	var perr error
	live := len(w.reqs)
	if len(p.descs) > 0 {
		// Init and post in one crossing (gu_coll_start): an op costs one
		// cgo call to issue, as a C caller's two library calls do. A small
		// op is progressed once there too (inline): when the peers posted
		// theirs first, it is done before Wait, which then costs no
		// crossing.
		var pctx C.uintptr_t
		if len(w.deps) == 0 && p.inline() {
			pctx = b.ctx
		}
		st := C.gu_coll_start(b.team, &p.descs[0], C.int(len(p.descs)), &w.reqs[0], &w.at, &w.post, pctx, &w.cerr)
		if st >= 0 {
			live = int(st)
		} else {
			if w.post == 0 {
				w.pin.Unpin()
				if w.slot != 0 {
					b.smallDoneLocked(w, false) // UCC never ran it
				}
				err := &Error{Call: "ucc_collective_init", Status: int(st)}
				return nil, &backend.OpError{Op: p.op.String(), Seq: p.m.Seq, Rank: b.cfg.Rank, Backend: Name, Kind: errKind(err), Err: err,
					Detail: fmt.Sprintf("collective %d of %d of the op", int(w.at)+1, len(p.descs))}
			}
			// The ones before are posted and stay, as after a timeout.
			err := &Error{Call: "ucc_collective_post", Status: int(st)}
			w.reqs = w.reqs[:w.at]
			perr = &backend.OpError{Op: p.op.String(), Seq: p.m.Seq, Rank: b.cfg.Rank, Backend: Name, Kind: errKind(err), Err: err}
			w.fail(perr)
		}
	}
	w.live = min(live, len(w.reqs))
	w.noteErr()
	h := w.h
	if w.live == 0 && len(w.deps) == 0 {
		// Nothing posted, or all of it done inline: complete now (after,
		// the unpin, a UCC failure's error), without the pending list;
		// the record goes back to the pool.
		w.testLocked(true)
		if perr != nil {
			return nil, perr
		}
		return h, nil
	}
	b.pending = append(b.pending, w)
	b.npending.Store(int32(len(b.pending)))
	if perr != nil {
		return nil, perr
	}
	// The watchdog learns of the work only if it outlives a tick of the
	// progress goroutine (watchLocked): most ops finish sooner, and an
	// entry per op would cost an append and keep the work alive for a tick.
	b.wake()
	return h, nil
}

// hostChecker is ucc's argument checker for rank (backend.HostChecker,
// which cpupool shares): reductions map to UCC (reductionOf), and a device
// tensor is unsupported rather than invalid, since UCC itself has CUDA
// components that Debian's build leaves out.
func hostChecker(rank int) backend.HostChecker[reduction] {
	return backend.HostChecker[reduction]{Backend: Name, Rank: rank, Lookup: reductionOf, OffHostKind: backend.ErrUnsupported,
		OffHostDetail: func(d tensor.Device) string {
			return fmt.Sprintf("tensor on %s: the ucc backend serves CPU tensors (Debian's UCC has no CUDA components)", d)
		}}
}

// reduction is how one reduce op on one dtype runs: UCC's datatype and
// op, and gocoll's kernel for what UCC lacks (PREMUL_SUM's scaling before,
// AVG's division after, the combine of several local tensors).
//
// A reduction of float16 or a float8 type is wide: UCC reduces float32
// scratch (wide is the caller's dtype, ratio 4 / its size), the kernel is
// float32's, and back rounds the result to the caller's dtype once.
type reduction struct {
	k       reduce.Kernel
	dt, op  uint64
	elemLen int // the size of the elements UCC reduces

	wide  tensor.DType
	ratio int // bytes UCC reduces per byte of the caller's tensor
}

// reductionOf maps (dt, op) to UCC. UCC reduces integers, float32/64 and
// bfloat16; float16 and the float8 types reduce wide, as float32; bool
// reduces as uint8 0/1 (SUM and MAX as MAX, PRODUCT and MIN as MIN). It is
// the lookup of b.args (hostChecker), which makes its errors OpErrors.
func reductionOf(dt tensor.DType, op backend.ReduceOp) (reduction, error) {
	k, err := reduce.For(dt, op)
	if err != nil {
		return reduction{}, err
	}
	r, err := uccReduction(dt, op)
	if err != nil {
		return reduction{}, err
	}
	r.k = k
	if r.ratio != 1 {
		if r.k, err = reduce.For(tensor.Float32, op); err != nil {
			return reduction{}, err
		}
	}
	return r, nil
}

// uccReduction is reductionOf without gocoll's kernel (r.k is zero): UCC's
// datatype and op and the widening, for a caller that has no local
// combine to do (allreduceOne).
func uccReduction(dt tensor.DType, op backend.ReduceOp) (reduction, error) {
	r := reduction{elemLen: dt.Size(), ratio: 1}
	switch dt {
	case tensor.Float16, tensor.Float8E4M3, tensor.Float8E5M2:
		// UCC 1.9's CPU float16 reductions return wrong sums (seen at 2
		// ranks: a rank's own values back) and UCC has no float8 types:
		// reduce in float32 and round once at the end, which matches or
		// beats torch's own rounding.
		r.dt, r.elemLen, r.wide, r.ratio = predefined(11), 4, dt, 4/dt.Size()
	case tensor.Int8:
		r.dt = predefined(0)
	case tensor.Int32:
		r.dt = predefined(2)
	case tensor.Int64:
		r.dt = predefined(3)
	case tensor.Uint8, tensor.Bool:
		r.dt = predefined(5)
	case tensor.Float32:
		r.dt = predefined(11)
	case tensor.Float64:
		r.dt = predefined(12)
	case tensor.BFloat16:
		r.dt = predefined(13)
	default:
		return reduction{}, backend.Errorf(backend.ErrUnsupported, "", "UCC has no %s datatype to reduce", dt)
	}
	switch op.Type {
	case backend.Sum, backend.Avg, backend.PreMulSum:
		r.op = opSum
	case backend.Product:
		r.op = opProd
	case backend.Min:
		r.op = opMin
	case backend.Max:
		r.op = opMax
	case backend.BAnd:
		r.op = opBAnd
	case backend.BOr:
		r.op = opBOr
	case backend.BXor:
		r.op = opBXor
	}
	if dt == tensor.Bool {
		switch op.Type {
		case backend.Product, backend.Min, backend.BAnd:
			r.op = opMin
		case backend.BXor:
			r.op = opBXor
		default:
			r.op = opMax
		}
	}
	return r, nil
}

// count is the number of elements of bs.
func (r reduction) count(bs []byte) C.uint64_t { return C.uint64_t(len(bs) / r.elemLen) }

// post finishes a reduced buffer (AVG's division).
func (r reduction) post(buf []byte, contributions int) {
	if r.k.Post != nil {
		r.k.Post(buf, contributions)
	}
}

// combineLocal scales (PREMUL_SUM) and reduces this rank's tensors into
// bufs[into], Gloo's handling of several tensors per call.
func (r reduction) combineLocal(bufs [][]byte, into int) []byte {
	if r.k.Pre != nil {
		for _, o := range bufs {
			r.k.Pre(o)
		}
	}
	buf := bufs[into]
	for i, o := range bufs {
		if i != into {
			r.k.Combine(buf, o)
		}
	}
	return buf
}

// in returns the bytes UCC reduces for the caller's buf: buf itself, or
// a float32 copy of it for a wide reduction.
func (r reduction) in(buf []byte) []byte {
	if r.ratio == 1 {
		return buf
	}
	out := make([]byte, len(buf)*r.ratio)
	switch r.wide {
	case tensor.Float16:
		for i := 0; i+2 <= len(buf); i += 2 {
			binary.LittleEndian.PutUint32(out[2*i:], math.Float32bits(tensor.Float16ToFloat32(binary.LittleEndian.Uint16(buf[i:]))))
		}
	case tensor.Float8E4M3:
		for i, v := range buf {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(tensor.Float8E4M3ToFloat32(v)))
		}
	default: // Float8E5M2
		for i, v := range buf {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(tensor.Float8E5M2ToFloat32(v)))
		}
	}
	return out
}

// ins is in of every buffer.
func (r reduction) ins(bufs [][]byte) [][]byte {
	if r.ratio == 1 {
		return bufs
	}
	out := make([][]byte, len(bufs))
	for i, b := range bufs {
		out[i] = r.in(b)
	}
	return out
}

// scratch is where UCC leaves a result meant for out: out itself, or
// float32 scratch for a wide reduction.
func (r reduction) scratch(out []byte) []byte {
	if r.ratio == 1 {
		return out
	}
	return make([]byte, len(out)*r.ratio)
}

// back puts a result (from in or scratch) into the caller's dst: a copy,
// none when it is dst itself, or the one rounding of a wide reduction.
func (r reduction) back(dst, res []byte) {
	if len(dst) == 0 {
		return
	}
	if r.ratio == 1 {
		if &dst[0] != &res[0] {
			copy(dst, res)
		}
		return
	}
	f := func(i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(res[4*i:])) }
	switch r.wide {
	case tensor.Float16:
		for i := 0; i+2 <= len(dst); i += 2 {
			binary.LittleEndian.PutUint16(dst[i:], tensor.Float16FromFloat32(f(i/2)))
		}
	case tensor.Float8E4M3:
		for i := range dst {
			dst[i] = tensor.Float8E4M3FromFloat32(f(i))
		}
	default: // Float8E5M2
		for i := range dst {
			dst[i] = tensor.Float8E5M2FromFloat32(f(i))
		}
	}
}

// scaled returns in, or a scaled copy of it when the op pre-scales, so
// that the caller's input is left as it was; a wide reduction's is a
// float32 copy in any case.
func (r reduction) scaled(in []byte) []byte {
	if r.ratio != 1 {
		c := r.in(in)
		if r.k.Pre != nil {
			r.k.Pre(c)
		}
		return c
	}
	if r.k.Pre == nil {
		return in
	}
	c := append([]byte(nil), in...)
	r.k.Pre(c)
	return c
}

func flat(lists [][]*tensor.Tensor) []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

func pack(bufs [][]byte) ([]byte, []int) {
	n := 0
	sizes := make([]int, len(bufs))
	for i, x := range bufs {
		n += len(x)
		sizes[i] = len(x)
	}
	out := make([]byte, 0, n)
	for _, x := range bufs {
		out = append(out, x...)
	}
	return out, sizes
}

func unpack(packed []byte, bufs [][]byte) {
	off := 0
	for _, x := range bufs {
		off += copy(x, packed[off:])
	}
}

func allEqual(sizes []int) bool {
	for _, s := range sizes {
		if s != sizes[0] {
			return false
		}
	}
	return true
}
