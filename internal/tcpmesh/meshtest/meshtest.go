// Package meshtest connects the ranks of a tcpmesh inside one test
// process, one goroutine per rank, for the tests of tcpmesh and of what
// runs over it.
package meshtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/store"
)

// KVOnly hides every method of a store but the two of tcpmesh.KV, so that
// the meshes it sets up prove that the rendezvous needs no more.
type KVOnly struct{ tcpmesh.KV }

// Connect sets up a mesh of n ranks with cfg (Rank, Size and, when nil,
// Store filled in: a fresh HashStore behind KVOnly; ConnectTimeout 10 s
// when zero). It fails tb if any rank fails, and closes the meshes when
// tb ends.
func Connect(tb testing.TB, n int, cfg tcpmesh.Config) []*tcpmesh.Mesh {
	tb.Helper()
	if cfg.Store == nil {
		cfg.Store = KVOnly{store.NewHashStore()}
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	ms := make([]*tcpmesh.Mesh, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			c := cfg
			c.Rank, c.Size = r, n
			ms[r], errs[r] = tcpmesh.Connect(context.Background(), c)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, m := range ms {
			if m != nil {
				_ = m.Close()
			}
		}
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		for _, m := range ms {
			_ = m.Close()
		}
	})
	return ms
}
