package tcpmesh

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Errors.
var (
	// ErrClosed is the cause of failures after Close.
	ErrClosed = errors.New("tcpmesh: closed")
	// ErrPeerClosed is the cause of a receive from a peer that closed in
	// order before sending the message.
	ErrPeerClosed = errors.New("tcpmesh: peer closed")
	// ErrSize is a receive whose buffer does not match the message's length.
	ErrSize = errors.New("tcpmesh: message size mismatch")
)

// SizeError is a receive that a message of another length matched: the
// ranks disagree on the size of the op's buffers. It wraps ErrSize.
type SizeError struct {
	Rank      int // the sender
	Tag       uint64
	Got, Want int // the message's length, the receive's
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("%v: %d bytes from rank %d, tag %d, for a %d-byte receive", ErrSize, e.Got, e.Rank, e.Tag, e.Want)
}

func (e *SizeError) Unwrap() error { return ErrSize }

// Codes of FailTag.
const (
	// CodeOther is any reason not listed.
	CodeOther = 0
	// CodeSize is a size mismatch between the ranks' buffers.
	CodeSize = 1
	// CodeMismatch is a disagreement on the op itself (MismatchError).
	CodeMismatch = 2
)

// RemoteOpError fails the receives of an op that a peer gave up (FailTag):
// the peer will not send the rest, so waiting would only hang.
type RemoteOpError struct {
	Rank   int    // the rank that gave up
	Peer   int    // the rank it found at odds with it (size or op mismatch); -1 if none
	Tag    uint64 // the op's tag
	Code   byte   // CodeSize, CodeMismatch or CodeOther
	Reason string // the peer's error text
}

func (e *RemoteOpError) Error() string {
	return fmt.Sprintf("rank %d gave up this op (tag %d): %s", e.Rank, e.Tag, e.Reason)
}

