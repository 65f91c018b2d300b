package nccl

/*
#include "nccl_dl.h"
*/
import "C"

import (
	"context"
	"fmt"
	"time"

	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// rawAllreduce issues iters float32 sum allreduces of t, in place, straight
// from C on stream s with device dev's communicator: the raw-NCCL baseline
// that benchmarks compare the backend with. It returns the host time spent
// issuing them.
func (b *Backend) rawAllreduce(ctx context.Context, t *tensor.Tensor, s *cuda.Stream, iters int) (time.Duration, error) {
	c, err := b.getComm(ctx, t.Device().Index)
	if err != nil {
		return 0, err
	}
	dt, err := ncclType(t.DType())
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	ns := C.gn_bench_raw(C.uintptr_t(c.ctx), C.uintptr_t(c.handle), C.uintptr_t(s.Handle()), C.uintptr_t(t.Ptr()), C.size_t(t.Numel()), dt, C.int(iters))
	c.mu.Unlock()
	if ns < 0 {
		return 0, fmt.Errorf("nccl: raw allreduce failed (%d): %s", ns, C.GoString(C.gn_last_error()))
	}
	return time.Duration(ns), nil
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
	if iters < 1 {
		return 0, fmt.Errorf("nccl: FloorAllreduce of %d calls", iters)
	}
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
	ns := C.gn_bench_floor(C.uintptr_t(c.ctx), C.uintptr_t(c.handle), C.uintptr_t(c.stream.Handle()), C.uintptr_t(s.Handle()),
		C.uintptr_t(c.syncEv.Handle()), C.uintptr_t(end.Handle()), C.uintptr_t(t.Ptr()), C.size_t(t.Numel()), dt, C.int(iters))
	if ns < 0 {
		return 0, fmt.Errorf("nccl: floor allreduce failed (%d): %s", ns, C.GoString(C.gn_last_error()))
	}
	return time.Duration(ns), nil
}
