// Package backend defines what a collective backend implements and what it
// returns: the Backend interface (generated from spec/ops.yaml), per-op
// option structs, Work and Future, ReduceOp, the error types, capabilities,
// and the registry that backends join in init(), as database/sql drivers do.
//
// Applications do not call backends directly; they use package dispatcher,
// which validates arguments, numbers ops and routes them by device.
package backend

import (
	"context"
	"time"

	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

//go:generate go run ../gen -spec ../spec/ops.yaml -root ..

// Core is the part of Backend that is not an op: identity, capabilities
// and shutdown. The generated Backend interface embeds it.
type Core interface {
	// Name is the registered name, e.g. "nccl".
	Name() string
	// Capabilities says which semantics the backend provides.
	Capabilities() Capabilities
	// Rank is this process's rank in the backend's group.
	Rank() int
	// Size is the number of ranks in the backend's group.
	Size() int
	// Close waits for issued ops to finish (bounded by ctx) and releases
	// resources. Ops after Close fail with ErrClosed.
	Close(ctx context.Context) error
	// Abort stops the backend at once, without waiting for peers: pending
	// works fail with ErrAborted wrapping reason, and later ops fail with an
	// error that keeps reason.
	Abort(ctx context.Context, reason error) error
}

// Coalescer is implemented by backends that can group several ops into one
// launch with one Work (NCCL's group calls).
type Coalescer interface {
	// StartCoalescing opens a block; ops issued until EndCoalescing are
	// queued, not launched, and return nil Work.
	StartCoalescing(ctx context.Context) error
	// EndCoalescing launches the block and returns its single Work.
	EndCoalescing(ctx context.Context) (Work, error)
}

// Meta is what the dispatcher tells a backend about one op besides its
// arguments.
type Meta struct {
	Op  Op     // which op
	Seq uint64 // the op's number in its counter (collective or p2p)
	// Timeout is the op's timeout, resolved once, by the dispatcher: the
	// op's option, else the group's default. Backends use it as is and
	// resolve nothing. Zero, which only a caller that bypasses the
	// dispatcher passes (a backend's own tests), means no timeout.
	Timeout time.Duration
	// Issued is when the dispatcher numbered the op, on the Mono clock,
	// when it read the clock for the op anyway (the flight recorder, hooks
	// or metrics); zero when it did not. A backend that needs the op's
	// start time (its timeout's origin) takes it from here rather than
	// reading the clock again: a read is ~40 ns on a virtual machine, a
	// few percent of a GPU op's host cost (issue 16).
	Issued time.Duration
	// Waited says the caller waits for the op as soon as the call
	// returns: the dispatcher's blocking forms (AllreduceWait, ...) set
	// it. A host backend that runs small ops on the waiting goroutine
	// need not then arrange for another goroutine to run the op should
	// nobody wait (cpupool's nudge timer, whose wake-ups took a core
	// from the ranks of an oversubscribed host: docs/perf.md, issue 17,
	// twelfth pass).
	Waited bool
}

// Config is what a backend is constructed with.
type Config struct {
	// Store is the group's store, already prefixed for this group.
	Store store.Store
	// Rank and WorldSize are this process's rank and the size, in the group.
	Rank, WorldSize int
	// GlobalRanks maps group ranks to global ranks; nil for the default group.
	GlobalRanks []int
	// GroupName is the group's unique id ("0" for the default group).
	GroupName string
	// GroupDesc is a human description ("default_pg", "default_pg:split:0").
	GroupDesc string
	// Timeout is the group's default op timeout, for bounds of the
	// backend's own (such as cpupool's connect timeout). An op's timeout
	// comes in its Meta.
	Timeout time.Duration
	// Device, when set, asks for eager initialisation on that device.
	Device *tensor.Device
	// Devices are the device types this instance serves: one backend named
	// for several device types ("cpu:cpupool,cuda:cpupool") is built once
	// and serves them all, as PyTorch builds one backend per name. A host
	// backend stages CUDA tensors only when CUDA is among them. Nil (a
	// caller that bypasses the dispatcher) means the host alone.
	Devices []tensor.DeviceType
	// Options holds backend-specific options (e.g. *nccl.Options); nil for
	// defaults.
	Options any
	// Parent is the same backend of the parent group, for NewGroup; a
	// backend may derive its communicator from it (ncclCommSplit).
	Parent Backend
	// Desync, when set, explains a timed-out collective: it asks the store
	// how far every rank of the group has got and returns the ranks that
	// never enqueued (or never completed) op seq, with a sentence such as
	// "rank 1 never enqueued allreduce seq 42; ranks 0,2,3 did". Backends
	// call it when an op times out and put the result in the OpError
	// (Ranks and Detail). It is bounded by ctx.
	Desync func(ctx context.Context, op Op, seq uint64) (late []int, detail string)
	// DumpAll, when set, dumps this process's flight recorder and asks
	// every peer, through the store, to dump theirs. It returns the dump
	// file ("" when the recorder is off). Backends call it when an op fails
	// or times out, before their error policy tears anything down. It
	// returns promptly even when the store does not answer (the
	// dispatcher's waits at most 100 ms for the signal to land, then lets
	// it land on its own), so a failing op's error need not wait for it.
	DumpAll func(reason string) string
}

// Heartbeater is implemented by backends whose watchdog goroutine can stop
// advancing (a hang in a native call). The dispatcher's heartbeat monitor
// ends the process, after dumping, when the counter stands still for the
// heartbeat timeout.
type Heartbeater interface {
	// Heartbeat returns a counter the watchdog bumps on every round.
	Heartbeat() uint64
}

// Capabilities says what a backend provides. Conformance specs that need a
// capability are skipped, with the reason, on backends that lack it.
type Capabilities struct {
	// Devices the backend accepts tensors on.
	Devices []tensor.DeviceType
	// DTypes the backend can move.
	DTypes []tensor.DType
	// StreamSemantics: Wait orders the current stream instead of blocking.
	StreamSemantics bool
	// Coalescing: the backend implements Coalescer.
	Coalescing bool
	// BitwiseReductions: BAND, BOR and BXOR work.
	BitwiseReductions bool
	// Timing: Duration works when timing is on.
	Timing bool
	// GraphCapture: ops can be captured into CUDA graphs.
	GraphCapture bool
	// UnevenSizes: uneven allgather/reduce_scatter output lists work.
	UnevenSizes bool
	// MismatchChecks: the backend itself finds ranks that pass one
	// collective different ops, dtypes, reduce ops or element counts (its
	// messages carry them), and fails the op on every rank with
	// ErrInvalidArgument. Without it, only the dispatcher's debug check
	// (Config.Debug "detail") finds them.
	MismatchChecks bool
}

// SupportsDType reports whether dt is in c.DTypes.
func (c Capabilities) SupportsDType(dt tensor.DType) bool {
	for _, d := range c.DTypes {
		if d == dt {
			return true
		}
	}
	return false
}
