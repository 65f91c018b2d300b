package store

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

func wireKey(k string) string { return keyPrefix + k }

func wireKeys(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = keyPrefix + k
	}
	return out
}

func readValue(r *reader, dst *[]byte) error {
	b, err := r.bytes("value", 1<<40)
	*dst = b
	return err
}

func readI64(r *reader, dst *int64) error {
	v, err := r.u64()
	*dst = int64(v) //nolint:gosec
	return err
}

// Set implements Store.
func (c *TCPStore) Set(ctx context.Context, key string, value []byte) error {
	k := wireKey(key)
	return c.call(ctx, opSet, []string{k}, func(b []byte) []byte { return appendStr(appendStr(b, k), value) }, nil)
}

// Get implements Store: WAIT, as PyTorch's client, on a wait connection,
// then GET on the main connection.
func (c *TCPStore) Get(ctx context.Context, key string) ([]byte, error) {
	return c.getRaw(ctx, wireKey(key))
}

func (c *TCPStore) getRaw(ctx context.Context, k string) ([]byte, error) {
	if err := c.wait(ctx, time.Now(), []string{k}); err != nil {
		return nil, err
	}
	var v []byte
	err := c.call(ctx, opGet, []string{k}, func(b []byte) []byte { return appendStr(b, k) },
		func(r *reader) error { return readValue(r, &v) })
	return v, err
}

// Add implements Store.
func (c *TCPStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	return c.add(ctx, wireKey(key), delta)
}

func (c *TCPStore) add(ctx context.Context, k string, delta int64) (int64, error) {
	var n int64
	err := c.call(ctx, opAdd, []string{k}, func(b []byte) []byte { return appendI64(appendStr(b, k), delta) },
		func(r *reader) error { return readI64(r, &n) })
	return n, err
}

// CompareSet implements Store.
func (c *TCPStore) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	k := wireKey(key)
	var v []byte
	err := c.call(ctx, opCompareSet, []string{k},
		func(b []byte) []byte { return appendStr(appendStr(appendStr(b, k), expected), desired) },
		func(r *reader) error { return readValue(r, &v) })
	return v, err
}

// Check implements Store.
func (c *TCPStore) Check(ctx context.Context, keys ...string) (bool, error) {
	wk := wireKeys(keys)
	var r byte
	err := c.call(ctx, opCheck, wk, func(b []byte) []byte { return appendKeys(b, wk) },
		func(rd *reader) (err error) { r, err = rd.u8(); return err })
	if err != nil {
		return false, err
	}
	if r != replyReady && r != replyNotReady {
		return false, fmt.Errorf("store: tcp %s: CHECK: %w: reply %d", c.addr, errMalformed, r)
	}
	return r == replyReady, nil
}

// Wait implements Store, on a wait connection. On timeout it cancels the
// server-side wait, so the connection stays usable.
func (c *TCPStore) Wait(ctx context.Context, keys ...string) error {
	return c.wait(ctx, time.Now(), wireKeys(keys))
}

// DeleteKey implements Store.
func (c *TCPStore) DeleteKey(ctx context.Context, key string) (bool, error) {
	k := wireKey(key)
	var n int64
	err := c.call(ctx, opDeleteKey, []string{k}, func(b []byte) []byte { return appendStr(b, k) },
		func(r *reader) error { return readI64(r, &n) })
	return n == 1, err
}

// NumKeys implements Store. As in PyTorch it counts every key on the
// server, the internal "init/" included, and not the queues.
func (c *TCPStore) NumKeys(ctx context.Context) (int64, error) {
	var n int64
	err := c.call(ctx, opNumKeys, nil, func(b []byte) []byte { return b },
		func(r *reader) error { return readI64(r, &n) })
	return n, err
}

// Append implements Store. DialectV1 has no APPEND; it is emulated with
// COMPARE_SET, as PyTorch's fallback does.
func (c *TCPStore) Append(ctx context.Context, key string, value []byte) error {
	k := wireKey(key)
	if c.opts.Dialect == DialectV2 {
		return c.call(ctx, opAppend, []string{k}, func(b []byte) []byte { return appendStr(appendStr(b, k), value) }, nil)
	}
	for {
		var cur []byte
		ok, err := c.Check(ctx, key)
		if err != nil {
			return err
		}
		if ok {
			if cur, err = c.Get(ctx, key); err != nil {
				return err
			}
		}
		want := append(bytes.Clone(cur), value...)
		got, err := c.CompareSet(ctx, key, cur, want)
		if err != nil {
			return err
		}
		if bytes.Equal(got, want) {
			return nil
		}
	}
}

