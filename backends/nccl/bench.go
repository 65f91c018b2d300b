package nccl

/*
#include "nccl_dl.h"
*/
import "C"

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// rawAllreduce issues iters float32 sum allreduces of t, in place, straight
// from C on stream s with device dev's communicator: the raw-NCCL baseline
// that benchmarks compare the backend with. It returns the host time spent
// issuing them.
func (b *Backend) rawAllreduce(ctx context.Context, t *tensor.Tensor, s *cuda.Stream, iters int) (time.Duration, error) {
	return b.benchCall(ctx, "raw allreduce", t, func(c *comm, _ *cuda.Event, dt C.int) (C.longlong, error) {
		return C.gn_bench_raw(C.uintptr_t(c.ctx), C.uintptr_t(c.handle), C.uintptr_t(s.Handle()), C.uintptr_t(t.Ptr()), C.size_t(t.Numel()), dt, C.int(iters)), nil
	})
}

// RawAllreduce is NCCL's own call, the peer of host-cost benchmarks
// (`conftest bench hostcost`): iters in-place SUM allreduces of t (a CUDA
// tensor of a dtype NCCL has), issued by a C loop on stream s with the
// communicator of t's device, no events, no Go in between. It returns the
// host time the C loop measured around its calls.
func (b *Backend) RawAllreduce(ctx context.Context, t *tensor.Tensor, s *cuda.Stream, iters int) (time.Duration, error) {
	if iters < 1 {
		return 0, fmt.Errorf("nccl: RawAllreduce of %d calls", iters)
	}
	return b.rawAllreduce(ctx, t, s, iters)
}

// FloorAllreduce is the CUDA floor of the backend's async allreduce +
// Wait, the second peer of `conftest bench hostcost`: iters calls from a C
// loop, each making the driver calls that launch and Wait make (context
// check, sync event record on s, the internal stream's wait on it, the
// capture query, ncclAllReduce on the internal stream, the end event's
// record, s's wait on it) on t in place, with events of the communicator's
// own. What the backend costs above it is Go's.
func (b *Backend) FloorAllreduce(ctx context.Context, t *tensor.Tensor, s *cuda.Stream, iters int) (time.Duration, error) {
	return b.floor(ctx, "FloorAllreduce", t, iters, func(c *comm, end *cuda.Event, dt C.int) C.longlong {
		return C.gn_bench_floor(C.uintptr_t(c.ctx), C.uintptr_t(c.handle), C.uintptr_t(c.stream.Handle()), C.uintptr_t(s.Handle()),
			C.uintptr_t(c.syncEv.Handle()), C.uintptr_t(end.Handle()), C.uintptr_t(t.Ptr()), C.size_t(t.Numel()), dt, C.int(iters))
	})
}

// FloorAllreduceCurrentStream is FloorAllreduce for
// Options.AsyncOnCurrentStream: iters calls from a C loop, each making the
// driver calls of an async allreduce + Wait in that mode (context check,
// capture query, ncclAllReduce on s, the end event's record on s; Wait on
// s makes none) on t in place.
func (b *Backend) FloorAllreduceCurrentStream(ctx context.Context, t *tensor.Tensor, s *cuda.Stream, iters int) (time.Duration, error) {
	return b.floor(ctx, "FloorAllreduceCurrentStream", t, iters, func(c *comm, end *cuda.Event, dt C.int) C.longlong {
		return C.gn_bench_floor_cur(C.uintptr_t(c.ctx), C.uintptr_t(c.handle), C.uintptr_t(s.Handle()), C.uintptr_t(end.Handle()),
			C.uintptr_t(t.Ptr()), C.size_t(t.Numel()), dt, C.int(iters))
	})
}

// CrossingAllreduceCurrentStream makes FloorAllreduceCurrentStream's
// driver and NCCL calls from a Go loop, one cgo call per op (the one the
// backend's issue makes) and no other Go work: what it costs over the C
// loop is the crossing, and what the backend's call costs over it is the
// backend's Go (`conftest bench hostcost`). The end event is re-recorded,
// as in the C loop.
func (b *Backend) CrossingAllreduceCurrentStream(ctx context.Context, t *tensor.Tensor, s *cuda.Stream, iters int) error {
	if iters < 1 {
		return fmt.Errorf("nccl: CrossingAllreduceCurrentStream of %d calls", iters)
	}
	return b.issueLoop(ctx, t, s, iters)
}

