package tcpmesh

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/gocoll/gocoll/internal/shm"
)

// The board: where a flat exchange of small messages between all the
// ranks of one host posts each rank's message once (shm.Board), rather
// than one lane frame to each peer. Every rank reads every peer's slot
// straight out of shared memory.
//
// A slot holds the stamp (the op's tag, written last), the header
// (payload length, element count, op, dtype, reduce op, magic, rank:
// what a lane frame says about its op, so that a rank that disagrees is
// caught and named as on the lanes) and the payload. Each rank writes its
// two slots in turn; it may overwrite the older one (tag s) only once
// every peer has posted a later message, which says that the peer is
// done with s (a rank runs its lane ops one at a time, in tag order).
// After an op that succeeded here that holds already (every peer posted
// that op's message, later than s), so the check costs a comparison per
// peer; after one that failed, the post waits for the peers that have
// not posted since s.
//
// Set up only where every peer has a lane, with 3 to BoardRanks ranks;
// every rank agrees on whether it exists (Board), so that every rank
// takes the same path for an op.

const (
	// BoardMax is the largest payload of a board message.
	BoardMax = 1 << 10
	// BoardRanks is the most ranks a board is set up for.
	BoardRanks = 8
	boardHdr   = 32
	// Header fields after the stamp (bytes 0-7).
	bhLen   = 8
	bhCount = 16
	bhOp    = 24 // op, dtype, reduce op, magic
	bhRank  = 28
)

// setupBoard makes the board: rank 0 creates the file and publishes its
// path in the store; the others map it and say whether they could; rank 0
// unlinks it and publishes the verdict, which every rank follows. A board
// that cannot be made leaves the mesh without one (the flat exchange
// then takes the lanes).
func (m *Mesh) setupBoard(ctx context.Context) error {
	key := func(s string) string { return "tcpmesh/board/" + s }
	if m.rank == 0 {
		b, path, cerr := shm.CreateBoard(fmt.Sprintf("gocoll-%d-board-", os.Getpid()), m.size, 0, boardHdr+BoardMax)
		if cerr != nil {
			path = ""
		}
		if path != "" {
			defer func() { _ = shm.Unlink(path) }()
		}
		if err := m.cfg.Store.Set(ctx, key("path"), []byte(path)); err != nil {
			if b != nil {
				_ = b.Unmap()
			}
			return fmt.Errorf("tcpmesh: publishing the board: %w", err)
		}
		ok := b != nil
		for r := 1; r < m.size; r++ {
			v, err := m.cfg.Store.Get(ctx, key(strconv.Itoa(r)))
			if err != nil {
				if b != nil {
					_ = b.Unmap()
				}
				return fmt.Errorf("tcpmesh: rank 0 waiting for rank %d's board: %w", r, err)
			}
			ok = ok && len(v) == 1 && v[0] == '1'
		}
		verdict := []byte{'0'}
		if ok {
			verdict[0] = '1'
		}
		if err := m.cfg.Store.Set(ctx, key("use"), verdict); err != nil {
			if b != nil {
				_ = b.Unmap()
			}
			return fmt.Errorf("tcpmesh: publishing the board's verdict: %w", err)
		}
		if ok {
			m.board = b
		} else if b != nil {
			_ = b.Unmap()
		}
	} else {
		v, err := m.cfg.Store.Get(ctx, key("path"))
		if err != nil {
			return fmt.Errorf("tcpmesh: rank %d waiting for the board: %w", m.rank, err)
		}
		var b *shm.Board
		if len(v) > 0 {
			b, _ = shm.OpenBoard(string(v), m.size, m.rank)
		}
		mine := []byte{'0'}
		if b != nil {
			mine[0] = '1'
		}
		if err := m.cfg.Store.Set(ctx, key(strconv.Itoa(m.rank)), mine); err != nil {
			if b != nil {
				_ = b.Unmap()
			}
			return fmt.Errorf("tcpmesh: publishing rank %d's board: %w", m.rank, err)
		}
		verdict, err := m.cfg.Store.Get(ctx, key("use"))
		if err != nil {
			if b != nil {
				_ = b.Unmap()
			}
			return fmt.Errorf("tcpmesh: rank %d waiting for the board's verdict: %w", m.rank, err)
		}
		if len(verdict) == 1 && verdict[0] == '1' && b != nil {
			m.board = b
		} else if b != nil {
			_ = b.Unmap()
		}
	}
	if m.board != nil {
		m.boardSeen = make([]uint64, m.size)
	}
	return nil
}

