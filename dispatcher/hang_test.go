package dispatcher

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/testgroup"
	"github.com/gocoll/gocoll/store"
)

// hangStore is a store that, once armed, stops answering: its calls block,
// whatever their context says, until the test ends, as calls do behind
// another call on the connection of a TCPStore whose server is across a
// cut link.
type hangStore struct {
	store.Store
	armed   atomic.Bool
	release chan struct{}
	once    sync.Once
	sets    sync.Map // key -> value of every Set that returned
}

// hang blocks, while the store is armed, until it is released; the call
// then goes through.
func (h *hangStore) hang() error {
	if h.armed.Load() {
		<-h.release
	}
	return nil
}

func (h *hangStore) unhang() { h.once.Do(func() { close(h.release) }) }

func (h *hangStore) Set(ctx context.Context, key string, value []byte) error {
	if err := h.hang(); err != nil {
		return err
	}
	err := h.Store.Set(ctx, key, value)
	if err == nil {
		h.sets.Store(key, string(value))
	}
	return err
}

func (h *hangStore) Get(ctx context.Context, key string) ([]byte, error) {
	if err := h.hang(); err != nil {
		return nil, err
	}
	return h.Store.Get(ctx, key)
}

func (h *hangStore) Check(ctx context.Context, keys ...string) (bool, error) {
	if err := h.hang(); err != nil {
		return false, err
	}
	return h.Store.Check(ctx, keys...)
}

// initHung starts two ranks on one hangStore, not yet armed; the store is
// released before the groups close.
func initHung(t *testing.T) ([]*ProcessGroup, *hangStore) {
	t.Helper()
	hs := &hangStore{Store: store.NewHashStore(), release: make(chan struct{})}
	dir := t.TempDir()
	pgs := testgroup.StartClosed(t, 2, func(r int) (*ProcessGroup, error) {
		return Init(context.Background(), Config{Store: hs, Rank: r, WorldSize: 2, Backend: "reccpu", Timeout: 5 * time.Second,
			FlightRecorder: FlightRecorderOptions{DumpPrefix: filepath.Join(dir, "rank_")}})
	})
	t.Cleanup(hs.unhang) // runs first
	return pgs, hs
}

// TestDesyncStoreHangs: the desync report of a store that does not answer
// comes when the caller's context ends, saying it is unavailable, so that
// a backend failing a timed-out op is not held by the store. The bound is
// generous: it fails only a report that waits for the store.
func TestDesyncStoreHangs(t *testing.T) {
	pgs, hs := initHung(t)
	hs.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	done := make(chan string, 1)
	go func() {
		_, detail := pgs[0].Desync(ctx, backend.OpAllreduce, 3)
		done <- detail
	}()
	select {
	case detail := <-done:
		if !strings.Contains(detail, "desync report unavailable") {
			t.Fatalf("desync against a hung store: %q", detail)
		}
		t.Logf("after %v: %s", time.Since(start).Round(time.Millisecond), detail)
	case <-time.After(5 * time.Second):
		t.Fatal("Desync waited for a store that does not answer")
	}
}

// TestDumpAllStoreHangs: DumpAll writes the local dump and returns even
// when the store does not take the dump signal; once the store answers
// again, the signal lands.
func TestDumpAllStoreHangs(t *testing.T) {
	pgs, hs := initHung(t)
	hs.armed.Store(true)
	start := time.Now()
	done := make(chan string, 1)
	go func() { done <- pgs[0].DumpAll("timeout of allreduce seq 3") }()
	select {
	case path := <-done:
		if path == "" || !strings.HasSuffix(path, "rank_0") {
			t.Fatalf("local dump %q", path)
		}
		t.Logf("returned after %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("DumpAll waited for a store that does not answer")
	}
	hs.unhang()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var sig string
		hs.sets.Range(func(k, v any) bool {
			if strings.HasSuffix(k.(string), dumpSignalKey) {
				sig = v.(string)
			}
			return sig == ""
		})
		if strings.Contains(sig, "rank 0: timeout of allreduce seq 3") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dump signal never reached the store: %q", sig)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