// floor runs one of the C floor loops (call); name is the exported
// function's, for errors.
func (b *Backend) floor(ctx context.Context, name string, t *tensor.Tensor, iters int, call func(c *comm, end *cuda.Event, dt C.int) C.longlong) (time.Duration, error) {
	if iters < 1 {
		return 0, fmt.Errorf("nccl: %s of %d calls", name, iters)
	}
	return b.benchCall(ctx, name, t, func(c *comm, end *cuda.Event, dt C.int) (C.longlong, error) {
		return call(c, end, dt), nil
	})
}

// benchCall runs one of the C benchmark loops (call) with t's
// communicator locked, an end event of the communicator's own (which the
// raw loop leaves unused) and t's dtype in NCCL's numbering, and returns
// the host time the loop measured, or its failure (a negative result)
// under name.
func (b *Backend) benchCall(ctx context.Context, name string, t *tensor.Tensor, call func(c *comm, end *cuda.Event, dt C.int) (C.longlong, error)) (time.Duration, error) {
	c, err := b.getComm(ctx, t.Device().Index)
	if err != nil {
		return 0, err
	}
	dt, err := ncclType(t.DType())
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	end, err := c.event(false)
	if err != nil {
		return 0, err
	}
	defer c.putEvents(end)
	ns, err := call(c, end, dt)
	if err != nil {
		return 0, err
	}
	if ns < 0 {
		return 0, fmt.Errorf("nccl: %s failed (%d): %s", name, ns, C.GoString(C.gn_last_error()))
	}
	return time.Duration(ns), nil
}

// callSlots names gn_bench_calls' slots, in its order (GN_S_*).
var callSlots = [...]string{"clock", "ctx-check", "record-sync", "wait-sync", "capture-query", "ncclAllReduce",
	"record-end", "ctx-check-wait", "wait-end", "query-end"}

// callsBench is the state of driverCalls across batches: the sync events
// of mode 1 and the words of mode 2, made once, and the next word value.
type callsBench struct {
	nsync   int // sync events of mode 1 (0: 64)
	syncEvs []*cuda.Event
	words   *cuda.HostBuffer
	base    uint32
}

func (cb *callsBench) free() {
	for _, e := range cb.syncEvs {
		e.Destroy()
	}
	if cb.words != nil {
		cb.words.Free()
	}
}

// driverCalls runs gn_bench_calls: iters floor iterations on t in place
// from C, each driver call timed on its own, added into ns (callSlots).
// mode 0 is the backend's design, 1 a fresh sync event per op, 2 stream
// memory operations instead of events. The caller drains s between
// batches and before cb.free.
func (b *Backend) driverCalls(ctx context.Context, t *tensor.Tensor, s *cuda.Stream, iters, mode int, cb *callsBench, ns *[len(callSlots)]int64) error {
	c, err := b.getComm(ctx, t.Device().Index)
	if err != nil {
		return err
	}
	dt, err := ncclType(t.DType())
	if err != nil {
		return err
	}
	if cb.syncEvs == nil {
		if cb.syncEvs, err = c.dev.NewEvents(max(cb.nsync, 64), false); err != nil {
			return err
		}
		if cb.words, err = c.dev.HostAlloc(256, cuda.HostDeviceMap|cuda.HostPortable); err != nil {
			return err
		}
		clear(cb.words.Bytes())
		var syms [3]uintptr
		for i, n := range []string{"cuEventQuery", "cuStreamWriteValue32_v2", "cuStreamWaitValue32_v2"} {
			if syms[i], err = cuda.Symbol(n); err != nil {
				return err
			}
		}
		C.gn_bench_calls_syms(C.uintptr_t(syms[0]), C.uintptr_t(syms[1]), C.uintptr_t(syms[2]))
	}
	evs := make([]C.uintptr_t, len(cb.syncEvs))
	for i, e := range cb.syncEvs {
		evs[i] = C.uintptr_t(e.Handle())
	}
	var out [C.GN_SLOTS]C.longlong
	c.mu.Lock()
	defer c.mu.Unlock()
	end, err := c.event(false)
	if err != nil {
		return err
	}
	defer c.putEvents(end)
	hostB := (*C.uint)(unsafe.Add(cb.words.Pointer(), 128))
	r := C.gn_bench_calls(C.uintptr_t(c.ctx), C.uintptr_t(c.handle), C.uintptr_t(c.stream.Handle()), C.uintptr_t(s.Handle()),
		&evs[0], C.int(len(evs)), C.uintptr_t(end.Handle()), C.uintptr_t(cb.words.DevicePtr()), C.uintptr_t(cb.words.DevicePtr()+128),
		hostB, C.uintptr_t(t.Ptr()), C.size_t(t.Numel()), dt, C.int(iters), C.int(mode), C.uint(cb.base), &out[0])
	cb.base += uint32(iters)
	if r != 0 {
		return fmt.Errorf("nccl: driver-call bench failed (%d): %s", r, C.GoString(C.gn_last_error()))
	}
	for i := range ns {
		ns[i] += int64(out[i])
	}
	return nil
}

