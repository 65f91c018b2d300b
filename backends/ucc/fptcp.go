package ucc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gocoll/gocoll/internal/tcpmesh"
)

// tcpBoard is the fingerprint board of ranks on different hosts: the
// board lives in this process's heap, and a mesh of TCP connections of
// its own (internal/tcpmesh, TCP only, set up over the group's store
// under "ucc/fp/") carries each rank's slots to every peer, one 32-byte
// message per op and peer, tagged with the op's number. One goroutine per
// peer receives them in order into the peer's ring here; it waits (and
// TCP holds the peer back) while the ring is full of numbers this rank
// has not checked yet, so post itself never waits for the peers' checks.
//
// A peer that dies or aborts breaks its connection: tcpmesh fails the
// receive with an error naming the rank, and gone reports it.
type tcpBoard struct {
	r    *fpRings
	mesh *tcpmesh.Mesh
	rank int

	mu    sync.Mutex
	cond  *sync.Cond
	done  uint64  // this rank's checked count
	errs  []error // per peer: why its receives ended
	blame []int   // per peer: the rank errs blames (tcpmesh.RootRank)
	quit  bool
	wg    sync.WaitGroup
	sendT time.Duration // bounds one send
}

var _ fpBoard = (*tcpBoard)(nil)

// newTCPBoard connects the side channel and starts its receivers.
func newTCPBoard(ctx context.Context, st tcpmesh.KV, rank, n int, host string, connect, sendT time.Duration) (*tcpBoard, error) {
	m, err := tcpmesh.Connect(ctx, tcpmesh.Config{Rank: rank, Size: n, Store: st, Host: host, ConnectTimeout: connect,
		Transport: tcpmesh.TransportTCP, MaxMessage: fpSlotSize})
	if err != nil {
		return nil, fmt.Errorf("ucc: fingerprint side channel: %w", err)
	}
	t := &tcpBoard{r: heapRings(n, fpSlots), mesh: m, rank: rank, errs: make([]error, n), blame: make([]int, n), sendT: sendT}
	t.cond = sync.NewCond(&t.mu)
	for p := range n {
		if p != rank {
			t.wg.Add(1)
			go t.receive(p)
		}
	}
	return t, nil
}

// receive fills peer's ring from its messages, in order.
func (t *tcpBoard) receive(peer int) {
	defer t.wg.Done()
	var buf [fpSlotSize]byte
	for seq := uint64(0); ; seq++ {
		t.mu.Lock()
		for !t.quit && seq >= t.done+uint64(t.r.k) {
			t.cond.Wait()
		}
		quit := t.quit
		t.mu.Unlock()
		if quit {
			return
		}
		err := t.mesh.Irecv(peer, seq, buf[:]).Wait(context.Background())
		if err != nil {
			t.fail(peer, err)
			return
		}
		t.r.put(peer, seq, decodeSlot(buf[:]))
	}
}

// encodeSlot and decodeSlot are a slot on the wire: the two data words,
// little-endian, in 32 bytes (the rest spare).
func encodeSlot(b []byte, s fpSlot) {
	w1, w2 := s.words()
	for i := range 8 {
		b[i], b[8+i] = byte(w1>>(8*i)), byte(w2>>(8*i))
	}
}

func decodeSlot(b []byte) fpSlot {
	var w1, w2 uint64
	for i := range 8 {
		w1 |= uint64(b[i]) << (8 * i)
		w2 |= uint64(b[8+i]) << (8 * i)
	}
	return slotOf(w1, w2)
}

func (t *tcpBoard) post(seq uint64, s fpSlot) bool {
	var buf [fpSlotSize]byte
	encodeSlot(buf[:], s)
	ctx, cancel := context.WithTimeout(context.Background(), t.sendT)
	defer cancel()
	for p := range t.r.n {
		if p == t.rank {
			continue
		}
		if err := t.mesh.Send(ctx, p, seq, buf[:]); err != nil {
			t.fail(p, err)
		}
	}
	return true
}

func (t *tcpBoard) peek(peer int, seq uint64) (fpSlot, bool) { return t.r.get(peer, seq) }

func (t *tcpBoard) checked(n uint64) {
	t.mu.Lock()
	if n > t.done {
		t.done = n
		t.cond.Broadcast()
	}
	t.mu.Unlock()
}

// fail records why peer's channel ended. The mesh fails every receive
// when one connection breaks, naming the rank whose connection it was
// (or the rank a peer gave up because of): that rank is blamed, not peer.
func (t *tcpBoard) fail(peer int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.errs[peer] != nil || t.quit {
		return
	}
	t.blame[peer] = peer
	if r, ok := tcpmesh.RootRank(err); ok && r != t.rank {
		t.blame[peer] = r
	}
	t.errs[peer] = fmt.Errorf("the fingerprint channel broke because of rank %d: %w", t.blame[peer], err)
}

func (t *tcpBoard) gone(peer int) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.blame[peer], t.errs[peer]
}

func (t *tcpBoard) kind() string { return "tcp" }

func (t *tcpBoard) close() error {
	t.mu.Lock()
	t.quit = true
	t.cond.Broadcast()
	t.mu.Unlock()
	err := t.mesh.Close()
	t.wg.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("ucc: fingerprint side channel: %w", err)
	}
	return nil
}
