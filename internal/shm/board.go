package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Board: one shared file for all the ranks of a host, where each rank
// posts a small message once for every peer to read, rather than one
// frame into each peer's ring (a flat exchange of n ranks writes one slot,
// not n-1 frames: at 4 ranks on 2 cores and 8 B, the three stamped writes
// were the largest part of the op's own CPU time, each waiting for the
// cross-core transfer of the line its reader polls; docs/perf.md, issue
// 17, ninth pass).
//
// Each rank owns two slots and writes them in turn (Post): a message's
// slot is reused two messages later. The slot's first word, its stamp,
// is written last: the caller's tag for the message (tags grow, and a
// fresh file holds zeros, so a stamp is never mistaken for a later one).
// Readers poll both slots of a peer for the stamp they want (Await); the
// writer must not overwrite a slot while a peer may still want it, which
// the caller ensures (tcpmesh's board: a peer that has posted a later
// message has finished reading the older one).
//
// Waiting is Ring.AwaitStamped's: polls with sched_yield for Yield (or a
// spin), then futex sleeps on the owner's word, which Post wakes when
// someone announced a sleep; Close and MarkDead wake the sleepers.
// The file is unlinked once every rank has mapped it, as pair files are.
//
// Where ranks outnumber CPUs, KeepHome makes Post keep its rank on a home
// CPU, the ranks of the host spread evenly over their CPUs (spread.go).

// Board layout: a header page (magic, ranks, slot bytes), then per rank a
// control line (the futex word and the sleepers' count) and its two slots.
const (
	boardMagic  = 0x6763627264303031 // "gcbrd001"
	boardHeader = 4096
	boardCtrl   = 64
)

// Board is one rank's mapping of a board file.
type Board struct {
	mem    []byte
	n      int
	rank   int
	slot   int // bytes per slot, a multiple of StampAlign
	stride int // bytes per rank: control line and two slots

	// Yield is how long Await polls with sched_yield when spin <= 0,
	// before it sleeps (Ring.Yield's role).
	Yield time.Duration
	// Budget, when not nil, is where Await takes its spin from when it is
	// given one (spin > 0), and what it tells how its sleeps went.
	Budget *SpinBudget

	closed atomic.Bool
	dead   []atomic.Bool // per peer, this side's view
	mu     sync.Mutex    // orders Close and MarkDead's wake-ups with Unmap
	posted uint64        // Posts so far: the next one's slot is posted&1
	sp     *spreader     // Post's home CPU (KeepHome); nil: none
}

// BoardBytes is the size of a board file of n ranks with slots of
// slotBytes (a multiple of StampAlign).
func BoardBytes(n, slotBytes int) int { return boardHeader + n*(boardCtrl+2*slotBytes) }

// CreateBoard makes, sizes and maps a new board file of n ranks whose
// slots hold slotBytes each (rounded up to StampAlign), named after
// prefix plus a random suffix, as rank. The caller unlinks it once every
// peer has mapped it.
func CreateBoard(prefix string, n, rank, slotBytes int) (*Board, string, error) {
	slotBytes = (slotBytes + StampAlign - 1) &^ (StampAlign - 1)
	if n < 1 || rank < 0 || rank >= n || slotBytes <= 0 {
		return nil, "", fmt.Errorf("shm: board of %d ranks (rank %d), slots of %d bytes", n, rank, slotBytes)
	}
	mem, path, err := createFile(prefix, BoardBytes(n, slotBytes))
	if err != nil {
		return nil, "", err
	}
	binary.LittleEndian.PutUint64(mem[8:], uint64(n))
	binary.LittleEndian.PutUint64(mem[16:], uint64(slotBytes))
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&mem[0])), boardMagic) // last: OpenBoard checks it
	return newBoard(mem, n, rank, slotBytes), path, nil
}

// OpenBoard maps a board file made by CreateBoard as rank of n.
func OpenBoard(path string, n, rank int) (*Board, error) {
	mem, err := mapFile(path, boardHeader)
	if err != nil {
		return nil, err
	}
	bn := binary.LittleEndian.Uint64(mem[8:])
	sb := binary.LittleEndian.Uint64(mem[16:])
	if atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[0]))) != boardMagic || bn != uint64(n) || sb == 0 || sb%StampAlign != 0 ||
		BoardBytes(n, int(sb)) != len(mem) || rank < 0 || rank >= n {
		_ = syscall.Munmap(mem)
		return nil, fmt.Errorf("shm: %s is not a gocoll board file of %d ranks", path, n)
	}
	return newBoard(mem, n, rank, int(sb)), nil
}

func newBoard(mem []byte, n, rank, slot int) *Board {
	return &Board{mem: mem, n: n, rank: rank, slot: slot, stride: boardCtrl + 2*slot, dead: make([]atomic.Bool, n)}
}

// KeepHome makes Post keep the posting thread on this rank's home CPU
// (spread.go), until Close gives the threads it bound their affinity
// back. Call it before the board is used, on a host with fewer CPUs than
// ranks.
func (b *Board) KeepHome() { b.sp = newSpreader(b.rank) }

// SlotBytes is the size of a slot, stamp included.
func (b *Board) SlotBytes() int { return b.slot }

