package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// raw is a bare protocol connection for probing the server.
type raw struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func rawDial(t *testing.T, addr string, d Dialect) *raw {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &raw{t: t, c: c, br: bufio.NewReader(c)}
	if d == DialectV2 {
		r.send(appendU32([]byte{0}, validationMagic))
	}
	return r
}

func (r *raw) send(b []byte) {
	r.t.Helper()
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

// recv reads n bytes, or reports the error (EOF for a closed connection).
func (r *raw) recv(n int, d time.Duration) ([]byte, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(d))
	b := make([]byte, n)
	_, err := io.ReadFull(r.br, b)
	return b, err
}

func (r *raw) want(n int, want []byte) {
	r.t.Helper()
	b, err := r.recv(n, 5*time.Second)
	if err != nil || !bytes.Equal(b, want) {
		r.t.Fatalf("reply %x, %v; want %x", b, err, want)
	}
}

// closed checks that the server closed the connection.
func (r *raw) closed() {
	r.t.Helper()
	if b, err := r.recv(1, 5*time.Second); !errors.Is(err, io.EOF) && !isConnReset(err) {
		r.t.Fatalf("connection still open (read %x, %v)", b, err)
	}
}

func req(code byte, fields ...any) []byte {
	b := []byte{code}
	for _, f := range fields {
		switch v := f.(type) {
		case string:
			b = appendStr(b, v)
		case []byte:
			b = appendStr(b, v)
		case int64:
			b = appendI64(b, v)
		case uint64:
			b = appendU64(b, v)
		case []string:
			b = appendKeys(b, v)
		}
	}
	return b
}

func i64(v int64) []byte { return appendI64(nil, v) }

// v2 codes used below.
const (
	cSet, cCAS, cGet, cAdd, cCheck, cWait, cNum, cDel = 1, 2, 3, 4, 5, 6, 7, 8
	cCancel, cPing                                    = 12, 13
)

