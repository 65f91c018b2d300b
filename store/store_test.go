package store

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// logBuf collects server log lines for assertions.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitLog polls the log until it contains s.
func (l *logBuf) waitLog(t *testing.T, s string) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if strings.Contains(l.String(), s) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("server log lacks %q:\n%s", s, l.String())
}

func newTestServer(t testing.TB, o ServerOptions) (*TCPServer, *logBuf) {
	t.Helper()
	lb := &logBuf{}
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	o.Logger = slog.New(slog.NewTextHandler(lb, nil))
	o.NoEnvSecret = o.NoEnvSecret || len(o.Secret) == 0
	s, err := NewTCPServer(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, lb
}

func dial(t testing.TB, addr string, o ClientOptions) *TCPStore {
	t.Helper()
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	o.NoEnvSecret = o.NoEnvSecret || len(o.Secret) == 0
	c, err := DialTCPStore(context.Background(), addr, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

type storeCase struct {
	name   string
	new    func(t *testing.T) Store
	queues bool // QueuePush/Pop/Len and ListKeys work
}

func storeCases() []storeCase {
	tcp := func(d Dialect) func(t *testing.T) Store {
		return func(t *testing.T) Store {
			s, _ := newTestServer(t, ServerOptions{})
			return dial(t, s.Addr().String(), ClientOptions{Dialect: d})
		}
	}
	return []storeCase{
		{"hash", func(t *testing.T) Store { return NewHashStore() }, true},
		{"tcp-v2", tcp(DialectV2), true},
		{"tcp-v1", tcp(DialectV1), false},
		{"file", func(t *testing.T) Store {
			s, err := NewFileStore(filepath.Join(t.TempDir(), "store"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}, true},
		{"prefix-tcp", func(t *testing.T) Store {
			p, err := NewPrefixStore("pfx", tcp(DialectV2)(t))
			if err != nil {
				t.Fatal(err)
			}
			return p
		}, true},
		{"prefix-hash", func(t *testing.T) Store {
			p, _ := NewPrefixStore("a", NewHashStore())
			q, _ := NewPrefixStore("b", p)
			return q
		}, true},
	}
}

func clone(t *testing.T, s Store) Store {
	t.Helper()
	c, err := s.Clone()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func must[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestStores(t *testing.T) {
	for _, tc := range storeCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := tc.new(t)

			t.Run("set_get_check_delete", func(t *testing.T) {
				if err := s.Set(ctx, "k", []byte("v")); err != nil {
					t.Fatal(err)
				}
				if v := must(s.Get(ctx, "k"))(t); string(v) != "v" {
					t.Fatalf("get = %q", v)
				}
				for _, d := range []int64{1, 2, 3} {
					must(s.Add(ctx, "ctr", d))(t)
				}
				if v := must(s.Get(ctx, "ctr"))(t); string(v) != "6" {
					t.Fatalf("add stores %q, want ASCII 6", v)
				}
				if n := must(s.Add(ctx, "ctr", -10))(t); n != -4 {
					t.Fatalf("add = %d", n)
				}
				if ok := must(s.Check(ctx, "k", "ctr"))(t); !ok {
					t.Fatal("check of existing keys = false")
				}
				if ok := must(s.Check(ctx, "k", "nope"))(t); ok {
					t.Fatal("check with a missing key = true")
				}
				if ok := must(s.Check(ctx))(t); !ok {
					t.Fatal("check of no keys = false")
				}
				if ok := must(s.DeleteKey(ctx, "k"))(t); !ok {
					t.Fatal("delete of existing key = false")
				}
				if ok := must(s.DeleteKey(ctx, "k"))(t); ok {
					t.Fatal("second delete = true")
				}
				if ok := must(s.Check(ctx, "k"))(t); ok {
					t.Fatal("deleted key still there")
				}
			})

			t.Run("add_non_integer", func(t *testing.T) {
				_ = s.Set(ctx, "txt", []byte("abc"))
				if _, err := s.Add(ctx, "txt", 1); err == nil {
					t.Fatal("add to a non-integer value succeeded")
				}
				// The store stays usable (a TCP client reconnects).
				if v := must(s.Get(ctx, "txt"))(t); string(v) != "abc" {
					t.Fatalf("get = %q", v)
				}
			})

			t.Run("compare_set", func(t *testing.T) {
				if v := must(s.CompareSet(ctx, "cas", []byte("x"), []byte("y")))(t); string(v) != "x" {
					t.Fatalf("missing key, wrong expected: %q, want the expected argument", v)
				}
				if ok := must(s.Check(ctx, "cas"))(t); ok {
					t.Fatal("cas with wrong expected created the key")
				}
				if v := must(s.CompareSet(ctx, "cas", nil, []byte("a")))(t); string(v) != "a" {
					t.Fatalf("missing key, empty expected: %q", v)
				}
				if v := must(s.CompareSet(ctx, "cas", []byte("zz"), []byte("b")))(t); string(v) != "a" {
					t.Fatalf("wrong old value: %q, want current", v)
				}
				if v := must(s.CompareSet(ctx, "cas", []byte("a"), []byte("b")))(t); string(v) != "b" {
					t.Fatalf("right old value: %q", v)
				}
			})

			t.Run("wait_timeout", func(t *testing.T) {
				s.SetTimeout(250 * time.Millisecond)
				defer s.SetTimeout(10 * time.Second)
				start := time.Now()
				err := s.Wait(ctx, "never")
				if !errors.Is(err, ErrTimeout) {
					t.Fatalf("wait on missing key: %v, want ErrTimeout", err)
				}
				if d := time.Since(start); d < 200*time.Millisecond {
					t.Fatalf("timed out after %v, before the 250ms timeout", d)
				}
				if !strings.Contains(strings.ToLower(err.Error()), "timeout") {
					t.Fatalf("error %q does not say timeout", err)
				}
				if _, err := s.Get(ctx, "never"); !errors.Is(err, ErrTimeout) {
					t.Fatalf("get of missing key: %v", err)
				}
				// Still usable after a timeout.
				must(s.Add(ctx, "after-timeout", 1))(t)
				// A context deadline shorter than the store timeout wins.
				s.SetTimeout(10 * time.Second)
				cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				if err := s.Wait(cctx, "never"); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("wait with ctx deadline: %v", err)
				}
				must(s.Add(ctx, "after-timeout", 1))(t)
			})

			t.Run("wait_woken_by_other_handle", func(t *testing.T) {
				c := clone(t, s)
				done := make(chan error, 1)
				go func() {
					v, err := s.Get(ctx, "late")
					if err == nil && string(v) != "L" {
						err = errors.New("wrong value " + string(v))
					}
					done <- err
				}()
				time.Sleep(50 * time.Millisecond)
				if err := c.Set(ctx, "late", []byte("L")); err != nil {
					t.Fatal(err)
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				go func() { done <- s.Wait(ctx, "w1", "w2", "w3") }()
				must(c.Add(ctx, "w1", 1))(t)
				must(c.CompareSet(ctx, "w2", nil, []byte("x")))(t)
				if err := c.Append(ctx, "w3", []byte("z")); err != nil {
					t.Fatal(err)
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			})

			t.Run("append_multi", func(t *testing.T) {
				_ = s.Append(ctx, "ap", []byte("x"))
				_ = s.Append(ctx, "ap", []byte("yz"))
				if v := must(s.Get(ctx, "ap"))(t); string(v) != "xyz" {
					t.Fatalf("append: %q", v)
				}
				if err := s.MultiSet(ctx, []string{"m1", "m2"}, [][]byte{[]byte("a"), []byte("bb")}); err != nil {
					t.Fatal(err)
				}
				vs := must(s.MultiGet(ctx, []string{"m1", "m2"}))(t)
				if len(vs) != 2 || string(vs[0]) != "a" || string(vs[1]) != "bb" {
					t.Fatalf("multi_get: %q", vs)
				}
				if err := s.MultiSet(ctx, []string{"a"}, nil); err == nil {
					t.Fatal("multi_set with mismatched lengths succeeded")
				}
			})

			t.Run("clone_shares_data", func(t *testing.T) {
				c := clone(t, s)
				_ = c.Set(ctx, "from-clone", []byte("1"))
				if v := must(s.Get(ctx, "from-clone"))(t); string(v) != "1" {
					t.Fatalf("get = %q", v)
				}
				if c.Timeout() != s.Timeout() {
					t.Fatalf("clone timeout %v, want %v", c.Timeout(), s.Timeout())
				}
			})

			if !tc.queues {
				t.Run("unsupported", func(t *testing.T) {
					if err := s.QueuePush(ctx, "q", nil); !errors.Is(err, ErrUnsupported) {
						t.Fatalf("queue push: %v", err)
					}
					if _, err := s.ListKeys(ctx); !errors.Is(err, ErrUnsupported) {
						t.Fatalf("list keys: %v", err)
					}
				})
				return
			}

			t.Run("queues", func(t *testing.T) {
				for _, v := range []string{"e1", "e2", "e3"} {
					if err := s.QueuePush(ctx, "q", []byte(v)); err != nil {
						t.Fatal(err)
					}
				}
				if n := must(s.QueueLen(ctx, "q"))(t); n != 3 {
					t.Fatalf("queue_len = %d", n)
				}
				if ok := must(s.Check(ctx, "q"))(t); !ok {
					t.Fatal("non-empty queue not visible to check")
				}
				if err := s.Wait(ctx, "q"); err != nil {
					t.Fatal(err)
				}
				for _, want := range []string{"e1", "e2", "e3"} {
					if v := must(s.QueuePop(ctx, "q", false))(t); string(v) != want {
						t.Fatalf("pop = %q, want %q (FIFO)", v, want)
					}
				}
				if _, err := s.QueuePop(ctx, "q", false); !errors.Is(err, ErrQueueEmpty) {
					t.Fatalf("pop of empty queue: %v", err)
				}
				if n := must(s.QueueLen(ctx, "unknown"))(t); n != 0 {
					t.Fatalf("queue_len of unknown = %d", n)
				}
				// Blocking pops in two goroutines, fed by a clone.
				c := clone(t, s)
				got := make(chan string, 2)
				errs := make(chan error, 2)
				for _, st := range []Store{s, clone(t, s)} {
					go func() {
						v, err := st.QueuePop(ctx, "bq", true)
						if err != nil {
							errs <- err
							return
						}
						got <- string(v)
					}()
				}
				time.Sleep(50 * time.Millisecond)
				_ = c.QueuePush(ctx, "bq", []byte("p1"))
				_ = c.QueuePush(ctx, "bq", []byte("p2"))
				var vals []string
				for range 2 {
					select {
					case v := <-got:
						vals = append(vals, v)
					case err := <-errs:
						t.Fatal(err)
					}
				}
				slices.Sort(vals)
				if !slices.Equal(vals, []string{"p1", "p2"}) {
					t.Fatalf("blocking pops got %q", vals)
				}
				s.SetTimeout(100 * time.Millisecond)
				defer s.SetTimeout(10 * time.Second)
				if _, err := s.QueuePop(ctx, "bq", true); !errors.Is(err, ErrTimeout) {
					t.Fatalf("blocking pop timeout: %v", err)
				}
			})

			t.Run("list_keys", func(t *testing.T) {
				keys := must(s.ListKeys(ctx))(t)
				for _, k := range []string{"ap", "m1", "m2", "cas", "late"} {
					if !slices.Contains(keys, k) {
						t.Fatalf("list_keys %q lacks %q", keys, k)
					}
				}
				n := must(s.NumKeys(ctx))(t)
				if n < int64(len(keys)) {
					t.Fatalf("num_keys %d < %d listed", n, len(keys))
				}
			})
		})
	}
}

func TestPrefixStoreKeys(t *testing.T) {
	ctx := context.Background()
	h := NewHashStore()
	p1, _ := NewPrefixStore("p1", h)
	p2, _ := NewPrefixStore("p2", p1)
	must(p2.Add(ctx, "x", 1))(t)
	if ok := must(h.Check(ctx, "p1/p2/x"))(t); !ok {
		t.Fatalf("nested prefix stored %q", must(h.ListKeys(ctx))(t))
	}
	if p2.Underlying() != p1 || p2.Prefix() != "p2" {
		t.Fatal("Underlying/Prefix")
	}
	if _, err := NewPrefixStore("p", nil); err == nil {
		t.Fatal("nil underlying store accepted")
	}
	if n := must(p2.NumKeys(ctx))(t); n != 1 {
		t.Fatalf("num_keys %d", n)
	}
}

// TestTryGet checks that TryGet does not wait for a missing key, as Get
// would, and returns a set one.
func TestTryGet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := NewHashStore()
	if v, ok := TryGet(ctx, s, "k"); ok || v != nil {
		t.Fatalf("missing key: %q, %v", v, ok)
	}
	if err := s.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, ok := TryGet(ctx, s, "k"); !ok || string(v) != "v" {
		t.Fatalf("set key: %q, %v", v, ok)
	}
}
