package tcpmesh

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/gocoll/gocoll/internal/shm"
)

// Lanes: the fast path of small collectives between ranks of one host.
//
// Every shared-memory peer gets a second pair of rings, its lane, that no
// reader goroutine watches: the op's own goroutine writes its messages
// into the peer's lane and reads (and reduces) the peer's straight out of
// its own, with no tag matching, no unexpected-message buffers and no
// goroutine wake-up. That is safe because lane messages are used by one op
// at a time, in issue order, on every rank (the backend serializes its
// lane ops), so the next message in a lane is always the one the op wants;
// the header still says which op it belongs to (tag, and what the op is),
// so a rank that disagrees is caught rather than misread.
//
// A lane message is one stamped frame (shm.WriteStamped): a 40-byte
// header (the stamp, tag, payload length, element count, op, dtype,
// reduce op, source rank) and the payload, padded to shm.StampAlign (64)
// bytes, published at once (messages are at most half the ring, so a
// write waits only for the previous op's message to be read). The reader
// polls the frame's stamp, not the ring's tail, and the writer looks at
// the reader's head only when its cached free space runs out, so an 8 B
// message moves one cache line each way. Messages of an earlier tag are
// stragglers of an op that failed on this rank and are skipped; a later
// tag means the peer has moved past the op.

const (
	laneHdr   = 40
	laneMagic = 0x4c // 'L', in byte 35 of the header
	// LaneRingBytes is the capacity of each direction of a lane.
	LaneRingBytes = 1 << 20
	// laneSlice bounds a parked lane wait, so that the caller's check (a
	// peer gave the op up, or sent it the slow way) runs now and then.
	laneSlice = 2 * time.Millisecond
	// laneYield is how long a lane receive polls with sched_yield before
	// it sleeps when more ranks than cores share the host (shm.Ring.Yield).
	laneYield = 100 * time.Microsecond
)

// The lane header's fields (after the stamp, bytes 0-7).
const (
	lhTag   = 8
	lhLen   = 16
	lhCount = 24
	lhOp    = 32 // op, dtype, reduce op, magic
	lhRank  = 36
)

// LaneMax is the largest payload a lane message may carry.
const LaneMax = LaneRingBytes/2 - laneHdr - shm.StampAlign

// lanePad is the padding after a lane payload of n bytes: frames are
// multiples of shm.StampAlign, so each starts a cache line.
func lanePad(n int) int { return -(laneHdr + n) & (shm.StampAlign - 1) }

// offerLane sets the lane up with a peer whose rings are mapped already,
// over the same connection and in the same way (the lower rank creates
// and unlinks). A lane that cannot be made leaves the peer without one:
// its ops take the rings.
func (m *Mesh) offerLane(ctx context.Context, p *peer) error {
	c := p.conn
	fail := func(err error) error {
		return fmt.Errorf("tcpmesh: rank %d, lane with rank %d: %w", m.rank, p.rank, err)
	}
	var pair *shm.Pair
	var why, err error
	if m.rank < p.rank {
		pair, why, err = createPair(c, fmt.Sprintf("gocoll-%d-%d-%d-lane-", os.Getpid(), m.rank, p.rank), LaneRingBytes, p.rank)
	} else {
		pair, why, err = openPair(c, p.rank)
	}
	if err != nil {
		return fail(err)
	}
	if why != nil {
		return nil // no lane: this peer's ops take the rings
	}
	p.lane = pair
	return m.probeDirect(p)
}

// Oversubscribed reports whether more ranks share this host (this one
// and its shared-memory peers) than it has CPUs: waits then give the
// core away rather than spin.
func (m *Mesh) Oversubscribed() bool { return 1+m.shmPeers > runtime.NumCPU() }

// Lanes reports whether every peer has a lane, so that the backend may run
// collectives over them (HoldLanes, LaneSendHeld, LaneRecvHeld).
func (m *Mesh) Lanes() bool { return m.lanes }

// HoldLanes keeps every lane mapped until ReleaseLanes, for the calls of
// one lane op to LaneSendHeld and LaneRecvHeld, which take no lock of
// their own: an op pays one read lock rather than two atomic updates per
// message (a tenth of a small allreduce's own CPU time at 4
// ranks, docs/perf.md, issue 17). Close waits for the holders, whose
// waits its failure of the mesh ends.
func (m *Mesh) HoldLanes() { m.laneHold.RLock() }

// ReleaseLanes ends a HoldLanes.
func (m *Mesh) ReleaseLanes() { m.laneHold.RUnlock() }