func TestServerProtocolEdges(t *testing.T) {
	srv, lb := newTestServer(t, ServerOptions{MaxValueLen: 1 << 10})
	addr := srv.Addr().String()
	alive := func() {
		t.Helper()
		r := rawDial(t, addr, DialectV2)
		r.send([]byte{cNum})
		if _, err := r.recv(8, 5*time.Second); err != nil {
			t.Fatalf("server not serving after a bad client: %v", err)
		}
	}
	cases := []struct {
		name string
		d    Dialect
		send []byte
		log  string
	}{
		{"unknown opcode", DialectV2, []byte{0xEE}, "unknown query code 238"},
		{"BARRIER is not in 2.11", DialectV2, req(18, "k", int64(2)), "unknown query code 18"},
		{"key length 2^62", DialectV2, append([]byte{cSet}, appendU64(nil, 1<<62)...), "key length 4611686018427387904 exceeds the limit 8192"},
		{"key of 8193 bytes", DialectV2, req(cSet, strings.Repeat("k", 8193), "v"), "key length 8193"},
		{"value over the limit", DialectV2, req(cSet, "k", strings.Repeat("v", 1025)), "value length 1025 exceeds the limit 1024"},
		{"WAIT of 200000 keys", DialectV2, append([]byte{cWait}, appendU64(nil, 200000)...), "key count 200000"},
		{"second VALIDATE", DialectV2, appendU32([]byte{0}, validationMagic), "VALIDATE after the start"},
		{"v1 GET of a missing key", DialectV1, req(2, "/missing"), "GET of missing key"},
		{"v1 WATCH_KEY", DialectV1, req(7, "/k"), "WATCH_KEY"},
		{"v1 code 9", DialectV1, []byte{9}, "unknown query code 9"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := rawDial(t, addr, tc.d)
			r.send(tc.send)
			r.closed()
			lb.waitLog(t, tc.log)
			alive()
		})
	}

	t.Run("ADD on non-numeric value", func(t *testing.T) {
		r := rawDial(t, addr, DialectV2)
		r.send(req(cSet, "/txt", "abc"))
		r.send(req(cAdd, "/txt", int64(1)))
		r.closed()
		lb.waitLog(t, `not a decimal integer`)
	})

	t.Run("stoll quirks", func(t *testing.T) {
		r := rawDial(t, addr, DialectV2)
		r.send(req(cSet, "/q", " \t+12abc"))
		r.send(req(cAdd, "/q", int64(1)))
		r.want(8, i64(13))
		r.send(req(cGet, "/q"))
		r.want(10, append(i64(2), "13"...))
	})

	t.Run("v2 GET of a missing key is empty", func(t *testing.T) {
		r := rawDial(t, addr, DialectV2)
		r.send(req(cGet, "/missing"))
		r.want(8, i64(0))
		r.send(req(10, []string{"/missing", "/q"})) // MULTI_GET
		r.want(18, append(append(i64(0), i64(2)...), "13"...))
	})

	t.Run("key of 8192 bytes and empty counts", func(t *testing.T) {
		r := rawDial(t, addr, DialectV2)
		r.send(req(cSet, strings.Repeat("k", 8192), "v"))
		r.send(req(cCheck, []string{}))
		r.want(1, []byte{0})
		r.send(req(cWait, []string{}))
		r.want(1, []byte{0})
		r.send(append([]byte{cPing}, 0xde, 0xad, 0xbe, 0xef))
		r.want(4, []byte{0xde, 0xad, 0xbe, 0xef})
		r.send([]byte{cCancel}) // nothing pending: still answered
		r.want(1, []byte{1})
	})

	t.Run("waiters woken by every creating write", func(t *testing.T) {
		w := rawDial(t, addr, DialectV2)
		w.send(req(cWait, []string{"/w1", "/w2", "/w3", "/w4", "/w5", "/w1"}))
		o := rawDial(t, addr, DialectV2)
		o.send(req(cSet, "/w1", "x"))
		o.send(req(cAdd, "/w2", int64(1)))
		o.want(8, i64(1))
		o.send(req(cCAS, "/w3", "", "y"))
		o.want(9, append(i64(1), 'y'))
		o.send(req(9, "/w4", "z")) // APPEND
		if b, err := w.recv(1, 100*time.Millisecond); err == nil {
			t.Fatalf("woken early: %x", b)
		}
		o.send(req(11, uint64(1), "/w5", "m")) // MULTI_SET
		w.want(1, []byte{0})
	})

	t.Run("CANCEL_WAIT after the key arrived", func(t *testing.T) {
		w := rawDial(t, addr, DialectV2)
		w.send(req(cWait, []string{"/race"}))
		o := rawDial(t, addr, DialectV2)
		o.send(req(cSet, "/race", "x"))
		o.send([]byte{cNum})
		o.recv(8, 5*time.Second)
		w.send([]byte{cCancel})
		w.want(2, []byte{0, 1}) // STOP_WAITING, then WAIT_CANCELED
	})

	t.Run("cancelled wait is not woken", func(t *testing.T) {
		w := rawDial(t, addr, DialectV2)
		w.send(req(cWait, []string{"/cw"}))
		w.send([]byte{cCancel})
		w.want(1, []byte{1})
		o := rawDial(t, addr, DialectV2)
		o.send(req(cSet, "/cw", "x"))
		o.send([]byte{cNum})
		want, _ := o.recv(8, 5*time.Second)
		w.send([]byte{cNum})
		w.want(8, want) // no stray STOP_WAITING before it
	})

	t.Run("partial request delays no other client", func(t *testing.T) {
		a := rawDial(t, addr, DialectV2)
		a.send(req(cSet, "/half", "value")[:7])
		b := rawDial(t, addr, DialectV2)
		b.send([]byte{cNum})
		if _, err := b.recv(8, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		a.send(req(cSet, "/half", "value")[7:])
		a.send(req(cGet, "/half"))
		a.want(13, append(i64(5), "value"...))
	})

	t.Run("1.x and 2.x clients share data", func(t *testing.T) {
		v1 := rawDial(t, addr, DialectV1)
		v1.send(req(0, "/shared", "one")) // 1.x SET, which has no reply
		// A round trip on v1 (1.x GETNUMKEYS, a single byte) orders the
		// SET before v2's GET: the server serves connections concurrently.
		v1.send([]byte{6})
		if _, err := v1.recv(8, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		v2 := rawDial(t, addr, DialectV2)
		v2.send(req(cGet, "/shared"))
		v2.want(11, append(i64(3), "one"...))
		// The idle second connection of a 1.13 client is tolerated.
		idle := rawDial(t, addr, DialectV1)
		_ = idle
	})
}

func TestServerCloseWakesBlockedClients(t *testing.T) {
	srv, _ := newTestServer(t, ServerOptions{})
	addr := srv.Addr().String()
	ctx := context.Background()
	type blocked struct {
		name string
		fn   func(*TCPStore) error
		d    Dialect
	}
	var calls []blocked
	for _, d := range []Dialect{DialectV2, DialectV1} {
		calls = append(calls,
			blocked{"get-" + d.String(), func(c *TCPStore) error { _, err := c.Get(ctx, "never"); return err }, d},
			blocked{"wait-" + d.String(), func(c *TCPStore) error { return c.Wait(ctx, "a", "b") }, d})
	}
	calls = append(calls, blocked{"queue_pop", func(c *TCPStore) error { _, err := c.QueuePop(ctx, "q", true); return err }, DialectV2})
	errs := make(chan error, len(calls))
	for _, b := range calls {
		c := dial(t, addr, ClientOptions{Dialect: b.d, Timeout: time.Minute})
		go func() { errs <- fmt.Errorf("%s: %w", b.name, b.fn(c)) }()
	}
	time.Sleep(100 * time.Millisecond)
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	for range calls {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), addr) {
				t.Errorf("blocked call after server close: %v; want ErrClosed naming %s", err, addr)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a blocked client was not woken by Close")
		}
	}
	_ = srv.Close() // idempotent
}

