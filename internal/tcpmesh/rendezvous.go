package tcpmesh

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

func (m *Mesh) rendezvous(ctx context.Context) error {
	st := m.cfg.Store
	var session uint64
	if m.rank == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("tcpmesh: session id: %w", err)
		}
		session = binary.LittleEndian.Uint64(b[:])
		if err := st.Set(ctx, "tcpmesh/session", []byte(strconv.FormatUint(session, 10))); err != nil {
			return fmt.Errorf("tcpmesh: publishing session: %w", err)
		}
	} else {
		v, err := st.Get(ctx, "tcpmesh/session")
		if err != nil {
			return fmt.Errorf("tcpmesh: rank %d waiting for rank 0's session: %w", m.rank, err)
		}
		if session, err = strconv.ParseUint(string(v), 10, 64); err != nil {
			return fmt.Errorf("tcpmesh: bad session %q: %w", v, err)
		}
	}
	var ln *net.TCPListener
	if m.rank < m.size-1 {
		l, err := net.Listen("tcp", net.JoinHostPort(m.cfg.Host, "0"))
		if err != nil {
			return fmt.Errorf("tcpmesh: listen on %s: %w", m.cfg.Host, err)
		}
		ln = l.(*net.TCPListener)
		defer ln.Close()
		if err := st.Set(ctx, "tcpmesh/addr/"+strconv.Itoa(m.rank), []byte(ln.Addr().String())); err != nil {
			return fmt.Errorf("tcpmesh: publishing address: %w", err)
		}
	}
	errc := make(chan error, 2)
	go func() { errc <- m.acceptAll(ctx, ln, session) }()
	go func() { errc <- m.dialAll(ctx, session) }()
	var first error
	for range 2 {
		if err := <-errc; err != nil && first == nil {
			first = err
			if ln != nil {
				_ = ln.Close() // unblock Accept
			}
		}
	}
	return first
}

func (m *Mesh) newPeer(rank int, c *net.TCPConn) *peer {
	_ = c.SetNoDelay(true)
	if m.cfg.SocketBuffer > 0 {
		_ = c.SetReadBuffer(m.cfg.SocketBuffer)
		_ = c.SetWriteBuffer(m.cfg.SocketBuffer)
	}
	br := bufio.NewReaderSize(c, 256<<10)
	return &peer{rank: rank, conn: c, br: br, r: br, wbuf: make([]byte, hdrLen+smallWrite), readEnd: make(chan struct{})}
}

func (m *Mesh) acceptAll(ctx context.Context, ln *net.TCPListener, session uint64) error {
	want := m.size - 1 - m.rank
	if want == 0 {
		return nil
	}
	dl, _ := ctx.Deadline()
	_ = ln.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = ln.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	got := 0
	for got < want {
		c, err := ln.AcceptTCP()
		if err != nil {
			missing := []int{}
			for r := m.rank + 1; r < m.size; r++ {
				if m.peers[r] == nil {
					missing = append(missing, r)
				}
			}
			return fmt.Errorf("tcpmesh: rank %d accepting connections: ranks %v did not connect: %w", m.rank, missing, err)
		}
		_ = c.SetDeadline(dl)
		var h [20]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			_ = c.Close()
			continue
		}
		magic := binary.LittleEndian.Uint32(h[0:])
		sess := binary.LittleEndian.Uint64(h[4:])
		from := int(binary.LittleEndian.Uint32(h[12:]))
		size := int(binary.LittleEndian.Uint32(h[16:]))
		if magic != helloMagic || sess != session || size != m.size || from <= m.rank || from >= m.size || m.peers[from] != nil {
			_ = c.Close() // a stranger, a stale job, or a duplicate
			continue
		}
		var ack [8]byte
		binary.LittleEndian.PutUint32(ack[0:], helloMagic)
		binary.LittleEndian.PutUint32(ack[4:], uint32(m.rank))
		if _, err := c.Write(ack[:]); err != nil {
			_ = c.Close()
			continue
		}
		_ = c.SetDeadline(time.Time{})
		m.peers[from] = m.newPeer(from, c)
		got++
	}
	return nil
}

func (m *Mesh) dialAll(ctx context.Context, session uint64) error {
	for r := 0; r < m.rank; r++ {
		v, err := m.cfg.Store.Get(ctx, "tcpmesh/addr/"+strconv.Itoa(r))
		if err != nil {
			return fmt.Errorf("tcpmesh: rank %d waiting for rank %d's address: %w", m.rank, r, err)
		}
		c, err := m.dial(ctx, string(v), r, session)
		if err != nil {
			return err
		}
		m.peers[r] = m.newPeer(r, c)
	}
	return nil
}

// dial connects to rank r, retrying refused connections with backoff until
// ctx expires.
func (m *Mesh) dial(ctx context.Context, addr string, r int, session uint64) (*net.TCPConn, error) {
	backoff := 10 * time.Millisecond
	var d net.Dialer
	for {
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c := nc.(*net.TCPConn)
			if err = m.hello(ctx, c, r, session); err == nil {
				return c, nil
			}
			_ = c.Close()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("tcpmesh: rank %d connecting to rank %d at %s: %w (last error: %v)", m.rank, r, addr, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (m *Mesh) hello(ctx context.Context, c *net.TCPConn, r int, session uint64) error {
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	var h [20]byte
	binary.LittleEndian.PutUint32(h[0:], helloMagic)
	binary.LittleEndian.PutUint64(h[4:], session)
	binary.LittleEndian.PutUint32(h[12:], uint32(m.rank))
	binary.LittleEndian.PutUint32(h[16:], uint32(m.size))
	if _, err := c.Write(h[:]); err != nil {
		return err
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return err
	}
	if binary.LittleEndian.Uint32(ack[0:]) != helloMagic || int(binary.LittleEndian.Uint32(ack[4:])) != r {
		return fmt.Errorf("tcpmesh: bad handshake reply from rank %d", r)
	}
	return c.SetDeadline(time.Time{})
}