// Board reports whether the ranks share a board, so that a flat exchange
// of up to BoardMax bytes may post its messages there (BoardPostHeld,
// BoardRecvHeld). Every rank of the mesh sees the same.
func (m *Mesh) Board() bool { return m.board != nil }

// BoardPostHeld posts buf as this rank's message of the op with tag,
// described by fp. It waits only after an op that failed here, for the
// peers that may still read the slot it overwrites. The caller holds the
// lanes (HoldLanes).
func (m *Mesh) BoardPostHeld(ctx context.Context, tag uint64, fp Fingerprint, buf []byte) error {
	bd := m.board
	if len(buf) > BoardMax {
		return fmt.Errorf("tcpmesh: board message of %d bytes exceeds %d", len(buf), BoardMax)
	}
	if m.boardGone {
		return m.errOr(ErrClosed)
	}
	i := bd.Next()
	a, c := bd.Stamps(m.rank)
	old := a
	if i == 1 {
		old = c
	}
	for p := range m.size {
		if old == 0 || p == m.rank || m.boardSeen[p] > old {
			continue
		}
		// p has not posted since the message this slot holds: it may
		// still read it. Wait until it posts a later one.
		slot, later, err := bd.Await(ctx, p, old+1, m.cfg.PollSpin, laneSlice, func() error { return m.TagError(p, tag, len(buf)) })
		if err != nil {
			return m.laneErr(m.peers[p], err)
		}
		if slot >= 0 {
			later = old + 1
		}
		m.boardSeen[p] = max(m.boardSeen[p], later)
	}
	s := bd.Slot(m.rank, i)
	binary.LittleEndian.PutUint64(s[bhLen:], uint64(len(buf)))
	binary.LittleEndian.PutUint64(s[bhCount:], fp.Count)
	s[bhOp], s[bhOp+1], s[bhOp+2], s[bhOp+3] = fp.Op, fp.DType, fp.ReduceOp, laneMagic
	binary.LittleEndian.PutUint32(s[bhRank:], uint32(m.rank))
	copy(s[boardHdr:], buf)
	bd.Post(tag)
	return nil
}

// BoardRecvHeld hands peer's message of the op with tag to fn (dst, and
// the payload straight from shared memory), after checking that the peer
// describes the op as fp does and sent len(dst) bytes. The peer may be
// this rank (its own message, posted already). While the wait is parked
// it looks for why it should end (boardCheck: the op failed elsewhere, or
// the peer sent it over its lane). The caller holds the lanes.
func (m *Mesh) BoardRecvHeld(ctx context.Context, peer int, tag uint64, fp Fingerprint, dst []byte, fn func(dst, src []byte)) error {
	bd := m.board
	if m.boardGone {
		return m.errOr(ErrClosed)
	}
	n := len(dst)
	if peer == m.rank {
		s := bd.Slot(m.rank, bd.Next()^1) // the last one posted
		fn(dst, s[boardHdr:boardHdr+n])
		return nil
	}
	i, later, err := bd.Await(ctx, peer, tag, m.cfg.PollSpin, laneSlice, func() error { return m.boardCheck(peer, tag, fp, n) })
	if err != nil {
		return m.laneErr(m.peers[peer], err)
	}
	if i < 0 {
		m.boardSeen[peer] = max(m.boardSeen[peer], later)
		return &RemoteOpError{Rank: peer, Tag: tag, Reason: fmt.Sprintf("rank %d moved on to a later op (tag %d) without posting this one's message", peer, later)}
	}
	m.boardSeen[peer] = max(m.boardSeen[peer], tag)
	s := bd.Slot(peer, i)
	if err := m.boardHeader(s, peer, tag, fp, n); err != nil {
		return err
	}
	fn(dst, s[boardHdr:boardHdr+n])
	return nil
}

