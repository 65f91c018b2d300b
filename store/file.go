package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// FileStore is a Store in one file that the processes of one host share.
// The file is an append-only log of records, guarded by flock(2); every
// call replays the records appended since the last call. Blocking calls
// poll every 10 ms. Each FileStore handle counts itself in the file, and the
// handle that closes last removes the file (PyTorch's refcount behaviour).
//
// The log only grows; it suits rendezvous data, not a long-lived database.
type FileStore struct {
	timeoutSetting
	path   string
	mu     sync.Mutex
	f      *os.File
	off    int64
	kv     map[string][]byte
	queues map[string][][]byte
	refs   int64
	closed bool
}

// FileStore record kinds.
const (
	recSet      = 1
	recDelete   = 2
	recQPush    = 3
	recQPop     = 4
	recRef      = 5 // value: decimal delta of the handle count
	fileMaxRecd = 1 << 30
)

// NewFileStore opens (creating it when missing) the store file at path and
// counts this handle in it.
func NewFileStore(path string) (*FileStore, error) {
	if path == "" {
		return nil, errors.New("store: NewFileStore: empty path")
	}
	s := &FileStore{path: path}
	s.SetTimeout(DefaultTimeout)
	if err := s.open(); err != nil {
		return nil, err
	}
	err := s.locked(true, func() error { return s.appendRec(recRef, "", []byte("1")) })
	if err != nil {
		_ = s.f.Close()
		return nil, err
	}
	return s, nil
}

func (s *FileStore) open() error {
	f, err := os.OpenFile(s.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("store: file store %s: %w", s.path, err)
	}
	s.f, s.off = f, 0
	s.kv, s.queues, s.refs = map[string][]byte{}, map[string][][]byte{}, 0
	return nil
}

// locked runs fn with the file locked and the cache up to date. When the
// file was removed and re-created by others since it was opened, the handle
// reopens it (only before it has counted itself, i.e. from NewFileStore).
func (s *FileStore) locked(first bool, fn func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("store: file store %s: %w", s.path, ErrClosed)
	}
	for {
		if err := syscall.Flock(int(s.f.Fd()), syscall.LOCK_EX); err != nil {
			return fmt.Errorf("store: file store %s: lock: %w", s.path, err)
		}
		if first && !s.samefile() {
			_ = syscall.Flock(int(s.f.Fd()), syscall.LOCK_UN)
			_ = s.f.Close()
			if err := s.open(); err != nil {
				return err
			}
			continue
		}
		break
	}
	defer syscall.Flock(int(s.f.Fd()), syscall.LOCK_UN)
	if err := s.refresh(); err != nil {
		return err
	}
	return fn()
}

// samefile reports whether the open file is still the one at path.
func (s *FileStore) samefile() bool {
	a, err1 := s.f.Stat()
	b, err2 := os.Stat(s.path)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// refresh replays the records appended since the last read.
func (s *FileStore) refresh() error {
	st, err := s.f.Stat()
	if err != nil {
		return fmt.Errorf("store: file store %s: %w", s.path, err)
	}
	if st.Size() == s.off {
		return nil
	}
	buf := make([]byte, st.Size()-s.off)
	if _, err := s.f.ReadAt(buf, s.off); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("store: file store %s: read: %w", s.path, err)
	}
	p := buf
	for len(p) > 0 {
		if len(p) < 17 {
			return fmt.Errorf("store: file store %s: truncated record at offset %d", s.path, s.off)
		}
		kind := p[0]
		kl := binary.LittleEndian.Uint64(p[1:])
		if kl > fileMaxRecd || uint64(len(p)) < 17+kl {
			return fmt.Errorf("store: file store %s: corrupt record at offset %d", s.path, s.off)
		}
		key := string(p[9 : 9+kl])
		vl := binary.LittleEndian.Uint64(p[9+kl:])
		if vl > fileMaxRecd || uint64(len(p)) < 17+kl+vl {
			return fmt.Errorf("store: file store %s: corrupt record at offset %d", s.path, s.off)
		}
		val := p[17+kl : 17+kl+vl]
		s.apply(kind, key, val)
		n := 17 + kl + vl
		p = p[n:]
		s.off += int64(n)
	}
	return nil
}