// issueLoop is the Go side of BenchmarkIssueCrossing: iters calls of
// gn_issue from a Go loop, one cgo crossing each and no other Go work, with
// the arguments of a current-stream async allreduce of t in place on s
// (no sync event, one end event re-recorded). What it costs above the C
// loop of the same calls (FloorAllreduceCurrentStream) is the crossing;
// what the backend costs above it is the backend's Go.
func (b *Backend) issueLoop(ctx context.Context, t *tensor.Tensor, s *cuda.Stream, iters int) error {
	_, err := b.benchCall(ctx, "issue loop", t, func(c *comm, end *cuda.Event, dt C.int) (C.longlong, error) {
		for range iters {
			r := C.gn_issue(C.uintptr_t(c.ctx), C.uintptr_t(c.handle), C.uintptr_t(s.Handle()), C.uintptr_t(s.Handle()), 0, 0,
				C.uintptr_t(end.Handle()), C.GN_ALLREDUCE, C.uintptr_t(t.Ptr()), C.uintptr_t(t.Ptr()), C.size_t(t.Numel()), dt, 0, 0, 0)
			if err := result("ncclAllReduce", r); err != nil {
				return 0, err
			}
		}
		return 0, nil
	})
	return err
}

// rotBench is the state of the rotating-event variants of
// BenchmarkIssueCrossing across batches: the events, their handles for C,
// and the next one to record.
type rotBench struct {
	evs  []*cuda.Event
	hs   []C.uintptr_t
	next C.int
}

func newRotBench(c *comm, n int) (*rotBench, error) {
	evs, err := c.dev.NewEvents(n, false)
	if err != nil {
		return nil, err
	}
	rb := &rotBench{evs: evs, hs: make([]C.uintptr_t, n)}
	for i, e := range evs {
		rb.hs[i] = C.uintptr_t(e.Handle())
	}
	return rb, nil
}

// free destroys the events; the caller drained their stream.
func (rb *rotBench) free() {
	for _, e := range rb.evs {
		e.Destroy()
	}
}

// floorCurEvs is FloorAllreduceCurrentStream recording a different end
// event per op, of rb's in turn (gn_bench_floor_cur_evs).
func (b *Backend) floorCurEvs(ctx context.Context, t *tensor.Tensor, s *cuda.Stream, rb *rotBench, iters int) error {
	_, err := b.benchCall(ctx, "floor, rotating events", t, func(c *comm, _ *cuda.Event, dt C.int) (C.longlong, error) {
		return C.gn_bench_floor_cur_evs(C.uintptr_t(c.ctx), C.uintptr_t(c.handle), C.uintptr_t(s.Handle()), &rb.hs[0], C.int(len(rb.hs)), &rb.next,
			C.uintptr_t(t.Ptr()), C.size_t(t.Numel()), dt, C.int(iters)), nil
	})
	return err
}

// issueLoopEvs is issueLoop recording a different end event per op, of
// rb's in turn.
func (b *Backend) issueLoopEvs(ctx context.Context, t *tensor.Tensor, s *cuda.Stream, rb *rotBench, iters int) error {
	_, err := b.benchCall(ctx, "issue loop, rotating events", t, func(c *comm, _ *cuda.Event, dt C.int) (C.longlong, error) {
		k := int(rb.next)
		for range iters {
			r := C.gn_issue(C.uintptr_t(c.ctx), C.uintptr_t(c.handle), C.uintptr_t(s.Handle()), C.uintptr_t(s.Handle()), 0, 0,
				rb.hs[k], C.GN_ALLREDUCE, C.uintptr_t(t.Ptr()), C.uintptr_t(t.Ptr()), C.size_t(t.Numel()), dt, 0, 0, 0)
			if err := result("ncclAllReduce", r); err != nil {
				return 0, err
			}
			if k++; k == len(rb.hs) {
				k = 0
			}
		}
		rb.next = C.int(k)
		return 0, nil
	})
	return err
}

// commFor is t's communicator, for the benchmarks' set-up.
func (b *Backend) commFor(ctx context.Context, t *tensor.Tensor) (*comm, error) {
	return b.getComm(ctx, t.Device().Index)
}
