package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// wait runs a WAIT for raw keys on a wait connection.
func (c *TCPStore) wait(ctx context.Context, start time.Time, keys []string) error {
	return c.withWaitConn(ctx, opWait, keys, start, func(cn *tcpConn) error {
		return c.waitOn(ctx, cn, start, keys)
	})
}

// waitOn sends WAIT for raw keys on cn and waits for STOP_WAITING until the
// deadline; on timeout it cancels the wait with CANCEL_WAIT (DialectV2) or
// drops the connection (DialectV1, which has no cancel, and any connection
// whose server never acknowledged the WAIT, so never answers the cancel).
func (c *TCPStore) waitOn(ctx context.Context, cn *tcpConn, start time.Time, keys []string) error {
	code, _ := encodeOp(c.opts.Dialect, opWait)
	b := appendKeys(append(cn.wbuf[:0], code), keys)
	cn.wbuf = b
	deadline := c.deadline(ctx, start)
	_ = cn.nc.SetDeadline(deadline)
	stop := interruptOnDone(ctx, cn.nc)
	_, err := cn.nc.Write(b)
	var r byte
	if err == nil {
		r, err = cn.br.ReadByte()
	}
	stopped := stop()
	if err == nil && (stopped || r == replyStopWait) {
		// A reply, even one that came as ctx ended: honour it.
		if r == replyWaitCancel {
			// gocoll's server refuses a WAIT past its per-connection limit
			// of pending wait keys (ServerOptions.MaxWaitKeysPerConn).
			return c.errorf(opWait, keys, start, "the server refused the WAIT (WAIT_CANCELED): too many keys pending on one connection")
		}
		if r != replyStopWait {
			cn.broken = true
			return c.errorf(opWait, keys, start, "%w: WAIT reply %d, want STOP_WAITING", errMalformed, r)
		}
		return nil
	}
	if err == nil {
		err = ctx.Err()
	}
	var ne net.Error
	timedOut := (errors.As(err, &ne) && ne.Timeout()) || ctx.Err() != nil
	if !timedOut || c.isClosed() {
		cn.broken = true
		return c.wrapIOErr(ctx, opWait, keys, start, err)
	}
	elapsed := time.Since(start)
	msg := fmt.Sprintf("wait timeout after %dms, keys: %s", elapsed.Milliseconds(), strings.Join(keys, ", "))
	switch n, known := unacked(cn.nc); {
	case c.opts.Dialect != DialectV2:
		cn.broken = true
	case known && n > 0:
		// The server's host never acknowledged the WAIT: a CANCEL_WAIT
		// would get no answer either, and would only delay this error by
		// CancelTimeout. Dropping the connection cancels the wait (a
		// false alarm, on a slow link, costs one dial).
		cn.broken = true
		msg += fmt.Sprintf(" (the server's host never acknowledged the request, %d bytes: the link or the host is down, or the server stopped reading)", n)
	case c.cancelWait(cn) != nil:
		cn.broken = true
	}
	switch {
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		return c.errorf(opWait, keys, start, "%s: %w", msg, ctx.Err())
	case ctxDeadlineFirst(ctx, deadline):
		return c.errorf(opWait, keys, start, "%s: %w: %w", msg, ErrTimeout, context.DeadlineExceeded)
	}
	return c.errorf(opWait, keys, start, "%s: %w", msg, ErrTimeout)
}

// cancelWait sends CANCEL_WAIT on cn and reads its reply, after a possible
// STOP_WAITING that crossed it, within CancelTimeout: the wait's error
// waits for it, so that the connection can serve the next wait.
func (c *TCPStore) cancelWait(cn *tcpConn) error {
	_ = cn.nc.SetDeadline(time.Now().Add(c.opts.CancelTimeout))
	defer func() { _ = cn.nc.SetDeadline(time.Time{}) }()
	code, _ := encodeOp(DialectV2, opCancelWait)
	if _, err := cn.nc.Write([]byte{code}); err != nil {
		return err
	}
	r, err := cn.br.ReadByte()
	if err != nil {
		return err
	}
	if r == replyStopWait {
		if r, err = cn.br.ReadByte(); err != nil {
			return err
		}
	}
	if r != replyWaitCancel {
		return fmt.Errorf("%w: CANCEL_WAIT reply %d", errMalformed, r)
	}
	return nil
}

// WaitForWorkers blocks until n clients have announced themselves under
// "init/" (PyTorch's wait_for_workers on the master), polling every 10 ms.
func (c *TCPStore) WaitForWorkers(ctx context.Context, n int) error {
	start := time.Now()
	deadline := c.deadline(ctx, start)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var joined int64
	for {
		v, err := c.getRaw(dctx, initKey)
		if err == nil {
			joined, err = parseStoll(v)
		}
		if err == nil && joined >= int64(n) {
			return nil
		}
		if err != nil && !errors.Is(err, ErrTimeout) {
			return err
		}
		if err != nil || time.Now().After(deadline) {
			return c.errorf(opInvalid, []string{initKey}, start, "timed out after %d seconds waiting for clients. %d/%d clients joined: %w",
				int(time.Since(start).Seconds()), joined, n, ErrTimeout)
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-dctx.Done():
		}
	}
}