func (s *FileStore) apply(kind byte, key string, val []byte) {
	switch kind {
	case recSet:
		s.kv[key] = bytes.Clone(val)
	case recDelete:
		delete(s.kv, key)
	case recQPush:
		s.queues[key] = append(s.queues[key], bytes.Clone(val))
	case recQPop:
		if q := s.queues[key]; len(q) > 1 {
			s.queues[key] = q[1:]
		} else {
			delete(s.queues, key)
		}
	case recRef:
		d, _ := strconv.ParseInt(string(val), 10, 64)
		s.refs += d
	}
}

// appendRec writes one record at the end of the file and applies it.
func (s *FileStore) appendRec(kind byte, key string, val []byte) error {
	b := make([]byte, 0, 17+len(key)+len(val))
	b = append(b, kind)
	b = appendStr(b, key)
	b = appendStr(b, val)
	if _, err := s.f.WriteAt(b, s.off); err != nil {
		return fmt.Errorf("store: file store %s: write: %w", s.path, err)
	}
	s.off += int64(len(b))
	s.apply(kind, key, val)
	return nil
}

func (s *FileStore) has(k string) bool {
	if _, ok := s.kv[k]; ok {
		return true
	}
	return len(s.queues[k]) > 0
}

// poll runs try with the file locked every 10 ms until it reports done, the
// store timeout passes or ctx ends.
func (s *FileStore) poll(ctx context.Context, what string, try func() (bool, error)) error {
	start := time.Now()
	deadline := start.Add(s.Timeout())
	for {
		var done bool
		if err := s.locked(false, func() (err error) { done, err = try(); return err }); err != nil {
			return err
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("store: file store %s: %s: %w after %v", s.path, what, ErrTimeout, time.Since(start).Round(time.Millisecond))
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			err := ctx.Err()
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("store: file store %s: %s: %w after %v: %w", s.path, what, ErrTimeout, time.Since(start).Round(time.Millisecond), err)
			}
			return fmt.Errorf("store: file store %s: %s: %w", s.path, what, err)
		}
	}
}

// Set implements Store.
func (s *FileStore) Set(ctx context.Context, key string, value []byte) error {
	return s.locked(false, func() error { return s.appendRec(recSet, key, value) })
}

// Get implements Store.
func (s *FileStore) Get(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	err := s.poll(ctx, fmt.Sprintf("get key %q", key), func() (bool, error) {
		b, ok := s.kv[key]
		v = bytes.Clone(b)
		return ok, nil
	})
	return v, err
}

// Add implements Store.
func (s *FileStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var n int64
	err := s.locked(false, func() error {
		if b, ok := s.kv[key]; ok {
			cur, err := parseStoll(b)
			if err != nil {
				return fmt.Errorf("store: file store %s: add to key %q: %w", s.path, key, err)
			}
			n = cur
		}
		n += delta
		return s.appendRec(recSet, key, strconv.AppendInt(nil, n, 10))
	})
	return n, err
}

// CompareSet implements Store.
func (s *FileStore) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	var res []byte
	err := s.locked(false, func() error {
		cur, ok := s.kv[key]
		switch {
		case !ok && len(expected) == 0, ok && bytes.Equal(cur, expected):
			res = bytes.Clone(desired)
			return s.appendRec(recSet, key, desired)
		case !ok:
			res = bytes.Clone(expected)
		default:
			res = bytes.Clone(cur)
		}
		return nil
	})
	return res, err
}

// Check implements Store.
func (s *FileStore) Check(ctx context.Context, keys ...string) (bool, error) {
	ok := true
	err := s.locked(false, func() error {
		for _, k := range keys {
			if !s.has(k) {
				ok = false
			}
		}
		return nil
	})
	return ok && err == nil, err
}

