// Package stage lets a host backend (cpupool, ucc) take CUDA tensors, in
// UCC's execution-engine model: an op on CUDA tensors is ordered on the
// caller's current stream and the host does not block when it is issued.
//
// Wrap puts a Backend in front of a host backend. An op on CUDA tensors is
// staged through pinned host memory on an internal stream per device
// (Engine.Stage queues it all at issue, without blocking):
//
//  1. an event recorded on the caller's current stream, which the internal
//     stream waits on;
//  2. copies of the device tensors into pinned host tensors;
//  3. a hold (a stream gate) that opens once the host collective is done;
//  4. copies of the outputs back to the device, and an end event.
//
// The wrapper's issuer goroutine waits for step 2 on the host and then
// issues the host backend's op on the host tensors, in issue order: ops
// issued while a staged op waits for its copies, CPU ones too, are issued
// after it, so every rank issues the same sequence to the host backend.
// Work.Wait makes ctx's current stream wait on the end event and returns
// (nccl's stream semantics); BlockStream orders any stream of the device;
// WaitHost blocks until the end event has completed, or ctx ends first
// (*backend.WaitError). The op's timeout, counted from issue, goes to the
// host op, so a timeout, the time the stream held the op included, is found
// and reported by the host backend's watchdog as any host op's is. The
// device tensors stay stashed until the end event has completed.
//
// The package is free of cgo: the device side is the Engine interface,
// which internal/stage/cudastage implements over package cuda, and tests
// replace with a fake.
package stage

import (
	"context"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// Engine is the device side of staging on one CUDA device: its internal
// stream and its pinned host buffers.
type Engine interface {
	// Stage queues, on the internal stream and without blocking, what one
	// op needs: a wait for ctx's current stream, copies of ts to host
	// tensors, a hold until Staged.Release, copies back of the ts[i] with
	// back[i], and an end event. It retains (stashes) ts until Free.
	Stage(ctx context.Context, ts []*tensor.Tensor, back []bool) (Staged, error)
	// Stream is the internal stream (a *cuda.Stream), for tests that hold it.
	Stream() backend.Stream
	// Close releases the stream and the buffers once no op is staged.
	Close() error
}

// Staged is one op staged by an Engine.
type Staged interface {
	// Host returns the host tensor of each staged device tensor, in order.
	Host() []*tensor.Tensor
	// WaitCopied blocks until the copies to the host have landed, or ctx
	// ends (its error is then returned).
	WaitCopied(ctx context.Context) error
	// Release opens the hold: the copies back and the end event run. It is
	// idempotent.
	Release()
	// WaitDone blocks until the end event has completed, or ctx ends.
	WaitDone(ctx context.Context) error
	// Done reports, without blocking, whether the end event has completed.
	Done() bool
	// OrderCurrent makes ctx's current stream on the op's device wait for
	// the end event, without blocking the host.
	OrderCurrent(ctx context.Context) error
	// OrderStream makes s wait for the end event; s must be a stream of the
	// op's device of the engine's kind (else ErrInvalidArgument).
	OrderStream(s backend.Stream) error
	// Free returns the host buffers to the engine and releases the stash.
	// Call it once the end event has completed.
	Free()
}

// Engines makes (or returns the already made) Engine of CUDA device dev.
type Engines func(dev int) (Engine, error)
