package coll

// Op names a collective, as the selector sees it.
type Op int

// Ops of Shape.
const (
	OpAllreduce Op = iota + 1
	OpReduceScatter
	OpAllgather
	OpBroadcast
	OpReduce
	OpGather
	OpScatter
	OpAlltoall
	OpBarrier
	OpMonitoredBarrier
)

var opNames = [...]string{"op(0)", "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "gather", "scatter", "alltoall", "barrier", "monitored_barrier"}

func (o Op) String() string {
	if o < 0 || int(o) >= len(opNames) {
		return "op(?)"
	}
	return opNames[o]
}

// Algo names an algorithm. One name may serve several ops (the binomial
// tree runs broadcast, reduce, gather and scatter); the pair of Op and Algo
// picks the function.
type Algo int

// Algorithms of Choice.
const (
	// AlgoNone is no algorithm: an Op that the selector does not know.
	AlgoNone Algo = iota
	// AlgoLocal sends nothing: one rank, or nothing to move. What is left
	// is the op's local part (a copy for gather, scatter and alltoall).
	AlgoLocal
	// AlgoRecursiveDoubling is allreduce in log2(n) exchanges of the whole
	// buffer (recursive_doubling.go): the fewest messages, for small ones.
	AlgoRecursiveDoubling
	// AlgoRing is the segmented, pipelined ring (ring.go): allreduce as
	// reduce-scatter then all-gather, or either phase on its own.
	AlgoRing
	// AlgoBinomialTree is a binomial tree rooted at the op's root
	// (tree.go and the *_tree.go files).
	AlgoBinomialTree
	// AlgoPairwise is the pairwise exchange of alltoall
	// (alltoall_pairwise.go).
	AlgoPairwise
	// AlgoDissemination is the dissemination barrier
	// (barrier_dissemination.go).
	AlgoDissemination
	// AlgoArbiter is the monitored barrier, with rank 0 as the arbiter
	// (barrier_monitored.go).
	AlgoArbiter
)

var algoNames = [...]string{"none", "local", "recursive_doubling", "ring", "binomial_tree", "pairwise", "dissemination", "arbiter"}

func (a Algo) String() string {
	if a < 0 || int(a) >= len(algoNames) {
		return "algo(?)"
	}
	return algoNames[a]
}

// Shape is what the selector decides on: the op, its size, the world
// size and what the transport can do.
type Shape struct {
	Op Op
	// Bytes is the size of the buffer the op moves: the whole buffer for
	// allreduce, broadcast and reduce (the only ops whose algorithm
	// depends on it today).
	Bytes int
	// Elem is the element size in bytes (reducing ops); below 1 counts as 1.
	Elem int
	// Size is the number of ranks.
	Size int
	// Small is the allreduce size up to which recursive doubling beats the
	// ring (Comm.Small; 0 means DefaultSmall).
	Small int
	// ReduceReceiver says that the transport implements ReduceReceiver.
	ReduceReceiver bool
}

// Choice is the selector's answer.
type Choice struct {
	Algo Algo
	// ReduceOnReceive makes a reducing ring combine each message into its
	// block as the transport reads it (ReduceReceiver.IrecvReduce: from
	// shared memory, without a receive copy), instead of receiving it into
	// scratch slots and combining afterwards. Set for a ring with a kernel
	// (allreduce, reduce-scatter) over a transport that can.
	ReduceOnReceive bool
}

// Select picks the algorithm of an op. It is the one place where that is
// decided, and it decides as follows:
//
//   - one rank sends nothing (AlgoLocal), nor do allreduce, broadcast and
//     reduce of an empty buffer;
//   - allreduce runs recursive doubling up to Small bytes, and also when
//     the buffer has fewer elements than there are ranks (a ring block
//     would be empty); beyond, the ring;
//   - reduce-scatter and all-gather run the ring (uneven blocks included,
//     and empty ones too: the ring's size check still runs);
//   - broadcast, reduce, gather and scatter run binomial trees;
//   - alltoall runs the pairwise exchange, barrier the dissemination
//     barrier, monitored barrier the arbiter.
//
// A ring with a kernel reduces on receive when the transport can.
func Select(s Shape) Choice {
	if s.Size <= 1 {
		if s.Op < OpAllreduce || s.Op > OpMonitoredBarrier {
			return Choice{}
		}
		return Choice{Algo: AlgoLocal}
	}
	switch s.Op {
	case OpAllreduce:
		if s.Bytes == 0 {
			return Choice{Algo: AlgoLocal}
		}
		small := s.Small
		if small <= 0 {
			small = DefaultSmall
		}
		if s.Bytes <= small || s.Bytes/max(s.Elem, 1) < s.Size {
			return Choice{Algo: AlgoRecursiveDoubling}
		}
		return Choice{Algo: AlgoRing, ReduceOnReceive: s.ReduceReceiver}
	case OpReduceScatter:
		return Choice{Algo: AlgoRing, ReduceOnReceive: s.ReduceReceiver}
	case OpAllgather:
		return Choice{Algo: AlgoRing}
	case OpBroadcast, OpReduce:
		if s.Bytes == 0 {
			return Choice{Algo: AlgoLocal}
		}
		return Choice{Algo: AlgoBinomialTree}
	case OpGather, OpScatter:
		return Choice{Algo: AlgoBinomialTree}
	case OpAlltoall:
		return Choice{Algo: AlgoPairwise}
	case OpBarrier:
		return Choice{Algo: AlgoDissemination}
	case OpMonitoredBarrier:
		return Choice{Algo: AlgoArbiter}
	}
	return Choice{}
}

// choose is Select for an op of bytes (elements of elem bytes) on this
// communicator.
func (c *Comm) choose(op Op, bytes, elem int) Choice {
	_, rr := c.T.(ReduceReceiver)
	return Select(Shape{Op: op, Bytes: bytes, Elem: elem, Size: c.T.Size(), Small: c.Small, ReduceReceiver: rr})
}
