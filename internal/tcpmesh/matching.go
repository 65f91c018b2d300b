package tcpmesh

import (
	"fmt"
	"io"

	"github.com/gocoll/gocoll/internal/coll"
)

type key struct {
	peer int
	tag  uint64
}

// deliver reads one data frame's payload: into a posted receive, or into
// a pooled buffer queued as unexpected.
func (m *Mesh) deliver(p *peer, tag uint64, n uint64, fp Fingerprint) error {
	k := key{p.rank, tag}
	m.mu.Lock()
	if m.broken != nil {
		m.mu.Unlock()
		return m.broken
	}
	r := popFrom(m.posted, k)
	if r == nil {
		r = popFrom(m.anyPosted, tag)
	}
	if r != nil {
		r.state = stateClaimed
		r.src = p.rank
		m.mu.Unlock()
		if bad := fp.mismatch(r.fp); bad || n != uint64(len(r.buf)) {
			// Refused before anything is read into (or reduced into) the
			// receive's buffer: the op's description first, the size next.
			if _, err := io.CopyN(io.Discard, p.r, int64(n)); err != nil {
				r.complete(&PeerError{Rank: p.rank, Err: err})
				return err
			}
			var err error = &SizeError{Rank: p.rank, Tag: tag, Got: int(n), Want: len(r.buf)}
			if bad {
				err = &MismatchError{Rank: p.rank, Tag: tag, Theirs: fp, Ours: r.fp}
			}
			m.refuseTag(tag, err)
			r.complete(err)
			return nil
		}
		var err error
		if r.combine != nil {
			err = m.readCombine(p, r)
		} else {
			_, err = io.ReadFull(p.r, r.buf)
		}
		if err != nil {
			r.complete(&PeerError{Rank: p.rank, Err: err})
			return err
		}
		r.complete(nil)
		return nil
	}
	if len(m.failed) > 0 && m.failed[tag] != nil {
		// A straggler of an op that failed: nobody will receive it.
		m.mu.Unlock()
		_, err := io.CopyN(io.Discard, p.r, int64(n))
		return err
	}
	if n > uint64(m.cfg.MaxMessage) {
		m.mu.Unlock()
		return fmt.Errorf("unexpected message of %d bytes exceeds the %d-byte limit", n, m.cfg.MaxMessage)
	}
	mg := m.msgPool.Get().(*msg)
	mg.src, mg.tag, mg.ready, mg.waiter, mg.err, mg.fp = p.rank, tag, false, nil, nil, fp
	m.arrivals++
	mg.seq = m.arrivals
	pushTo(m.unexpected, k, mg)
	m.mu.Unlock()
	buf := m.pool.Get(int(n))
	_, rerr := io.ReadFull(p.r, buf)
	m.mu.Lock()
	mg.buf, mg.ready = buf, true
	if rerr != nil {
		mg.err = &PeerError{Rank: p.rank, Err: rerr}
	}
	w := mg.waiter
	m.mu.Unlock()
	if w != nil {
		m.fill(w, mg)
	}
	return rerr
}

// readCombine reads r's payload and combines it into r.buf: straight out
// of the shared ring (no receive copy), or through a pooled piece of
// scratch for a TCP peer (so the reader goroutine, not the op's, reduces).
func (m *Mesh) readCombine(p *peer, r *Req) error {
	if p.pair != nil {
		in := p.pair.In
		for off := 0; off < len(r.buf); {
			src, err := in.NextUnits(len(r.buf)-off, r.elem)
			if err != nil {
				return err
			}
			r.combine(r.buf[off:off+len(src)], src)
			in.Consume(len(src))
			off += len(src)
		}
		return nil
	}
	piece := min(len(r.buf), 64<<10)
	piece -= piece % r.elem
	tmp := m.pool.Get(piece)
	defer m.pool.Put(tmp)
	for off := 0; off < len(r.buf); off += piece {
		b := tmp[:min(piece, len(r.buf)-off)]
		if _, err := io.ReadFull(p.r, b); err != nil {
			return err
		}
		r.combine(r.buf[off:off+len(b)], b)
	}
	return nil
}

// fill completes r from an unexpected message that left the queue.
func (m *Mesh) fill(r *Req, mg *msg) {
	var err error
	switch {
	case mg.err != nil:
		err = mg.err
	case mg.fp.mismatch(r.fp):
		err = &MismatchError{Rank: mg.src, Tag: mg.tag, Theirs: mg.fp, Ours: r.fp}
	case len(mg.buf) != len(r.buf):
		err = &SizeError{Rank: mg.src, Tag: mg.tag, Got: len(mg.buf), Want: len(r.buf)}
	default:
		if r.combine != nil {
			r.combine(r.buf, mg.buf)
		} else {
			copy(r.buf, mg.buf)
		}
	}
	if err != nil && mg.err == nil {
		m.refuseTag(mg.tag, err)
	}
	r.src = mg.src
	m.pool.Put(mg.buf)
	*mg = msg{}
	m.msgPool.Put(mg)
	r.complete(err)
}