// StreamLanes sets whether this rank's large lane messages stream past its
// cache into the lanes (shm.Ring.Stream) until the next call. The caller
// holds the lanes (HoldLanes) and runs the only lane op of this rank, or
// sets the mesh up before its first op.
func (m *Mesh) StreamLanes(on bool) {
	for _, p := range m.peers {
		if p != nil && p.lane != nil {
			p.lane.Out.Stream = on
		}
	}
}

// LaneSendHeld writes buf to peer's lane as the message of the op with
// tag, described by fp (the same fingerprint as the rings' frames carry).
// It waits only while the peer's previous message is unread. The caller
// holds the lanes (HoldLanes).
func (m *Mesh) LaneSendHeld(ctx context.Context, peer int, tag uint64, fp Fingerprint, buf []byte) error {
	p := m.peers[peer]
	if len(buf) > LaneMax {
		return fmt.Errorf("tcpmesh: lane message of %d bytes exceeds %d", len(buf), LaneMax)
	}
	if p.laneGone {
		return m.errOr(ErrClosed)
	}
	h := p.lhdr[:]
	binary.LittleEndian.PutUint64(h[lhTag:], tag)
	binary.LittleEndian.PutUint64(h[lhLen:], uint64(len(buf)))
	binary.LittleEndian.PutUint64(h[lhCount:], fp.Count)
	h[lhOp], h[lhOp+1], h[lhOp+2], h[lhOp+3] = fp.Op, fp.DType, fp.ReduceOp, laneMagic
	binary.LittleEndian.PutUint32(h[lhRank:], uint32(m.rank))
	// A write waits only while the peer has not read this rank's earlier
	// messages; the check ends it if the op fails meanwhile elsewhere.
	if err := p.lane.Out.WriteStamped(ctx, h, buf, lanePad(len(buf)), func() error { return m.TagError(peer, tag, len(buf)) }); err != nil {
		return m.laneErr(p, err)
	}
	return nil
}

// LaneRecvHeld reads the message of the op with tag from peer's lane: it
// checks that the peer describes the op as fp does and sent n bytes, then hands
// the payload to fn in runs of whole units of unit bytes (off is the run's
// offset in the payload), straight from shared memory, and releases it.
// unit must divide 8 (an element's size). check, when not nil, is called
// while the receive is parked; its error ends the wait (a peer gave the
// op up, say). The caller holds the lanes (HoldLanes).
func (m *Mesh) LaneRecvHeld(ctx context.Context, peer int, tag uint64, fp Fingerprint, n, unit int, fn func(off int, src []byte), check func() error) error {
	if unit <= 0 || 8%unit != 0 {
		return fmt.Errorf("tcpmesh: lane receive in units of %d bytes (want 1, 2, 4 or 8)", unit)
	}
	p := m.peers[peer]
	if p.laneGone {
		return m.errOr(ErrClosed)
	}
	in := p.lane.In
	h := p.lrhdr[:]
	for {
		// A frame is published whole: once its stamp is there, so is
		// the rest.
		if err := in.AwaitStamped(ctx, m.cfg.PollSpin, laneSlice, check); err != nil {
			return m.laneErr(p, err)
		}
		a, b := in.FrameAt(0, laneHdr)
		copy(h[copy(h, a):], b)
		if h[lhOp+3] != laneMagic || int(binary.LittleEndian.Uint32(h[lhRank:])) != peer {
			err := &PeerError{Rank: peer, Err: errors.New("corrupt lane frame")}
			m.fail(err)
			return err
		}
		got := binary.LittleEndian.Uint64(h[lhTag:])
		ln := int(binary.LittleEndian.Uint64(h[lhLen:]))
		theirs := Fingerprint{Op: h[lhOp], DType: h[lhOp+1], ReduceOp: h[lhOp+2], Count: binary.LittleEndian.Uint64(h[lhCount:])}
		whole := laneHdr + ln + lanePad(ln)
		if got > tag {
			// The peer is past this op (it gave it up, or never ran it
			// here): leave its message to the op it belongs to.
			return &RemoteOpError{Rank: peer, Tag: tag, Reason: fmt.Sprintf("rank %d moved on to a later op (tag %d) without sending this one's message", peer, got)}
		}
		if got < tag {
			in.Consume(whole) // a straggler of an op that failed here
			continue
		}
		if theirs.mismatch(fp) {
			in.Consume(whole)
			err := &MismatchError{Rank: peer, Tag: tag, Theirs: theirs, Ours: fp}
			m.refuseTag(tag, err)
			return err
		}
		if ln != n {
			in.Consume(whole)
			err := &SizeError{Rank: peer, Tag: tag, Got: ln, Want: n}
			m.refuseTag(tag, err)
			return err
		}
		// The payload lies in at most two runs (the second one after the
		// ring's end), each a whole number of units: frames and payloads
		// sit at 8-byte boundaries of the ring, and no unit is larger.
		if a, b := in.FrameAt(laneHdr, n); n > 0 {
			fn(0, a)
			if len(b) > 0 {
				fn(len(a), b)
			}
		}
		in.Consume(whole)
		return nil
	}
}

