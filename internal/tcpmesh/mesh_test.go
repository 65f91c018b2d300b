package tcpmesh_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/internal/tcpmesh/meshtest"
	"github.com/gocoll/gocoll/store"
)

// store.Store is a tcpmesh.KV without an adapter.
var _ tcpmesh.KV = store.Store(nil)

func connect(t *testing.T, n int, transport string) []*tcpmesh.Mesh {
	t.Helper()
	return meshtest.Connect(t, n, tcpmesh.Config{Transport: transport, ShmRingBytes: 1 << 16})
}

// TestTransports: messages larger than the ring, in both directions, on
// every transport; shared memory is used where asked, and no pair file is
// left in /dev/shm once the mesh is up.
func TestTransports(t *testing.T) {
	for _, tr := range []string{"tcp", "shm", "auto"} {
		t.Run(tr, func(t *testing.T) {
			ms := connect(t, 3, tr)
			for _, m := range ms {
				for p := range 3 {
					if p != m.Rank() && m.UsesShm(p) != (tr != "tcp") {
						t.Fatalf("rank %d to %d: UsesShm %v with transport %s", m.Rank(), p, m.UsesShm(p), tr)
					}
				}
			}
			left, _ := filepath.Glob(fmt.Sprintf("/dev/shm/gocoll-%d-*", os.Getpid()))
			if len(left) > 0 {
				t.Fatalf("pair files left behind: %v", left)
			}
			ctx := context.Background()
			var wg sync.WaitGroup
			errs := make([]error, 3)
			for r, m := range ms {
				wg.Go(func() {
					for i := range 20 {
						size := 1 + i*20000 // up to ~6 ring capacities
						out := make([]byte, size)
						for j := range out {
							out[j] = byte(r + i + j)
						}
						in := make([]byte, size)
						q := m.Irecv((r+2)%3, uint64(i), in)
						if err := m.Send(ctx, (r+1)%3, uint64(i), out); err != nil {
							errs[r] = err
							return
						}
						if err := q.Wait(ctx); err != nil {
							errs[r] = err
							return
						}
						src := (r + 2) % 3
						for j := range in {
							if in[j] != byte(src+i+j) {
								errs[r] = fmt.Errorf("rank %d message %d byte %d corrupt", r, i, j)
								return
							}
						}
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestShmPeerDeath: a peer that aborts (its connections close, as when a
// process dies) fails a receive waiting on it with a PeerError naming it,
// at once; Abort unblocks a local waiter.
func TestShmPeerDeath(t *testing.T) {
	ms := connect(t, 2, "shm")
	q := ms[0].Irecv(1, 7, make([]byte, 8))
	time.Sleep(20 * time.Millisecond)
	ms[1].Abort(errors.New("simulated crash"))
	done := make(chan error, 1)
	go func() { done <- q.Wait(context.Background()) }()
	select {
	case err := <-done:
		// The peer's abort notice names it as the cause.
		if r, ok := tcpmesh.RootRank(err); !ok || r != 1 {
			t.Fatalf("want an error naming rank 1, got %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("hang after the peer's death")
	}

	ms = connect(t, 2, "shm")
	q = ms[0].Irecv(1, 7, make([]byte, 8))
	go func() { done <- q.Wait(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	ms[0].Abort(errors.New("local abort"))
	select {
	case err := <-done:
		if err == nil || err.Error() != "local abort" {
			t.Fatalf("want the abort's error, got %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Abort did not unblock the waiter")
	}
}

// TestRootCause: a rank that gives the mesh up because of another (its
// connection to it failed, or its Abort names it) makes every peer's
// pending and later receives fail naming that rank, never the follower,
// on both transports; the notice arrives before the follower's
// connections close.
func TestRootCause(t *testing.T) {
	for _, tr := range []string{"tcp", "shm"} {
		t.Run(tr, func(t *testing.T) {
			ms := connect(t, 4, tr)
			// Rank 0 waits on rank 1, the follower; rank 3 on rank 2.
			q0 := ms[0].Irecv(1, 5, make([]byte, 8))
			q3 := ms[3].Irecv(1, 5, make([]byte, 8))
			time.Sleep(20 * time.Millisecond)
			ms[1].AbortBecause(errors.New("rank 2 died"), 2)
			for r, q := range map[int]interface{ Wait(context.Context) error }{0: q0, 3: q3} {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				err := q.Wait(ctx)
				cancel()
				var ce *tcpmesh.CauseError
				if !errors.As(err, &ce) || ce.Rank != 2 {
					t.Fatalf("rank %d: want a CauseError naming rank 2, got %v", r, err)
				}
			}
			// A later receive, from any peer, fails the same way.
			err := ms[2].Irecv(0, 6, make([]byte, 8)).Wait(context.Background())
			if r, ok := tcpmesh.RootRank(err); !ok || r != 2 {
				t.Fatalf("rank 2's later receive: want rank 2 named, got %v", err)
			}
		})
	}
}

// BenchmarkPingPong8 is the round trip of an 8-byte message between two
// ranks of this process (both goroutines share GOMAXPROCS).
func BenchmarkPingPong8(b *testing.B) {
	for _, tr := range []string{"tcp", "shm"} {
		b.Run(tr, func(b *testing.B) {
			st := store.NewHashStore()
			ms := make([]*tcpmesh.Mesh, 2)
			var wg sync.WaitGroup
			for r := range 2 {
				wg.Go(func() {
					ms[r], _ = tcpmesh.Connect(context.Background(), tcpmesh.Config{Rank: r, Size: 2, Store: st, Transport: tr})
				})
			}
			wg.Wait()
			ctx := context.Background()
			stop := make(chan struct{})
			echoed := make(chan struct{})
			go func() {
				defer close(echoed)
				buf := make([]byte, 8)
				for i := uint64(0); ; i++ {
					if ms[1].Irecv(0, i, buf).Wait(ctx) != nil {
						return
					}
					select {
					case <-stop:
						return
					default:
					}
					if ms[1].Send(ctx, 0, i, buf) != nil {
						return
					}
				}
			}()
			buf := make([]byte, 8)
			b.ReportAllocs()
			i := uint64(0)
			for b.Loop() {
				q := ms[0].Irecv(1, i, buf)
				if err := ms[0].Send(ctx, 1, i, buf); err != nil {
					b.Fatal(err)
				}
				if err := q.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				i++
			}
			close(stop)
			_ = ms[0].Send(ctx, 1, i, buf)
			<-echoed
			_ = ms[0].Close()
			_ = ms[1].Close()
		})
	}
}
