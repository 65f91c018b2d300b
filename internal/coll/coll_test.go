package coll_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/reduce"
	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/internal/tcpmesh/meshtest"
	"github.com/gocoll/gocoll/tensor"
)

// meshes connects n ranks, goroutines of this process, over real TCP (and
// shared memory; GOCOLL_TEST_TRANSPORT=tcp runs the algorithms over TCP
// only).
func meshes(t *testing.T, n int) []*tcpmesh.Mesh {
	t.Helper()
	return meshtest.Connect(t, n, tcpmesh.Config{Transport: os.Getenv("GOCOLL_TEST_TRANSPORT")})
}

// onAll runs f on every rank and fails the test on any error.
func onAll(t *testing.T, ms []*tcpmesh.Mesh, f func(r int, c *coll.Comm) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for r, m := range ms {
		wg.Go(func() {
			c := &coll.Comm{T: m, Pool: &coll.Pool{}, Segment: 4096, Window: 3, Small: 1024}
			errs[r] = f(r, c)
		})
	}
	_ = ctx
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func f32(vals []float32) []byte {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func at(b []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }

func TestAlgorithms(t *testing.T) {
	ctx := context.Background()
	k, err := reduce.For(tensor.Float32, backend.SUM)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2, 3, 4, 5} {
		ms := meshes(t, n)
		for _, count := range []int{0, 1, 3, 100, 5000} {
			t.Run(fmt.Sprintf("allreduce/n%d/c%d", n, count), func(t *testing.T) {
				onAll(t, ms, func(r int, c *coll.Comm) error {
					v := make([]float32, count)
					for i := range v {
						v[i] = float32(r*1000 + i)
					}
					buf := f32(v)
					if err := coll.Allreduce(ctx, c, 1, buf, k); err != nil {
						return err
					}
					for i := range count {
						want := float32(1000*n*(n-1)/2 + n*i)
						if got := at(buf, i); got != want {
							return fmt.Errorf("rank %d elem %d: got %v want %v", r, i, got, want)
						}
					}
					return nil
				})
			})
		}
		for _, root := range []int{0, n - 1} {
			t.Run(fmt.Sprintf("rooted/n%d/root%d", n, root), func(t *testing.T) {
				const count = 3000
				onAll(t, ms, func(r int, c *coll.Comm) error {
					// broadcast
					buf := make([]byte, count)
					if r == root {
						for i := range buf {
							buf[i] = byte(i * 7)
						}
					}
					if err := coll.Broadcast(ctx, c, 2, buf, root); err != nil {
						return err
					}
					for i := range buf {
						if buf[i] != byte(i*7) {
							return fmt.Errorf("broadcast rank %d byte %d", r, i)
						}
					}
					// reduce
					v := make([]float32, count)
					for i := range v {
						v[i] = float32(r + i)
					}
					rb := f32(v)
					if err := coll.Reduce(ctx, c, 3, rb, k, root); err != nil {
						return err
					}
					if r == root {
						for i := range count {
							if got, want := at(rb, i), float32(n*(n-1)/2+n*i); got != want {
								return fmt.Errorf("reduce elem %d: got %v want %v", i, got, want)
							}
						}
					}
					// gather
					in := []byte{byte(r), byte(r + 1), byte(r + 2)}
					out := make([]byte, 3*n)
					if err := coll.Gather(ctx, c, 4, in, out, root); err != nil {
						return err
					}
					if r == root {
						for i := range n {
							if out[3*i] != byte(i) || out[3*i+2] != byte(i+2) {
								return fmt.Errorf("gather: %v", out)
							}
						}
					}
					// scatter
					sin := make([]byte, 2*n)
					for i := range sin {
						sin[i] = byte(i)
					}
					sout := make([]byte, 2)
					if err := coll.Scatter(ctx, c, 5, sin, sout, root); err != nil {
						return err
					}
					if sout[0] != byte(2*r) || sout[1] != byte(2*r+1) {
						return fmt.Errorf("scatter rank %d: %v", r, sout)
					}
					return nil
				})
			})
		}
		t.Run(fmt.Sprintf("uneven/n%d", n), func(t *testing.T) {
			onAll(t, ms, func(r int, c *coll.Comm) error {
				// blocks of size 4*(i%3) floats: some empty
				blocks := make([][]byte, n)
				for i := range blocks {
					v := make([]float32, 1000*(i%3))
					for j := range v {
						v[j] = float32(r + j)
					}
					blocks[i] = f32(v)
				}
				if err := coll.ReduceScatter(ctx, c, 6, blocks, k); err != nil {
					return err
				}
				for j := 0; j < len(blocks[r])/4; j++ {
					if got, want := at(blocks[r], j), float32(n*(n-1)/2+n*j); got != want {
						return fmt.Errorf("reduce-scatter rank %d elem %d: %v want %v", r, j, got, want)
					}
				}
				ag := make([][]byte, n)
				for i := range ag {
					ag[i] = make([]byte, 4097*(i%3))
				}
				for j := range ag[r] {
					ag[r][j] = byte(r + j)
				}
				if err := coll.Allgather(ctx, c, 7, ag); err != nil {
					return err
				}
				for i := range ag {
					for j := range ag[i] {
						if ag[i][j] != byte(i+j) {
							return fmt.Errorf("allgather block %d byte %d", i, j)
						}
					}
				}
				in := make([][]byte, n)
				out := make([][]byte, n)
				for p := range n {
					in[p] = make([]byte, r+p+1)
					for j := range in[p] {
						in[p][j] = byte(r*10 + p)
					}
					out[p] = make([]byte, p+r+1)
				}
				if err := coll.Alltoall(ctx, c, 8, out, in); err != nil {
					return err
				}
				for p := range n {
					for j := range out[p] {
						if out[p][j] != byte(p*10+r) {
							return fmt.Errorf("alltoall from %d: %v", p, out[p])
						}
					}
				}
				if err := coll.Barrier(ctx, c, 9); err != nil {
					return err
				}
				return coll.MonitoredBarrier(ctx, c, 10, 5*time.Second, true)
			})
		})
	}
}

func TestMonitoredBarrierNamesLateRanks(t *testing.T) {
	ms := meshes(t, 4)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for r := range 3 { // rank 3 never arrives
		wg.Go(func() {
			c := &coll.Comm{T: ms[r]}
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			errs[r] = coll.MonitoredBarrier(cctx, c, 1, 300*time.Millisecond, true)
		})
	}
	wg.Wait()
	var le *coll.LateRanksError
	if !errors.As(errs[0], &le) || len(le.Ranks) != 1 || le.Ranks[0] != 3 {
		t.Fatalf("rank 0: %v", errs[0])
	}
	var ae *coll.ArbiterError
	if !errors.As(errs[1], &ae) {
		t.Fatalf("rank 1: %v", errs[1])
	}
}

func TestPeerDeathFailsPending(t *testing.T) {
	ms := meshes(t, 3)
	q := ms[0].Irecv(2, 5, make([]byte, 8))
	q2 := ms[0].Irecv(1, 5, make([]byte, 8)) // rank 1 is alive, but the mesh is broken
	ms[2].Abort(errors.New("crash"))         // no goodbye: the peers see a dead connection
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Rank 2's abort notice names it (a killed process's closed
	// connection does as well: a PeerError).
	err := q.Wait(ctx)
	if r, ok := tcpmesh.RootRank(err); !ok || r != 2 {
		t.Fatalf("want an error naming rank 2, got %v", err)
	}
	if err := q2.Wait(ctx); err == nil {
		t.Fatalf("second receive: %v", err)
	} else if r, ok := tcpmesh.RootRank(err); !ok || r != 2 {
		t.Fatalf("second receive: want rank 2 named, got %v", err)
	}
}

func TestUnexpectedAndAnySource(t *testing.T) {
	ms := meshes(t, 3)
	ctx := context.Background()
	if err := ms[1].Send(ctx, 0, 42, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := ms[1].Send(ctx, 0, 42, []byte("two")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let them arrive unexpected
	b := make([]byte, 3)
	if err := ms[0].Irecv(1, 42, b).Wait(ctx); err != nil || string(b) != "one" {
		t.Fatalf("%q %v", b, err)
	}
	if err := ms[0].Irecv(1, 42, b).Wait(ctx); err != nil || string(b) != "two" {
		t.Fatalf("%q %v", b, err)
	}
	q := ms[0].IrecvAny(7, b)
	if err := ms[2].Send(ctx, 0, 7, []byte("any")); err != nil {
		t.Fatal(err)
	}
	src, err := q.WaitSource(ctx)
	if err != nil || src != 2 || string(b) != "any" {
		t.Fatalf("src %d %q %v", src, b, err)
	}
	v, err := ms[0].Probe(ctx, 2)
	if err != nil || v != 0 {
		t.Fatalf("probe %d %v", v, err)
	}
	// A receive withdrawn by its deadline leaves the mesh usable.
	tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := ms[0].Irecv(2, 99, b).Wait(tctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline, got %v", err)
	}
}

func TestOrderlyCloseFailsOnlyThatPeer(t *testing.T) {
	ms := meshes(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q := ms[0].Irecv(2, 5, make([]byte, 8))
	b := make([]byte, 2)
	q1 := ms[0].Irecv(1, 5, b)
	_ = ms[2].Close()
	var pe *tcpmesh.PeerError
	if err := q.Wait(ctx); !errors.As(err, &pe) || pe.Rank != 2 || !errors.Is(err, tcpmesh.ErrPeerClosed) {
		t.Fatalf("want ErrPeerClosed from rank 2, got %v", err)
	}
	if err := ms[1].Send(ctx, 0, 5, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if err := q1.Wait(ctx); err != nil || string(b) != "ok" {
		t.Fatalf("rank 1 still reachable: %q %v", b, err)
	}
}