// laneErr turns a ring error on p's lane into the mesh's error: a dead
// peer breaks the mesh, as a failed connection does.
func (m *Mesh) laneErr(p *peer, err error) error {
	switch {
	case errors.Is(err, shm.ErrClosed):
		return m.errOr(ErrClosed)
	case errors.Is(err, shm.ErrPeerDead):
		// The peer may have left because of another rank and said so
		// on its rings (an abort notice, read by its reader, not by the
		// lane): failWrite's grace lets that reason win over this view.
		perr := &PeerError{Rank: p.rank, Err: fmt.Errorf("connection closed: %w", err)}
		m.failWrite(p, perr)
		return m.errOr(perr)
	}
	return err
}

// closeLane makes p's lane waits fail and unmaps it once no lane call
// runs; m.laneHold is held (no HoldLanes holder either).
func (p *peer) closeLane() {
	if p.lane == nil {
		return
	}
	p.lane.Close()
	p.laneMu.Lock()
	if !p.laneGone {
		p.laneGone = true
		_ = p.lane.Unmap()
	}
	p.laneMu.Unlock()
}

// TagError is why a lane receive from peer of the op with tag (want
// bytes) should stop waiting, or nil: the mesh broke, a rank gave the op
// up (FailTag), or the peer sent the op's messages over the rings, which
// it does when its buffer is too large for the lanes: the sizes differ.
func (m *Mesh) TagError(peer int, tag uint64, want int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.broken != nil {
		return m.broken
	}
	if e := m.failed[tag]; e != nil {
		return e
	}
	if l, ok := m.unexpected[key{peer, tag}]; ok && l.head != nil {
		return &SizeError{Rank: peer, Tag: tag, Got: len(l.head.buf), Want: want}
	}
	return nil
}

// LaneCheck is TagError for a lane receive of the op with tag (described
// by fp, want bytes) from peer, which also looks at peer's board slots:
// a peer that posted the op there (a flat exchange, where this rank's
// size sent it elsewhere) is at odds with this rank, which refuses the op.
func (m *Mesh) LaneCheck(peer int, tag uint64, fp Fingerprint, want int) error {
	if err := m.TagError(peer, tag, want); err != nil {
		return err
	}
	if err := m.boardConflict(peer, tag, fp, want); err != nil {
		m.refuseTag(tag, err)
		return err
	}
	return nil
}

// boardCheck is the check of a board receive of the op with tag (fp, want
// bytes) from peer: TagError, or the peer's lane frame of the op (it ran
// it over its lanes: its size differs).
func (m *Mesh) boardCheck(peer int, tag uint64, fp Fingerprint, want int) error {
	if err := m.TagError(peer, tag, want); err != nil {
		return err
	}
	if err := m.laneConflict(peer, tag, fp); err != nil {
		m.refuseTag(tag, err)
		return err
	}
	return nil
}

// laneConflict is the mismatch of a receive of the op with tag (described
// by fp) from peer over the rings when the peer runs that op over its
// lane instead (its lane message for tag waits in this rank's lane), or
// nil. The look is read-only and may race this rank's lane ops, which is
// why the header is read stably.
func (m *Mesh) laneConflict(peer int, tag uint64, fp Fingerprint) error {
	p := m.peers[peer]
	if p == nil || p.lane == nil {
		return nil
	}
	p.laneMu.RLock()
	defer p.laneMu.RUnlock()
	if p.laneGone {
		return nil
	}
	var h [laneHdr]byte
	if !p.lane.In.PeekStable(h[:]) || h[lhOp+3] != laneMagic || binary.LittleEndian.Uint64(h[lhTag:]) != tag {
		// Or the peer posted the op on the board (a flat exchange).
		return m.boardConflict(peer, tag, fp, -1)
	}
	theirs := Fingerprint{Op: h[lhOp], DType: h[lhOp+1], ReduceOp: h[lhOp+2], Count: binary.LittleEndian.Uint64(h[lhCount:])}
	return &MismatchError{Rank: peer, Tag: tag, Theirs: theirs, Ours: fp}
}