// PeerError is the failure of the connection to Rank: the peer died,
// closed its end, or broke the protocol.
type PeerError struct {
	Rank int
	Err  error
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("tcpmesh: connection to rank %d failed: %v", e.Rank, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// CauseError is a peer's notice that it gave the mesh up because of rank
// Rank (the root cause: the rank that died, aborted or broke the
// protocol first), so that a rank that is merely following the failure
// is never blamed for it. Via is the peer that sent the notice; it equals
// Rank when the peer itself was the cause (its own Abort).
type CauseError struct {
	Rank   int    // the root cause
	Via    int    // the rank that sent the notice
	Reason string // its error text
}

func (e *CauseError) Error() string {
	if e.Via == e.Rank {
		return fmt.Sprintf("tcpmesh: rank %d gave up: %s", e.Rank, e.Reason)
	}
	return fmt.Sprintf("tcpmesh: rank %d gave up because of rank %d: %s", e.Via, e.Rank, e.Reason)
}

// RootRank returns the rank that err blames: a *CauseError's root cause,
// or the rank of a *PeerError whose connection failed.
func RootRank(err error) (int, bool) {
	var ce *CauseError
	if errors.As(err, &ce) {
		return ce.Rank, true
	}
	var pe *PeerError
	if errors.As(err, &pe) {
		return pe.Rank, true
	}
	return -1, false
}

// noticeBound bounds the abort notices a rank sends its peers when its
// mesh breaks (each peer's notice on its own goroutine): they go out
// before the failed receives complete, so that a rank which exits right
// after its op fails has told its peers why, but a peer that takes no
// data may not hold the failure back.
const noticeBound = 200 * time.Millisecond

// FailTag tells every peer that this rank gave up the op with tag (for
// the reason err, of kind code, having found rank peer at odds with it, or
// -1), so that their receives of it fail with a *RemoteOpError instead of
// waiting for messages that will not come. Best effort, bounded by a
// second per peer.
func (m *Mesh) FailTag(tag uint64, code byte, peer int, err error) {
	reason := err.Error()
	if len(reason) > maxReason-5 {
		reason = reason[:maxReason-5]
	}
	b := make([]byte, 5, 5+len(reason))
	b[0] = code
	binary.LittleEndian.PutUint32(b[1:], uint32(int32(peer)))
	b = append(b, reason...)
	// Locally too: stragglers of the op that arrive later are dropped.
	m.tagFailed(&RemoteOpError{Rank: m.rank, Peer: peer, Tag: tag, Code: code, Reason: reason})
	var wg sync.WaitGroup
	for _, p := range m.peers {
		if p == nil {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = m.write(ctx, p.rank, kindFail, tag, b)
		})
	}
	wg.Wait()
}

// tagFailed records a peer's FailTag: the receives posted under the tag
// fail now, later ones at once, and messages already queued for it are
// dropped.
func (m *Mesh) tagFailed(e *RemoteOpError) {
	var victims []*Req
	m.mu.Lock()
	if _, ok := m.failed[e.Tag]; !ok {
		m.failed[e.Tag] = e
	}
	for peer := range m.size {
		k := key{peer, e.Tag}
		if l, ok := m.posted[k]; ok {
			victims = claim(victims, &l)
			delete(m.posted, k)
		}
		for l := m.unexpected[k]; l.head != nil && l.head.ready; l = m.unexpected[k] {
			mg := popFrom(m.unexpected, k)
			m.pool.Put(mg.buf)
			*mg = msg{}
			m.msgPool.Put(mg)
		}
	}
	if l, ok := m.anyPosted[e.Tag]; ok {
		victims = claim(victims, &l)
		delete(m.anyPosted, e.Tag)
	}
	m.mu.Unlock()
	for _, r := range victims {
		r.complete(e)
	}
}

// claim empties l of its posted receives, marking each claimed (so that
// neither a message nor a withdraw takes it meanwhile), and appends them to
// victims, which the caller fails once m.mu is released.
func claim(victims []*Req, l *fifo[*Req]) []*Req {
	for r := l.pop(); r != nil; r = l.pop() {
		r.state = stateClaimed
		victims = append(victims, r)
	}
	return victims
}

// peerGone records an orderly close of peer and fails the receives posted
// from it.
func (m *Mesh) peerGone(peer int) {
	err := &PeerError{Rank: peer, Err: ErrPeerClosed}
	m.mu.Lock()
	m.gone[peer] = err
	var victims []*Req
	for k, l := range m.posted {
		if k.peer != peer {
			continue
		}
		victims = claim(victims, &l)
		delete(m.posted, k)
	}
	m.mu.Unlock()
	for _, r := range victims {
		r.complete(err)
	}
}

// fail breaks the mesh with err (the first error wins) and fails every
// posted receive. The first failure other than Close is told to every
// peer first (notify), naming its root cause.
func (m *Mesh) fail(err error) {
	root, ok := RootRank(err)
	if !ok {
		root = m.rank
	}
	m.failBecause(err, root)
}

// failBecause is fail with the root cause given: the rank the peers are
// told this rank gave up because of.
func (m *Mesh) failBecause(err error, root int) {
	m.mu.Lock()
	first := m.broken == nil
	tell := first && !errors.Is(err, ErrClosed)
	if first {
		m.broken = err
		m.isBroken.Store(true)
		if tell {
			// Whoever sees the mesh broken and then closes it waits for
			// the notices (Abort, Close): they must leave first.
			m.notices.Add(1)
		}
	}
	err = m.broken
	m.mu.Unlock()
	if tell {
		m.notify(root, err)
		m.notices.Done()
	}
	m.mu.Lock()
	var victims []*Req
	for _, l := range m.posted {
		victims = claim(victims, &l)
	}
	clear(m.posted)
	for _, l := range m.anyPosted {
		victims = claim(victims, &l)
	}
	clear(m.anyPosted)
	m.mu.Unlock()
	for _, r := range victims {
		r.complete(err)
	}
}

// Abort breaks the mesh with err at once: pending and later receives and
// sends fail with it, and the connections are closed. The peers are told
// that this rank gave up because of the rank err blames (RootRank), or of
// itself.
func (m *Mesh) Abort(err error) {
	root, ok := RootRank(err)
	if !ok {
		root = m.rank
	}
	m.AbortBecause(err, root)
}

// AbortBecause is Abort naming the root cause: the peers' meshes fail
// with a *CauseError naming root, so that they blame it and not this rank.
func (m *Mesh) AbortBecause(err error, root int) {
	if root < 0 || root >= m.size {
		root = m.rank
	}
	m.failBecause(err, root)
	m.notices.Wait()
	for _, p := range m.peers {
		if p != nil {
			_ = p.conn.Close()
			if p.pair != nil {
				p.pair.Close() // unblock this side's ring waits
			}
			if p.lane != nil {
				p.lane.Close()
			}
		}
	}
}

// writeGrace is how long a failed write to a peer that went away waits
// for that peer's reader to finish: the peer may have told this rank why
// it left (an abort notice, still unread behind the broken socket), and
// its reason, naming the root cause, must win over this rank's own view
// that the peer failed.
const writeGrace = 100 * time.Millisecond

// failWrite breaks the mesh after a write to p (or a lane op with p)
// failed with perr, letting p's reader report first what p said before it
// left (writeGrace). A write that ran out of time (a slow peer, not a gone
// one) fails at once.
func (m *Mesh) failWrite(p *peer, perr *PeerError) {
	if !errors.Is(perr.Err, context.DeadlineExceeded) && !errors.Is(perr.Err, context.Canceled) && !isTimeout(perr.Err) {
		t := time.NewTimer(writeGrace)
		select {
		case <-p.readEnd:
		case <-t.C:
		}
		t.Stop()
	}
	m.fail(perr)
}

// isTimeout reports whether err is a network deadline.
func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

// notify sends every peer (but root when its connection failed) an abort
// notice naming root, in parallel, and waits for the notices at most noticeBound. The
// notice travels after the frames already sent, so a peer reads it before
// the end of the connection. A peer whose writer is stuck (its lock held
// by a send that waits for room) gets its notice when the lock is free.
func (m *Mesh) notify(root int, err error) {
	if m.size == 1 {
		return
	}
	reason := err.Error()
	if len(reason) > maxReason-4 {
		reason = reason[:maxReason-4]
	}
	b := make([]byte, 4+len(reason))
	binary.LittleEndian.PutUint32(b, uint32(int32(root)))
	copy(b[4:], reason)
	// The root itself is told too (it may be alive: a late rank), unless
	// its connection is what failed.
	skip := -1
	var pe *PeerError
	if errors.As(err, &pe) && pe.Rank == root {
		skip = root
	}
	done := make(chan struct{}, m.size)
	n := 0
	for _, p := range m.peers {
		if p == nil || p.rank == skip {
			continue
		}
		n++
		go func() {
			defer func() { done <- struct{}{} }()
			ctx, cancel := context.WithTimeout(context.Background(), noticeBound)
			defer cancel()
			_ = m.writeFrame(ctx, p, kindAbort, 0, b, Fingerprint{})
		}()
	}
	t := time.NewTimer(noticeBound)
	defer t.Stop()
	for range n {
		select {
		case <-done:
		case <-t.C:
			return
		}
	}
}

// errOr returns the error that broke the mesh, or err.
func (m *Mesh) errOr(err error) error {
	if e := m.Err(); e != nil {
		return e
	}
	return err
}
