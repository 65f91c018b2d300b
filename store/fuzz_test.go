package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
)

// FuzzServerParser feeds arbitrary bytes to one server connection's parser
// and executor (both dialects, chosen by the first bytes as on the wire).
// The seed corpus is every client byte stream of the torch captures. It
// checks that nothing panics, that the limits hold (a length field alone
// never allocates), and that a finished connection leaves no wait behind.
func FuzzServerParser(f *testing.F) {
	addCaptureSeeds(f)
	f.Add(appendU32([]byte{0}, validationMagic))
	f.Add(append(appendU32([]byte{0}, validationMagic), req(cWait, []string{"/a", "/b"})...))
	f.Add(req(1, "a", "b", "c"))
	f.Fuzz(func(t *testing.T, data []byte) {
		opts := ServerOptions{MaxValueLen: 64 << 10, MaxKeysPerRequest: 1024, MaxRequestBytes: 1 << 20,
			Logger: slog.New(slog.DiscardHandler), NoEnvSecret: true, Addr: "unused"}
		opts.fill()
		s := &TCPServer{opts: opts, st: newServerState(&opts), log: opts.Logger}
		// Two connections share the store: the second replays the input
		// after the first, so waits of one can be woken by the other.
		for range 2 {
			var out bytes.Buffer
			c := s.newConn(nil, &out)
			c.br = bufio.NewReader(bytes.NewReader(data))
			c.rd.r = c.br
			err := c.serveStream()
			if err == nil {
				t.Fatal("serveStream ended without an error")
			}
			if err != io.EOF && err != io.ErrUnexpectedEOF && !isMalformed(err) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			c.teardown()
		}
		s.st.mu.Lock()
		defer s.st.mu.Unlock()
		if len(s.st.waiters) != 0 {
			t.Fatalf("%d keys still have waiters after every connection ended", len(s.st.waiters))
		}
		for k, v := range s.st.kv {
			if len(k) > opts.MaxKeyLen || len(v) > opts.MaxValueLen+20 {
				t.Fatalf("stored key %d bytes / value %d bytes over the limits", len(k), len(v))
			}
		}
	})
}

// addCaptureSeeds adds every client byte stream of the torch captures to
// f's seed corpus.
func addCaptureSeeds(f *testing.F) {
	files, _ := filepath.Glob("testdata/captures/*.jsonl")
	for _, file := range files {
		streams := map[int][]byte{}
		for _, ev := range loadCapture(f, file) {
			if ev.kind == "C>S" {
				streams[ev.conn] = append(streams[ev.conn], ev.data...)
			}
		}
		for _, s := range streams {
			f.Add(s)
		}
	}
}

// FuzzFrameLen holds frameLen and the parser together, as the ring engine
// needs: wherever frameLen calls a request complete, the parser, given
// exactly those bytes, either uses all of them or refuses them as
// malformed, and never runs out; wherever frameLen asks for more, the
// parser, given everything there is, runs out.
func FuzzFrameLen(f *testing.F) {
	addCaptureSeeds(f)
	f.Add(append(appendU32([]byte{0}, validationMagic), req(11, uint64(2), "/a", "1", "/b", "2")...))
	f.Add(req(4, []string{"/a", "/b"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		opts := ServerOptions{MaxValueLen: 64 << 10, MaxKeysPerRequest: 64, MaxRequestBytes: 4 << 10,
			Logger: slog.New(slog.DiscardHandler), NoEnvSecret: true, Addr: "unused"}
		opts.fill()
		s := &TCPServer{opts: opts, st: newServerState(&opts), log: opts.Logger}
		c := s.newConn(nil, io.Discard)
		src := &sliceSource{}
		c.rd.r = src
		c.dialect = DialectV1
		if len(data) >= 5 && data[0] == 0 && binary.LittleEndian.Uint32(data[1:]) == validationMagic {
			c.dialect, data = DialectV2, data[5:]
		}
		defer c.teardown()
		for len(data) > 0 {
			n, need := frameLen(c.dialect, &s.opts, data)
			if n == 0 {
				if need <= len(data) {
					t.Fatalf("frameLen wants %d bytes of %d and has them", need, len(data))
				}
				src.b = data
				if err := c.handleOne(); err != io.EOF && err != io.ErrUnexpectedEOF {
					t.Fatalf("frameLen: incomplete at %d bytes, but the parser says %v", len(data), err)
				}
				return
			}
			src.b = data[:n]
			err := c.handleOne()
			if isMalformed(err) {
				return
			}
			if err != nil || len(src.b) != 0 {
				t.Fatalf("frameLen: %d bytes, but the parser left %d and says %v", n, len(src.b), err)
			}
			data = data[n:]
		}
	})
}
