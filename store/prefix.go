package store

import (
	"context"
	"errors"
	"strings"
	"time"
)

// PrefixStore puts every key of an underlying store under prefix + "/", as
// PyTorch's PrefixStore: PrefixStore("p2", PrefixStore("p1", s)) stores "x"
// as "p1/p2/x". NumKeys passes through and counts every key of the
// underlying store.
type PrefixStore struct {
	prefix string
	s      Store
}

// NewPrefixStore wraps s. Closing the PrefixStore leaves s open: s belongs
// to whoever created it.
func NewPrefixStore(prefix string, s Store) (*PrefixStore, error) {
	if s == nil {
		return nil, errors.New("store: NewPrefixStore: the underlying store is nil")
	}
	return &PrefixStore{prefix: prefix + "/", s: s}, nil
}

// Prefix returns the prefix, without the trailing "/".
func (p *PrefixStore) Prefix() string { return strings.TrimSuffix(p.prefix, "/") }

// Underlying returns the wrapped store.
func (p *PrefixStore) Underlying() Store { return p.s }

func (p *PrefixStore) k(key string) string { return p.prefix + key }

func (p *PrefixStore) ks(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = p.prefix + k
	}
	return out
}

// Set implements Store.
func (p *PrefixStore) Set(ctx context.Context, key string, value []byte) error {
	return p.s.Set(ctx, p.k(key), value)
}

// Get implements Store.
func (p *PrefixStore) Get(ctx context.Context, key string) ([]byte, error) {
	return p.s.Get(ctx, p.k(key))
}

// Add implements Store.
func (p *PrefixStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	return p.s.Add(ctx, p.k(key), delta)
}

// CompareSet implements Store.
func (p *PrefixStore) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	return p.s.CompareSet(ctx, p.k(key), expected, desired)
}

// Check implements Store.
func (p *PrefixStore) Check(ctx context.Context, keys ...string) (bool, error) {
	return p.s.Check(ctx, p.ks(keys)...)
}

// Wait implements Store.
func (p *PrefixStore) Wait(ctx context.Context, keys ...string) error {
	return p.s.Wait(ctx, p.ks(keys)...)
}

// DeleteKey implements Store.
func (p *PrefixStore) DeleteKey(ctx context.Context, key string) (bool, error) {
	return p.s.DeleteKey(ctx, p.k(key))
}

// NumKeys implements Store: the underlying store's count, as in PyTorch.
func (p *PrefixStore) NumKeys(ctx context.Context) (int64, error) { return p.s.NumKeys(ctx) }

// Append implements Store.
func (p *PrefixStore) Append(ctx context.Context, key string, value []byte) error {
	return p.s.Append(ctx, p.k(key), value)
}

// MultiGet implements Store.
func (p *PrefixStore) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	return p.s.MultiGet(ctx, p.ks(keys))
}

// MultiSet implements Store.
func (p *PrefixStore) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	return p.s.MultiSet(ctx, p.ks(keys), values)
}

// QueuePush implements Store.
func (p *PrefixStore) QueuePush(ctx context.Context, key string, value []byte) error {
	return p.s.QueuePush(ctx, p.k(key), value)
}

// QueuePop implements Store.
func (p *PrefixStore) QueuePop(ctx context.Context, key string, block bool) ([]byte, error) {
	return p.s.QueuePop(ctx, p.k(key), block)
}

// QueueLen implements Store.
func (p *PrefixStore) QueueLen(ctx context.Context, key string) (int64, error) {
	return p.s.QueueLen(ctx, p.k(key))
}

// ListKeys implements Store: the keys under the prefix, with it removed.
func (p *PrefixStore) ListKeys(ctx context.Context) ([]string, error) {
	all, err := p.s.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, k := range all {
		if s, ok := strings.CutPrefix(k, p.prefix); ok {
			out = append(out, s)
		}
	}
	return out, nil
}

// SetTimeout implements Store (on the underlying store).
func (p *PrefixStore) SetTimeout(d time.Duration) { p.s.SetTimeout(d) }

// Timeout implements Store.
func (p *PrefixStore) Timeout() time.Duration { return p.s.Timeout() }

// Clone implements Store: a PrefixStore with the same prefix over a clone
// of the underlying store. Closing the clone closes that underlying clone.
func (p *PrefixStore) Clone() (Store, error) {
	u, err := p.s.Clone()
	if err != nil {
		return nil, err
	}
	return &ownedPrefix{PrefixStore{prefix: p.prefix, s: u}}, nil
}

// Close implements Store. It does not close the underlying store.
func (p *PrefixStore) Close() error { return nil }

// ownedPrefix is a PrefixStore that owns its underlying store (a clone).
type ownedPrefix struct{ PrefixStore }

func (p *ownedPrefix) Close() error { return p.s.Close() }