func (b *Board) seq(r int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b.mem[boardHeader+r*b.stride]))
}

func (b *Board) sleepers(r int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b.mem[boardHeader+r*b.stride+4]))
}

func (b *Board) stamp(r, i int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&b.mem[boardHeader+r*b.stride+boardCtrl+i*b.slot]))
}

// Slot is slot i (0 or 1) of rank r, stamp included: the caller fills its
// own next slot (Next) before Post, and reads a peer's after Await.
func (b *Board) Slot(r, i int) []byte {
	o := boardHeader + r*b.stride + boardCtrl + i*b.slot
	return b.mem[o : o+b.slot : o+b.slot]
}

// Stamps returns the stamps of rank r's two slots.
func (b *Board) Stamps(r int) (uint64, uint64) { return b.stamp(r, 0).Load(), b.stamp(r, 1).Load() }

// Next is the index of this rank's slot that the next Post publishes:
// the older of the two, which the caller fills (after the stamp) first.
func (b *Board) Next() int { return int(b.posted & 1) }

// Post publishes this rank's slot Next under stamp (> 0 and greater than
// every earlier one): the slot's bytes written before it are visible to a
// reader that sees the stamp. It wakes the peers that sleep on it.
func (b *Board) Post(stamp uint64) {
	i := int(b.posted & 1)
	b.posted++
	// A locked store: it orders the slot's bytes before it and the
	// sleepers' load after it (the sleeper announces, then looks).
	b.stamp(b.rank, i).Store(stamp)
	if b.sleepers(b.rank).Load() != 0 {
		b.seq(b.rank).Add(1)
		futexWake(b.seq(b.rank))
	}
	if b.sp != nil {
		b.sp.check()
	}
}

// Await waits until one of rank r's slots holds stamp want, and returns
// its index; or until a slot holds a greater stamp and neither holds want
// (r has moved past the message), returning -1 and that stamp. It polls
// as Ring.AwaitStamped does (spin, b.Yield, slices of at most slice,
// check while parked) and fails with ErrClosed, ErrPeerDead (r is gone
// and has not posted want), ctx's error or check's.
func (b *Board) Await(ctx context.Context, r int, want uint64, spin, slice time.Duration, check func() error) (int, uint64, error) {
	s0, s1 := b.stamp(r, 0), b.stamp(r, 1)
	p := newPacer(spin, b.Yield, b.Budget)
	for i := 0; ; i++ {
		dead := b.dead[r].Load()
		a, c := s0.Load(), s1.Load()
		switch {
		case a == want:
			p.ended()
			return 0, 0, nil
		case c == want:
			p.ended()
			return 1, 0, nil
		case a > want || c > want:
			p.ended()
			// Read again: the two loads are not one, and the writer may
			// have posted want into the slot read first and then a later
			// message into the other. Once a later stamp is seen, want
			// (posted before it, if at all) is visible; and the slot that
			// holds it is not overwritten before this rank posts a later
			// message than want (the caller's rule).
			if a, c = s0.Load(), s1.Load(); a == want {
				return 0, 0, nil
			} else if c == want {
				return 1, 0, nil
			}
			return -1, max(a, c), nil
		}
		if b.closed.Load() {
			return -1, 0, ErrClosed
		}
		if dead {
			return -1, 0, ErrPeerDead
		}
		if p.poll(i) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return -1, 0, fmt.Errorf("shm: waiting for rank %d's board slot: %w", r, err)
		}
		if check != nil {
			if err := check(); err != nil {
				return -1, 0, err
			}
		}
		d := slice
		if dl, ok := ctx.Deadline(); ok {
			d = min(d, time.Until(dl)+time.Millisecond)
		}
		sl, sq := b.sleepers(r), b.seq(r)
		sl.Add(1)
		seq := sq.Load()
		// Announced before looking (a locked add), as Post stamps before
		// it looks at the sleepers.
		if a, c := s0.Load(), s1.Load(); a < want && c < want && !b.closed.Load() && !b.dead[r].Load() {
			p.sleeping()
			futexWait(sq, seq, max(d, time.Microsecond))
		}
		sl.Add(^uint32(0))
	}
}

// MarkDead records that rank r is gone: waits for it fail with
// ErrPeerDead once it has not posted what they want.
func (b *Board) MarkDead(r int) {
	b.dead[r].Store(true)
	b.kick(r)
}

// Close makes the local waits return ErrClosed, now and later. It may be
// called more than once, and after Unmap.
func (b *Board) Close() {
	b.closed.Store(true)
	if b.sp != nil {
		b.sp.restore()
	}
	for r := range b.n {
		b.kick(r)
	}
}

func (b *Board) kick(r int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mem != nil {
		b.seq(r).Add(1)
		futexWake(b.seq(r))
	}
}

// Unmap releases the mapping; no call may run on the board or start
// after it (Close it and wait first).
func (b *Board) Unmap() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mem == nil {
		return nil
	}
	err := syscall.Munmap(b.mem)
	b.mem = nil
	if err != nil {
		return fmt.Errorf("shm: munmap: %w", err)
	}
	return nil
}
