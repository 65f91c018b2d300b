package store

import (
	"bufio"
	"bytes"
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
	f.Add(appendU32([]byte{0}, validationMagic))
	f.Add(append(appendU32([]byte{0}, validationMagic), req(cWait, []string{"/a", "/b"})...))
	f.Add(req(1, "a", "b", "c"))
	f.Fuzz(func(t *testing.T, data []byte) {
		opts := ServerOptions{MaxValueLen: 64 << 10, MaxKeysPerRequest: 1024, MaxRequestBytes: 1 << 20,
			Logger: slog.New(slog.DiscardHandler), NoEnvSecret: true, Addr: "unused"}
		opts.fill()
		s := &TCPServer{opts: opts, st: newServerState(), log: opts.Logger}
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
