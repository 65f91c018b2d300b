package store

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// capEvent is one line of a proxy capture: [time, kind, conn, hex].
type capEvent struct {
	kind string
	conn int
	data []byte
}

func loadCapture(t testing.TB, path string) []capEvent {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var evs []capEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var raw []any
		if err := json.Unmarshal(sc.Bytes(), &raw); err != nil || len(raw) != 4 {
			t.Fatalf("%s: bad line %q: %v", path, sc.Text(), err)
		}
		data, err := hex.DecodeString(raw[3].(string))
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, capEvent{kind: raw[1].(string), conn: int(raw[2].(float64)), data: data})
	}
	return evs
}

// parseListKeys decodes a LIST_KEYS reply into its sorted keys.
func parseListKeys(t *testing.T, b []byte) []string {
	t.Helper()
	if len(b) < 8 {
		t.Fatalf("short LIST_KEYS reply %x", b)
	}
	n := binary.LittleEndian.Uint64(b)
	b = b[8:]
	var keys []string
	for range n {
		l := binary.LittleEndian.Uint64(b)
		keys = append(keys, string(b[8:8+l]))
		b = b[8+l:]
	}
	slices.Sort(keys)
	return keys
}

// TestReplayCaptures plays the client side of every captured PyTorch
// session (1.13 and 2.11 clients, the store API tour and real gloo/nccl
// rendezvous) against our server, in the captured order, and checks that
// our server answers byte for byte what PyTorch's server answered. The one
// nondeterministic answer, LIST_KEYS (map order), is compared as a set.
func TestReplayCaptures(t *testing.T) {
	files, _ := filepath.Glob("testdata/captures/*.jsonl")
	if len(files) < 8 {
		t.Fatalf("captures missing: %v", files)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".jsonl"), func(t *testing.T) {
			t.Parallel()
			evs := loadCapture(t, file)
			srv, lb := newTestServer(t, ServerOptions{})
			conns := map[int]net.Conn{}
			readers := map[int]*bufio.Reader{}
			last := map[int][]byte{}
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			// The server runs connections in parallel, so requests of
			// different connections are sent one at a time, in the order of
			// the capture: after each request, the reply that follows it on
			// its connection is read at once when it comes within 50 ms (a
			// WAIT on a missing key does not; its reply is read later, at
			// its place in the capture).
			nextIsReply := make([]int, len(evs)) // index of the S>C that answers a C>S, or -1
			for i := range evs {
				nextIsReply[i] = -1
				if evs[i].kind != "C>S" {
					continue
				}
				for j := i + 1; j < len(evs); j++ {
					if evs[j].conn == evs[i].conn && evs[j].kind != "OPEN" {
						if evs[j].kind == "S>C" {
							nextIsReply[i] = j
						}
						break
					}
				}
			}
			partial := map[int][]byte{}
			consumed := map[int]bool{}
			replies := 0
			check := func(i int, ev capEvent, got []byte) {
				replies++
				if bytes.Equal(last[ev.conn], []byte{0x11}) { // LIST_KEYS
					if g, w := parseListKeys(t, got), parseListKeys(t, ev.data); !slices.Equal(g, w) {
						t.Fatalf("event %d: LIST_KEYS = %q, torch answered %q", i, g, w)
					}
					return
				}
				if !bytes.Equal(got, ev.data) {
					t.Fatalf("event %d conn %d (after request %x): reply %x, torch answered %x", i, ev.conn, last[ev.conn], got, ev.data)
				}
			}
			// read reads the reply of event j within d; it reports whether
			// the whole reply came.
			read := func(j int, d time.Duration) bool {
				ev := evs[j]
				c := conns[ev.conn]
				_ = c.SetReadDeadline(time.Now().Add(d))
				buf := make([]byte, len(ev.data)-len(partial[ev.conn]))
				n, err := io.ReadFull(readers[ev.conn], buf)
				partial[ev.conn] = append(partial[ev.conn], buf[:n]...)
				if err != nil {
					if ne, ok := err.(net.Error); ok && ne.Timeout() {
						return false
					}
					t.Fatalf("event %d conn %d: reading %d-byte reply %x: %v\nserver log:\n%s", j, ev.conn, len(ev.data), ev.data, err, lb.String())
				}
				got := partial[ev.conn]
				delete(partial, ev.conn)
				consumed[j] = true
				check(j, ev, got)
				return true
			}
			for i, ev := range evs {
				switch ev.kind {
				case "OPEN":
					c, err := net.Dial("tcp", srv.Addr().String())
					if err != nil {
						t.Fatal(err)
					}
					conns[ev.conn], readers[ev.conn] = c, bufio.NewReader(c)
				case "C>S":
					if _, err := conns[ev.conn].Write(ev.data); err != nil {
						t.Fatalf("event %d: write: %v", i, err)
					}
					last[ev.conn] = ev.data
					if j := nextIsReply[i]; j >= 0 {
						read(j, 50*time.Millisecond)
					}
				case "C>S EOF":
					_ = conns[ev.conn].(*net.TCPConn).CloseWrite()
				case "S>C":
					if !consumed[i] && !read(i, 5*time.Second) {
						t.Fatalf("event %d conn %d: no reply %x within 5s\nserver log:\n%s", i, ev.conn, ev.data, lb.String())
					}
				}
			}
			// Nothing more than torch sent may be pending on any connection.
			for id, c := range conns {
				_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
				if b, err := readers[id].ReadByte(); err == nil {
					t.Fatalf("conn %d: extra reply byte %02x", id, b)
				}
			}
			if strings.Contains(lb.String(), "closing connection") {
				t.Fatalf("server closed a connection:\n%s", lb.String())
			}
			t.Logf("%d events, %d replies matched", len(evs), replies)
		})
	}
}

