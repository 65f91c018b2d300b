package tcpmesh

import (
	"context"
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
)

// RemoteOpError fails the receives of an op that a peer gave up (FailTag):
// the peer will not send the rest, so waiting would only hang.
type RemoteOpError struct {
	Rank   int    // the rank that gave up
	Tag    uint64 // the op's tag
	Code   byte   // CodeSize or CodeOther
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

// FailTag tells every peer that this rank gave up the op with tag (for
// the reason err, of kind code), so that their receives of it fail with a
// *RemoteOpError instead of waiting for messages that will not come. Best
// effort, bounded by a second per peer.
func (m *Mesh) FailTag(tag uint64, code byte, err error) {
	reason := err.Error()
	if len(reason) > maxReason-1 {
		reason = reason[:maxReason-1]
	}
	b := append([]byte{code}, reason...)
	// Locally too: stragglers of the op that arrive later are dropped.
	m.tagFailed(&RemoteOpError{Rank: m.rank, Tag: tag, Code: code, Reason: reason})
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
// posted receive.
func (m *Mesh) fail(err error) {
	m.mu.Lock()
	if m.broken == nil {
		m.broken = err
	}
	err = m.broken
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
// sends fail with it, and the connections are closed.
func (m *Mesh) Abort(err error) {
	m.fail(err)
	for _, p := range m.peers {
		if p != nil {
			_ = p.conn.Close()
			if p.pair != nil {
				p.pair.Close() // unblock this side's ring waits
			}
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