// Wait implements Store.
func (s *FileStore) Wait(ctx context.Context, keys ...string) error {
	return s.poll(ctx, fmt.Sprintf("wait for keys %q", keys), func() (bool, error) {
		for _, k := range keys {
			if !s.has(k) {
				return false, nil
			}
		}
		return true, nil
	})
}

// DeleteKey implements Store.
func (s *FileStore) DeleteKey(ctx context.Context, key string) (bool, error) {
	var ok bool
	err := s.locked(false, func() error {
		if _, ok = s.kv[key]; !ok {
			return nil
		}
		return s.appendRec(recDelete, key, nil)
	})
	return ok, err
}

// NumKeys implements Store (values only, as TCPStore; queues not counted).
func (s *FileStore) NumKeys(ctx context.Context) (int64, error) {
	var n int64
	err := s.locked(false, func() error { n = int64(len(s.kv)); return nil })
	return n, err
}

// Append implements Store.
func (s *FileStore) Append(ctx context.Context, key string, value []byte) error {
	return s.locked(false, func() error {
		return s.appendRec(recSet, key, append(bytes.Clone(s.kv[key]), value...))
	})
}

// MultiGet implements Store.
func (s *FileStore) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	if err := s.Wait(ctx, keys...); err != nil {
		return nil, err
	}
	out := make([][]byte, len(keys))
	err := s.locked(false, func() error {
		for i, k := range keys {
			out[i] = bytes.Clone(s.kv[k])
		}
		return nil
	})
	return out, err
}

// MultiSet implements Store.
func (s *FileStore) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("store: file store %s: multi_set of %d keys with %d values", s.path, len(keys), len(values))
	}
	return s.locked(false, func() error {
		for i, k := range keys {
			if err := s.appendRec(recSet, k, values[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// QueuePush implements Store.
func (s *FileStore) QueuePush(ctx context.Context, key string, value []byte) error {
	return s.locked(false, func() error { return s.appendRec(recQPush, key, value) })
}

// QueuePop implements Store.
func (s *FileStore) QueuePop(ctx context.Context, key string, block bool) ([]byte, error) {
	var v []byte
	pop := func() (bool, error) {
		q := s.queues[key]
		if len(q) == 0 {
			return false, nil
		}
		v = q[0]
		return true, s.appendRec(recQPop, key, nil)
	}
	if block {
		err := s.poll(ctx, fmt.Sprintf("queue_pop of key %q", key), pop)
		return v, err
	}
	var ok bool
	err := s.locked(false, func() (err error) { ok, err = pop(); return err })
	if err == nil && !ok {
		err = fmt.Errorf("store: file store %s: key %q: %w", s.path, key, ErrQueueEmpty)
	}
	return v, err
}

// QueueLen implements Store.
func (s *FileStore) QueueLen(ctx context.Context, key string) (int64, error) {
	var n int64
	err := s.locked(false, func() error { n = int64(len(s.queues[key])); return nil })
	return n, err
}

// ListKeys implements Store (values only, sorted).
func (s *FileStore) ListKeys(ctx context.Context) ([]string, error) {
	var keys []string
	err := s.locked(false, func() error {
		for k := range s.kv {
			keys = append(keys, k)
		}
		return nil
	})
	slices.Sort(keys)
	return keys, err
}

// Clone implements Store: a new handle on the same file, counted in it.
func (s *FileStore) Clone() (Store, error) {
	c, err := NewFileStore(s.path)
	if err != nil {
		return nil, err
	}
	c.SetTimeout(s.Timeout())
	return c, nil
}

// Path returns the store file's path.
func (s *FileStore) Path() string { return s.path }

// Close implements Store: it uncounts the handle, and the last handle
// removes the file.
func (s *FileStore) Close() error {
	err := s.locked(false, func() error {
		if err := s.appendRec(recRef, "", []byte("-1")); err != nil {
			return err
		}
		if s.refs <= 0 {
			if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("store: file store %s: remove: %w", s.path, err)
			}
		}
		return nil
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if cerr := s.f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return err
}
