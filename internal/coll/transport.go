// Package coll holds host collective algorithms written over a small
// point-to-point Transport, so that every host backend (cpupool over TCP, a
// UCX backend over libucp) shares them:
//
//   - allreduce: recursive doubling for small buffers, ring reduce-scatter
//     plus ring all-gather, segmented and pipelined, for large ones;
//   - reduce-scatter and all-gather: the two ring phases on their own, with
//     per-rank block sizes (uneven sizes);
//   - broadcast, reduce, gather and scatter: binomial trees;
//   - all-to-all: pairwise exchange;
//   - barrier: dissemination;
//   - monitored barrier: rank 0 as the arbiter.
//
// Select (select.go) is the one place that picks an op's algorithm, from
// the op, its size, the world size and what the transport can do; the
// collectives in collectives.go ask it and run the algorithm it names.
// Each algorithm has a file of its own, as in Gloo: ring.go,
// recursive_doubling.go, broadcast_tree.go, reduce_tree.go,
// gather_tree.go, scatter_tree.go (with tree.go), alltoall_pairwise.go,
// barrier_dissemination.go and barrier_monitored.go.
//
// Every algorithm takes the op's tag. Messages between two ranks with one
// tag match in the order they were sent, so an algorithm may send several
// messages to one peer under one tag as long as the peer posts its receives
// in the same order, which every algorithm here does by construction.
package coll

import (
	"context"
)

// Transport moves tagged byte messages between the ranks of a group.
// Implementations must let Send and Irecv run concurrently from several
// goroutines, and must keep receiving while no receive is posted (buffering
// unexpected messages), so that two ranks that both send before they
// receive never deadlock.
type Transport interface {
	// Rank is this rank, in [0, Size).
	Rank() int
	// Size is the number of ranks.
	Size() int
	// Send sends buf to peer under tag. It returns once buf may be reused.
	// A deadline on ctx bounds it.
	Send(ctx context.Context, peer int, tag uint64, buf []byte) error
	// Irecv posts the receive of one message of exactly len(buf) bytes from
	// peer under tag into buf. Messages from one peer under one tag fill
	// receives in the order these were posted. The caller must Wait or
	// Cancel the request before it touches buf again.
	Irecv(peer int, tag uint64, buf []byte) Request
}

// ReduceReceiver is a Transport that can reduce a message into a buffer
// as it arrives, instead of receiving it into scratch space that the
// algorithm then combines: from shared memory this saves the receive copy.
type ReduceReceiver interface {
	// IrecvReduce is Irecv, except that the message is combined into buf
	// (combine(dst, src) sets dst = dst op src) rather than copied, in
	// pieces of whole elements of elem bytes.
	IrecvReduce(peer int, tag uint64, buf []byte, elem int, combine func(dst, src []byte)) Request
}

// Request is a posted receive.
type Request interface {
	// Wait blocks until the message has filled the buffer, the transport
	// failed, or ctx is done (the receive is then withdrawn). It releases the
	// request: call it, or Cancel, exactly once.
	Wait(ctx context.Context) error
	// Cancel withdraws the receive if it has not matched a message yet,
	// otherwise waits until the matched message has been written, so the
	// buffer is the caller's again when Cancel returns. It releases the
	// request.
	Cancel()
}

// reqs tracks the receives an algorithm has posted but not yet waited, so
// that an error path can withdraw them all before the buffers are reused:
// a receive left posted would otherwise write into memory the caller owns
// again.
type reqs struct {
	q []Request
}

func (r *reqs) push(q Request) { r.q = append(r.q, q) }

// wait waits for the oldest request.
func (r *reqs) wait(ctx context.Context) error {
	q := r.q[0]
	r.q = r.q[1:]
	return q.Wait(ctx)
}

// cancel withdraws every request still posted.
func (r *reqs) cancel() {
	for _, q := range r.q {
		q.Cancel()
	}
	r.q = r.q[:0]
}