// recorder is a TCP proxy that records the client→server bytes of each
// connection, in connection order, and the order in which chunks arrived
// across connections.
type recorder struct {
	ln     net.Listener
	mu     sync.Mutex
	conns  []*bytes.Buffer
	chunks [][2]int // (connection, end offset) of each chunk received, in order
}

func newRecorder(t *testing.T, target string) *recorder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			buf := &bytes.Buffer{}
			r.mu.Lock()
			id := len(r.conns)
			r.conns = append(r.conns, buf)
			r.mu.Unlock()
			go func() { io.Copy(c, s); c.Close() }()
			go func() {
				b := make([]byte, 4096)
				for {
					n, err := c.Read(b)
					if n > 0 {
						r.mu.Lock()
						buf.Write(b[:n])
						r.chunks = append(r.chunks, [2]int{id, buf.Len()})
						r.mu.Unlock()
						s.Write(b[:n])
					}
					if err != nil {
						s.Close()
						return
					}
				}
			}()
		}
	}()
	return r
}

func (r *recorder) sent(i int) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i >= len(r.conns) {
		return nil
	}
	return bytes.Clone(r.conns[i].Bytes())
}

// arrival returns the index, in the order of arrival, of the chunk that
// held byte off of connection i.
func (r *recorder) arrival(i, off int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for n, ch := range r.chunks {
		if ch[0] == i && off < ch[1] {
			return n
		}
	}
	return -1
}

// v2Request is one client request of the 2.x protocol, split from a byte
// stream.
type v2Request struct {
	op   op
	data []byte
}

// splitV2Requests splits a client's byte stream into its requests.
func splitV2Requests(t *testing.T, b []byte) []v2Request {
	t.Helper()
	var out []v2Request
	for len(b) > 0 {
		o := decodeOp(DialectV2, b[0])
		n := 1
		u64 := func() uint64 {
			if len(b) < n+8 {
				t.Fatalf("truncated %s request %x", o, b)
			}
			v := binary.LittleEndian.Uint64(b[n:])
			n += 8
			return v
		}
		str := func() { n += int(u64()) }
		switch o {
		case opValidate, opPing:
			n += 4
		case opNumKeys, opCancelWait, opListKeys:
		case opGet, opDeleteKey, opQueuePop, opQueueLen:
			str()
		case opSet, opAppend, opQueuePush:
			str()
			str()
		case opCompareSet:
			str()
			str()
			str()
		case opAdd:
			str()
			n += 8
		case opCheck, opWait, opMultiGet:
			for range u64() {
				str()
			}
		case opMultiSet:
			for range u64() {
				str()
				str()
			}
		default:
			t.Fatalf("unknown request code %d in %x", b[0], b)
		}
		if n > len(b) {
			t.Fatalf("truncated %s request %x", o, b)
		}
		out = append(out, v2Request{o, b[:n]})
		b = b[n:]
	}
	return out
}

