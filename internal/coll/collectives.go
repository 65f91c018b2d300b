package coll

import (
	"context"
	"fmt"
	"time"

	"github.com/gocoll/gocoll/internal/reduce"
)

// The collectives: each asks Select for its algorithm and runs it. The
// algorithms live one to a file (ring.go, recursive_doubling.go,
// broadcast_tree.go, ...), as Gloo keeps them.

// Allreduce reduces buf across ranks in place with k.Combine. It does not
// apply k.Pre or k.Post; the caller does, so that it can scale a copy.
// Every rank ends with bit-identical bytes.
func Allreduce(ctx context.Context, c *Comm, tag uint64, buf []byte, k reduce.Kernel) error {
	switch ch := c.choose(OpAllreduce, len(buf), k.ElemSize); ch.Algo {
	case AlgoLocal:
		return nil
	case AlgoRecursiveDoubling:
		return allreduceRD(ctx, c, tag, buf, k)
	case AlgoRing:
		return allreduceRing(ctx, c, tag, buf, k, ch.ReduceOnReceive)
	default:
		return noAlgo(OpAllreduce, ch)
	}
}

// ReduceScatter reduces, in place, the blocks of a buffer that every rank
// holds in full, leaving the fully reduced blocks[r] on rank r. blocks may
// have different sizes (uneven reduce-scatter); every rank passes the same
// sizes. It does not apply k.Pre or k.Post.
func ReduceScatter(ctx context.Context, c *Comm, tag uint64, blocks [][]byte, k reduce.Kernel) error {
	switch ch := c.choose(OpReduceScatter, total(blocks), k.ElemSize); ch.Algo {
	case AlgoLocal:
		return nil
	case AlgoRing:
		return ring(ctx, c, tag, blocks, ringPhase{a: -1, k: &k, check: true, direct: ch.ReduceOnReceive})
	default:
		return noAlgo(OpReduceScatter, ch)
	}
}

// Allgather fills every blocks[i] from rank i, given that each rank has
// filled its own blocks[r]. Blocks may differ in size; every rank passes
// the same sizes.
func Allgather(ctx context.Context, c *Comm, tag uint64, blocks [][]byte) error {
	switch ch := c.choose(OpAllgather, total(blocks), 1); ch.Algo {
	case AlgoLocal:
		return nil
	case AlgoRing:
		return ring(ctx, c, tag, blocks, ringPhase{a: 0, check: true})
	default:
		return noAlgo(OpAllgather, ch)
	}
}

// Broadcast copies root's buf to every rank's buf along a binomial tree,
// segment by segment, so that inner ranks forward a segment while the next
// one arrives.
func Broadcast(ctx context.Context, c *Comm, tag uint64, buf []byte, root int) error {
	switch ch := c.choose(OpBroadcast, len(buf), 1); ch.Algo {
	case AlgoLocal:
		return nil
	case AlgoBinomialTree:
		return broadcastTree(ctx, c, tag, buf, root)
	default:
		return noAlgo(OpBroadcast, ch)
	}
}

// Reduce combines every rank's buf into root's buf along a binomial tree,
// segment by segment. Other ranks' buffers are clobbered (their partial
// results). It does not apply k.Pre or k.Post.
func Reduce(ctx context.Context, c *Comm, tag uint64, buf []byte, k reduce.Kernel, root int) error {
	switch ch := c.choose(OpReduce, len(buf), k.ElemSize); ch.Algo {
	case AlgoLocal:
		return nil
	case AlgoBinomialTree:
		return reduceTree(ctx, c, tag, buf, k, root)
	default:
		return noAlgo(OpReduce, ch)
	}
}

// Gather collects every rank's in (all of one size) into out on root: out
// has Size blocks of len(in) bytes, in rank order, and is only used on
// root. Inner ranks of the binomial tree forward their subtree's blocks in
// one message.
func Gather(ctx context.Context, c *Comm, tag uint64, in []byte, out []byte, root int) error {
	switch ch := c.choose(OpGather, len(in), 1); ch.Algo {
	case AlgoLocal:
		copy(out, in)
		return nil
	case AlgoBinomialTree:
		return gatherTree(ctx, c, tag, in, out, root)
	default:
		return noAlgo(OpGather, ch)
	}
}

// Scatter sends block i of root's in (Size blocks of len(out) bytes, rank
// order) to rank i's out, along a binomial tree.
func Scatter(ctx context.Context, c *Comm, tag uint64, in []byte, out []byte, root int) error {
	switch ch := c.choose(OpScatter, len(out), 1); ch.Algo {
	case AlgoLocal:
		copy(out, in)
		return nil
	case AlgoBinomialTree:
		return scatterTree(ctx, c, tag, in, out, root)
	default:
		return noAlgo(OpScatter, ch)
	}
}

// Alltoall sends in[i] to rank i and receives rank i's message into out[i]
// by pairwise exchange: at step s rank r sends to r+s and receives from
// r-s. Sizes may differ per pair; both sides pass matching sizes.
func Alltoall(ctx context.Context, c *Comm, tag uint64, out, in [][]byte) error {
	switch ch := c.choose(OpAlltoall, total(in), 1); ch.Algo {
	case AlgoLocal:
		r := c.T.Rank()
		copy(out[r], in[r])
		return nil
	case AlgoPairwise:
		return alltoallPairwise(ctx, c, tag, out, in)
	default:
		return noAlgo(OpAlltoall, ch)
	}
}

// Barrier returns once every rank has entered it: a dissemination barrier
// of empty messages, ceil(log2 n) rounds.
func Barrier(ctx context.Context, c *Comm, tag uint64) error {
	switch ch := c.choose(OpBarrier, 0, 1); ch.Algo {
	case AlgoLocal:
		return nil
	case AlgoDissemination:
		return barrierDissemination(ctx, c, tag)
	default:
		return noAlgo(OpBarrier, ch)
	}
}

// MonitoredBarrier is Gloo's monitored barrier: every other rank reports to
// rank 0, which waits at most timeout for them and then answers each one
// with the verdict, so that all ranks pass or all fail. On rank 0 a failure
// is a *LateRanksError naming the first late rank, or every late rank with
// waitAll. Other ranks wait for the verdict until ctx is done and fail with
// an *ArbiterError.
func MonitoredBarrier(ctx context.Context, c *Comm, tag uint64, timeout time.Duration, waitAll bool) error {
	switch ch := c.choose(OpMonitoredBarrier, 0, 1); ch.Algo {
	case AlgoLocal:
		return nil
	case AlgoArbiter:
		return barrierArbiter(ctx, c, tag, timeout, waitAll)
	default:
		return noAlgo(OpMonitoredBarrier, ch)
	}
}

// noAlgo is the failure of a collective whose choice it has no function
// for: Select and the switch above it disagree, a bug.
func noAlgo(op Op, ch Choice) error {
	return fmt.Errorf("coll: %v has no %v algorithm", op, ch.Algo)
}