// Irecv implements coll.Transport.
func (m *Mesh) Irecv(peer int, tag uint64, buf []byte) coll.Request {
	return m.irecv(peer, tag, buf, 0, nil)
}

// IrecvReduce implements coll.ReduceReceiver: the message is combined
// into buf as it is read (from shared memory without a receive copy).
func (m *Mesh) IrecvReduce(peer int, tag uint64, buf []byte, elem int, combine func(dst, src []byte)) coll.Request {
	if elem < 1 || len(buf)%elem != 0 {
		return m.newReq(peer, tag, buf).failNow(fmt.Errorf("tcpmesh: reduce-receive of %d bytes in elements of %d", len(buf), elem))
	}
	return m.irecv(peer, tag, buf, elem, combine)
}

// IrecvAny posts a receive from whichever rank sends first under tag. The
// returned request's Source names that rank after Wait.
func (m *Mesh) IrecvAny(tag uint64, buf []byte) *Req {
	return m.irecv(-1, tag, buf, 0, nil)
}

// refuseLocked is why a receive from peer under tag cannot be posted at
// all, or nil: an invalid rank, a broken mesh, or an op that a rank gave
// up (FailTag). m.mu is held.
func (m *Mesh) refuseLocked(peer int, tag uint64) error {
	if peer == m.rank || peer >= m.size || peer < -1 {
		return fmt.Errorf("tcpmesh: receive from invalid rank %d", peer)
	}
	if m.broken != nil {
		return m.broken
	}
	if len(m.failed) > 0 {
		if e := m.failed[tag]; e != nil {
			return e
		}
	}
	return nil
}

func (m *Mesh) irecv(peer int, tag uint64, buf []byte, elem int, combine func(dst, src []byte)) *Req {
	r := m.newReq(peer, tag, buf)
	r.elem, r.combine = elem, combine
	m.mu.Lock()
	if len(m.fps) > 0 {
		r.fp = m.fps[tag]
	}
	if err := m.refuseLocked(peer, tag); err != nil {
		m.mu.Unlock()
		m.notices.Wait() // a broken mesh's notices leave before its ops fail
		return r.failNow(err)
	}
	var mg *msg
	if peer >= 0 {
		mg = popFrom(m.unexpected, key{peer, tag})
	} else { // the earliest arrival from any peer
		best := -1
		var seq uint64
		for p := range m.size {
			if l, ok := m.unexpected[key{p, tag}]; ok && (best < 0 || l.head.seq < seq) {
				best, seq = p, l.head.seq
			}
		}
		if best >= 0 {
			mg = popFrom(m.unexpected, key{best, tag})
		}
	}
	if mg != nil {
		r.state = stateClaimed
		if !mg.ready {
			mg.waiter = r // the reader completes r when the payload is in
			m.mu.Unlock()
			return r
		}
		m.mu.Unlock()
		m.fill(r, mg)
		return r
	}
	if peer >= 0 && m.gone[peer] != nil {
		err := m.gone[peer]
		m.mu.Unlock()
		return r.failNow(err)
	}
	r.state = statePosted
	if peer >= 0 {
		pushTo(m.posted, key{peer, tag}, r)
	} else {
		pushTo(m.anyPosted, tag, r)
	}
	m.mu.Unlock()
	return r
}

// refuseTag records that this rank refused a message of the op under tag
// (err: a mismatch): the op's later receives fail with err at once, its
// stragglers are dropped, and a send of it that fails because the peer
// has left with the failure reports err, the cause, rather than the
// broken connection.
func (m *Mesh) refuseTag(tag uint64, err error) {
	m.mu.Lock()
	if m.failed[tag] == nil {
		m.failed[tag] = err
	}
	m.mu.Unlock()
}

// tagError returns what made this rank or a peer give up the op under tag,
// or nil.
func (m *Mesh) tagError(tag uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failed[tag]
}

// msg is a message that arrived before its receive was posted.
type msg struct {
	src    int
	tag    uint64
	seq    uint64
	buf    []byte
	ready  bool
	err    error
	fp     Fingerprint // the sender's description of the op
	waiter *Req
	next   *msg
}
