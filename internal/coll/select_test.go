package coll_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/reduce"
	"github.com/gocoll/gocoll/tensor"
)

// TestSelect is the selector's table: op, size, world size and transport
// in, algorithm out. The rows pin today's choices, boundaries included.
func TestSelect(t *testing.T) {
	const small = coll.DefaultSmall
	type C = coll.Choice
	for _, c := range []struct {
		name string
		in   coll.Shape
		want coll.Choice
	}{
		{"allreduce one rank", coll.Shape{Op: coll.OpAllreduce, Bytes: 1 << 20, Elem: 4, Size: 1}, C{Algo: coll.AlgoLocal}},
		{"allreduce empty", coll.Shape{Op: coll.OpAllreduce, Bytes: 0, Elem: 4, Size: 4}, C{Algo: coll.AlgoLocal}},
		{"allreduce tiny", coll.Shape{Op: coll.OpAllreduce, Bytes: 8, Elem: 4, Size: 2}, C{Algo: coll.AlgoRecursiveDoubling}},
		{"allreduce at Small", coll.Shape{Op: coll.OpAllreduce, Bytes: small, Elem: 4, Size: 4}, C{Algo: coll.AlgoRecursiveDoubling}},
		{"allreduce past Small", coll.Shape{Op: coll.OpAllreduce, Bytes: small + 4, Elem: 4, Size: 4}, C{Algo: coll.AlgoRing}},
		{"allreduce past Small, reduce-receiver", coll.Shape{Op: coll.OpAllreduce, Bytes: small + 4, Elem: 4, Size: 4, ReduceReceiver: true}, C{Algo: coll.AlgoRing, ReduceOnReceive: true}},
		{"allreduce own Small, at it", coll.Shape{Op: coll.OpAllreduce, Bytes: 1024, Elem: 4, Size: 4, Small: 1024}, C{Algo: coll.AlgoRecursiveDoubling}},
		{"allreduce own Small, past it", coll.Shape{Op: coll.OpAllreduce, Bytes: 1028, Elem: 4, Size: 4, Small: 1024}, C{Algo: coll.AlgoRing}},
		{"allreduce fewer elements than ranks", coll.Shape{Op: coll.OpAllreduce, Bytes: 1032, Elem: 8, Size: 200, Small: 1024}, C{Algo: coll.AlgoRecursiveDoubling}},
		{"allreduce as many elements as ranks", coll.Shape{Op: coll.OpAllreduce, Bytes: 1032, Elem: 8, Size: 129, Small: 1024}, C{Algo: coll.AlgoRing}},
		{"allreduce elem 0 counts as 1", coll.Shape{Op: coll.OpAllreduce, Bytes: 1028, Elem: 0, Size: 4, Small: 1024}, C{Algo: coll.AlgoRing}},
		{"reduce_scatter one rank", coll.Shape{Op: coll.OpReduceScatter, Bytes: 1 << 20, Elem: 4, Size: 1}, C{Algo: coll.AlgoLocal}},
		{"reduce_scatter empty still checks sizes", coll.Shape{Op: coll.OpReduceScatter, Bytes: 0, Elem: 4, Size: 3}, C{Algo: coll.AlgoRing}},
		{"reduce_scatter small, reduce-receiver", coll.Shape{Op: coll.OpReduceScatter, Bytes: 8, Elem: 4, Size: 2, ReduceReceiver: true}, C{Algo: coll.AlgoRing, ReduceOnReceive: true}},
		{"allgather", coll.Shape{Op: coll.OpAllgather, Bytes: 8, Size: 3}, C{Algo: coll.AlgoRing}},
		{"allgather never reduces on receive", coll.Shape{Op: coll.OpAllgather, Bytes: 1 << 20, Size: 3, ReduceReceiver: true}, C{Algo: coll.AlgoRing}},
		{"allgather one rank", coll.Shape{Op: coll.OpAllgather, Bytes: 8, Size: 1}, C{Algo: coll.AlgoLocal}},
		{"broadcast", coll.Shape{Op: coll.OpBroadcast, Bytes: 1, Size: 2}, C{Algo: coll.AlgoBinomialTree}},
		{"broadcast large", coll.Shape{Op: coll.OpBroadcast, Bytes: 64 << 20, Size: 8, ReduceReceiver: true}, C{Algo: coll.AlgoBinomialTree}},
		{"broadcast empty", coll.Shape{Op: coll.OpBroadcast, Bytes: 0, Size: 4}, C{Algo: coll.AlgoLocal}},
		{"reduce", coll.Shape{Op: coll.OpReduce, Bytes: 4, Elem: 4, Size: 5}, C{Algo: coll.AlgoBinomialTree}},
		{"reduce empty", coll.Shape{Op: coll.OpReduce, Bytes: 0, Elem: 4, Size: 5}, C{Algo: coll.AlgoLocal}},
		{"gather empty still runs the tree", coll.Shape{Op: coll.OpGather, Bytes: 0, Size: 2}, C{Algo: coll.AlgoBinomialTree}},
		{"gather one rank copies", coll.Shape{Op: coll.OpGather, Bytes: 8, Size: 1}, C{Algo: coll.AlgoLocal}},
		{"scatter", coll.Shape{Op: coll.OpScatter, Bytes: 8, Size: 3}, C{Algo: coll.AlgoBinomialTree}},
		{"alltoall", coll.Shape{Op: coll.OpAlltoall, Bytes: 0, Size: 2}, C{Algo: coll.AlgoPairwise}},
		{"alltoall one rank copies", coll.Shape{Op: coll.OpAlltoall, Bytes: 8, Size: 1}, C{Algo: coll.AlgoLocal}},
		{"barrier", coll.Shape{Op: coll.OpBarrier, Size: 7}, C{Algo: coll.AlgoDissemination}},
		{"barrier one rank", coll.Shape{Op: coll.OpBarrier, Size: 1}, C{Algo: coll.AlgoLocal}},
		{"monitored barrier", coll.Shape{Op: coll.OpMonitoredBarrier, Size: 2}, C{Algo: coll.AlgoArbiter}},
		{"unknown op", coll.Shape{Op: 0, Size: 4}, C{Algo: coll.AlgoNone}},
		{"unknown op, one rank", coll.Shape{Op: 99, Size: 1}, C{Algo: coll.AlgoNone}},
	} {
		if got := coll.Select(c.in); got != c.want {
			t.Errorf("%s: Select(%+v) = %v/%v, want %v/%v", c.name, c.in, got.Algo, got.ReduceOnReceive, c.want.Algo, c.want.ReduceOnReceive)
		}
	}
}

