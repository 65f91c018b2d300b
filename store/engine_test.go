package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/internal/uring"
)

// engines returns the server engines this machine can run; the ring engine
// is skipped, with the reason logged, where io_uring is not available.
func engines(t *testing.T) []Engine {
	t.Helper()
	s, err := NewTCPServer(context.Background(), ServerOptions{Addr: "127.0.0.1:0", Engine: EngineRing, NoEnvSecret: true})
	if errors.Is(err, uring.ErrUnsupported) {
		t.Logf("ring engine not tested: %v", err)
		return []Engine{EngineGoroutines}
	}
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	return []Engine{EngineGoroutines, EngineRing}
}

// exchange sends script to a fresh connection in chunks of at most chunk
// bytes, shuts its side down, and returns every byte the server sent
// before it closed.
func exchange(t *testing.T, addr string, script []byte, chunk int) []byte {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(nc)
		got <- b
	}()
	for b := script; len(b) > 0; {
		n := min(chunk, len(b))
		if _, err := nc.Write(b[:n]); err != nil {
			break // the server closed: what it sent is the answer
		}
		b = b[n:]
	}
	_ = nc.(*net.TCPConn).CloseWrite()
	return <-got
}

// TestEnginesAgree sends the same request streams, in both dialects, to
// each engine, whole and cut into pieces down to single bytes, and checks
// that every engine sends the same bytes back. The cuts make the ring
// engine wait for partial requests at every field boundary.
func TestEnginesAgree(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 1280) // 20 KiB: several receives
	v2 := appendU32([]byte{0}, validationMagic)
	for _, r := range [][]byte{
		req(cSet, "/a", "1"), req(cGet, "/a"), req(cAdd, "/n", int64(5)), req(cAdd, "/n", int64(7)),
		req(cCheck, []string{"/a", "/n"}), req(cCheck, []string{"/missing"}), req(cWait, []string{"/a", "/n"}),
		req(cCAS, "/a", "1", "2"), req(cCAS, "/zz", "", "new"), req(9, "/a", "xy"),
		append(req(11, uint64(2)), append(req(0, "/m1", "v1")[1:], req(0, "/m2", "v2")[1:]...)...),
		req(10, []string{"/m1", "/m2", "/a"}), req(cDel, "/m2"), req(cNum), appendU32([]byte{13}, 0x1234),
		req(14, "/q", "item"), req(16, "/q"), req(15, "/q"), req(15, "/q"),
		req(cSet, "/big", big), req(cGet, "/big"), req(12),
	} {
		v2 = append(v2, r...)
	}
	var v1 []byte
	for _, r := range [][]byte{
		req(0, "/a", "1"), req(2, "/a"), req(3, "/n", int64(3)), req(4, []string{"/a", "/n"}),
		req(5, []string{"/a"}), req(1, "/a", "1", "2"), req(0, "/big", big), req(2, "/big"),
		req(6), req(8, "/a"), req(2, "/gone"), // a 1.x GET of a missing key ends the connection
	} {
		v1 = append(v1, r...)
	}
	var want map[string][]byte
	for _, e := range engines(t) {
		got := map[string][]byte{}
		for name, script := range map[string][]byte{"v2": v2, "v1": v1} {
			for _, chunk := range []int{len(script), 4096, 7, 1} {
				srv, lb := newTestServer(t, ServerOptions{Engine: e})
				out := exchange(t, srv.Addr().String(), script, chunk)
				if name == "v1" {
					lb.waitLog(t, `GET of missing key \"/gone\"`)
				}
				if len(out) == 0 {
					t.Fatalf("%v %s in %d-byte pieces: no reply", e, name, chunk)
				}
				if prev, ok := got[name]; ok && !bytes.Equal(out, prev) {
					t.Fatalf("%v %s in %d-byte pieces: %d reply bytes differ from the whole stream's %d", e, name, chunk, len(out), len(prev))
				}
				got[name] = out
			}
		}
		if want == nil {
			want = got
		} else {
			for name := range want {
				if !bytes.Equal(got[name], want[name]) {
					t.Fatalf("%s: %v replied %d bytes that differ from %v's %d", name, e, len(got[name]), EngineGoroutines, len(want[name]))
				}
			}
		}
	}
}