// boardHeader checks the header of peer's slot s, stamped with tag,
// against the op (fp, n bytes): a corrupt header breaks the mesh, a
// different op or size is refused (refuseTag) and returned.
func (m *Mesh) boardHeader(s []byte, peer int, tag uint64, fp Fingerprint, n int) error {
	if s[bhOp+3] != laneMagic || int(binary.LittleEndian.Uint32(s[bhRank:])) != peer {
		err := &PeerError{Rank: peer, Err: errors.New("corrupt board slot")}
		m.fail(err)
		return err
	}
	ln := int(binary.LittleEndian.Uint64(s[bhLen:]))
	theirs := Fingerprint{Op: s[bhOp], DType: s[bhOp+1], ReduceOp: s[bhOp+2], Count: binary.LittleEndian.Uint64(s[bhCount:])}
	if ln > BoardMax {
		err := &PeerError{Rank: peer, Err: errors.New("corrupt board slot")}
		m.fail(err)
		return err
	}
	if theirs.mismatch(fp) {
		err := &MismatchError{Rank: peer, Tag: tag, Theirs: theirs, Ours: fp}
		m.refuseTag(tag, err)
		return err
	}
	if ln != n {
		err := &SizeError{Rank: peer, Tag: tag, Got: ln, Want: n}
		m.refuseTag(tag, err)
		return err
	}
	return nil
}

// boardConflict is the mismatch of an op with tag (fp, want bytes, or
// -1 for any) that this rank runs elsewhere (over its lanes or rings)
// while peer posted it on the board, or nil: peer's slot for tag holds a
// different op or size. A read-only look, safe beside the peer's writes
// (the stamp is read before and after the header) and beside Close.
func (m *Mesh) boardConflict(peer int, tag uint64, fp Fingerprint, want int) error {
	if m.board == nil || peer == m.rank || peer < 0 || peer >= m.size {
		return nil
	}
	m.boardMu.RLock()
	defer m.boardMu.RUnlock()
	if m.boardGone {
		return nil
	}
	bd := m.board
	for i := range 2 {
		s := bd.Slot(peer, i)
		st := func() uint64 { a, c := bd.Stamps(peer); return [2]uint64{a, c}[i] }
		if st() != tag {
			continue
		}
		var h [boardHdr]byte
		copy(h[:], s)
		if st() != tag || h[bhOp+3] != laneMagic {
			return nil
		}
		ln := int(binary.LittleEndian.Uint64(h[bhLen:]))
		theirs := Fingerprint{Op: h[bhOp], DType: h[bhOp+1], ReduceOp: h[bhOp+2], Count: binary.LittleEndian.Uint64(h[bhCount:])}
		if theirs.mismatch(fp) {
			return &MismatchError{Rank: peer, Tag: tag, Theirs: theirs, Ours: fp}
		}
		if want >= 0 && ln != want {
			return &SizeError{Rank: peer, Tag: tag, Got: ln, Want: want}
		}
		return nil
	}
	return nil
}

// closeBoard makes the board's waits fail; unmapBoard unmaps it once no
// board call runs (m.laneHold held) and no look (boardMu).
func (m *Mesh) closeBoard() {
	if m.board != nil {
		m.board.Close()
	}
}

func (m *Mesh) unmapBoard() {
	if m.board == nil {
		return
	}
	m.boardMu.Lock()
	if !m.boardGone {
		m.boardGone = true
		_ = m.board.Unmap()
	}
	m.boardMu.Unlock()
}