// MultiGet implements Store: WAIT for all keys on a wait connection, then
// MULTI_GET on the main connection (one Get per key in DialectV1).
func (c *TCPStore) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	if c.opts.Dialect == DialectV1 {
		return getEach(ctx, c.Get, keys)
	}
	wk := wireKeys(keys)
	if err := c.wait(ctx, time.Now(), wk); err != nil {
		return nil, err
	}
	out := make([][]byte, len(keys))
	err := c.call(ctx, opMultiGet, wk, func(b []byte) []byte { return appendKeys(b, wk) }, func(r *reader) error {
		for i := range out {
			if err := readValue(r, &out[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// MultiSet implements Store (one SET per key in DialectV1).
func (c *TCPStore) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("store: tcp %s: MULTI_SET of %d keys with %d values", c.addr, len(keys), len(values))
	}
	if c.opts.Dialect == DialectV1 {
		for i, k := range keys {
			if err := c.Set(ctx, k, values[i]); err != nil {
				return err
			}
		}
		return nil
	}
	wk := wireKeys(keys)
	return c.call(ctx, opMultiSet, wk, func(b []byte) []byte {
		b = appendU64(b, uint64(len(wk)))
		for i, k := range wk {
			b = appendStr(appendStr(b, k), values[i])
		}
		return b
	}, nil)
}

// QueuePush implements Store (DialectV2 servers with queues: ours, and
// PyTorch's libuv server).
func (c *TCPStore) QueuePush(ctx context.Context, key string, value []byte) error {
	k := wireKey(key)
	return c.call(ctx, opQueuePush, []string{k}, func(b []byte) []byte { return appendStr(appendStr(b, k), value) }, nil)
}

// QueuePop implements Store. A non-blocking pop runs on the main
// connection. A blocking one runs on a wait connection: it waits for the
// key, then pops, and waits again if another client took the item first.
func (c *TCPStore) QueuePop(ctx context.Context, key string, block bool) ([]byte, error) {
	k := wireKey(key)
	keys := []string{k}
	var n int64
	var v []byte
	build := func(b []byte) []byte { return appendStr(b, k) }
	read := func(r *reader) error {
		if err := readI64(r, &n); err != nil || n <= 0 {
			return err
		}
		return readValue(r, &v)
	}
	start := time.Now()
	if !block {
		if err := c.call(ctx, opQueuePop, keys, build, read); err != nil {
			return nil, err
		}
		if n <= 0 {
			return nil, c.errorf(opQueuePop, keys, start, "%w", ErrQueueEmpty)
		}
		return v, nil
	}
	code, ok := encodeOp(c.opts.Dialect, opQueuePop)
	if !ok {
		return nil, c.errorf(opQueuePop, keys, start, "%w: the %s dialect has no %s", ErrUnsupported, c.opts.Dialect, opQueuePop)
	}
	err := c.withWaitConn(ctx, opQueuePop, keys, start, func(cn *tcpConn) error {
		for n <= 0 {
			if err := c.waitOn(ctx, cn, start, keys); err != nil {
				return err
			}
			if err := c.roundTrip(ctx, cn, opQueuePop, keys, start, code, build, read); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// QueueLen implements Store.
func (c *TCPStore) QueueLen(ctx context.Context, key string) (int64, error) {
	k := wireKey(key)
	var n int64
	err := c.call(ctx, opQueueLen, []string{k}, func(b []byte) []byte { return appendStr(b, k) },
		func(r *reader) error { return readI64(r, &n) })
	return n, err
}

// ListKeys implements Store: the user keys, without PyTorch's "/" prefix
// and without internal keys such as "init/", sorted.
func (c *TCPStore) ListKeys(ctx context.Context) ([]string, error) {
	var keys []string
	err := c.call(ctx, opListKeys, nil, func(b []byte) []byte { return b }, func(r *reader) error {
		var n int64
		if err := readI64(r, &n); err != nil {
			return err
		}
		if n < 0 || n > 1<<32 {
			return fmt.Errorf("%w: LIST_KEYS count %d", errMalformed, n)
		}
		for range n {
			var k []byte
			if err := readValue(r, &k); err != nil {
				return err
			}
			if s, ok := strings.CutPrefix(string(k), keyPrefix); ok {
				keys = append(keys, s)
			}
		}
		return nil
	})
	slices.Sort(keys)
	return keys, err
}
