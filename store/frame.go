package store

import (
	"encoding/binary"
	"errors"
	"io"
)

// byteSource is what the protocol reader reads from: a *bufio.Reader over a
// socket, or a sliceSource over bytes already received.
type byteSource interface {
	io.Reader
	io.ByteReader
	Peek(n int) ([]byte, error)
	Discard(n int) (int, error)
	Buffered() int
}

// sliceSource is a byteSource over one slice: the requests that frameLen
// found complete. It never blocks, and it copies nothing it need not.
type sliceSource struct{ b []byte }

func (s *sliceSource) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

func (s *sliceSource) ReadByte() (byte, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c, nil
}

func (s *sliceSource) Peek(n int) ([]byte, error) {
	if n > len(s.b) {
		return s.b, io.EOF
	}
	return s.b[:n], nil
}

func (s *sliceSource) Discard(n int) (int, error) {
	if n > len(s.b) {
		n = len(s.b)
		s.b = s.b[n:]
		return n, io.EOF
	}
	s.b = s.b[n:]
	return n, nil
}

func (s *sliceSource) Buffered() int { return len(s.b) }

// errFrameMismatch reports that the parser and frameLen disagreed about
// where a request ends: a bug, which closes the connection.
var errFrameMismatch = errors.New("store server: internal error: request framing disagrees with the parser")

// frameLen returns the length of the request at the start of b, or n == 0
// when b holds only part of it; need is then the length b must reach before
// the answer can change. It reads only length fields, so an event loop can
// wait for a whole request and then run the ordinary parser over bytes in
// memory, which never blocks.
//
// A length or count over its limit ends the frame right after that field:
// the parser, reading the same field, fails with its usual error, so a huge
// length is refused at once rather than waited for. Every limit check here
// mirrors one in the handlers (server_ops.go); FuzzFrameLen holds the two
// together.
func frameLen(d Dialect, o *ServerOptions, b []byte) (n, need int) {
	if len(b) == 0 {
		return 0, 1
	}
	p := 1
	// short: ran out of bytes, and need says how many are wanted. A field
	// over its limit stops the scan without short: the frame ends at p.
	short := false
	fixed := func(k int) bool {
		if len(b)-p < k {
			short, need = true, p+k
			return false
		}
		p += k
		return true
	}
	// str skips a u64 length and that many bytes, returning the length.
	str := func(limit int) (int, bool) {
		if !fixed(8) {
			return 0, false
		}
		l := binary.LittleEndian.Uint64(b[p-8:])
		if l > uint64(limit) {
			return 0, false
		}
		if !fixed(int(l)) {
			return 0, false
		}
		return int(l), true
	}
	count := func() (int, bool) {
		if !fixed(8) {
			return 0, false
		}
		c := binary.LittleEndian.Uint64(b[p-8:])
		if c > uint64(o.MaxKeysPerRequest) {
			return 0, false
		}
		return int(c), true
	}
	key := func() bool { _, ok := str(o.MaxKeyLen); return ok }
	value := func() bool { _, ok := str(o.MaxValueLen); return ok }

	switch decodeOp(d, b[0]) {
	case opSet, opAppend, opQueuePush:
		_ = key() && value()
	case opCompareSet:
		_ = key() && value() && value()
	case opGet, opDeleteKey, opQueuePop, opQueueLen:
		key()
	case opAdd:
		_ = key() && fixed(8)
	case opPing:
		fixed(4)
	case opCheck, opWait, opMultiGet: // keysB
		c, ok := count()
		total := 0
		for i := 0; ok && i < c; i++ {
			var l int
			if l, ok = str(o.MaxKeyLen); ok {
				total += l + 8
				ok = total <= o.MaxRequestBytes
			}
		}
	case opMultiSet:
		c, ok := count()
		total := 0
		for i := 0; ok && i < c; i++ {
			var kl, vl int
			if kl, ok = str(o.MaxKeyLen); ok {
				if vl, ok = str(o.MaxValueLen); ok {
					total += kl + vl + 16
					ok = total <= o.MaxRequestBytes
				}
			}
		}
	}
	// NUM_KEYS, CANCEL_WAIT and LIST_KEYS are the code alone; an invalid
	// code is one byte the parser refuses.
	if short {
		return 0, need
	}
	return p, 0
}
