package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The tests of TCPStore's connection pool. Their time bounds are loose on
// purpose: a call that waits behind another would take the store timeout
// (30 s), so a few seconds tell the two apart on a loaded machine.

const poolTimeout = 30 * time.Second

var dialects = []Dialect{DialectV2, DialectV1}

// TestTCPStoreSetWhileGetBlocked: a Get blocked on a key does not hold up
// the Set of that key from another goroutine of the same client.
func TestTCPStoreSetWhileGetBlocked(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			srv, _ := newTestServer(t, ServerOptions{})
			a := dial(t, srv.Addr().String(), ClientOptions{Dialect: d, Timeout: poolTimeout})
			ctx := context.Background()
			type result struct {
				v   []byte
				err error
				at  time.Time
			}
			got := make(chan result, 1)
			start := time.Now()
			go func() {
				v, err := a.Get(ctx, "k2")
				got <- result{v, err, time.Now()}
			}()
			time.Sleep(200 * time.Millisecond)
			setStart := time.Now()
			if err := a.Set(ctx, "k2", []byte("v2")); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(setStart); d > 3*time.Second {
				t.Errorf("Set took %v: it waited behind the blocked Get", d)
			}
			select {
			case r := <-got:
				if r.err != nil || string(r.v) != "v2" {
					t.Fatalf("Get = %q, %v", r.v, r.err)
				}
				if d := r.at.Sub(start); d > 5*time.Second {
					t.Errorf("Get returned after %v", d)
				}
			case <-time.After(poolTimeout / 2):
				t.Fatal("the Get did not return after the Set")
			}

			// The same with Wait and Add, and (v2) a blocking QueuePop and
			// QueuePush.
			blocked := 1
			errc := make(chan error, 2)
			go func() { errc <- a.Wait(ctx, "w1", "w2") }()
			var popped chan []byte
			if d == DialectV2 {
				blocked++
				popped = make(chan []byte, 1)
				go func() {
					v, err := a.QueuePop(ctx, "q", true)
					popped <- v
					errc <- err
				}()
			}
			time.Sleep(100 * time.Millisecond)
			must(a.Add(ctx, "w1", 1))(t)
			must(a.CompareSet(ctx, "w2", nil, []byte("x")))(t)
			if d == DialectV2 {
				if err := a.QueuePush(ctx, "q", []byte("item")); err != nil {
					t.Fatal(err)
				}
			}
			for range blocked {
				select {
				case err := <-errc:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(poolTimeout / 2):
					t.Fatal("a blocked call did not return")
				}
			}
			if popped != nil {
				if v := <-popped; string(v) != "item" {
					t.Fatalf("pop = %q", v)
				}
			}
		})
	}
}

