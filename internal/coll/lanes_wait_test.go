package coll

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/gocoll/gocoll/internal/reduce"
	"github.com/gocoll/gocoll/reduceop"
	"github.com/gocoll/gocoll/tensor"
)

// memLanes is an in-memory Lanes between goroutines: a queue of messages
// per ordered pair, and a count of the receives that Expect came before
// (a large op's wait) and of those it did not.
type memLanes struct {
	rank, size int
	net        *memNet
	expected   map[int]bool // peer -> Expect called since its last receive
	waited     int          // receives preceded by Expect
	plain      int          // receives not preceded by Expect
}

type memNet struct {
	mu sync.Mutex
	cv *sync.Cond
	q  map[[2]int][][]byte // (from, to) -> messages
}

func newMemNet(n int) []*memLanes {
	net := &memNet{q: map[[2]int][][]byte{}}
	net.cv = sync.NewCond(&net.mu)
	ls := make([]*memLanes, n)
	for r := range n {
		ls[r] = &memLanes{rank: r, size: n, net: net, expected: map[int]bool{}}
	}
	return ls
}

func (l *memLanes) Rank() int { return l.rank }
func (l *memLanes) Size() int { return l.size }

func (l *memLanes) Send(_ context.Context, peer int, buf []byte) error {
	l.net.mu.Lock()
	defer l.net.mu.Unlock()
	k := [2]int{l.rank, peer}
	l.net.q[k] = append(l.net.q[k], append([]byte(nil), buf...))
	l.net.cv.Broadcast()
	return nil
}

// next waits for peer's next message; with take, it removes it.
func (l *memLanes) next(peer int, take bool) []byte {
	l.net.mu.Lock()
	defer l.net.mu.Unlock()
	k := [2]int{peer, l.rank}
	for len(l.net.q[k]) == 0 {
		l.net.cv.Wait()
	}
	m := l.net.q[k][0]
	if take {
		l.net.q[k] = l.net.q[k][1:]
	}
	return m
}

func (l *memLanes) Expect(_ context.Context, peer, n int) error {
	if m := l.next(peer, false); len(m) != n {
		return fmt.Errorf("rank %d expects %d bytes from %d, the message has %d", l.rank, n, peer, len(m))
	}
	l.expected[peer] = true
	return nil
}

func (l *memLanes) Recv(_ context.Context, peer int, n, _ int, fn func(off int, src []byte)) error {
	m := l.next(peer, true)
	if len(m) != n {
		return fmt.Errorf("rank %d receives %d bytes from %d, want %d", l.rank, len(m), peer, n)
	}
	l.count(peer)
	fn(0, m)
	return nil
}

func (l *memLanes) RecvInto(ctx context.Context, peer int, buf []byte, unit int, fn func(dst, src []byte)) error {
	return l.Recv(ctx, peer, len(buf), unit, func(off int, src []byte) { fn(buf[off:off+len(src)], src) })
}

func (l *memLanes) count(peer int) {
	if l.expected[peer] {
		l.waited++
	} else {
		l.plain++
	}
	delete(l.expected, peer)
}

// TestLaneLargeWaits checks that the receives of a large lane allreduce
// wait as a large op's should (Expect before each: a poll that yields for
// milliseconds before it parks), and a small one's do not (they park
// after a short spin, so that an idle group costs nothing): recursive
// doubling in chunks at 2 ranks, the reduce-scatter and allgather at 4,
// and one-message recursive doubling below. The sums are checked too.
func TestLaneLargeWaits(t *testing.T) {
	k, err := reduce.For(tensor.Float32, reduceop.ReduceOp{Type: reduceop.Sum})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		n     int
		elems int
		large bool
		run   func(context.Context, Lanes, []byte, reduce.Kernel) error
	}{
		{"chunked, 2 ranks", 2, (laneWhole + 4096) / 4, true, AllreduceLanes},
		{"chunked, 3 ranks (fold)", 3, (laneWhole + 4096) / 4, true, AllreduceLanes},
		{"rsag, 4 ranks", 4, (256<<10)/4 + 3, true, AllreduceLanesRSAG},
		{"one message, 2 ranks", 2, 1000, false, AllreduceLanes},
	} {
		t.Run(c.name, func(t *testing.T) {
			ls := newMemNet(c.n)
			bufs := make([][]byte, c.n)
			errs := make([]error, c.n)
			var wg sync.WaitGroup
			for r := range c.n {
				bufs[r] = make([]byte, 4*c.elems)
				for i := range c.elems {
					binary.LittleEndian.PutUint32(bufs[r][4*i:], math.Float32bits(float32(r+i%5)))
				}
				wg.Go(func() { errs[r] = c.run(context.Background(), ls[r], bufs[r], k) })
			}
			wg.Wait()
			for r, l := range ls {
				if errs[r] != nil {
					t.Fatalf("rank %d: %v", r, errs[r])
				}
				for i := range c.elems {
					want := float32(0)
					for q := range c.n {
						want += float32(q + i%5)
					}
					if got := math.Float32frombits(binary.LittleEndian.Uint32(bufs[r][4*i:])); got != want {
						t.Fatalf("rank %d element %d = %v, want %v", r, i, got, want)
					}
				}
				if c.large && (l.plain != 0 || l.waited == 0) {
					t.Errorf("rank %d: %d receives waited as a large op's, %d did not (want all)", r, l.waited, l.plain)
				}
				if !c.large && l.waited != 0 {
					t.Errorf("rank %d: %d receives of a small op waited as a large op's (want none)", r, l.waited)
				}
			}
		})
	}
}
