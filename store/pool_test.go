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

// The tests of TCPStore's main and wait connections. Their time bounds are
// loose on purpose: a call that waits behind another would take the store
// timeout (30 s), so a few seconds tell the two apart on a loaded machine.

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
// kind of call, while some of them wait. Each checks that its own calls
// take effect in its program order (a Get or MultiGet after a Set returns
// that Set's value, a CompareSet after a Set sees it, its queue is FIFO),
// counters kept with Add are exact, and it waits for a key of its
// neighbour.
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
							if got, err := c.Get(ctx, k); err != nil || string(got) != v {
								return fmt.Errorf("%s: Get after Set %q = %q, %v", k, v, got, err)
							}
							next := strconv.Itoa(r + 1)
							got, err := c.CompareSet(ctx, k, []byte(v), []byte(next))
							if err != nil {
								return err
							}
							if string(got) != next {
								return fmt.Errorf("%s: CompareSet after Get %q returned %q", k, v, got)
							}
							if err := c.MultiSet(ctx, []string{k, k + "b"}, [][]byte{[]byte(v), []byte(next)}); err != nil {
								return err
							}
							if got, err := c.MultiGet(ctx, []string{k + "b", k}); err != nil || string(got[0]) != next || string(got[1]) != v {
								return fmt.Errorf("%s: MultiGet after MultiSet %q, %q = %q, %v", k, v, next, got, err)
							}
							if _, err := c.Add(ctx, "counter", 1); err != nil {
								return err
							}
							if ok, err := c.Check(ctx, k); err != nil || !ok {
								return fmt.Errorf("%s: Check = %v, %v", k, ok, err)
							}
							if d == DialectV2 {
								q := "q" + k
								if err := c.QueuePush(ctx, q, []byte(v)); err != nil {
									return err
								}
								if err := c.QueuePush(ctx, q, []byte(next)); err != nil {
									return err
								}
								if got, err := c.QueuePop(ctx, q, r%2 == 0); err != nil || string(got) != v {
									return fmt.Errorf("%s: QueuePop = %q, %v; want %q", q, got, err, v)
								}
								if got, err := c.QueuePop(ctx, q, r%2 == 1); err != nil || string(got) != next {
									return fmt.Errorf("%s: QueuePop = %q, %v; want %q", q, got, err, next)
								}
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
			if open, idle := c.waitConns(); idle > maxIdleConns || open > maxIdleConns {
				t.Fatalf("%d wait connections open, %d idle after the calls; want at most %d", open, idle, maxIdleConns)
			}
		})
	}
}

// TestTCPStoreOwnWritesBeforeWaits: a Set, which has no reply, followed by
// a Get or MultiGet of the same key: the Get waits on a wait connection but
// reads on the main connection, behind the Set, so it returns the new value
// and never the old one, also while other calls of the client are blocked
// in waits; and a Wait after the caller's own Set returns.
func TestTCPStoreOwnWritesBeforeWaits(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			srv, _ := newTestServer(t, ServerOptions{})
			c := dial(t, srv.Addr().String(), ClientOptions{Dialect: d, Timeout: poolTimeout})
			ctx := context.Background()
			blocked := make(chan error, 3)
			for i := range cap(blocked) {
				go func() { _, err := c.Get(ctx, fmt.Sprintf("gate%d", i)); blocked <- err }()
			}
			for i := range 200 {
				v := []byte(strconv.Itoa(i))
				if err := c.Set(ctx, "x", v); err != nil {
					t.Fatal(err)
				}
				if got := must(c.Get(ctx, "x"))(t); string(got) != string(v) {
					t.Fatalf("round %d: Get after Set = %q", i, got)
				}
				if err := c.Append(ctx, "x", []byte("+")); err != nil {
					t.Fatal(err)
				}
				if got := must(c.MultiGet(ctx, []string{"x"}))(t); string(got[0]) != string(v)+"+" {
					t.Fatalf("round %d: MultiGet after Append = %q", i, got[0])
				}
				w := fmt.Sprintf("w%d", i)
				if err := c.Set(ctx, w, nil); err != nil {
					t.Fatal(err)
				}
				if err := c.Wait(ctx, w); err != nil {
					t.Fatal(err)
				}
				if i%50 == 49 {
					if _, err := c.DeleteKey(ctx, "x"); err != nil {
						t.Fatal(err)
					}
				}
			}
			for i := range cap(blocked) {
				if err := c.Set(ctx, fmt.Sprintf("gate%d", i), nil); err != nil {
					t.Fatal(err)
				}
				if err := <-blocked; err != nil {
					t.Fatal(err)
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
			if err := c.Set(ctx, "s", []byte("v")); err != nil {
				t.Fatal(err)
			}
			errs := make(chan error, len(calls))
			for name, f := range calls {
				go func() { errs <- fmt.Errorf("%s: %w", name, f()) }()
			}
			waitFor(t, fmt.Sprintf("a wait connection for each of %d blocked calls", len(calls)), func() bool {
				open, _ := c.waitConns()
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
			if open, idle := c.waitConns(); open != 0 || idle != 0 {
				t.Fatalf("after Close: %d wait connections open, %d idle", open, idle)
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

// TestTCPStoreIdleBound: sequential calls use the main connection and one
// wait connection, and the "init/" announcement is made once. A burst of
// blocked Gets opens a wait connection each; once they return, at most
// maxIdleConns stay open, on the client and on the server.
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
			if err := c.Wait(wctx, "missing"); !errors.Is(err, ErrTimeout) {
				t.Fatalf("wait for a missing key: %v", err)
			}
			cancel()
			must(c.Get(ctx, "seq"))(t) // v1 dropped the wait connection of the timed-out wait
			if open, idle := c.waitConns(); open != 1 || idle != 1 {
				t.Fatalf("sequential calls: %d wait connections open, %d idle; want 1", open, idle)
			}
			waitFor(t, "the server to hold 2 connections (main, wait)", func() bool { return srv.numConns() == 2 })

			var wg sync.WaitGroup
			errc := make(chan error, burst)
			for range burst {
				wg.Go(func() {
					if _, err := c.Get(ctx, "gate"); err != nil {
						errc <- err
					}
				})
			}
			waitFor(t, fmt.Sprintf("a wait connection for each of %d blocked Gets", burst), func() bool {
				open, _ := c.waitConns()
				return open == burst
			})
			waitFor(t, "the server to hold them", func() bool { return srv.numConns() == burst+1 })
			if err := c.Set(ctx, "gate", []byte("open")); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
			if open, idle := c.waitConns(); open != maxIdleConns || idle != maxIdleConns {
				t.Fatalf("after the burst: %d wait connections open, %d idle; want %d", open, idle, maxIdleConns)
			}
			waitFor(t, fmt.Sprintf("the server to hold %d connections", maxIdleConns+1), func() bool {
				return srv.numConns() == maxIdleConns+1
			})
			if v := must(c.getRaw(ctx, initKey))(t); string(v) != "1" {
				t.Fatalf("init/ = %q: the announcement was repeated", v)
			}
		})
	}
}