// TestTCPStoreConcurrentCalls: many goroutines share one client for every
// kind of call. Each checks that its own writes are applied in order (a
// CompareSet after a Set sees the Set, though the two may run on different
// connections), and waits for a key of its neighbour.
func TestTCPStoreConcurrentCalls(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			const workers, rounds = 24, 30
			srv, _ := newTestServer(t, ServerOptions{})
			c := dial(t, srv.Addr().String(), ClientOptions{Dialect: d, Timeout: poolTimeout})
			ctx := context.Background()
			var wg sync.WaitGroup
			errc := make(chan error, workers)
			for w := range workers {
				wg.Go(func() {
					err := func() error {
						k := fmt.Sprintf("k%d", w)
						for r := range rounds {
							v := strconv.Itoa(r)
							if err := c.Set(ctx, k, []byte(v)); err != nil {
								return err
							}
							next := strconv.Itoa(r + 1)
							got, err := c.CompareSet(ctx, k, []byte(v), []byte(next))
							if err != nil {
								return err
							}
							if string(got) != next {
								return fmt.Errorf("%s: CompareSet after Set %q returned %q: the Set was not applied first", k, v, got)
							}
							if got, err := c.Get(ctx, k); err != nil || string(got) != next {
								return fmt.Errorf("%s: Get = %q, %v; want %q", k, got, err, next)
							}
							if _, err := c.Add(ctx, "counter", 1); err != nil {
								return err
							}
							if ok, err := c.Check(ctx, k); err != nil || !ok {
								return fmt.Errorf("%s: Check = %v, %v", k, ok, err)
							}
							// Wait for the neighbour's round r; it sets it
							// before waiting for ours.
							if err := c.Set(ctx, fmt.Sprintf("r%d-%d", w, r), nil); err != nil {
								return err
							}
							if err := c.Wait(ctx, fmt.Sprintf("r%d-%d", (w+1)%workers, r)); err != nil {
								return err
							}
							if r%10 == 9 {
								if _, err := c.NumKeys(ctx); err != nil {
									return err
								}
							}
						}
						return nil
					}()
					if err != nil {
						errc <- fmt.Errorf("worker %d: %w", w, err)
					}
				})
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Error(err)
			}
			if v := must(c.Get(ctx, "counter"))(t); string(v) != strconv.Itoa(workers*rounds) {
				t.Fatalf("counter = %s, want %d", v, workers*rounds)
			}
			if open, idle := c.poolSize(); idle > maxIdleConns || open > maxIdleConns {
				t.Fatalf("%d connections open, %d idle after the calls; want at most %d", open, idle, maxIdleConns)
			}
		})
	}
}

// TestTCPStoreWriteOrderAcrossConnections: a SET given back on a
// connection that then waits (a Get of a key not yet there) is applied
// before a later call on another connection; with DialectV2 the wait is
// broken off and resumed for that, and still sees the key set later.
func TestTCPStoreWriteOrderAcrossConnections(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			srv, _ := newTestServer(t, ServerOptions{})
			c := dial(t, srv.Addr().String(), ClientOptions{Dialect: d, Timeout: poolTimeout})
			ctx := context.Background()
			for i := range 20 {
				a, b := fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)
				if err := c.Set(ctx, a, []byte("1")); err != nil {
					t.Fatal(err)
				}
				got := make(chan error, 1)
				go func() {
					v, err := c.Get(ctx, b) // on the connection of the Set
					if err == nil && string(v) != "B" {
						err = fmt.Errorf("get %s = %q", b, v)
					}
					got <- err
				}()
				if i%2 == 0 {
					time.Sleep(20 * time.Millisecond) // let the Get start waiting
				}
				if v := must(c.CompareSet(ctx, a, []byte("1"), []byte("2")))(t); string(v) != "2" {
					t.Fatalf("round %d: CompareSet after Set returned %q", i, v)
				}
				if n := must(c.Add(ctx, a, 1))(t); n != 3 {
					t.Fatalf("round %d: Add = %d", i, n)
				}
				if err := c.Set(ctx, b, []byte("B")); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-got:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(poolTimeout / 2):
					t.Fatal("the Get did not return")
				}
			}
		})
	}
}

