package store

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
)

// HashStore is an in-process Store, for ranks that are goroutines of one
// process and for tests. Clones share the data.
type HashStore struct {
	timeoutSetting
	d *hashData
}

type hashData struct {
	mu      sync.Mutex
	kv      map[string][]byte
	queues  map[string][][]byte
	changed chan struct{} // closed and replaced on every write
}

// NewHashStore returns an empty HashStore with DefaultTimeout.
func NewHashStore() *HashStore {
	s := &HashStore{d: &hashData{kv: map[string][]byte{}, queues: map[string][][]byte{}, changed: make(chan struct{})}}
	s.SetTimeout(DefaultTimeout)
	return s
}

// notify wakes every waiter. Callers hold d.mu.
func (d *hashData) notify() {
	close(d.changed)
	d.changed = make(chan struct{})
}

// waitFor blocks until cond (evaluated under d.mu) holds, then runs it once
// more under the lock and returns.
func (s *HashStore) waitFor(ctx context.Context, what string, cond func() bool) error {
	timer := time.NewTimer(s.Timeout())
	defer timer.Stop()
	start := time.Now()
	for {
		s.d.mu.Lock()
		if cond() {
			s.d.mu.Unlock()
			return nil
		}
		ch := s.d.changed
		s.d.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			return fmt.Errorf("%w: hash store: %s after %v", ErrTimeout, what, time.Since(start).Round(time.Millisecond))
		case <-ctx.Done():
			return fmt.Errorf("%w: hash store: %s after %v: %w", ErrTimeout, what, time.Since(start).Round(time.Millisecond), ctx.Err())
		}
	}
}

func (d *hashData) has(key string) bool {
	if _, ok := d.kv[key]; ok {
		return true
	}
	_, ok := d.queues[key]
	return ok
}

// Set implements Store.
func (s *HashStore) Set(ctx context.Context, key string, value []byte) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	s.d.kv[key] = bytes.Clone(value)
	s.d.notify()
	return nil
}

// Get implements Store.
func (s *HashStore) Get(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	err := s.waitFor(ctx, fmt.Sprintf("waiting for key %q", key), func() bool {
		b, ok := s.d.kv[key]
		v = bytes.Clone(b)
		return ok
	})
	return v, err
}

// Add implements Store.
func (s *HashStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	var cur int64
	if b, ok := s.d.kv[key]; ok {
		n, err := strconv.ParseInt(string(b), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("store: add to key %q: value %q is not an integer", key, b)
		}
		cur = n
	}
	cur += delta
	s.d.kv[key] = []byte(strconv.FormatInt(cur, 10))
	s.d.notify()
	return cur, nil
}

// CompareSet implements Store.
func (s *HashStore) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	cur, ok := s.d.kv[key]
	switch {
	case !ok && len(expected) == 0:
		s.d.kv[key] = bytes.Clone(desired)
		s.d.notify()
		return bytes.Clone(desired), nil
	case !ok:
		return bytes.Clone(expected), nil
	case bytes.Equal(cur, expected):
		s.d.kv[key] = bytes.Clone(desired)
		s.d.notify()
		return bytes.Clone(desired), nil
	}
	return bytes.Clone(cur), nil
}

// Check implements Store.
func (s *HashStore) Check(ctx context.Context, keys ...string) (bool, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	for _, k := range keys {
		if !s.d.has(k) {
			return false, nil
		}
	}
	return true, nil
}

// Wait implements Store.
func (s *HashStore) Wait(ctx context.Context, keys ...string) error {
	return s.waitFor(ctx, fmt.Sprintf("wait for keys %q", keys), func() bool {
		for _, k := range keys {
			if !s.d.has(k) {
				return false
			}
		}
		return true
	})
}

// DeleteKey implements Store.
func (s *HashStore) DeleteKey(ctx context.Context, key string) (bool, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	_, ok := s.d.kv[key]
	_, okq := s.d.queues[key]
	delete(s.d.kv, key)
	delete(s.d.queues, key)
	return ok || okq, nil
}

// NumKeys implements Store.
func (s *HashStore) NumKeys(ctx context.Context) (int64, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return int64(len(s.d.kv) + len(s.d.queues)), nil
}

// Append implements Store.
func (s *HashStore) Append(ctx context.Context, key string, value []byte) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	s.d.kv[key] = append(bytes.Clone(s.d.kv[key]), value...)
	s.d.notify()
	return nil
}

// MultiGet implements Store.
func (s *HashStore) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	return getEach(ctx, s.Get, keys)
}

// MultiSet implements Store.
func (s *HashStore) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("store: multi_set of %d keys with %d values", len(keys), len(values))
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	for i, k := range keys {
		s.d.kv[k] = bytes.Clone(values[i])
	}
	s.d.notify()
	return nil
}

// QueuePush implements Store.
func (s *HashStore) QueuePush(ctx context.Context, key string, value []byte) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	s.d.queues[key] = append(s.d.queues[key], bytes.Clone(value))
	s.d.notify()
	return nil
}

// QueuePop implements Store.
func (s *HashStore) QueuePop(ctx context.Context, key string, block bool) ([]byte, error) {
	var v []byte
	pop := func() bool {
		q := s.d.queues[key]
		if len(q) == 0 {
			return false
		}
		v, s.d.queues[key] = q[0], q[1:]
		return true
	}
	if !block {
		s.d.mu.Lock()
		defer s.d.mu.Unlock()
		if !pop() {
			return nil, fmt.Errorf("%w: key %q", ErrQueueEmpty, key)
		}
		return v, nil
	}
	err := s.waitFor(ctx, fmt.Sprintf("queue_pop of key %q", key), pop)
	return v, err
}

// QueueLen implements Store.
func (s *HashStore) QueueLen(ctx context.Context, key string) (int64, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return int64(len(s.d.queues[key])), nil
}

// ListKeys implements Store.
func (s *HashStore) ListKeys(ctx context.Context) ([]string, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	keys := make([]string, 0, len(s.d.kv)+len(s.d.queues))
	for k := range s.d.kv {
		keys = append(keys, k)
	}
	for k := range s.d.queues {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys, nil
}

// Clone implements Store: the clone shares the data and copies the timeout.
func (s *HashStore) Clone() (Store, error) {
	c := &HashStore{d: s.d}
	c.SetTimeout(s.Timeout())
	return c, nil
}

// Close implements Store. The data stays for other clones.
func (s *HashStore) Close() error { return nil }