// TestManyClients: 1024 concurrent clients doing set/get/add/wait.
func TestManyClients(t *testing.T) {
	const n = 1024
	srv, _ := newTestServer(t, ServerOptions{})
	addr := srv.Addr().String()
	ctx := context.Background()
	var wg sync.WaitGroup
	var failed atomic.Int64
	errc := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			c, err := DialTCPStore(ctx, addr, ClientOptions{Timeout: 60 * time.Second, NoEnvSecret: true, Backoff: Backoff{Initial: 20 * time.Millisecond}})
			if err != nil {
				failed.Add(1)
				errc <- err
				return
			}
			defer c.Close()
			err = func() error {
				k := fmt.Sprintf("k%d", i)
				if err := c.Set(ctx, k, []byte(k)); err != nil {
					return err
				}
				if v, err := c.Get(ctx, k); err != nil || string(v) != k {
					return fmt.Errorf("get %s = %q, %w", k, v, err)
				}
				if _, err := c.Add(ctx, "counter", 1); err != nil {
					return err
				}
				// Everyone waits for a neighbour's key.
				return c.Wait(ctx, fmt.Sprintf("k%d", (i+1)%n))
			}()
			if err != nil {
				failed.Add(1)
				errc <- err
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
		break
	}
	if failed.Load() > 0 {
		t.Fatalf("%d of %d clients failed", failed.Load(), n)
	}
	c := dial(t, addr, ClientOptions{})
	if v := must(c.Get(ctx, "counter"))(t); string(v) != fmt.Sprint(n) {
		t.Fatalf("counter = %s", v)
	}
}

// TestHelperProcess is not a test: the tests below run it as a separate
// process, which they kill or let finish.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv("GOCOLL_STORE_HELPER")
	if mode == "" {
		t.Skip("helper process")
	}
	ctx := context.Background()
	switch mode {
	case "half-request":
		c, err := net.Dial("tcp", os.Getenv("ADDR"))
		if err != nil {
			os.Exit(2)
		}
		c.Write(appendU32([]byte{0}, validationMagic))
		c.Write(req(cWait, []string{"/victim-key"}))
		c.Write(req(cSet, "/half", strings.Repeat("v", 100))[:30])
		fmt.Println("SENT")
		time.Sleep(time.Minute)
	case "filestore":
		s, err := NewFileStore(os.Getenv("FILE"))
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(2)
		}
		_ = s.Set(ctx, "from-child", []byte("C"))
		v, err := s.Get(ctx, "from-parent")
		fmt.Println("GOT", string(v), err)
		_ = s.Close()
	}
	os.Exit(0)
}

func helper(t *testing.T, mode string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(append(os.Environ(), "GOCOLL_STORE_HELPER="+mode), env...)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewScanner(out)
}

