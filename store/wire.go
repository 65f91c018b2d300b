package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
)

// Dialect is a numbering of TCPStore query codes. The two are incompatible
// for every opcode (reference/tcpstore-protocol.md §3).
type Dialect int

const (
	// DialectV2 is the numbering of PyTorch 2.2 and later: the connection
	// starts with VALIDATE (and PING), and codes run VALIDATE=0 … LIST_KEYS=17.
	DialectV2 Dialect = iota
	// DialectV1 is the numbering of PyTorch 1.x and 2.0: no handshake,
	// SET=0 … DELETE_KEY=8, and no APPEND, MULTI_*, CANCEL_WAIT, queues or LIST_KEYS.
	DialectV1
)

// String returns "v2" or "v1".
func (d Dialect) String() string {
	switch d {
	case DialectV2:
		return "v2"
	case DialectV1:
		return "v1"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// op is a query kind, independent of its code in either dialect.
type op uint8

const (
	opInvalid op = iota
	opValidate
	opSet
	opCompareSet
	opGet
	opAdd
	opCheck
	opWait
	opNumKeys
	opWatchKey
	opDeleteKey
	opAppend
	opMultiGet
	opMultiSet
	opCancelWait
	opPing
	opQueuePush
	opQueuePop
	opQueueLen
	opListKeys
)

var opNames = [...]string{
	opInvalid: "INVALID", opValidate: "VALIDATE", opSet: "SET", opCompareSet: "COMPARE_SET",
	opGet: "GET", opAdd: "ADD", opCheck: "CHECK", opWait: "WAIT", opNumKeys: "GETNUMKEYS",
	opWatchKey: "WATCH_KEY", opDeleteKey: "DELETE_KEY", opAppend: "APPEND", opMultiGet: "MULTI_GET",
	opMultiSet: "MULTI_SET", opCancelWait: "CANCEL_WAIT", opPing: "PING", opQueuePush: "QUEUE_PUSH",
	opQueuePop: "QUEUE_POP", opQueueLen: "QUEUE_LEN", opListKeys: "LIST_KEYS",
}

func (o op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// v2Codes and v1Codes map a wire code to an op (index = code).
var (
	v2Codes = [...]op{opValidate, opSet, opCompareSet, opGet, opAdd, opCheck, opWait, opNumKeys,
		opDeleteKey, opAppend, opMultiGet, opMultiSet, opCancelWait, opPing, opQueuePush,
		opQueuePop, opQueueLen, opListKeys}
	v1Codes = [...]op{opSet, opCompareSet, opGet, opAdd, opCheck, opWait, opNumKeys, opWatchKey, opDeleteKey}
)

// decodeOp returns the op that code means in dialect d, or opInvalid.
func decodeOp(d Dialect, code byte) op {
	tab := v2Codes[:]
	if d == DialectV1 {
		tab = v1Codes[:]
	}
	if int(code) < len(tab) {
		return tab[code]
	}
	return opInvalid
}

// encodeOp returns the code of o in dialect d; ok is false when d lacks o.
func encodeOp(d Dialect, o op) (code byte, ok bool) {
	tab := v2Codes[:]
	if d == DialectV1 {
		tab = v1Codes[:]
	}
	for i, x := range tab {
		if x == o {
			return byte(i), true
		}
	}
	return 0, false
}

// Wire constants (reference/tcpstore-protocol.md §2.1, §3).
const (
	validationMagic uint32 = 0x3C85F7CE
	replyReady      byte   = 0 // CHECK
	replyNotReady   byte   = 1
	replyStopWait   byte   = 0 // WAIT
	replyWaitCancel byte   = 1 // CANCEL_WAIT

	// initKey is the raw key that wait_for_workers counts in.
	initKey = "init/"
	// keyPrefix is what a PyTorch client puts before every user key.
	keyPrefix = "/"
)

// Limits the server applies by default (those of PyTorch's libuv server).
const (
	// DefaultMaxKeyLen bounds a key's length in bytes.
	DefaultMaxKeyLen = 8 << 10
	// DefaultMaxValueLen bounds a value's length in bytes.
	DefaultMaxValueLen = 8 << 20
	// DefaultMaxKeysPerRequest bounds the key count of CHECK, WAIT,
	// MULTI_GET and MULTI_SET.
	DefaultMaxKeysPerRequest = 128 << 10
	// DefaultMaxRequestBytes bounds the bytes of one MULTI_SET request.
	DefaultMaxRequestBytes = 64 << 20
)

// errMalformed marks input that violates the protocol or a limit.
var errMalformed = errors.New("malformed request")

// reader reads protocol fields from a buffered stream, allocating only as
// data arrives, so a length field alone cannot make it allocate.
type reader struct {
	r byteSource
	// grow, when set, is asked before a field's buffer grows by a chunk
	// of n bytes of data not yet received; an error stops the read. The
	// goroutine engine counts request buffers against the memory budget
	// through it.
	grow func(n int) error
}

func (r *reader) u8() (byte, error) { return r.r.ReadByte() }

// fixed returns the next n bytes (n is at most 8, so never more than the
// buffer), consumed; the slice is valid until the next read.
func (r *reader) fixed(n int) ([]byte, error) {
	b, err := r.r.Peek(n)
	if err != nil {
		if len(b) > 0 && err == io.EOF {
			err = io.ErrUnexpectedEOF // what io.ReadFull says
		}
		return nil, err
	}
	_, _ = r.r.Discard(n)
	return b, nil
}

func (r *reader) u32() (uint32, error) {
	b, err := r.fixed(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (r *reader) u64() (uint64, error) {
	b, err := r.fixed(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// count reads a u64 count and checks it against limit.
func (r *reader) count(what string, limit int) (int, error) {
	n, err := r.u64()
	if err != nil {
		return 0, err
	}
	if n > uint64(limit) {
		return 0, fmt.Errorf("%w: %s count %d exceeds the limit %d", errMalformed, what, n, limit)
	}
	return int(n), nil
}

// bytes reads a u64 length and that many bytes; the length is checked
// against limit before anything is allocated, and the buffer grows with the
// data actually received.
func (r *reader) bytes(what string, limit int) ([]byte, error) {
	n, err := r.u64()
	if err != nil {
		return nil, err
	}
	if n > uint64(limit) {
		return nil, fmt.Errorf("%w: %s length %d exceeds the limit %d", errMalformed, what, n, limit)
	}
	const chunk = 64 << 10
	if n <= chunk {
		b := make([]byte, n)
		_, err := io.ReadFull(r.r, b)
		return b, err
	}
	b := make([]byte, 0, chunk)
	for uint64(len(b)) < n {
		m := min(n-uint64(len(b)), chunk)
		if r.grow != nil && uint64(r.r.Buffered()) < m {
			if err := r.grow(int(m)); err != nil {
				return nil, err
			}
		}
		b = append(b, make([]byte, m)...)
		if _, err := io.ReadFull(r.r, b[uint64(len(b))-m:]); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// appendBytes reads a u64 length and appends that many bytes to dst,
// returning the extended slice. As with bytes, the length is checked against
// limit first and dst grows at most one 64 KiB chunk ahead of the data
// received, so a server can reuse one scratch buffer per connection.
func (r *reader) appendBytes(dst []byte, what string, limit int) ([]byte, error) {
	n, err := r.u64()
	if err != nil {
		return nil, err
	}
	if n > uint64(limit) {
		return nil, fmt.Errorf("%w: %s length %d exceeds the limit %d", errMalformed, what, n, limit)
	}
	if n <= uint64(r.r.Buffered()) { // already received: one copy
		b, _ := r.r.Peek(int(n))
		dst = append(dst, b...)
		_, _ = r.r.Discard(int(n))
		return dst, nil
	}
	const chunk = 64 << 10
	for n > 0 {
		m := int(min(n, chunk))
		if r.grow != nil && r.r.Buffered() < m {
			if err := r.grow(m); err != nil {
				return nil, err
			}
		}
		start := len(dst)
		dst = slices.Grow(dst, m)[:start+m]
		if _, err := io.ReadFull(r.r, dst[start:]); err != nil {
			return nil, err
		}
		n -= uint64(m)
	}
	return dst, nil
}

// appendU64 and friends encode fields.
func appendU64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }
func appendI64(b []byte, v int64) []byte  { return binary.LittleEndian.AppendUint64(b, uint64(v)) }
func appendU32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }
func appendStr[S string | []byte](b []byte, s S) []byte {
	return append(appendU64(b, uint64(len(s))), s...)
}

// appendKeys encodes the key list of CHECK, WAIT and MULTI_GET: a count,
// then each key.
func appendKeys(b []byte, keys []string) []byte {
	b = appendU64(b, uint64(len(keys)))
	for _, k := range keys {
		b = appendStr(b, k)
	}
	return b
}

// parseStoll parses a decimal integer the way C++ std::stoll does: leading
// white space and a sign are accepted, trailing bytes after the digits are
// ignored, and no digits or an overflow is an error.
func parseStoll(b []byte) (int64, error) {
	i := 0
	for i < len(b) && (b[i] == ' ' || (b[i] >= '\t' && b[i] <= '\r')) {
		i++
	}
	neg := false
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		neg = b[i] == '-'
		i++
	}
	start := i
	var v uint64
	limit := uint64(math.MaxInt64)
	if neg {
		limit++
	}
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		d := uint64(b[i] - '0')
		if v > (limit-d)/10 {
			return 0, fmt.Errorf("value %q is out of the int64 range", b)
		}
		v = v*10 + d
	}
	if i == start {
		return 0, fmt.Errorf("value %q is not a decimal integer", b)
	}
	if neg {
		return int64(-v), nil //nolint:gosec // -2^63 wraps to itself, as intended
	}
	return int64(v), nil
}