// counts is what a counting transport saw.
type counts struct{ sends, reduceRecvs atomic.Int64 }

// countT counts sends and hides the mesh's ReduceReceiver.
type countT struct {
	coll.Transport
	n *counts
}

func (c countT) Send(ctx context.Context, peer int, tag uint64, buf []byte) error {
	c.n.sends.Add(1)
	return c.Transport.Send(ctx, peer, tag, buf)
}

// countRR is countT with the mesh's ReduceReceiver, counted.
type countRR struct {
	countT
	rr coll.ReduceReceiver
}

func (c countRR) IrecvReduce(peer int, tag uint64, buf []byte, elem int, combine func(dst, src []byte)) coll.Request {
	c.n.reduceRecvs.Add(1)
	return c.rr.IrecvReduce(peer, tag, buf, elem, combine)
}

// TestAllreduceFollowsSelect runs Allreduce on both sides of the Small
// boundary, over a transport with and without ReduceReceiver, and checks
// from the messages each rank sent that it ran the algorithm Select names:
// recursive doubling sends log2(4) = 2 messages at 4 ranks; the ring sends
// the size check, then 3 reduce-scatter and 3 all-gather blocks of one
// segment each, and reduces on receive exactly when Select says so.
func TestAllreduceFollowsSelect(t *testing.T) {
	const n, small = 4, 1024
	k, err := reduce.For(tensor.Float32, backend.SUM)
	if err != nil {
		t.Fatal(err)
	}
	ms := meshes(t, n)
	for _, bytes := range []int{small, small + 4} {
		for _, rr := range []bool{false, true} {
			ch := coll.Select(coll.Shape{Op: coll.OpAllreduce, Bytes: bytes, Elem: 4, Size: n, Small: small, ReduceReceiver: rr})
			var wantSends, wantRR int64
			switch ch.Algo {
			case coll.AlgoRecursiveDoubling:
				wantSends = 2
			case coll.AlgoRing:
				wantSends = 1 + 2*(n-1)
				if ch.ReduceOnReceive {
					wantRR = n - 1
				}
			default:
				t.Fatalf("%d bytes: unexpected choice %v", bytes, ch.Algo)
			}
			t.Run(fmt.Sprintf("%dB/rr=%v/%v", bytes, rr, ch.Algo), func(t *testing.T) {
				cs := make([]counts, n)
				onAll(t, ms, func(r int, c *coll.Comm) error {
					var tr coll.Transport = countT{c.T, &cs[r]}
					if rr {
						tr = countRR{countT{c.T, &cs[r]}, c.T.(coll.ReduceReceiver)}
					}
					c.T = tr
					v := make([]float32, bytes/4)
					for i := range v {
						v[i] = float32(r + i)
					}
					buf := f32(v)
					if err := coll.Allreduce(context.Background(), c, 9, buf, k); err != nil {
						return err
					}
					for i := range v {
						if want := float32(n*(n-1)/2 + n*i); at(buf, i) != want {
							return fmt.Errorf("rank %d elem %d: got %v, want %v", r, i, at(buf, i), want)
						}
					}
					return nil
				})
				for r := range cs {
					if got := cs[r].sends.Load(); got != wantSends {
						t.Errorf("rank %d sent %d messages, want %d for %v", r, got, wantSends, ch.Algo)
					}
					if got := cs[r].reduceRecvs.Load(); got != wantRR {
						t.Errorf("rank %d posted %d reduce-receives, want %d (ReduceOnReceive %v)", r, got, wantRR, ch.ReduceOnReceive)
					}
				}
			})
		}
	}
}