// TestKilledClientDisturbsNoOther: a client process killed with a WAIT
// pending and half a request sent leaves the server and the other clients
// unaffected.
func TestKilledClientDisturbsNoOther(t *testing.T) {
	srv, lb := newTestServer(t, ServerOptions{})
	addr := srv.Addr().String()
	ctx := context.Background()
	other := dial(t, addr, ClientOptions{})
	waiter := dial(t, addr, ClientOptions{})
	got := make(chan error, 1)
	go func() { _, err := waiter.Get(ctx, "victim-key"); got <- err }()

	cmd, out := helper(t, "half-request", "ADDR="+addr)
	if !out.Scan() || out.Text() != "SENT" {
		t.Fatalf("helper: %q", out.Text())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for i := range 50 {
		if err := other.Set(ctx, fmt.Sprint("k", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
		must(other.Add(ctx, "n", 1))(t)
	}
	if err := other.Set(ctx, "victim-key", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the other waiter on the same key: %v", err)
	}
	if v := must(other.Get(ctx, "n"))(t); string(v) != "50" {
		t.Fatalf("n = %s", v)
	}
	if strings.Contains(lb.String(), "closing connection") {
		t.Fatalf("unexpected log:\n%s", lb.String())
	}
}

func TestConnectRetryAndErrors(t *testing.T) {
	ctx := context.Background()
	port := freePort(t)
	addr := "127.0.0.1:" + port
	go func() {
		time.Sleep(300 * time.Millisecond)
		s, err := NewTCPServer(ctx, ServerOptions{Addr: addr, Logger: slog.New(slog.DiscardHandler), NoEnvSecret: true})
		if err == nil {
			t.Cleanup(func() { s.Close() })
		}
	}()
	c := dial(t, addr, ClientOptions{Backoff: Backoff{Initial: 50 * time.Millisecond}})
	if err := c.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	// Nobody listens: the error names the address and says timeout.
	dead := "127.0.0.1:" + freePort(t)
	// A timeout long enough that the last attempt is refused rather than cut
	// short by the deadline on a loaded machine.
	_, err := DialTCPStore(ctx, dead, ClientOptions{Timeout: time.Second, NoEnvSecret: true, Backoff: Backoff{Initial: 50 * time.Millisecond}})
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), dead) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("dial of a dead address: %v", err)
	}
	// A wait timeout names address, key and elapsed time, as PyTorch does.
	c.SetTimeout(100 * time.Millisecond)
	err = c.Wait(ctx, "nonexistent key")
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "keys: /nonexistent key") || !strings.Contains(err.Error(), "wait timeout after") {
		t.Fatalf("wait timeout error: %v", err)
	}
	// A cancelled context (not a deadline) reports context.Canceled.
	c.SetTimeout(time.Minute)
	cctx, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	if err := c.Wait(cctx, "never"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	must(c.Add(ctx, "still-usable", 1))(t)
	_ = c.Close()
	if err := c.Set(ctx, "k", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("set after close: %v", err)
	}
	if _, err := DialTCPStore(ctx, "no-port", ClientOptions{}); err == nil {
		t.Fatal("bad address accepted")
	}
	if _, err := DialTCPStore(ctx, addr, ClientOptions{Dialect: 7}); err == nil {
		t.Fatal("bad dialect accepted")
	}
	if _, err := NewTCPServer(ctx, ServerOptions{Addr: addr, Logger: slog.New(slog.DiscardHandler)}); err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("second server on a busy port: %v", err)
	}
}

