package tcpmesh

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"time"
)

// Frame kinds.
const (
	kindData       = 1
	kindProbe      = 2 // tag: probe id; no payload
	kindProbeReply = 3 // tag: probe id; payload: 8-byte value
	kindBye        = 4 // the peer closes in order; no payload
	kindFail       = 5 // tag: an op the peer gave up; payload: 1 byte code, 4-byte peer rank, then the reason
	kindAbort      = 6 // the peer gives the mesh up; payload: 4-byte root-cause rank, then the reason
	maxReason      = 4 << 10
	hdrLen         = 32
	helloMagic     = 0x67636f6c // "gcol"
	smallWrite     = 32 << 10   // payloads up to this are copied next to the header: one syscall
)

// Send implements coll.Transport.
func (m *Mesh) Send(ctx context.Context, peer int, tag uint64, buf []byte) error {
	return m.write(ctx, peer, kindData, tag, buf)
}

func (m *Mesh) write(ctx context.Context, to int, kind byte, tag uint64, buf []byte) error {
	if to == m.rank || to < 0 || to >= m.size {
		return fmt.Errorf("tcpmesh: send to invalid rank %d", to)
	}
	if err := m.Err(); err != nil {
		m.notices.Wait() // a broken mesh's notices leave before its ops fail
		return err
	}
	var fp Fingerprint
	if kind == kindData {
		fp = fingerprintFor(ctx, tag)
	}
	return m.writeFrame(ctx, m.peers[to], kind, tag, buf, fp)
}

// writeFrame writes one frame to p whether or not the mesh is broken (the
// abort notice goes out after it broke).
func (m *Mesh) writeFrame(ctx context.Context, p *peer, kind byte, tag uint64, buf []byte, fp Fingerprint) error {
	to := p.rank
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if p.pair != nil {
		return m.writeShm(ctx, p, kind, tag, buf, fp)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = p.conn.SetWriteDeadline(dl)
		p.dl = true
	} else if p.dl {
		_ = p.conn.SetWriteDeadline(time.Time{})
		p.dl = false
	}
	h := m.header(p, kind, tag, len(buf), fp)
	var err error
	if len(buf) <= smallWrite {
		n := copy(p.wbuf, h)
		n += copy(p.wbuf[n:], buf)
		_, err = p.conn.Write(p.wbuf[:n])
	} else {
		p.bufs = append(p.bufs[:0], h, buf)
		_, err = p.bufs.WriteTo(p.conn)
	}
	if err != nil {
		// A partial frame leaves the stream unusable.
		perr := &PeerError{Rank: to, Err: err}
		m.failWrite(p, perr)
		_ = p.conn.Close()
		if kind == kindData {
			// The op failed already (a mismatch, this rank's or the
			// peer's): that is why the peer left.
			if terr := m.tagError(tag); terr != nil {
				return terr
			}
		}
		return m.errOr(perr)
	}
	return nil
}

// Probe asks peer for its OnProbe value, bounded by ctx.
func (m *Mesh) Probe(ctx context.Context, to int) (uint64, error) {
	id := m.probeID.Add(1)
	ch := make(chan uint64, 1)
	m.mu.Lock()
	m.probes[id] = ch
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.probes, id)
		m.mu.Unlock()
	}()
	if err := m.write(ctx, to, kindProbe, id, nil); err != nil {
		return 0, err
	}
	select {
	case v := <-ch:
		return v, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("tcpmesh: probe of rank %d: %w", to, ctx.Err())
	}
}

func (m *Mesh) readLoop(p *peer) {
	defer m.readers.Done()
	defer close(p.readEnd)
	for {
		if err := m.readFrame(p); err != nil {
			if !p.bye || err != io.EOF {
				m.fail(&PeerError{Rank: p.rank, Err: err})
			}
			return
		}
	}
}

// header fills p's header buffer (its writer's: p.wmu is held) for a frame
// of kind and tag with an n-byte payload: kind, the fingerprint's op, dtype
// and reduce op, source rank, tag, length, the fingerprint's count.
func (m *Mesh) header(p *peer, kind byte, tag uint64, n int, fp Fingerprint) []byte {
	h := p.hdr[:]
	h[0] = kind
	fp.put(h)
	binary.LittleEndian.PutUint32(h[4:], uint32(m.rank))
	binary.LittleEndian.PutUint64(h[8:], tag)
	binary.LittleEndian.PutUint64(h[16:], uint64(n))
	return h
}

// readFrame reads and handles one frame from p.r.
func (m *Mesh) readFrame(p *peer) error {
	h := p.rhdr[:]
	if _, err := io.ReadFull(p.r, h); err != nil {
		return err
	}
	kind := h[0]
	src := int(binary.LittleEndian.Uint32(h[4:]))
	tag := binary.LittleEndian.Uint64(h[8:])
	n := binary.LittleEndian.Uint64(h[16:])
	if src != p.rank {
		return fmt.Errorf("frame claims source %d", src)
	}
	fp := fingerprintOf(h)
	if p.pair != nil {
		if err := m.handleFrame(p, kind, tag, n, fp); err != nil {
			return err
		}
		return p.pair.In.Skip(framePad(int(n)))
	}
	return m.handleFrame(p, kind, tag, n, fp)
}

// handleFrame handles one frame whose header has been read.
func (m *Mesh) handleFrame(p *peer, kind byte, tag, n uint64, fp Fingerprint) error {
	switch kind {
	case kindData:
		return m.deliver(p, tag, n, fp)
	case kindProbe:
		go func() {
			var val uint64
			if m.cfg.OnProbe != nil {
				val = m.cfg.OnProbe()
			}
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], val)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = m.write(ctx, p.rank, kindProbeReply, tag, b[:])
		}()
	case kindBye:
		p.bye = true
		m.peerGone(p.rank)
	case kindFail:
		if n < 5 || n > maxReason {
			return fmt.Errorf("failure notice of %d bytes", n)
		}
		b := make([]byte, n) // rare: an op failed
		if _, err := io.ReadFull(p.r, b); err != nil {
			return err
		}
		peer := int(int32(binary.LittleEndian.Uint32(b[1:])))
		if peer < -1 || peer >= m.size {
			peer = -1
		}
		m.tagFailed(&RemoteOpError{Rank: p.rank, Peer: peer, Tag: tag, Code: b[0], Reason: string(b[5:])})
	case kindAbort:
		if n < 4 || n > maxReason {
			return fmt.Errorf("abort notice of %d bytes", n)
		}
		b := make([]byte, n) // rare: the peer gave up
		if _, err := io.ReadFull(p.r, b); err != nil {
			return err
		}
		root := int(int32(binary.LittleEndian.Uint32(b)))
		if root < 0 || root >= m.size {
			root = p.rank
		}
		m.fail(&CauseError{Rank: root, Via: p.rank, Reason: string(b[4:])})
	case kindProbeReply:
		if n != 8 {
			return fmt.Errorf("probe reply of %d bytes", n)
		}
		v := p.rhdr[:8]
		if _, err := io.ReadFull(p.r, v); err != nil {
			return err
		}
		m.mu.Lock()
		ch := m.probes[tag]
		m.mu.Unlock()
		if ch != nil {
			select {
			case ch <- binary.LittleEndian.Uint64(v):
			default:
			}
		}
	default:
		return fmt.Errorf("unknown frame kind %d", kind)
	}
	return nil
}