// TestEnginesRefuseHugeLengths checks that a length over its limit closes
// the connection at once, without waiting for the bytes it announces.
func TestEnginesRefuseHugeLengths(t *testing.T) {
	for _, e := range engines(t) {
		srv, lb := newTestServer(t, ServerOptions{Engine: e})
		nc, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = nc.Write(append([]byte{0}, appendU64(nil, 1<<40)...)) // a 1.x SET's key length
		if _, err := nc.Read(make([]byte, 1)); err == nil {
			t.Fatalf("%v: the server answered a 1 TiB key", e)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%v: the server waited for the 1 TiB key instead of closing", e)
		}
		nc.Close()
		lb.waitLog(t, "key length 1099511627776 exceeds the limit")
		// The server serves on.
		c := dial(t, srv.Addr().String(), ClientOptions{})
		if err := c.Set(context.Background(), "k", []byte("v")); err != nil {
			t.Fatalf("%v: after a refused client: %v", e, err)
		}
	}
}

// TestEnginesLargeValues moves values larger than every buffer, through
// the client, both ways.
func TestEnginesLargeValues(t *testing.T) {
	val := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, 3<<20/7)
	for _, e := range engines(t) {
		srv, _ := newTestServer(t, ServerOptions{Engine: e})
		c := dial(t, srv.Addr().String(), ClientOptions{})
		ctx := context.Background()
		for i := range 3 {
			if err := c.Set(ctx, "big", val[i:]); err != nil {
				t.Fatal(err)
			}
			got, err := c.Get(ctx, "big")
			if err != nil || !bytes.Equal(got, val[i:]) {
				t.Fatalf("%v: get of a %d-byte value: %d bytes, %v", e, len(val)-i, len(got), err)
			}
		}
	}
}

