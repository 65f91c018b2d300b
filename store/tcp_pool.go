package store

import (
	"bufio"
	"context"
	"net"
	"time"
)

// maxIdleConns bounds the idle wait connections a TCPStore keeps; one given
// back beyond it is closed.
const maxIdleConns = 4

// tcpConn is one connection of a TCPStore, used by one call at a time.
type tcpConn struct {
	nc     net.Conn
	br     *bufio.Reader
	wbuf   []byte
	wait   bool // a wait connection (set before it is shared)
	broken bool // its state is unknown after a failure: drop it
}

// drop closes cn and forgets it.
func (c *TCPStore) drop(cn *tcpConn) {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	_ = cn.nc.Close()
	delete(c.conns, cn)
}

func (c *TCPStore) isClosed() bool {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	return c.closed
}

// withWaitConn runs fn on a wait connection: an idle one, or a new one when
// none is idle. It then gives the connection back to the idle list, or
// closes it when it is broken, when the store is closed or when
// maxIdleConns are idle already.
func (c *TCPStore) withWaitConn(ctx context.Context, o op, keys []string, start time.Time, fn func(*tcpConn) error) error {
	c.cmu.Lock()
	if c.closed {
		c.cmu.Unlock()
		return c.errorf(o, keys, start, "%w", ErrClosed)
	}
	var cn *tcpConn
	if n := len(c.idle); n > 0 {
		cn = c.idle[n-1]
		c.idle = c.idle[:n-1]
	}
	c.cmu.Unlock()
	if cn == nil {
		var err error
		if cn, err = c.dial(ctx, o, keys, start, true); err != nil {
			return err
		}
	}
	err := fn(cn)
	c.cmu.Lock()
	defer c.cmu.Unlock()
	if cn.broken || c.closed || len(c.idle) >= maxIdleConns {
		_ = cn.nc.Close()
		delete(c.conns, cn)
	} else {
		c.idle = append(c.idle, cn)
	}
	return err
}

// waitConns returns the number of open wait connections and of idle ones
// (for tests).
func (c *TCPStore) waitConns() (open, idle int) {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	for cn := range c.conns {
		if cn.wait {
			open++
		}
	}
	return open, len(c.idle)
}