// TestTCPStoreCloseWakesBlockedCalls: Close fails the calls in flight at
// once with ErrClosed naming the server, and later calls too; a clone is
// independent of it.
func TestTCPStoreCloseWakesBlockedCalls(t *testing.T) {
	srv, _ := newTestServer(t, ServerOptions{})
	addr := srv.Addr().String()
	ctx := context.Background()
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			c := dial(t, addr, ClientOptions{Dialect: d, Timeout: poolTimeout})
			cl := clone(t, c)
			calls := map[string]func() error{
				"get":      func() error { _, err := c.Get(ctx, "never"); return err },
				"wait":     func() error { return c.Wait(ctx, "never", "nor-this") },
				"multiget": func() error { _, err := c.MultiGet(ctx, []string{"never"}); return err },
			}
			if d == DialectV2 {
				calls["queue_pop"] = func() error { _, err := c.QueuePop(ctx, "never-q", true); return err }
			}
			// A set whose connection then waits, and a pending write
			// confirmed by nobody yet, must not hold Close up either.
			if err := c.Set(ctx, "s", []byte("v")); err != nil {
				t.Fatal(err)
			}
			errs := make(chan error, len(calls))
			for name, f := range calls {
				go func() { errs <- fmt.Errorf("%s: %w", name, f()) }()
			}
			waitFor(t, fmt.Sprintf("a connection for each of %d blocked calls", len(calls)), func() bool {
				open, _ := c.poolSize()
				return open == len(calls)
			})
			time.Sleep(100 * time.Millisecond) // let the calls block in their waits
			closed := time.Now()
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			for range calls {
				select {
				case err := <-errs:
					if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), addr) {
						t.Errorf("blocked call after Close: %v; want ErrClosed naming %s", err, addr)
					}
				case <-time.After(poolTimeout / 2):
					t.Fatal("a blocked call was not failed by Close")
				}
			}
			if d := time.Since(closed); d > 5*time.Second {
				t.Errorf("blocked calls failed %v after Close", d)
			}
			if err := c.Set(ctx, "k", nil); !errors.Is(err, ErrClosed) {
				t.Fatalf("set after close: %v", err)
			}
			if _, err := c.Get(ctx, "s"); !errors.Is(err, ErrClosed) {
				t.Fatalf("get after close: %v", err)
			}
			if open, idle := c.poolSize(); open != 0 || idle != 0 {
				t.Fatalf("after Close: %d open, %d idle", open, idle)
			}
			_ = c.Close() // idempotent
			if v := must(cl.Get(ctx, "s"))(t); string(v) != "v" {
				t.Fatalf("clone get = %q", v)
			}
		})
	}
}

// waitFor polls cond until it holds, for at most half the pool timeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(poolTimeout / 2)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serverConns counts the connections the server holds.
func serverConns(s *TCPServer) int {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return len(s.conns)
}

// TestTCPStoreIdleBound: a burst of blocked calls opens a connection each;
// once they return, at most maxIdleConns stay open, on the client and on
// the server. Sequential calls use a single connection, and the "init/"
// announcement is made once.
func TestTCPStoreIdleBound(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			const burst = 32
			srv, _ := newTestServer(t, ServerOptions{})
			c := dial(t, srv.Addr().String(), ClientOptions{Dialect: d, Timeout: poolTimeout, WorldSize: 2})
			ctx := context.Background()
			for i := range 10 {
				_ = c.Set(ctx, "seq", []byte{byte(i)})
				must(c.Get(ctx, "seq"))(t)
				must(c.Add(ctx, "n", 1))(t)
			}
			wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			_ = c.Wait(wctx, "missing")
			cancel()
			must(c.Add(ctx, "n", 1))(t) // v1 dropped the connection of the timed-out wait
			if open, idle := c.poolSize(); open != 1 || idle != 1 {
				t.Fatalf("sequential calls: %d connections open, %d idle; want 1", open, idle)
			}

			var wg sync.WaitGroup
			errc := make(chan error, burst)
			for range burst {
				wg.Go(func() {
					if _, err := c.Get(ctx, "gate"); err != nil {
						errc <- err
					}
				})
			}
			waitFor(t, fmt.Sprintf("a connection for each of %d blocked Gets", burst), func() bool {
				open, _ := c.poolSize()
				return open >= burst
			})
			waitFor(t, "the server to hold them", func() bool { return serverConns(srv) >= burst })
			if err := c.Set(ctx, "gate", []byte("open")); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
			if open, idle := c.poolSize(); open > maxIdleConns || idle > maxIdleConns {
				t.Fatalf("after the burst: %d connections open, %d idle; want at most %d", open, idle, maxIdleConns)
			}
			waitFor(t, fmt.Sprintf("the server to hold at most %d connections", maxIdleConns), func() bool {
				return serverConns(srv) <= maxIdleConns
			})
			if v := must(c.getRaw(ctx, initKey))(t); string(v) != "1" {
				t.Fatalf("init/ = %q: the announcement was repeated", v)
			}
		})
	}
}