// TestEnginesWriteTimeout checks that a client that sends requests and
// reads no reply is disconnected after WriteTimeout.
func TestEnginesWriteTimeout(t *testing.T) {
	for _, e := range engines(t) {
		srv, lb := newTestServer(t, ServerOptions{Engine: e, WriteTimeout: 200 * time.Millisecond})
		c := dial(t, srv.Addr().String(), ClientOptions{})
		if err := c.Set(context.Background(), "v", make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		must(c.Get(context.Background(), "v"))(t) // the SET is in
		base := srv.numConns()
		nc, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		get := req(cGet, "/v")
		script := append(appendU32([]byte{0}, validationMagic), bytes.Repeat(get, 64)...)
		_ = nc.SetWriteDeadline(time.Now().Add(20 * time.Second))
		_, _ = nc.Write(script) // 64 MiB of replies that nobody reads
		lb.waitLog(t, "write response")
		waitFor(t, "the server to drop the client that does not read", func() bool { return srv.numConns() == base })
	}
}

// TestEngineOption checks engine names and the environment variable.
func TestEngineOption(t *testing.T) {
	for _, e := range []Engine{EngineAuto, EngineGoroutines, EngineRing} {
		if got, err := ParseEngine(e.String()); err != nil || got != e {
			t.Fatalf("ParseEngine(%q) = %v, %v", e.String(), got, err)
		}
	}
	t.Setenv(EngineEnv, "threads")
	_, err := NewTCPServer(context.Background(), ServerOptions{Addr: "127.0.0.1:0", NoEnvSecret: true})
	if err == nil || !strings.Contains(err.Error(), EngineEnv) || !strings.Contains(err.Error(), `"threads"`) {
		t.Fatalf("bad %s: %v", EngineEnv, err)
	}
	t.Setenv(EngineEnv, "goroutines")
	srv, _ := newTestServer(t, ServerOptions{})
	if srv.ring != nil {
		t.Fatalf("%s=goroutines started the ring engine", EngineEnv)
	}
}

// TestEnginesAuthThenPipelined sends the handshake's proof and the first
// requests in one write, before the server's OK: the bytes read with the
// handshake must reach the engine that takes the connection over.
func TestEnginesAuthThenPipelined(t *testing.T) {
	secret := []byte("s3cret")
	for _, e := range engines(t) {
		srv, _ := newTestServer(t, ServerOptions{Engine: e, Secret: secret})
		nc, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		cn := bytes.Repeat([]byte{7}, authNonce)
		if _, err := nc.Write(append([]byte(authHello), cn...)); err != nil {
			t.Fatal(err)
		}
		resp := make([]byte, authNonce+32)
		if _, err := io.ReadFull(nc, resp); err != nil {
			t.Fatal(err)
		}
		msg := authMAC(secret, "gocoll-store client", resp[:authNonce], cn)
		msg = append(msg, appendU32([]byte{0}, validationMagic)...)
		msg = append(msg, req(cSet, "/k", "pipelined")...)
		msg = append(msg, req(cGet, "/k")...)
		if _, err := nc.Write(msg); err != nil {
			t.Fatal(err)
		}
		want := append([]byte{authOK}, appendStr(nil, "pipelined")...)
		got := make([]byte, len(want))
		if _, err := io.ReadFull(nc, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%v: got %q, %v; want %q", e, got, err, want)
		}
	}
}

// TestBigRequestsMidApply: large requests, which the ring engine runs on a
// goroutine (ringEngine.offload), keep their connection's reply order, and
// a connection reset or a server Close while one runs leaves the server
// serving, the wait index clean and the memory budget given back.
func TestBigRequestsMidApply(t *testing.T) {
	const n = 20_000 // ~400 KiB a MULTI_SET, over ringOffloadBytes
	keys := make([]string, n)
	cMultiSet, _ := encodeOp(DialectV2, opMultiSet)
	cMultiGet, _ := encodeOp(DialectV2, opMultiGet)
	ms := appendU64([]byte{cMultiSet}, uint64(n))
	for i := range keys {
		keys[i] = "/m/" + strconv.Itoa(i)
		ms = appendStr(appendStr(ms, keys[i]), "v")
	}
	for _, eng := range engines(t) {
		t.Run(eng.String(), func(t *testing.T) {
			srv, _ := newTestServer(t, ServerOptions{Engine: eng})
			addr := srv.Addr().String()
			// Order: small, big, small, big on one connection, pipelined.
			r := rawDial(t, addr, DialectV2)
			script := append(req(cSet, "/a", "1"), req(cGet, "/a")...)
			script = append(append(script, ms...), req(cMultiGet, keys)...)
			script = append(append(script, req(cGet, "/a")...), req(cCheck, keys)...)
			r.send(script)
			want := appendStr(nil, "1")
			for range n {
				want = appendStr(want, "v")
			}
			want = append(appendStr(want, "1"), replyReady)
			r.want(len(want), want)
			waited := func() int {
				srv.st.mu.Lock()
				defer srv.st.mu.Unlock()
				return len(srv.st.waiters)
			}
			base := srv.budget.Used()

			// busy starts a connection with a WAIT that never ends, a
			// GET whose 768 KiB reply it does not read (under the 1 MiB a
			// connection may queue before its requests wait), and a MULTI_SET
			// of DefaultMaxKeysPerRequest keys, which the server is likely
			// to run while the reply is in flight when busy returns.
			r.send(req(cSet, "/v", bytes.Repeat([]byte{'x'}, 768<<10)))
			r.send(req(cGet, "/v"))
			if _, err := r.recv(8+768<<10, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			huge := appendU64([]byte{cMultiSet}, uint64(DefaultMaxKeysPerRequest))
			for i := range DefaultMaxKeysPerRequest {
				huge = appendStr(appendStr(huge, "/h/"+strconv.Itoa(i)), "v")
			}
			busy := func() net.Conn {
				nc, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { nc.Close() })
				_ = nc.(*net.TCPConn).SetReadBuffer(4 << 10)
				script := append(appendU32([]byte{0}, validationMagic), req(cWait, []string{"/never"})...)
				script = append(script, req(cGet, "/v")...)
				if _, err := nc.Write(append(script, huge...)); err != nil {
					t.Fatal(err)
				}
				time.Sleep(20 * time.Millisecond)
				return nc
			}
			// A reset while the server may be running a request.
			for range 3 {
				nc := busy()
				_ = nc.(*net.TCPConn).SetLinger(0)
				_ = nc.Close()
			}
			r.send(req(cGet, "/a"))
			r.want(9, appendStr(nil, "1"))
			deadline := time.Now().Add(10 * time.Second)
			for srv.numConns() > 1 || srv.budget.Used() > base || waited() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("after the resets: %d connections, budget %d bytes held (%d before), %d keys waited on", srv.numConns(), srv.budget.Used(), base, waited())
				}
				time.Sleep(10 * time.Millisecond)
			}

			// Close while big requests are queued and running.
			busy()
			done := make(chan error, 1)
			go func() { done <- srv.Close() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Close did not return with a big request running")
			}
		})
	}
}