func TestWaitForWorkers(t *testing.T) {
	ctx := context.Background()
	port := freePort(t)
	addr := "127.0.0.1:" + port
	opts := func(master bool) TCPStoreOptions {
		return TCPStoreOptions{IsMaster: master, ClientOptions: ClientOptions{WorldSize: 3, Timeout: 20 * time.Second, NoEnvSecret: true,
			Backoff: Backoff{Initial: 20 * time.Millisecond}}, Server: ServerOptions{Addr: addr, Logger: slog.New(slog.DiscardHandler)}}
	}
	var wg sync.WaitGroup
	stores := make([]*TCPStore, 3)
	errs := make([]error, 3)
	for r := range 3 {
		wg.Go(func() {
			if r > 0 {
				time.Sleep(100 * time.Millisecond)
			}
			stores[r], errs[r] = NewTCPStore(ctx, addr, opts(r == 0))
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer stores[0].Close()
	for _, s := range stores[1:] {
		defer s.Close()
	}
	if n := must(stores[1].NumKeys(ctx))(t); n != 1 {
		t.Fatalf("num_keys = %d, want 1 (init/)", n)
	}
	if keys := must(stores[1].ListKeys(ctx))(t); len(keys) != 0 {
		t.Fatalf("list_keys shows internal keys: %q", keys)
	}

	// Too few workers: the master's constructor fails with PyTorch's message.
	o := opts(true)
	o.Server.Addr = "127.0.0.1:0"
	o.WorldSize = 2
	o.Timeout = 300 * time.Millisecond
	_, err := NewTCPStore(ctx, "127.0.0.1:0", o)
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "waiting for clients. 1/2 clients joined") {
		t.Fatalf("missing workers: %v", err)
	}
}

func TestAuth(t *testing.T) {
	ctx := context.Background()
	secret := []byte("s3cret")
	srv, lb := newTestServer(t, ServerOptions{Secret: secret})
	addr := srv.Addr().String()
	quick := ClientOptions{Timeout: 2 * time.Second, Backoff: Backoff{Initial: 20 * time.Millisecond}}

	for _, d := range []Dialect{DialectV2, DialectV1} {
		o := quick
		o.Secret, o.Dialect = secret, d
		c := dial(t, addr, o)
		if err := c.Set(ctx, "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
		if v := must(c.Get(ctx, "k"))(t); string(v) != "v" {
			t.Fatalf("get = %q", v)
		}
	}
	// The secret from the environment.
	t.Setenv(SecretEnv, string(secret))
	c, err := DialTCPStore(ctx, addr, quick)
	if err != nil {
		t.Fatalf("client with the secret from %s: %v", SecretEnv, err)
	}
	c.Close()

	// Wrong secret: refused at once, with ErrAuth, and logged.
	o := quick
	o.Secret = []byte("wrong")
	if _, err := DialTCPStore(ctx, addr, o); !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong secret: %v", err)
	}
	lb.waitLog(t, "refused client")
	// A gocoll client without the secret gets ErrAuth, not a retry loop
	// that ends in ErrTimeout (its timeout is far longer than the test).
	o = ClientOptions{Timeout: 5 * time.Minute, NoEnvSecret: true}
	if _, err := DialTCPStore(ctx, addr, o); !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), SecretEnv) {
		t.Fatalf("client without the secret: %v, want ErrAuth naming %s", err, SecretEnv)
	}
	o = quick
	o.Secret = []byte("wrong")
	// A PyTorch-style client (no handshake) is refused and logged; one
	// that opened with VALIDATE reads the refusal marker first, a 1.x one
	// nothing at all.
	r := rawDial(t, addr, DialectV2)
	r.send(append([]byte{cPing}, 1, 2, 3, 4))
	r.want(len(authRefused), []byte(authRefused))
	r.closed()
	lb.waitLog(t, "refused client")
	r = rawDial(t, addr, DialectV1)
	r.send(req(2, "/k"))
	r.closed()
	// A client with a secret against a server without one fails clearly.
	plain, _ := newTestServer(t, ServerOptions{NoEnvSecret: true})
	o.Secret = secret
	if _, err := DialTCPStore(ctx, plain.Addr().String(), o); !errors.Is(err, ErrAuth) {
		t.Fatalf("secret client vs plain server: %v", err)
	}
}

func TestFileStoreProcesses(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "fs")
	s, err := NewFileStore(path)
	if err != nil {
		t.Fatal(err)
	}
	cmd, out := helper(t, "filestore", "FILE="+path)
	if v := must(s.Get(ctx, "from-child"))(t); string(v) != "C" {
		t.Fatalf("from-child = %q", v)
	}
	_ = s.Set(ctx, "from-parent", []byte("P"))
	if !out.Scan() || out.Text() != "GOT P <nil>" {
		t.Fatalf("child: %q", out.Text())
	}
	// The child prints before it closes its handle: wait for it to exit,
	// or its close may come after ours and the file outlive our check.
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	// Refcount: the child closed; the file stays until our last handle goes.
	c := clone(t, s)
	_ = s.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("file removed while a handle is open: %v", err)
	}
	_ = c.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("file not removed after the last close: %v", err)
	}
	if err := s.Set(ctx, "k", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("set after close: %v", err)
	}
}
