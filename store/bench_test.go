package store

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
)

// loopReader yields data reps times, then io.EOF.
type loopReader struct {
	data []byte
	off  int
	reps int
}

func (r *loopReader) Read(p []byte) (int, error) {
	if r.reps == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.data[r.off:])
	if r.off += n; r.off == len(r.data) {
		r.off = 0
		r.reps--
	}
	return n, nil
}

// benchOpStream returns n ops of set + get as a PyTorch client sends them
// (SET, WAIT, GET; 1.x or 2.x codes) on keys /bench/0 … /bench/n-1, with a
// 16-byte value.
func benchOpStream(d Dialect, n int) []byte {
	code := func(o op) byte { c, _ := encodeOp(d, o); return c }
	val := []byte("0123456789abcdef")
	var b []byte
	for i := range n {
		k := "/bench/" + strconv.Itoa(i)
		b = append(b, code(opSet))
		b = appendStr(appendStr(b, k), val)
		b = append(b, code(opWait))
		b = appendStr(appendU64(b, 1), k)
		b = append(b, code(opGet))
		b = appendStr(b, k)
	}
	return b
}

// BenchmarkServerRequestPath runs the server's parser and executor on one
// connection over an in-memory stream of pipelined set+get ops (SET, WAIT on
// a present key, GET), with replies going to io.Discard. One iteration is
// one op, three requests. It measures the per-request CPU cost and
// allocations without the kernel.
func BenchmarkServerRequestPath(b *testing.B) {
	for _, d := range []Dialect{DialectV1, DialectV2} {
		b.Run(d.String(), func(b *testing.B) {
			const batch = 64
			stream := benchOpStream(d, batch)
			opts := ServerOptions{Logger: slog.New(slog.DiscardHandler), NoEnvSecret: true, Addr: "unused"}
			opts.fill()
			s := &TCPServer{opts: opts, st: newServerState(&opts), log: opts.Logger}
			// The memory budget's accounting is on the request path too.
			s.budget = newMemBudget(DefaultMemoryBudget)
			s.st.budget = s.budget
			prefix := []byte{}
			if d == DialectV2 {
				prefix = appendU32([]byte{0}, validationMagic)
			}
			run := func(reps int) {
				c := s.newConn(nil, io.Discard)
				c.br = bufio.NewReaderSize(io.MultiReader(&loopReader{data: prefix, reps: 1}, &loopReader{data: stream, reps: reps}), 16<<10)
				c.rd.r = c.br
				if err := c.serveStream(); err != io.EOF {
					b.Fatal(err)
				}
				c.teardown()
			}
			run(1) // populate the keys
			b.SetBytes(int64(len(stream) / batch))
			b.ReportAllocs()
			b.ResetTimer()
			// Whole batches, so that iterations stay ops.
			reps := (b.N + batch - 1) / batch
			run(reps)
		})
	}
}

// BenchmarkServerLoopback is one closed-loop client over loopback TCP doing
// set+get as PyTorch's client does (SET and WAIT back to back, read
// STOP_WAITING, then GET and read the value): two round trips per op. It
// includes the kernel and both sides' syscalls; use it with -cpuprofile to
// see where a real connection's time goes.
func BenchmarkServerLoopback(b *testing.B) {
	srv, _ := newTestServer(b, ServerOptions{})
	nc, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	one := benchOpStream(DialectV1, 1)
	getAt := len(one) - (1 + 8 + len("/bench/0"))
	first, get := one[:getAt], one[getAt:]
	buf := make([]byte, 8+16)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := nc.Write(first); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, buf[:1]); err != nil {
			b.Fatal(err)
		}
		if _, err := nc.Write(get); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkServerWaitWake measures a WAIT that blocks and is woken by
// another connection's SET of its key (the wake-up path: the setter's
// goroutine queues STOP_WAITING and hands the flush off).
func BenchmarkServerWaitWake(b *testing.B) {
	srv, _ := newTestServer(b, ServerOptions{})
	dial := func() net.Conn {
		nc, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { nc.Close() })
		return nc
	}
	waiter, setter := dial(), dial()
	code := func(o op) byte { c, _ := encodeOp(DialectV1, o); return c }
	var one [1]byte
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		k := "/wake/" + strconv.Itoa(i)
		i++
		w := appendStr(appendU64([]byte{code(opWait)}, 1), k)
		if _, err := waiter.Write(w); err != nil {
			b.Fatal(err)
		}
		// CHECK on the waiter's connection would be answered only after
		// STOP_WAITING; a round trip on the setter orders nothing, so the
		// SET may land before the WAIT, which is also a valid wake-up.
		s := appendStr(appendStr([]byte{code(opSet)}, k), []byte("v"))
		if _, err := setter.Write(s); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(waiter, one[:]); err != nil {
			b.Fatal(err)
		}
	}
}

// TestServerScratchReuse pipelines requests whose keys and values pass
// through the connection's reused scratch buffers and checks that stored
// values never alias them, including in-place overwrites of equal length.
func TestServerScratchReuse(t *testing.T) {
	opts := ServerOptions{Logger: slog.New(slog.DiscardHandler), NoEnvSecret: true, Addr: "unused"}
	opts.fill()
	s := &TCPServer{opts: opts, st: newServerState(&opts), log: opts.Logger}
	in := appendU32([]byte{0}, validationMagic)
	for _, r := range [][]byte{
		req(cSet, "/a", []byte("xx")), req(cSet, "/b", []byte("yyyy")), req(cSet, "/a", []byte("zz")),
		req(cAdd, "/n", int64(5)), req(cAdd, "/n", int64(7)), req(cWait, []string{"/a", "/b", "/n"}),
		req(cGet, "/a"), req(cGet, "/b"), req(cGet, "/n"), req(10, []string{"/b", "/a", "/none"}),
	} {
		in = append(in, r...)
	}
	var out bytesBuffer
	c := s.newConn(nil, &out)
	c.br = bufio.NewReader(&loopReader{data: in, reps: 1})
	c.rd.r = c.br
	if err := c.serveStream(); err != io.EOF {
		t.Fatal(err)
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	var want []byte
	want = appendI64(want, 5)
	want = appendI64(want, 12)
	want = append(want, replyStopWait)
	want = appendStr(appendStr(appendStr(want, "zz"), "yyyy"), "12")
	want = appendStr(appendStr(appendStr(want, "yyyy"), "zz"), "")
	if string(out.b) != string(want) {
		t.Fatalf("replies\n got %q\nwant %q", out.b, want)
	}
}

// bytesBuffer is a minimal io.Writer that keeps what it is given.
type bytesBuffer struct{ b []byte }

func (w *bytesBuffer) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }
