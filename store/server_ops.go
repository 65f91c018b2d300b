package store

import (
	"fmt"
	"time"
)

// handlers maps each op to the function that reads its fields from the
// connection and runs it on the server state: a handle method, or, for an
// op with no field or one key field, an adapter (bare, withField) around
// the state's method. A nil entry (opInvalid) is an unknown code. Both
// engines run requests through handleOne, so they parse and answer alike
// byte for byte; frameLen mirrors the field reads here, and FuzzFrameLen
// holds the two together.
var handlers = [...]func(*srvConn) error{
	opValidate:   (*srvConn).handleValidate,
	opSet:        (*srvConn).handleSet,
	opCompareSet: (*srvConn).handleCompareSet,
	opGet:        (*srvConn).handleGet,
	opAdd:        (*srvConn).handleAdd,
	opCheck:      withField((*srvConn).keysB, (*serverState).check),
	opWait:       (*srvConn).handleWait,
	opNumKeys:    bare((*serverState).numKeys),
	opWatchKey:   (*srvConn).handleWatchKey,
	opDeleteKey:  withField((*srvConn).keyB, (*serverState).deleteKey),
	opAppend:     (*srvConn).handleAppend,
	opMultiGet:   (*srvConn).handleMultiGet,
	opMultiSet:   (*srvConn).handleMultiSet,
	opCancelWait: bare((*serverState).cancelWait),
	opPing:       (*srvConn).handlePing,
	opQueuePush:  (*srvConn).handleQueuePush,
	opQueuePop:   (*srvConn).handleQueuePop,
	opQueueLen:   withField((*srvConn).key, (*serverState).queueLen),
	opListKeys:   (*srvConn).handleListKeys,
}

// handleOne reads and executes one request. An error ends the connection.
func (c *srvConn) handleOne() error {
	code, err := c.rd.u8()
	if err != nil {
		return err
	}
	o := decodeOp(c.dialect, code)
	if h := handlers[o]; h != nil {
		if obs := c.s.opts.Observer; obs != nil {
			start := time.Now()
			err := h(c)
			obs.Request(o.String(), time.Since(start))
			return err
		}
		return h(c)
	}
	return fmt.Errorf("%w: unknown query code %d (0x%02x) for dialect %s", errMalformed, code, code, c.dialect)
}

// bare is the handler of an op without fields.
func bare(run func(*serverState, *session)) func(*srvConn) error {
	return func(c *srvConn) error {
		run(c.st, &c.session)
		return nil
	}
}

// withField is the handler of an op with one field, which read reads: a
// key that the state keeps (key), a key that it only looks up, read into
// scratch without an allocation (keyB), or a key list (keysB).
func withField[F any](read func(*srvConn) (F, error), run func(*serverState, *session, F)) func(*srvConn) error {
	return func(c *srvConn) error {
		f, err := read(c)
		if err != nil {
			return err
		}
		run(c.st, &c.session, f)
		return nil
	}
}

func (c *srvConn) handleSet() error {
	k, err := c.keyB()
	if err != nil {
		return err
	}
	v, err := c.valueB()
	if err != nil {
		return err
	}
	flushAll(c.st.set(k, v))
	return nil
}

func (c *srvConn) handleCompareSet() error {
	k, exp, err := c.keyValue()
	if err != nil {
		return err
	}
	des, err := c.value()
	if err != nil {
		return err
	}
	return c.budgeted(func() error {
		wake, err := c.st.compareSet(&c.session, k, exp, des)
		flushAll(wake)
		return err
	})
}

func (c *srvConn) handleGet() error {
	k, err := c.keyB()
	if err != nil {
		return err
	}
	return c.budgeted(func() error {
		ok, err := c.st.get(&c.session, k, c.dialect != DialectV1)
		if err == nil && !ok && c.dialect == DialectV1 {
			return fmt.Errorf("%w: GET of missing key %q (the 1.x server closes the connection)", errMalformed, k)
		}
		return err
	})
}

func (c *srvConn) handleWait() error {
	keys, err := c.keysB()
	if err != nil {
		return err
	}
	if err := c.st.wait(&c.session, keys); err != nil {
		// Refused with WAIT_CANCELED; the connection goes on.
		c.s.logLimited("store server: refused a WAIT", "remote", c.remote, "err", err)
	}
	return nil
}

func (c *srvConn) handleQueuePop() error {
	k, err := c.key()
	if err != nil {
		return err
	}
	return c.budgeted(func() error { return c.st.queuePop(&c.session, k) })
}

func (c *srvConn) handleListKeys() error {
	return c.budgeted(func() error { return c.st.listKeys(&c.session) })
}

func (c *srvConn) handleAdd() error {
	k, err := c.keyB()
	if err != nil {
		return err
	}
	d, err := c.rd.u64()
	if err != nil {
		return err
	}
	wake, err := c.st.add(&c.session, k, int64(d)) //nolint:gosec // wraps like the C++ server
	if err != nil {
		return err
	}
	flushAll(wake)
	return nil
}

func (c *srvConn) handleAppend() error {
	k, v, err := c.keyValue()
	if err != nil {
		return err
	}
	wake, err := c.st.appendValue(k, v)
	if err != nil {
		return err
	}
	flushAll(wake)
	return nil
}

func (c *srvConn) handleMultiGet() error {
	keys, err := c.keysB()
	if err != nil {
		return err
	}
	return c.budgeted(func() error { return c.st.multiGet(&c.session, keys) })
}

func (c *srvConn) handleMultiSet() error {
	n, err := c.rd.count("key", c.s.opts.MaxKeysPerRequest)
	if err != nil {
		return err
	}
	keys := make([]string, 0, min(n, 1024))
	vals := make([][]byte, 0, min(n, 1024))
	total := 0
	for range n {
		k, v, err := c.keyValue()
		if err != nil {
			return err
		}
		if total += len(k) + len(v) + 16; total > c.s.opts.MaxRequestBytes {
			return fmt.Errorf("%w: MULTI_SET of %d keys exceeds %d bytes", errMalformed, n, c.s.opts.MaxRequestBytes)
		}
		keys, vals = append(keys, k), append(vals, v)
	}
	flushAll(c.st.multiSet(keys, vals))
	return nil
}

func (c *srvConn) handlePing() error {
	n, err := c.rd.u32()
	if err != nil {
		return err
	}
	c.outMu.Lock()
	c.out = appendU32(c.out, n)
	c.grewLocked(4)
	c.outMu.Unlock()
	return nil
}

func (c *srvConn) handleQueuePush() error {
	k, v, err := c.keyValue()
	if err != nil {
		return err
	}
	flushAll(c.st.queuePush(k, v))
	return nil
}

func (c *srvConn) handleValidate() error {
	return fmt.Errorf("%w: VALIDATE after the start of the connection", errMalformed)
}

func (c *srvConn) handleWatchKey() error {
	return fmt.Errorf("%w: WATCH_KEY (1.x watchKey) is not supported", errMalformed)
}

// flushAll sends the replies that completed waits queued on other
// connections.
func flushAll(wake []*session) {
	for _, s := range wake {
		s.conn.wakeFlush()
	}
}
