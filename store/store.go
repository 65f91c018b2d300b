package store

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// DefaultTimeout is the timeout of a store that was given none, as in
// PyTorch (300 s).
const DefaultTimeout = 300 * time.Second

// Errors that stores return, wrapped with the key and the store's address.
var (
	// ErrTimeout: a blocking call (Get, Wait, QueuePop) hit the store's
	// timeout or its context's deadline before the keys existed.
	ErrTimeout = errors.New("store: timeout")
	// ErrQueueEmpty: a non-blocking QueuePop found nothing.
	ErrQueueEmpty = errors.New("store: queue empty")
	// ErrClosed: the store, or its server, was closed.
	ErrClosed = errors.New("store: closed")
	// ErrUnsupported: this store or dialect cannot do the operation.
	ErrUnsupported = errors.New("store: unsupported")
)

// Store is a key-value store shared by the ranks of a job. Keys are strings
// and values bytes. Every call takes a context; a blocking call stops at the
// earlier of the context's deadline and the store's timeout.
//
// The semantics are PyTorch's c10d::Store: Add keeps its counter as decimal
// text, Get and Wait block until the keys exist, and CompareSet returns the
// value the key holds afterwards.
type Store interface {
	// Set stores value under key, waking waiters on key.
	Set(ctx context.Context, key string, value []byte) error
	// Get blocks until key exists, then returns its value.
	Get(ctx context.Context, key string) ([]byte, error)
	// Add adds delta to the decimal integer held by key (0 when missing)
	// and returns the sum.
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// CompareSet sets key to desired when its value equals expected (or when
	// key is missing and expected is empty). It returns the value after the
	// call; for a missing key with a non-empty expected, expected itself.
	CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error)
	// Check reports whether every key exists, without blocking.
	Check(ctx context.Context, keys ...string) (bool, error)
	// Wait blocks until every key exists.
	Wait(ctx context.Context, keys ...string) error
	// DeleteKey removes key and reports whether it existed.
	DeleteKey(ctx context.Context, key string) (bool, error)
	// NumKeys returns the number of keys.
	NumKeys(ctx context.Context) (int64, error)
	// Append appends value to key's value, creating it when missing.
	Append(ctx context.Context, key string, value []byte) error
	// MultiGet is Get of several keys in one round trip.
	MultiGet(ctx context.Context, keys []string) ([][]byte, error)
	// MultiSet is Set of several keys in one round trip.
	MultiSet(ctx context.Context, keys []string, values [][]byte) error
	// QueuePush appends value to the FIFO queue named key.
	QueuePush(ctx context.Context, key string, value []byte) error
	// QueuePop removes the oldest value of queue key. With block it waits
	// for one; without, it returns ErrQueueEmpty.
	QueuePop(ctx context.Context, key string, block bool) ([]byte, error)
	// QueueLen returns the length of queue key.
	QueueLen(ctx context.Context, key string) (int64, error)
	// ListKeys returns every key.
	ListKeys(ctx context.Context) ([]string, error)
	// SetTimeout changes the timeout of blocking calls.
	SetTimeout(d time.Duration)
	// Timeout returns the timeout of blocking calls.
	Timeout() time.Duration
	// Clone returns a new handle on the same data (for TCPStore a new
	// client, with connections of its own), safe to use from another
	// goroutine.
	Clone() (Store, error)
	// Close releases the handle.
	Close() error
}

// timeoutSetting is a store handle's timeout. Embedded, it gives every
// store of this package Store's SetTimeout and Timeout.
type timeoutSetting struct{ d atomic.Int64 }

// SetTimeout implements Store.
func (t *timeoutSetting) SetTimeout(d time.Duration) { t.d.Store(int64(d)) }

// Timeout implements Store.
func (t *timeoutSetting) Timeout() time.Duration { return time.Duration(t.d.Load()) }

// getEach is MultiGet as one Get per key, for a store without a batch read.
func getEach(ctx context.Context, get func(context.Context, string) ([]byte, error), keys []string) ([][]byte, error) {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		v, err := get(ctx, k)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// TryGet returns key's value if it is set now, without the wait of Get
// (which blocks until the key appears): a Check, then a Get. ok is false
// when the key is missing or either call failed.
func TryGet(ctx context.Context, s Store, key string) (v []byte, ok bool) {
	if found, err := s.Check(ctx, key); err != nil || !found {
		return nil, false
	}
	v, err := s.Get(ctx, key)
	return v, err == nil
}
