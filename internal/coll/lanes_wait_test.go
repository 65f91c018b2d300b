package coll

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"testing"
	"unsafe"

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
		// Blocks beyond RSAGMax: two whole rounds and a short third.
		{"rsag in rounds, 3 ranks", 3, (2*3*RSAGMax+4100)/4 + 1, true, AllreduceLanesRSAG},
		{"rsag in rounds, 4 ranks", 4, 2 * RSAGMax, true, AllreduceLanesRSAG},
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

// memDirect is memLanes whose ranks may read each other's buffers (they
// are goroutines of one process): ReadPeer copies from peer's buffer,
// found by its address, and fails on an address outside it.
type memDirect struct {
	*memLanes
	bufs [][]byte // by rank
}

func (l memDirect) ReadPeer(peer int, dst []byte, addr uintptr) error {
	b := l.bufs[peer]
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if addr < base || addr+uintptr(len(dst)) > base+uintptr(len(b)) {
		return fmt.Errorf("rank %d reads %d bytes at %#x, outside rank %d's buffer", l.rank, len(dst), addr, peer)
	}
	copy(dst, b[addr-base:])
	return nil
}

// TestDirectLanesSchedule runs AllreduceDirectLanes over in-memory lanes:
// worlds 2 to 4, element sizes 1 to 8, counts that give one, two, three
// and many raw chunks a block (and a last chunk of a few elements, blocks
// of unequal length), three ops in a row on the same lanes (a lane's
// order is checked message by message: each receive must find the length
// it expects). The result must be the exact sum on every rank.
func TestDirectLanesSchedule(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		for _, dt := range []tensor.DType{tensor.Int8, tensor.Float16, tensor.Int32, tensor.Int64} {
			// Float16 (the 2-byte element) takes MAX of small integers,
			// whose bits are f16 below; the integers take SUM.
			rop := reduceop.ReduceOp{Type: reduceop.Sum}
			if dt == tensor.Float16 {
				rop.Type = reduceop.Max
			}
			k, err := reduce.For(dt, rop)
			if err != nil {
				t.Fatal(err)
			}
			e := dt.Size()
			for _, blockBytes := range []int{e, 1000 * e, RawChunk + e, 2*RawChunk + 3*e, 6*RawChunk + 5*e} {
				if blockBytes > 3*RawChunk && (e == 2 || e == 4) {
					continue // many chunks (gathers in groups, then the rest): two element sizes suffice
				}
				elems := n*blockBytes/e - 1
				ls := newMemNet(n)
				for op := range 3 {
					bufs := make([][]byte, n)
					errs := make([]error, n)
					var wg sync.WaitGroup
					for r := range n {
						bufs[r] = make([]byte, elems*e)
						for i := range elems {
							put(dt, bufs[r][i*e:], (r+i+op)%7)
						}
					}
					for r := range n {
						wg.Go(func() { errs[r] = AllreduceDirectLanes(context.Background(), memDirect{ls[r], bufs}, bufs[r], k) })
					}
					wg.Wait()
					for r := range n {
						if errs[r] != nil {
							t.Fatalf("world %d %v %d elements op %d rank %d: %v", n, dt, elems, op, r, errs[r])
						}
						want := make([]byte, e)
						for i := range elems {
							w := 0
							for q := range n {
								if v := (q + i + op) % 7; dt == tensor.Float16 {
									w = max(w, v)
								} else {
									w += v
								}
							}
							put(dt, want, w)
							if got := bufs[r][i*e : (i+1)*e]; string(got) != string(want) {
								t.Fatalf("world %d %v %d elements op %d rank %d: element %d = %x, want %x", n, dt, elems, op, r, i, got, want)
							}
						}
					}
				}
				for r, l := range ls {
					for p := range n {
						if m := l.net.q[[2]int{p, r}]; len(m) != 0 {
							t.Fatalf("world %d %v: rank %d left %d messages of rank %d unread", n, dt, r, len(m), p)
						}
					}
				}
			}
		}
	}
}

// put stores the small integer v (0 to 28) as an element of dt at b: its
// float16 bits for Float16, else little-endian.
func put(dt tensor.DType, b []byte, v int) {
	clear(b[:dt.Size()])
	if dt == tensor.Float16 {
		binary.LittleEndian.PutUint16(b, f16[v])
		return
	}
	b[0] = byte(v)
}

// f16 are the float16 bits of 0 to 6.
var f16 = [7]uint16{0x0000, 0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600}
