package tcpmesh

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/gocoll/gocoll/internal/shm"
)

// setupShm offers shared memory to every peer over its connection, in
// parallel, and maps the pair files where both ends agree.
func (m *Mesh) setupShm(ctx context.Context) error {
	id, err := shm.HostID()
	if err != nil {
		if m.cfg.Transport == TransportShm {
			return err
		}
		id = "" // offer nothing; the peers fall back to TCP
	}
	errs := make([]error, m.size)
	var wg sync.WaitGroup
	for _, p := range m.peers {
		if p != nil {
			wg.Go(func() { errs[p.rank] = m.offerShm(ctx, p, id) })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// offerShm runs the shared-memory negotiation with one peer: both send
// (want, host id); if both want it and the ids match, the lower rank
// creates the pair file and sends its path, the upper rank maps it and
// acknowledges, and the lower rank unlinks it.
func (m *Mesh) offerShm(ctx context.Context, p *peer, id string) (err error) {
	c := p.conn
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	fail := func(format string, args ...any) error {
		return fmt.Errorf("tcpmesh: rank %d, shared memory with rank %d: "+format, append([]any{m.rank, p.rank}, args...)...)
	}
	// decline gives shared memory with this peer up: the pair stays on
	// TCP, unless the config demands shared memory, where it fails.
	decline := func(format string, args ...any) error {
		if m.cfg.Transport == TransportShm {
			return fail(format, args...)
		}
		return nil
	}
	if err := writeStr(c, id); err != nil {
		return fail("%w", err)
	}
	theirs, err := readStr(c)
	if err != nil {
		return fail("%w", err)
	}
	if id == "" || theirs == "" || id != theirs {
		return decline("not on the same host (%q, %q)", id, theirs)
	}
	var pair *shm.Pair
	var why error
	if m.rank < p.rank {
		pair, why, err = createPair(c, fmt.Sprintf("gocoll-%d-%d-%d-", os.Getpid(), m.rank, p.rank), m.cfg.ShmRingBytes, p.rank)
	} else {
		pair, why, err = openPair(c, p.rank)
	}
	if err != nil {
		return fail("%w", err)
	}
	if why != nil {
		return decline("%w", why)
	}
	p.pair = pair
	p.r = p.pair.In
	return m.offerLane(ctx, p)
}

// createPair is the lower rank's half of a pair handshake over c: it
// creates a pair file (name prefix, ring bytes), sends its path ("" when
// it could not) and waits for the peer's one-byte ack, and unlinks the
// file either way, since by then both have mapped it or given it up. It
// returns the pair; or why there is none (this side could not create it,
// or peer could not map it), which leaves the connection usable; or err,
// when the connection failed.
func createPair(c net.Conn, prefix string, ringBytes, peer int) (pair *shm.Pair, why, err error) {
	pair, path, cerr := shm.Create(prefix, ringBytes)
	if cerr != nil {
		path = ""
	}
	if err := writeStr(c, path); err != nil {
		if pair != nil {
			_ = shm.Unlink(path)
			_ = pair.Unmap()
		}
		return nil, nil, err
	}
	if cerr != nil {
		return nil, cerr, nil
	}
	var ack [1]byte
	_, rerr := io.ReadFull(c, ack[:])
	_ = shm.Unlink(path)
	if rerr != nil || ack[0] != 1 {
		_ = pair.Unmap()
		if rerr != nil {
			return nil, nil, rerr
		}
		return nil, fmt.Errorf("rank %d could not map the pair file", peer), nil
	}
	return pair, nil, nil
}

// openPair is the upper rank's half of createPair's handshake: it reads
// the path, maps the pair and acks whether it could; why and err as
// createPair's.
func openPair(c net.Conn, peer int) (pair *shm.Pair, why, err error) {
	path, err := readStr(c)
	if err != nil {
		return nil, nil, err
	}
	if path == "" {
		return nil, fmt.Errorf("rank %d could not create the pair file", peer), nil
	}
	pair, oerr := shm.Open(path)
	ack := []byte{1}
	if oerr != nil {
		ack[0] = 0
	}
	if _, err := c.Write(ack); err != nil {
		if pair != nil {
			_ = pair.Unmap()
		}
		return nil, nil, err
	}
	if oerr != nil {
		return nil, oerr, nil
	}
	return pair, nil, nil
}

func writeStr(c net.Conn, s string) error {
	b := make([]byte, 2+len(s))
	binary.LittleEndian.PutUint16(b, uint16(len(s)))
	copy(b[2:], s)
	_, err := c.Write(b)
	return err
}

func readStr(c net.Conn) (string, error) {
	var n [2]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return "", err
	}
	b := make([]byte, binary.LittleEndian.Uint16(n[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// writeShm writes one frame into the peer's ring; p.wmu is held.
func (m *Mesh) writeShm(ctx context.Context, p *peer, kind byte, tag uint64, buf []byte, fp Fingerprint) error {
	if p.unmapped {
		return m.errOr(ErrClosed)
	}
	h := m.header(p, kind, tag, len(buf), fp)
	pad := framePad(len(buf))
	if !p.pair.Out.Fits(hdrLen + len(buf) + pad) {
		// The write will wait for the peer to make room: let this rank's
		// reader take incoming frames meanwhile.
		if op := relaxOp(ctx); op != nil {
			defer op.acquire()
		}
	}
	if err := p.pair.Out.Write(ctx, h, buf, pad); err != nil {
		if errors.Is(err, shm.ErrClosed) {
			return m.errOr(ErrClosed)
		}
		perr := &PeerError{Rank: p.rank, Err: err}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			// A frame may be half written: the stream is unusable, as a
			// TCP write that timed out leaves it.
			perr.Err = fmt.Errorf("write timed out: %w", err)
		}
		m.failWrite(p, perr)
		if kind == kindData {
			if terr := m.tagError(tag); terr != nil {
				return terr
			}
		}
		return m.errOr(perr)
	}
	return nil
}

// framePad is the padding after a payload of n bytes in a shared ring: it
// keeps every frame, and so every payload (after the 32-byte header), at a
// multiple of 8 bytes in the ring, so an element never straddles the
// ring's end and combining in place sees aligned elements.
func framePad(n int) int { return -n & 7 }

// shmReadLoop is the reader of a shared-memory peer: it waits for bytes
// without the consumer role (so a polling receive can take it meanwhile),
// then reads every whole frame there is.
func (m *Mesh) shmReadLoop(p *peer) {
	defer m.readers.Done()
	defer close(p.readEnd)
	in := p.pair.In
	for {
		werr := in.WaitData()
		p.rmu.Lock()
		if p.rdone {
			p.rmu.Unlock()
			return
		}
		if werr != nil {
			m.endShm(p, werr)
			p.rmu.Unlock()
			return
		}
		m.drainLocked(p)
		done := p.rdone
		p.rmu.Unlock()
		if done {
			return
		}
	}
}

// drainLocked reads frames while bytes are buffered; p.rmu is held.
func (m *Mesh) drainLocked(p *peer) {
	for !p.rdone && !p.unmapped && p.pair.In.Buffered() > 0 {
		if err := m.readFrame(p); err != nil {
			m.endShm(p, err)
		}
	}
}

// endShm stops reading a shared-memory peer after err; p.rmu is held. The
// end of the ring after the peer's goodbye is orderly; anything else
// breaks the mesh, as a failed connection does.
func (m *Mesh) endShm(p *peer, err error) {
	p.rdone = true
	if errors.Is(err, shm.ErrClosed) || (p.bye && errors.Is(err, shm.ErrPeerDead)) {
		return
	}
	if errors.Is(err, shm.ErrPeerDead) {
		err = fmt.Errorf("connection closed: %w", err)
	}
	m.fail(&PeerError{Rank: p.rank, Err: err})
}

// watch holds the TCP connection of a shared-memory peer open as the
// liveness channel: nothing is sent on it after the setup, so its end
// means the peer is gone (it died, aborted or closed).
func (m *Mesh) watch(p *peer) {
	defer m.readers.Done()
	var b [64]byte
	for {
		if _, err := p.conn.Read(b[:]); err != nil {
			p.pair.MarkDead()
			if p.lane != nil {
				p.lane.MarkDead()
			}
			if m.board != nil {
				m.board.MarkDead(p.rank)
			}
			return
		}
	}
}