// TestClientMatchesTorch211 runs, with our DialectV2 client, the store API
// tour that produced proxylog_v2.11.0_libuv.jsonl and checks that it sends
// exactly the requests the torch 2.11 client sent (the PING nonce, the
// client's pid, excepted). Torch's second client sends its bytes on one
// connection, as ours does. Torch's first one sends every request on one
// connection; ours sends the WAITs and CANCEL_WAITs on a wait connection,
// after its own handshake, and the rest on its main connection: each of
// the two byte streams must be the torch stream's share, byte for byte,
// and their requests must have reached the proxy in torch's order wherever
// that order is fixed (a request after one with a reply; a SET, which has
// none, may be overtaken by the next request on the other connection).
func TestClientMatchesTorch211(t *testing.T) {
	ctx := context.Background()
	srv, _ := newTestServer(t, ServerOptions{})
	rec := newRecorder(t, srv.Addr().String())
	addr := rec.ln.Addr().String()
	c1 := dial(t, addr, ClientOptions{})
	time.Sleep(20 * time.Millisecond)
	c2 := dial(t, addr, ClientOptions{WorldSize: 2})

	_ = c1.Set(ctx, "k1", []byte("v1"))
	must(c1.Get(ctx, "k1"))(t)
	_ = c1.Set(ctx, "s", []byte("str-value"))
	must(c1.Add(ctx, "ctr", 5))(t)
	must(c1.Add(ctx, "ctr", -2))(t)
	must(c1.Get(ctx, "ctr"))(t)
	must(c1.CompareSet(ctx, "k1", []byte("v1"), []byte("v2")))(t)
	must(c1.CompareSet(ctx, "k1", []byte("nope"), []byte("zz")))(t)
	must(c1.CompareSet(ctx, "absent", nil, []byte("new")))(t)
	must(c1.CompareSet(ctx, "absent2", []byte("x"), []byte("y")))(t)
	must(c1.NumKeys(ctx))(t)
	must(c1.DeleteKey(ctx, "k1"))(t)
	must(c1.DeleteKey(ctx, "k1"))(t)
	must(c1.Check(ctx, "ctr"))(t)
	must(c1.Check(ctx, "ctr", "missing"))(t)
	if err := c1.Wait(ctx, "ctr"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_ = c1.Wait(wctx, "missing")
	cancel()
	c1.SetTimeout(400 * time.Millisecond)
	_, _ = c1.Get(ctx, "missing2")
	c1.SetTimeout(5 * time.Second)
	go func() { time.Sleep(300 * time.Millisecond); _ = c2.Set(ctx, "late", []byte("L")) }()
	must(c1.Get(ctx, "late"))(t)
	_ = c1.Append(ctx, "ap", []byte("x"))
	_ = c1.Append(ctx, "ap", []byte("yz"))
	must(c1.Get(ctx, "ap"))(t)
	_ = c1.MultiSet(ctx, []string{"m1", "m2"}, [][]byte{[]byte("a"), []byte("bb")})
	must(c1.MultiGet(ctx, []string{"m1", "m2"}))(t)
	_ = c1.QueuePush(ctx, "q", []byte("e1"))
	must(c1.QueueLen(ctx, "q"))(t)
	must(c1.QueuePop(ctx, "q", false))(t)
	_, _ = c1.QueuePop(ctx, "q", false)
	must(c1.ListKeys(ctx))(t)
	p, _ := NewPrefixStore("pfx", c1)
	_ = p.Set(ctx, "a", []byte("b"))
	p1, _ := NewPrefixStore("p1", c1)
	p2, _ := NewPrefixStore("p2", p1)
	must(p2.Add(ctx, "x", 1))(t)
	must(c1.NumKeys(ctx))(t)

	want := map[int][]byte{}
	for _, ev := range loadCapture(t, "testdata/captures/proxylog_v2.11.0_libuv.jsonl") {
		if ev.kind == "C>S" {
			want[ev.conn] = append(want[ev.conn], ev.data...)
		}
	}
	// Our connections, in the order the proxy accepted them: c1's main,
	// c2's, then c1's wait connection (dialled at its first Get).
	const c1Main, c2Main, c1Wait = 0, 1, 2
	rec.mu.Lock()
	nconns := len(rec.conns)
	rec.mu.Unlock()
	if nconns != 3 {
		t.Fatalf("our clients opened %d connections; want 3 (c1's main and wait connections, c2's)", nconns)
	}
	// Split torch's first connection: its handshake opens both of ours.
	reqs := splitV2Requests(t, want[1])
	if len(reqs) < 2 || reqs[0].op != opValidate || reqs[1].op != opPing {
		t.Fatalf("torch's connection 1 does not start with VALIDATE, PING: %x", want[1])
	}
	hello := slices.Concat(reqs[0].data, reqs[1].data)
	ours := map[int][]byte{c1Main: bytes.Clone(hello), c1Wait: bytes.Clone(hello), c2Main: want[2]}
	type placed struct {
		conn, off int
		req       v2Request
	}
	var order []placed // torch's requests after the handshake, where ours sends them
	for _, r := range reqs[2:] {
		id := c1Main
		if r.op == opWait || r.op == opCancelWait {
			id = c1Wait
		}
		order = append(order, placed{id, len(ours[id]), r})
		ours[id] = append(ours[id], r.data...)
	}
	ok := true
	for _, id := range []int{c1Main, c2Main, c1Wait} {
		got, w := rec.sent(id), ours[id]
		if len(got) >= 10 && len(w) >= 10 {
			copy(got[6:10], w[6:10]) // PING nonce = pid
		}
		if !bytes.Equal(got, w) {
			ok = false
			t.Errorf("connection %d: our client sent\n%x\nwant (from torch 2.11)\n%x", id, got, w)
		}
	}
	if !ok {
		return
	}
	for i := 1; i < len(order); i++ {
		prev, cur := order[i-1], order[i]
		if prev.conn == cur.conn || prev.req.op == opSet || prev.req.op == opAppend || prev.req.op == opMultiSet || prev.req.op == opQueuePush {
			continue
		}
		if a, b := rec.arrival(prev.conn, prev.off+len(prev.req.data)-1), rec.arrival(cur.conn, cur.off); a >= b {
			t.Errorf("request %d (%s, connection %d) arrived before request %d (%s, connection %d), which torch sent first", i+1, cur.req.op, cur.conn, i, prev.req.op, prev.conn)
		}
	}
}
