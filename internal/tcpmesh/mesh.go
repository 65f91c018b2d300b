// Package tcpmesh is a coll.Transport over a full mesh of TCP connections,
// one per pair of ranks, set up through a store.
//
// Rendezvous: every rank listens on an ephemeral port and publishes
// "host:port" under "tcpmesh/addr/<rank>"; rank 0 publishes a random
// session id. Each rank dials every lower rank and accepts every higher
// one; the dialer's hello carries the session id, its rank and the world
// size, so connections from another job or group are refused. Both sides
// give up at the connect deadline.
//
// Wire: every message is one frame, a 24-byte header (kind, source rank,
// tag, payload length; little-endian) and the payload. One reader
// goroutine per connection matches frames with posted receives by (source,
// tag), in order, and reads the payload straight into the receive's buffer;
// a frame nobody waits for yet is read into a pooled buffer and copied when
// its receive is posted. Writers take the connection's lock for one whole
// frame, so concurrent ops never interleave on the wire.
//
// Shared memory: with Transport "auto" (the default) or "shm", two ranks
// whose hosts have the same identity (host name and kernel boot id) move
// their frames through a pair of rings in an unlinked /dev/shm file
// (internal/shm) instead of the socket; the frames and the matching are
// the same. The TCP connection stays open as the liveness channel: its
// end (the peer died, aborted or closed) marks the rings dead, and a ring
// reader that then finds nothing left fails as a broken connection would.
// The pair file's name travels over the pair's own connection right after
// the handshake (so it is scoped to this session), and the creator unlinks
// it as soon as the peer has mapped it (or failed to), so nothing leaks if
// a process dies. A receiver waiting on a shared-memory peer polls the ring
// itself for a few microseconds before it parks, which saves the two
// goroutine wake-ups of a small message.
//
// Failure: when a connection fails without the peer's goodbye (the peer
// died or aborted), every posted receive and every later call fails with a
// *PeerError naming that rank: a collective over a broken mesh cannot
// complete, and failing fast beats waiting for the timeout. A peer that
// closes in order says goodbye first; then only receives from that peer
// fail (it may close while slower ranks still finish with the others).
package tcpmesh

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/shm"
	"github.com/gocoll/gocoll/store"
)

// Frame kinds.
const (
	kindData       = 1
	kindProbe      = 2 // tag: probe id; no payload
	kindProbeReply = 3 // tag: probe id; payload: 8-byte value
	kindBye        = 4 // the peer closes in order; no payload
	kindFail       = 5 // tag: an op the peer gave up; payload: 1 byte code, then the reason
	maxReason      = 4 << 10
	hdrLen         = 24
	helloMagic     = 0x67636f6c // "gcol"
	smallWrite     = 32 << 10   // payloads up to this are copied next to the header: one syscall
)

// Errors.
var (
	// ErrClosed is the cause of failures after Close.
	ErrClosed = errors.New("tcpmesh: closed")
	// ErrPeerClosed is the cause of a receive from a peer that closed in
	// order before sending the message.
	ErrPeerClosed = errors.New("tcpmesh: peer closed")
	// ErrSize is a receive whose buffer does not match the message's length.
	ErrSize = errors.New("tcpmesh: message size mismatch")
)

// SizeError is a receive that a message of another length matched: the
// ranks disagree on the size of the op's buffers. It wraps ErrSize.
type SizeError struct {
	Rank      int // the sender
	Tag       uint64
	Got, Want int // the message's length, the receive's
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("%v: %d bytes from rank %d, tag %d, for a %d-byte receive", ErrSize, e.Got, e.Rank, e.Tag, e.Want)
}

func (e *SizeError) Unwrap() error { return ErrSize }

// Codes of FailTag.
const (
	// CodeOther is any reason not listed.
	CodeOther = 0
	// CodeSize is a size mismatch between the ranks' buffers.
	CodeSize = 1
)

// RemoteOpError fails the receives of an op that a peer gave up (FailTag):
// the peer will not send the rest, so waiting would only hang.
type RemoteOpError struct {
	Rank   int    // the rank that gave up
	Tag    uint64 // the op's tag
	Code   byte   // CodeSize or CodeOther
	Reason string // the peer's error text
}

func (e *RemoteOpError) Error() string {
	return fmt.Sprintf("rank %d gave up this op (tag %d): %s", e.Rank, e.Tag, e.Reason)
}

// PeerError is the failure of the connection to Rank: the peer died,
// closed its end, or broke the protocol.
type PeerError struct {
	Rank int
	Err  error
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("tcpmesh: connection to rank %d failed: %v", e.Rank, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// Config sets up a mesh.
type Config struct {
	// Rank and Size place this process in the group.
	Rank, Size int
	// Store is where addresses are exchanged; it should be prefixed for the
	// group, as the dispatcher's is.
	Store store.Store
	// Host is the address peers dial this rank at (default 127.0.0.1).
	Host string
	// ConnectTimeout bounds the whole setup, on both sides (default 60 s).
	ConnectTimeout time.Duration
	// MaxMessage bounds the length a peer may announce for a message that
	// has no posted receive yet (default 4 GiB), so a bad frame cannot
	// exhaust memory.
	MaxMessage int64
	// Pool recycles buffers of unexpected messages; nil means a private one.
	Pool *coll.Pool
	// SocketBuffer, when > 0, sets the kernel send and receive buffer sizes
	// of every connection (SO_SNDBUF, SO_RCVBUF); 0 leaves the kernel's
	// autotuning alone.
	SocketBuffer int
	// OnProbe answers a peer's Probe (e.g. with the number of collectives
	// this rank has issued). Nil answers 0.
	OnProbe func() uint64
	// Transport picks the data path between ranks of one host: "auto" (or
	// ""): shared memory where both ends agree and it can be set up, else
	// TCP; "tcp": always TCP; "shm": shared memory to every peer, failing
	// Connect when a peer is on another host or mapping fails.
	Transport string
	// ShmRingBytes is the capacity of each direction of a shared-memory
	// pair (a power of two; default 4 MiB).
	ShmRingBytes int
	// PollSpin is how long a receive waiting on a shared-memory peer polls
	// the ring itself before it parks (negative: never). The default is
	// 50 µs, or never when more ranks share this host than it has CPUs:
	// there, a rank that spins takes the core a peer needs to make progress.
	PollSpin time.Duration
}

// Transport values of Config.
const (
	TransportAuto = "auto"
	TransportTCP  = "tcp"
	TransportShm  = "shm"
)

type key struct {
	peer int
	tag  uint64
}

// Mesh is a coll.Transport over TCP. Its methods are safe for concurrent
// use.
type Mesh struct {
	cfg   Config
	rank  int
	size  int
	peers []*peer
	pool  *coll.Pool

	mu         sync.Mutex
	posted     map[key]reqList // lists by value: no allocation per tag
	anyPosted  map[uint64]reqList
	unexpected map[key]msgList
	arrivals   uint64 // arrival counter, orders unexpected messages for anysource
	broken     error
	gone       []error                   // per peer: closed in order
	failed     map[uint64]*RemoteOpError // tags that a peer gave up
	shmPeers   int                       // peers reached through shared memory
	probes     map[uint64]chan uint64
	probeID    atomic.Uint64

	readers sync.WaitGroup
	reqPool sync.Pool
	msgPool sync.Pool
}

var _ coll.Transport = (*Mesh)(nil)

type peer struct {
	rank int
	conn *net.TCPConn
	br   *bufio.Reader
	r    io.Reader // where frames are read from: br, or the shared ring

	// Shared memory, nil for a TCP peer. rmu is the consumer's role on
	// pair.In: the reader goroutine or a polling receive holds it while it
	// reads frames; bye, rdone and unmapped are guarded by it (unmapped
	// also by wmu, for the writers).
	pair     *shm.Pair
	mapMu    sync.RWMutex // read-held by polling receives; Close takes it before unmapping
	rmu      sync.Mutex
	bye      bool
	rdone    bool
	unmapped bool // set under mapMu, wmu and rmu: any of them suffices to read it

	rhdr [hdrLen]byte // the reader's header buffer (a field: no allocation per frame)
	phdr [hdrLen]byte // poll's peeked header

	wmu  sync.Mutex
	hdr  [hdrLen]byte
	wbuf []byte
	bufs net.Buffers
	dl   bool // a write deadline is set
}

// Connect builds the mesh. It blocks until every connection is up or the
// connect timeout (or ctx) expires.
func Connect(ctx context.Context, cfg Config) (*Mesh, error) {
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("tcpmesh: rank %d out of range for size %d", cfg.Rank, cfg.Size)
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 60 * time.Second
	}
	if cfg.MaxMessage <= 0 {
		cfg.MaxMessage = 4 << 30
	}
	switch cfg.Transport {
	case "":
		cfg.Transport = TransportAuto
	case TransportAuto, TransportTCP, TransportShm:
	default:
		return nil, fmt.Errorf("tcpmesh: transport %q: want %q, %q or %q", cfg.Transport, TransportAuto, TransportTCP, TransportShm)
	}
	if cfg.ShmRingBytes <= 0 {
		cfg.ShmRingBytes = shm.DefaultRingBytes
	}
	if cfg.ShmRingBytes&(cfg.ShmRingBytes-1) != 0 {
		return nil, fmt.Errorf("tcpmesh: ShmRingBytes %d is not a power of two", cfg.ShmRingBytes)
	}
	m := &Mesh{
		cfg: cfg, rank: cfg.Rank, size: cfg.Size, pool: cfg.Pool,
		peers:      make([]*peer, cfg.Size),
		posted:     map[key]reqList{},
		anyPosted:  map[uint64]reqList{},
		unexpected: map[key]msgList{},
		probes:     map[uint64]chan uint64{},
		gone:       make([]error, cfg.Size),
		failed:     map[uint64]*RemoteOpError{},
	}
	if m.pool == nil {
		m.pool = &coll.Pool{}
	}
	m.reqPool.New = func() any { return &Req{m: m, done: make(chan struct{}, 1)} }
	m.msgPool.New = func() any { return &msg{} }
	if cfg.Size == 1 {
		return m, nil
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	err := m.rendezvous(ctx)
	if err == nil && cfg.Transport != TransportTCP {
		err = m.setupShm(ctx)
	}
	if err != nil {
		for _, p := range m.peers {
			if p != nil {
				_ = p.conn.Close()
				if p.pair != nil {
					_ = p.pair.Unmap()
				}
			}
		}
		return nil, err
	}
	for _, p := range m.peers {
		if p != nil && p.pair != nil {
			m.shmPeers++
		}
	}
	local := 1 + m.shmPeers
	oversubscribed := local > runtime.NumCPU()
	if m.cfg.PollSpin == 0 {
		m.cfg.PollSpin = 50 * time.Microsecond
		if oversubscribed {
			m.cfg.PollSpin = -1
		}
	}
	for _, p := range m.peers {
		if p == nil {
			continue
		}
		if p.pair != nil {
			if oversubscribed {
				p.pair.In.Spin, p.pair.Out.Spin = 0, 0 // sleep at once: yield the core
			}
			m.readers.Add(2)
			go m.shmReadLoop(p)
			go m.watch(p)
		} else {
			m.readers.Add(1)
			go m.readLoop(p)
		}
	}
	return m, nil
}

// OpPoll is an op's announcement, made with BeginOp, that its goroutine
// will read its shared-memory messages itself (Req.Wait polls): while it
// holds, peers do not wake this rank's ring readers, which would
// otherwise race the op's goroutine for the frames and cost a thread
// wake-up per message. Wait and Send release it while they block.
type OpPoll struct {
	m    *Mesh
	held bool
}

type opPollKey struct{}

// BeginOp makes the announcement for an op run on this goroutine with ctx
// (under which the op must then call Send and Wait) and returns that
// context. op is the caller's storage, so the announcement allocates only
// the context. It does nothing when polling is off or no peer shares
// memory.
func (m *Mesh) BeginOp(ctx context.Context, op *OpPoll) context.Context {
	if m.cfg.PollSpin < 0 || m.shmPeers == 0 {
		return ctx
	}
	op.m = m
	op.acquire()
	return context.WithValue(ctx, opPollKey{}, op)
}

// EndOp ends BeginOp's announcement.
func (m *Mesh) EndOp(op *OpPoll) {
	if op.m != nil && op.held {
		op.release()
	}
}

func (op *OpPoll) acquire() {
	op.held = true
	for _, p := range op.m.peers {
		if p != nil && p.pair != nil {
			p.mapMu.RLock()
			if !p.unmapped {
				p.pair.In.BeginPoll()
			}
			p.mapMu.RUnlock()
		}
	}
}

func (op *OpPoll) release() {
	op.held = false
	for _, p := range op.m.peers {
		if p != nil && p.pair != nil {
			p.mapMu.RLock()
			if !p.unmapped {
				p.pair.In.EndPoll()
			}
			p.mapMu.RUnlock()
		}
	}
}

// relaxOp releases the op's announcement, if ctx carries a held one, for
// as long as the caller blocks; it returns the op to re-acquire, or nil.
func relaxOp(ctx context.Context) *OpPoll {
	if op, ok := ctx.Value(opPollKey{}).(*OpPoll); ok && op.held {
		op.release()
		return op
	}
	return nil
}

// Blocking releases the op's announcement that ctx carries (BeginOp), if
// any, while the caller blocks on something other than this mesh's Wait
// and Send (which release it themselves); call the returned function when
// it is done blocking.
func Blocking(ctx context.Context) (resume func()) {
	if op := relaxOp(ctx); op != nil {
		return op.acquire
	}
	return func() {}
}

// PollSpin is the polling time in effect (Config.PollSpin, default filled
// in); negative means receives park at once.
func (m *Mesh) PollSpin() time.Duration { return m.cfg.PollSpin }

// UsesShm reports whether frames to and from peer go through shared memory.
func (m *Mesh) UsesShm(peer int) bool {
	return peer >= 0 && peer < m.size && m.peers[peer] != nil && m.peers[peer].pair != nil
}

// setupShm offers shared memory to every peer over its connection, in
// parallel, and maps the pair files where both ends agree.
func (m *Mesh) setupShm(ctx context.Context) error {
	id, err := shm.HostID()
	if err != nil {
		if m.cfg.Transport == TransportShm {
			return err
		}
		id = "" // offer nothing; the peers fall back to TCP
	}
	errs := make([]error, m.size)
	var wg sync.WaitGroup
	for _, p := range m.peers {
		if p != nil {
			wg.Go(func() { errs[p.rank] = m.offerShm(ctx, p, id) })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// offerShm runs the shared-memory negotiation with one peer: both send
// (want, host id); if both want it and the ids match, the lower rank
// creates the pair file and sends its path, the upper rank maps it and
// acknowledges, and the lower rank unlinks it.
func (m *Mesh) offerShm(ctx context.Context, p *peer, id string) (err error) {
	c := p.conn
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	fail := func(format string, args ...any) error {
		return fmt.Errorf("tcpmesh: rank %d, shared memory with rank %d: "+format, append([]any{m.rank, p.rank}, args...)...)
	}
	if err := writeStr(c, id); err != nil {
		return fail("%w", err)
	}
	theirs, err := readStr(c)
	if err != nil {
		return fail("%w", err)
	}
	if id == "" || theirs == "" || id != theirs {
		if m.cfg.Transport == TransportShm {
			return fail("not on the same host (%q, %q)", id, theirs)
		}
		return nil
	}
	if m.rank < p.rank {
		pair, path, cerr := shm.Create(fmt.Sprintf("gocoll-%d-%d-%d-", os.Getpid(), m.rank, p.rank), m.cfg.ShmRingBytes)
		if cerr != nil {
			path = ""
		}
		if err := writeStr(c, path); err != nil {
			if pair != nil {
				_ = shm.Unlink(path)
				_ = pair.Unmap()
			}
			return fail("%w", err)
		}
		if cerr != nil {
			if m.cfg.Transport == TransportShm {
				return fail("%w", cerr)
			}
			return nil
		}
		var ack [1]byte
		_, rerr := io.ReadFull(c, ack[:])
		_ = shm.Unlink(path) // mapped by both, or given up: the name is no longer needed
		if rerr != nil || ack[0] != 1 {
			_ = pair.Unmap()
			if rerr != nil {
				return fail("%w", rerr)
			}
			if m.cfg.Transport == TransportShm {
				return fail("rank %d could not map the pair file", p.rank)
			}
			return nil
		}
		p.pair = pair
	} else {
		path, err := readStr(c)
		if err != nil {
			return fail("%w", err)
		}
		if path == "" {
			if m.cfg.Transport == TransportShm {
				return fail("rank %d could not create the pair file", p.rank)
			}
			return nil
		}
		pair, oerr := shm.Open(path)
		ack := []byte{1}
		if oerr != nil {
			ack[0] = 0
		}
		if _, err := c.Write(ack); err != nil {
			if pair != nil {
				_ = pair.Unmap()
			}
			return fail("%w", err)
		}
		if oerr != nil {
			if m.cfg.Transport == TransportShm {
				return fail("%w", oerr)
			}
			return nil
		}
		p.pair = pair
	}
	p.r = p.pair.In
	return nil
}

func writeStr(c net.Conn, s string) error {
	b := make([]byte, 2+len(s))
	binary.LittleEndian.PutUint16(b, uint16(len(s)))
	copy(b[2:], s)
	_, err := c.Write(b)
	return err
}

func readStr(c net.Conn) (string, error) {
	var n [2]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return "", err
	}
	b := make([]byte, binary.LittleEndian.Uint16(n[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		return "", err
	}
	return string(b), nil
}

func (m *Mesh) rendezvous(ctx context.Context) error {
	st := m.cfg.Store
	var session uint64
	if m.rank == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("tcpmesh: session id: %w", err)
		}
		session = binary.LittleEndian.Uint64(b[:])
		if err := st.Set(ctx, "tcpmesh/session", []byte(strconv.FormatUint(session, 10))); err != nil {
			return fmt.Errorf("tcpmesh: publishing session: %w", err)
		}
	} else {
		v, err := st.Get(ctx, "tcpmesh/session")
		if err != nil {
			return fmt.Errorf("tcpmesh: rank %d waiting for rank 0's session: %w", m.rank, err)
		}
		if session, err = strconv.ParseUint(string(v), 10, 64); err != nil {
			return fmt.Errorf("tcpmesh: bad session %q: %w", v, err)
		}
	}
	var ln *net.TCPListener
	if m.rank < m.size-1 {
		l, err := net.Listen("tcp", net.JoinHostPort(m.cfg.Host, "0"))
		if err != nil {
			return fmt.Errorf("tcpmesh: listen on %s: %w", m.cfg.Host, err)
		}
		ln = l.(*net.TCPListener)
		defer ln.Close()
		if err := st.Set(ctx, "tcpmesh/addr/"+strconv.Itoa(m.rank), []byte(ln.Addr().String())); err != nil {
			return fmt.Errorf("tcpmesh: publishing address: %w", err)
		}
	}
	errc := make(chan error, 2)
	go func() { errc <- m.acceptAll(ctx, ln, session) }()
	go func() { errc <- m.dialAll(ctx, session) }()
	var first error
	for range 2 {
		if err := <-errc; err != nil && first == nil {
			first = err
			if ln != nil {
				_ = ln.Close() // unblock Accept
			}
		}
	}
	return first
}

func (m *Mesh) newPeer(rank int, c *net.TCPConn) *peer {
	_ = c.SetNoDelay(true)
	if m.cfg.SocketBuffer > 0 {
		_ = c.SetReadBuffer(m.cfg.SocketBuffer)
		_ = c.SetWriteBuffer(m.cfg.SocketBuffer)
	}
	br := bufio.NewReaderSize(c, 256<<10)
	return &peer{rank: rank, conn: c, br: br, r: br, wbuf: make([]byte, hdrLen+smallWrite)}
}

func (m *Mesh) acceptAll(ctx context.Context, ln *net.TCPListener, session uint64) error {
	want := m.size - 1 - m.rank
	if want == 0 {
		return nil
	}
	dl, _ := ctx.Deadline()
	_ = ln.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = ln.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	got := 0
	for got < want {
		c, err := ln.AcceptTCP()
		if err != nil {
			missing := []int{}
			for r := m.rank + 1; r < m.size; r++ {
				if m.peers[r] == nil {
					missing = append(missing, r)
				}
			}
			return fmt.Errorf("tcpmesh: rank %d accepting connections: ranks %v did not connect: %w", m.rank, missing, err)
		}
		_ = c.SetDeadline(dl)
		var h [20]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			_ = c.Close()
			continue
		}
		magic := binary.LittleEndian.Uint32(h[0:])
		sess := binary.LittleEndian.Uint64(h[4:])
		from := int(binary.LittleEndian.Uint32(h[12:]))
		size := int(binary.LittleEndian.Uint32(h[16:]))
		if magic != helloMagic || sess != session || size != m.size || from <= m.rank || from >= m.size || m.peers[from] != nil {
			_ = c.Close() // a stranger, a stale job, or a duplicate
			continue
		}
		var ack [8]byte
		binary.LittleEndian.PutUint32(ack[0:], helloMagic)
		binary.LittleEndian.PutUint32(ack[4:], uint32(m.rank))
		if _, err := c.Write(ack[:]); err != nil {
			_ = c.Close()
			continue
		}
		_ = c.SetDeadline(time.Time{})
		m.peers[from] = m.newPeer(from, c)
		got++
	}
	return nil
}

func (m *Mesh) dialAll(ctx context.Context, session uint64) error {
	for r := 0; r < m.rank; r++ {
		v, err := m.cfg.Store.Get(ctx, "tcpmesh/addr/"+strconv.Itoa(r))
		if err != nil {
			return fmt.Errorf("tcpmesh: rank %d waiting for rank %d's address: %w", m.rank, r, err)
		}
		c, err := m.dial(ctx, string(v), r, session)
		if err != nil {
			return err
		}
		m.peers[r] = m.newPeer(r, c)
	}
	return nil
}

// dial connects to rank r, retrying refused connections with backoff until
// ctx expires.
func (m *Mesh) dial(ctx context.Context, addr string, r int, session uint64) (*net.TCPConn, error) {
	backoff := 10 * time.Millisecond
	var d net.Dialer
	for {
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c := nc.(*net.TCPConn)
			if err = m.hello(ctx, c, r, session); err == nil {
				return c, nil
			}
			_ = c.Close()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("tcpmesh: rank %d connecting to rank %d at %s: %w (last error: %v)", m.rank, r, addr, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (m *Mesh) hello(ctx context.Context, c *net.TCPConn, r int, session uint64) error {
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	var h [20]byte
	binary.LittleEndian.PutUint32(h[0:], helloMagic)
	binary.LittleEndian.PutUint64(h[4:], session)
	binary.LittleEndian.PutUint32(h[12:], uint32(m.rank))
	binary.LittleEndian.PutUint32(h[16:], uint32(m.size))
	if _, err := c.Write(h[:]); err != nil {
		return err
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return err
	}
	if binary.LittleEndian.Uint32(ack[0:]) != helloMagic || int(binary.LittleEndian.Uint32(ack[4:])) != r {
		return fmt.Errorf("tcpmesh: bad handshake reply from rank %d", r)
	}
	return c.SetDeadline(time.Time{})
}

// Rank implements coll.Transport.
func (m *Mesh) Rank() int { return m.rank }

// Size implements coll.Transport.
func (m *Mesh) Size() int { return m.size }

// Err returns the error that broke the mesh, or nil.
func (m *Mesh) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.broken
}

// Send implements coll.Transport.
func (m *Mesh) Send(ctx context.Context, peer int, tag uint64, buf []byte) error {
	return m.write(ctx, peer, kindData, tag, buf)
}

func (m *Mesh) write(ctx context.Context, to int, kind byte, tag uint64, buf []byte) error {
	if to == m.rank || to < 0 || to >= m.size {
		return fmt.Errorf("tcpmesh: send to invalid rank %d", to)
	}
	if err := m.Err(); err != nil {
		return err
	}
	p := m.peers[to]
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if p.pair != nil {
		return m.writeShm(ctx, p, kind, tag, buf)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = p.conn.SetWriteDeadline(dl)
		p.dl = true
	} else if p.dl {
		_ = p.conn.SetWriteDeadline(time.Time{})
		p.dl = false
	}
	h := p.hdr[:]
	h[0] = kind
	binary.LittleEndian.PutUint32(h[4:], uint32(m.rank))
	binary.LittleEndian.PutUint64(h[8:], tag)
	binary.LittleEndian.PutUint64(h[16:], uint64(len(buf)))
	var err error
	if len(buf) <= smallWrite {
		n := copy(p.wbuf, h)
		n += copy(p.wbuf[n:], buf)
		_, err = p.conn.Write(p.wbuf[:n])
	} else {
		p.bufs = append(p.bufs[:0], h, buf)
		_, err = p.bufs.WriteTo(p.conn)
	}
	if err != nil {
		// A partial frame leaves the stream unusable.
		perr := &PeerError{Rank: to, Err: err}
		m.fail(perr)
		_ = p.conn.Close()
		return perr
	}
	return nil
}

// writeShm writes one frame into the peer's ring; p.wmu is held.
func (m *Mesh) writeShm(ctx context.Context, p *peer, kind byte, tag uint64, buf []byte) error {
	if p.unmapped {
		return m.errOr(ErrClosed)
	}
	h := p.hdr[:]
	h[0] = kind
	binary.LittleEndian.PutUint32(h[4:], uint32(m.rank))
	binary.LittleEndian.PutUint64(h[8:], tag)
	binary.LittleEndian.PutUint64(h[16:], uint64(len(buf)))
	pad := framePad(len(buf))
	if !p.pair.Out.Fits(hdrLen + len(buf) + pad) {
		// The write will wait for the peer to make room: let this rank's
		// reader take incoming frames meanwhile.
		if op := relaxOp(ctx); op != nil {
			defer op.acquire()
		}
	}
	if err := p.pair.Out.Write(ctx, h, buf, pad); err != nil {
		if errors.Is(err, shm.ErrClosed) {
			return m.errOr(ErrClosed)
		}
		perr := &PeerError{Rank: p.rank, Err: err}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			// A frame may be half written: the stream is unusable, as a
			// TCP write that timed out leaves it.
			perr.Err = fmt.Errorf("write timed out: %w", err)
		}
		m.fail(perr)
		return perr
	}
	return nil
}

// framePad is the padding after a payload of n bytes in a shared ring: it
// keeps every frame, and so every payload (after the 24-byte header), at a
// multiple of 8 bytes in the ring, so an element never straddles the
// ring's end and combining in place sees aligned elements.
func framePad(n int) int { return -n & 7 }

// errOr returns the error that broke the mesh, or err.
func (m *Mesh) errOr(err error) error {
	if e := m.Err(); e != nil {
		return e
	}
	return err
}

// Probe asks peer for its OnProbe value, bounded by ctx.
func (m *Mesh) Probe(ctx context.Context, to int) (uint64, error) {
	id := m.probeID.Add(1)
	ch := make(chan uint64, 1)
	m.mu.Lock()
	m.probes[id] = ch
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.probes, id)
		m.mu.Unlock()
	}()
	if err := m.write(ctx, to, kindProbe, id, nil); err != nil {
		return 0, err
	}
	select {
	case v := <-ch:
		return v, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("tcpmesh: probe of rank %d: %w", to, ctx.Err())
	}
}

func (m *Mesh) readLoop(p *peer) {
	defer m.readers.Done()
	for {
		if err := m.readFrame(p); err != nil {
			if !p.bye || err != io.EOF {
				m.fail(&PeerError{Rank: p.rank, Err: err})
			}
			return
		}
	}
}

// shmReadLoop is the reader of a shared-memory peer: it waits for bytes
// without the consumer role (so a polling receive can take it meanwhile),
// then reads every whole frame there is.
func (m *Mesh) shmReadLoop(p *peer) {
	defer m.readers.Done()
	in := p.pair.In
	for {
		werr := in.WaitData()
		p.rmu.Lock()
		if p.rdone {
			p.rmu.Unlock()
			return
		}
		if werr != nil {
			m.endShm(p, werr)
			p.rmu.Unlock()
			return
		}
		m.drainLocked(p)
		done := p.rdone
		p.rmu.Unlock()
		if done {
			return
		}
	}
}

// drainLocked reads frames while bytes are buffered; p.rmu is held.
func (m *Mesh) drainLocked(p *peer) {
	for !p.rdone && !p.unmapped && p.pair.In.Buffered() > 0 {
		if err := m.readFrame(p); err != nil {
			m.endShm(p, err)
		}
	}
}

// endShm stops reading a shared-memory peer after err; p.rmu is held. The
// end of the ring after the peer's goodbye is orderly; anything else
// breaks the mesh, as a failed connection does.
func (m *Mesh) endShm(p *peer, err error) {
	p.rdone = true
	if errors.Is(err, shm.ErrClosed) || (p.bye && errors.Is(err, shm.ErrPeerDead)) {
		return
	}
	if errors.Is(err, shm.ErrPeerDead) {
		err = fmt.Errorf("connection closed: %w", err)
	}
	m.fail(&PeerError{Rank: p.rank, Err: err})
}

// watch holds the TCP connection of a shared-memory peer open as the
// liveness channel: nothing is sent on it after the setup, so its end
// means the peer is gone (it died, aborted or closed).
func (m *Mesh) watch(p *peer) {
	defer m.readers.Done()
	var b [64]byte
	for {
		if _, err := p.conn.Read(b[:]); err != nil {
			p.pair.MarkDead()
			return
		}
	}
}

// poll reads the whole frames a shared-memory peer has sent, on the
// caller's goroutine, if no one else is reading them now. It never waits
// for bytes: a frame not wholly there yet, or a reader that holds the
// ring, is left to the reader goroutine, which poll wakes (the producer
// does not while someone polls; see shm.Ring.BeginPoll).
func (m *Mesh) poll(p *peer) {
	in := p.pair.In
	if !p.rmu.TryLock() {
		in.WakeReader()
		return
	}
	for !p.rdone && !p.unmapped {
		h := p.phdr[:]
		if !in.Peek(h) {
			break
		}
		n := binary.LittleEndian.Uint64(h[16:])
		if n > uint64(in.Cap()) {
			break // larger than the ring: only a reader that may wait can take it
		}
		if in.Buffered() < hdrLen+int(n)+framePad(int(n)) {
			break
		}
		if err := m.readFrame(p); err != nil {
			m.endShm(p, err)
		}
	}
	in.WakeReader()
	p.rmu.Unlock()
}

// readFrame reads and handles one frame from p.r.
func (m *Mesh) readFrame(p *peer) error {
	h := p.rhdr[:]
	if _, err := io.ReadFull(p.r, h); err != nil {
		return err
	}
	kind := h[0]
	src := int(binary.LittleEndian.Uint32(h[4:]))
	tag := binary.LittleEndian.Uint64(h[8:])
	n := binary.LittleEndian.Uint64(h[16:])
	if src != p.rank {
		return fmt.Errorf("frame claims source %d", src)
	}
	if p.pair != nil {
		if err := m.handleFrame(p, kind, tag, n); err != nil {
			return err
		}
		return p.pair.In.Skip(framePad(int(n)))
	}
	return m.handleFrame(p, kind, tag, n)
}

// handleFrame handles one frame whose header has been read.
func (m *Mesh) handleFrame(p *peer, kind byte, tag, n uint64) error {
	switch kind {
	case kindData:
		return m.deliver(p, tag, n)
	case kindProbe:
		go func() {
			var val uint64
			if m.cfg.OnProbe != nil {
				val = m.cfg.OnProbe()
			}
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], val)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = m.write(ctx, p.rank, kindProbeReply, tag, b[:])
		}()
	case kindBye:
		p.bye = true
		m.peerGone(p.rank)
	case kindFail:
		if n < 1 || n > maxReason {
			return fmt.Errorf("failure notice of %d bytes", n)
		}
		b := make([]byte, n) // rare: an op failed
		if _, err := io.ReadFull(p.r, b); err != nil {
			return err
		}
		m.tagFailed(&RemoteOpError{Rank: p.rank, Tag: tag, Code: b[0], Reason: string(b[1:])})
	case kindProbeReply:
		if n != 8 {
			return fmt.Errorf("probe reply of %d bytes", n)
		}
		v := p.rhdr[:8]
		if _, err := io.ReadFull(p.r, v); err != nil {
			return err
		}
		m.mu.Lock()
		ch := m.probes[tag]
		m.mu.Unlock()
		if ch != nil {
			select {
			case ch <- binary.LittleEndian.Uint64(v):
			default:
			}
		}
	default:
		return fmt.Errorf("unknown frame kind %d", kind)
	}
	return nil
}

// deliver reads one data frame's payload: into a posted receive, or into
// a pooled buffer queued as unexpected.
func (m *Mesh) deliver(p *peer, tag uint64, n uint64) error {
	k := key{p.rank, tag}
	m.mu.Lock()
	if m.broken != nil {
		m.mu.Unlock()
		return m.broken
	}
	r := popReq(m.posted, k)
	if r == nil {
		r = popReq(m.anyPosted, tag)
	}
	if r != nil {
		r.state = stateClaimed
		r.src = p.rank
		m.mu.Unlock()
		if n != uint64(len(r.buf)) {
			if _, err := io.CopyN(io.Discard, p.r, int64(n)); err != nil {
				r.complete(&PeerError{Rank: p.rank, Err: err})
				return err
			}
			r.complete(&SizeError{Rank: p.rank, Tag: tag, Got: int(n), Want: len(r.buf)})
			return nil
		}
		var err error
		if r.combine != nil {
			err = m.readCombine(p, r)
		} else {
			_, err = io.ReadFull(p.r, r.buf)
		}
		if err != nil {
			r.complete(&PeerError{Rank: p.rank, Err: err})
			return err
		}
		r.complete(nil)
		return nil
	}
	if len(m.failed) > 0 && m.failed[tag] != nil {
		// A straggler of an op that failed: nobody will receive it.
		m.mu.Unlock()
		_, err := io.CopyN(io.Discard, p.r, int64(n))
		return err
	}
	if n > uint64(m.cfg.MaxMessage) {
		m.mu.Unlock()
		return fmt.Errorf("unexpected message of %d bytes exceeds the %d-byte limit", n, m.cfg.MaxMessage)
	}
	mg := m.msgPool.Get().(*msg)
	mg.src, mg.tag, mg.ready, mg.waiter, mg.err = p.rank, tag, false, nil, nil
	m.arrivals++
	mg.seq = m.arrivals
	l := m.unexpected[k]
	l.push(mg)
	m.unexpected[k] = l
	m.mu.Unlock()
	buf := m.pool.Get(int(n))
	_, rerr := io.ReadFull(p.r, buf)
	m.mu.Lock()
	mg.buf, mg.ready = buf, true
	if rerr != nil {
		mg.err = &PeerError{Rank: p.rank, Err: rerr}
	}
	w := mg.waiter
	m.mu.Unlock()
	if w != nil {
		m.fill(w, mg)
	}
	return rerr
}

// readCombine reads r's payload and combines it into r.buf: straight out
// of the shared ring (no receive copy), or through a pooled piece of
// scratch for a TCP peer (so the reader goroutine, not the op's, reduces).
func (m *Mesh) readCombine(p *peer, r *Req) error {
	if p.pair != nil {
		in := p.pair.In
		for off := 0; off < len(r.buf); {
			src, err := in.NextUnits(len(r.buf)-off, r.elem)
			if err != nil {
				return err
			}
			r.combine(r.buf[off:off+len(src)], src)
			in.Consume(len(src))
			off += len(src)
		}
		return nil
	}
	piece := min(len(r.buf), 64<<10)
	piece -= piece % r.elem
	tmp := m.pool.Get(piece)
	defer m.pool.Put(tmp)
	for off := 0; off < len(r.buf); off += piece {
		b := tmp[:min(piece, len(r.buf)-off)]
		if _, err := io.ReadFull(p.r, b); err != nil {
			return err
		}
		r.combine(r.buf[off:off+len(b)], b)
	}
	return nil
}

// fill completes r from an unexpected message that left the queue.
func (m *Mesh) fill(r *Req, mg *msg) {
	var err error
	switch {
	case mg.err != nil:
		err = mg.err
	case len(mg.buf) != len(r.buf):
		err = &SizeError{Rank: mg.src, Tag: mg.tag, Got: len(mg.buf), Want: len(r.buf)}
	default:
		if r.combine != nil {
			r.combine(r.buf, mg.buf)
		} else {
			copy(r.buf, mg.buf)
		}
	}
	r.src = mg.src
	m.pool.Put(mg.buf)
	*mg = msg{}
	m.msgPool.Put(mg)
	r.complete(err)
}

// Irecv implements coll.Transport.
func (m *Mesh) Irecv(peer int, tag uint64, buf []byte) coll.Request {
	return m.irecv(peer, tag, buf, 0, nil)
}

// IrecvReduce implements coll.ReduceReceiver: the message is combined
// into buf as it is read (from shared memory without a receive copy).
func (m *Mesh) IrecvReduce(peer int, tag uint64, buf []byte, elem int, combine func(dst, src []byte)) coll.Request {
	if elem < 1 || len(buf)%elem != 0 {
		r := m.reqPool.Get().(*Req)
		r.peer, r.tag, r.buf, r.src, r.err, r.next = peer, tag, buf, peer, nil, nil
		r.state = stateClaimed
		r.complete(fmt.Errorf("tcpmesh: reduce-receive of %d bytes in elements of %d", len(buf), elem))
		return r
	}
	return m.irecv(peer, tag, buf, elem, combine)
}

// IrecvAny posts a receive from whichever rank sends first under tag. The
// returned request's Source names that rank after Wait.
func (m *Mesh) IrecvAny(tag uint64, buf []byte) *Req {
	return m.irecv(-1, tag, buf, 0, nil)
}

func (m *Mesh) irecv(peer int, tag uint64, buf []byte, elem int, combine func(dst, src []byte)) *Req {
	r := m.reqPool.Get().(*Req)
	r.peer, r.tag, r.buf, r.src, r.err, r.next = peer, tag, buf, peer, nil, nil
	r.elem, r.combine = elem, combine
	m.mu.Lock()
	if peer == m.rank || peer >= m.size || peer < -1 {
		m.mu.Unlock()
		r.state = stateClaimed
		r.complete(fmt.Errorf("tcpmesh: receive from invalid rank %d", peer))
		return r
	}
	if m.broken != nil {
		err := m.broken
		m.mu.Unlock()
		r.state = stateClaimed
		r.complete(err)
		return r
	}
	if len(m.failed) > 0 {
		if e := m.failed[tag]; e != nil {
			m.mu.Unlock()
			r.state = stateClaimed
			r.complete(e)
			return r
		}
	}
	var mg *msg
	if peer >= 0 {
		mg = popMsg(m.unexpected, key{peer, tag})
	} else { // the earliest arrival from any peer
		best := -1
		var seq uint64
		for p := range m.size {
			if l, ok := m.unexpected[key{p, tag}]; ok && (best < 0 || l.head.seq < seq) {
				best, seq = p, l.head.seq
			}
		}
		if best >= 0 {
			mg = popMsg(m.unexpected, key{best, tag})
		}
	}
	if mg != nil {
		r.state = stateClaimed
		if !mg.ready {
			mg.waiter = r // the reader completes r when the payload is in
			m.mu.Unlock()
			return r
		}
		m.mu.Unlock()
		m.fill(r, mg)
		return r
	}
	if peer >= 0 && m.gone[peer] != nil {
		err := m.gone[peer]
		m.mu.Unlock()
		r.state = stateClaimed
		r.complete(err)
		return r
	}
	r.state = statePosted
	if peer >= 0 {
		pushReq(m.posted, key{peer, tag}, r)
	} else {
		pushReq(m.anyPosted, tag, r)
	}
	m.mu.Unlock()
	return r
}

// FailTag tells every peer that this rank gave up the op with tag (for
// the reason err, of kind code), so that their receives of it fail with a
// *RemoteOpError instead of waiting for messages that will not come. Best
// effort, bounded by a second per peer.
func (m *Mesh) FailTag(tag uint64, code byte, err error) {
	reason := err.Error()
	if len(reason) > maxReason-1 {
		reason = reason[:maxReason-1]
	}
	b := append([]byte{code}, reason...)
	// Locally too: stragglers of the op that arrive later are dropped.
	m.tagFailed(&RemoteOpError{Rank: m.rank, Tag: tag, Code: code, Reason: reason})
	var wg sync.WaitGroup
	for _, p := range m.peers {
		if p == nil {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = m.write(ctx, p.rank, kindFail, tag, b)
		})
	}
	wg.Wait()
}

// tagFailed records a peer's FailTag: the receives posted under the tag
// fail now, later ones at once, and messages already queued for it are
// dropped.
func (m *Mesh) tagFailed(e *RemoteOpError) {
	var victims []*Req
	m.mu.Lock()
	if _, ok := m.failed[e.Tag]; !ok {
		m.failed[e.Tag] = e
	}
	for peer := range m.size {
		k := key{peer, e.Tag}
		for r := popReq(m.posted, k); r != nil; r = popReq(m.posted, k) {
			r.state = stateClaimed
			victims = append(victims, r)
		}
		for l := m.unexpected[k]; l.head != nil && l.head.ready; l = m.unexpected[k] {
			mg := popMsg(m.unexpected, k)
			m.pool.Put(mg.buf)
			*mg = msg{}
			m.msgPool.Put(mg)
		}
	}
	for r := popReq(m.anyPosted, e.Tag); r != nil; r = popReq(m.anyPosted, e.Tag) {
		r.state = stateClaimed
		victims = append(victims, r)
	}
	m.mu.Unlock()
	for _, r := range victims {
		r.complete(e)
	}
}

// peerGone records an orderly close of peer and fails the receives posted
// from it.
func (m *Mesh) peerGone(peer int) {
	err := &PeerError{Rank: peer, Err: ErrPeerClosed}
	m.mu.Lock()
	m.gone[peer] = err
	var victims []*Req
	for k, l := range m.posted {
		if k.peer != peer {
			continue
		}
		for r := l.pop(); r != nil; r = l.pop() {
			r.state = stateClaimed
			victims = append(victims, r)
		}
		delete(m.posted, k)
	}
	m.mu.Unlock()
	for _, r := range victims {
		r.complete(err)
	}
}

// fail breaks the mesh with err (the first error wins) and fails every
// posted receive.
func (m *Mesh) fail(err error) {
	m.mu.Lock()
	if m.broken == nil {
		m.broken = err
	}
	err = m.broken
	var victims []*Req
	for _, l := range m.posted {
		for r := l.pop(); r != nil; r = l.pop() {
			r.state = stateClaimed
			victims = append(victims, r)
		}
	}
	clear(m.posted)
	for _, l := range m.anyPosted {
		for r := l.pop(); r != nil; r = l.pop() {
			r.state = stateClaimed
			victims = append(victims, r)
		}
	}
	clear(m.anyPosted)
	m.mu.Unlock()
	for _, r := range victims {
		r.complete(err)
	}
}

// Abort breaks the mesh with err at once: pending and later receives and
// sends fail with it, and the connections are closed.
func (m *Mesh) Abort(err error) {
	m.fail(err)
	for _, p := range m.peers {
		if p != nil {
			_ = p.conn.Close()
			if p.pair != nil {
				p.pair.Close() // unblock this side's ring waits
			}
		}
	}
}

// Close shuts the connections down and waits for the readers to exit.
// Pending receives fail with ErrClosed.
func (m *Mesh) Close() error {
	if m.Err() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		for _, p := range m.peers {
			if p != nil {
				_ = m.write(ctx, p.rank, kindBye, 0, nil)
			}
		}
		cancel()
	}
	m.fail(ErrClosed)
	for _, p := range m.peers {
		if p != nil {
			_ = p.conn.CloseWrite() // FIN after what is queued, rather than a reset
			_ = p.conn.Close()
			if p.pair != nil {
				p.pair.Close()
			}
		}
	}
	m.readers.Wait()
	for _, p := range m.peers {
		if p == nil || p.pair == nil {
			continue
		}
		// Unmap only once no writer and no polling receive can touch the
		// rings: both roles are taken, and later ones see unmapped.
		p.mapMu.Lock()
		p.wmu.Lock()
		p.rmu.Lock()
		if !p.unmapped {
			p.unmapped, p.rdone = true, true
			_ = p.pair.Unmap()
		}
		p.rmu.Unlock()
		p.wmu.Unlock()
		p.mapMu.Unlock()
	}
	return nil
}

const (
	statePosted = iota + 1
	stateClaimed
	stateDone
)

// Req is a posted receive (coll.Request). Requests are recycled: after
// Wait or Cancel returns, the Req must not be used again.
type Req struct {
	m     *Mesh
	peer  int
	tag   uint64
	buf   []byte
	state int // guarded by m.mu while posted
	src   int
	err   error
	done  chan struct{}
	next  *Req
	// combine, when set, reduces the message into buf instead of copying
	// it (IrecvReduce); elem is the element size it works in.
	combine func(dst, src []byte)
	elem    int
}

func (r *Req) complete(err error) {
	r.err = err
	r.done <- struct{}{}
}

// Source is the rank the message came from; valid once Wait returned nil.
func (r *Req) Source() int { return r.src }

// Wait implements coll.Request.
func (r *Req) Wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.release()
	default:
	}
	if r.spin() {
		return r.release()
	}
	if op := relaxOp(ctx); op != nil {
		defer op.acquire()
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		if r.withdraw() {
			r.m.reqPool.Put(r.reset())
			return fmt.Errorf("tcpmesh: receive from rank %d, tag %d: %w", r.peer, r.tag, ctx.Err())
		}
		<-r.done // matched already: the reader is filling the buffer
	}
	return r.release()
}

// spin polls the peer's shared-memory ring on this goroutine for up to
// PollSpin, reading its frames (this receive's, or others'), and reports
// whether the receive completed meanwhile. Parking on r.done instead costs
// two goroutine wake-ups (the reader's, then ours), tens of microseconds
// on a busy machine.
func (r *Req) spin() bool {
	m := r.m
	if r.peer < 0 || m.cfg.PollSpin < 0 || m.peers[r.peer] == nil || m.peers[r.peer].pair == nil {
		return false
	}
	p := m.peers[r.peer]
	p.mapMu.RLock()
	defer p.mapMu.RUnlock()
	if p.unmapped {
		return false
	}
	p.pair.In.BeginPoll()
	defer p.pair.In.EndPoll()
	var start time.Time
	for i := 0; ; i++ {
		m.poll(p)
		select {
		case <-r.done:
			return true
		default:
		}
		if i&15 == 15 { // the clock is read now and then: it costs more than a poll
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > m.cfg.PollSpin {
				return false
			}
		}
		runtime.Gosched()
	}
}

// WaitSource is Wait for a receive from any rank: it also returns the
// source.
func (r *Req) WaitSource(ctx context.Context) (int, error) {
	src := -1
	select {
	case <-r.done:
	case <-ctx.Done():
		if r.withdraw() {
			r.m.reqPool.Put(r.reset())
			return -1, fmt.Errorf("tcpmesh: receive from any rank, tag %d: %w", r.tag, ctx.Err())
		}
		<-r.done
	}
	src = r.src
	return src, r.release()
}

// Cancel implements coll.Request.
func (r *Req) Cancel() {
	select {
	case <-r.done:
	default:
		if r.withdraw() {
			r.m.reqPool.Put(r.reset())
			return
		}
		<-r.done
	}
	_ = r.release()
}

// withdraw removes a still-posted receive from its queue; it reports false
// when a message has matched it already.
func (r *Req) withdraw() bool {
	m := r.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.state != statePosted {
		return false
	}
	if r.peer >= 0 {
		removeReq(m.posted, key{r.peer, r.tag}, r)
	} else {
		removeReq(m.anyPosted, r.tag, r)
	}
	r.state = stateDone
	return true
}

func (r *Req) release() error {
	err := r.err
	r.m.reqPool.Put(r.reset())
	return err
}

func (r *Req) reset() *Req {
	r.buf, r.err, r.next, r.state, r.combine = nil, nil, nil, 0, nil
	return r
}

type reqList struct{ head, tail *Req }

// popReq, pushReq, removeReq and popMsg edit the FIFO of one key, deleting
// it when it empties so that the maps do not grow with every op's tag.
func popReq[K comparable](mp map[K]reqList, k K) *Req {
	l, ok := mp[k]
	if !ok {
		return nil
	}
	r := l.pop()
	if l.head == nil {
		delete(mp, k)
	} else {
		mp[k] = l
	}
	return r
}

func pushReq[K comparable](mp map[K]reqList, k K, r *Req) {
	l := mp[k]
	l.push(r)
	mp[k] = l
}

func removeReq[K comparable](mp map[K]reqList, k K, r *Req) {
	l := mp[k]
	l.remove(r)
	if l.head == nil {
		delete(mp, k)
	} else {
		mp[k] = l
	}
}

func popMsg(mp map[key]msgList, k key) *msg {
	l, ok := mp[k]
	if !ok {
		return nil
	}
	mg := l.pop()
	if l.head == nil {
		delete(mp, k)
	} else {
		mp[k] = l
	}
	return mg
}

func (l *reqList) push(r *Req) {
	r.next = nil
	if l.tail == nil {
		l.head, l.tail = r, r
		return
	}
	l.tail.next = r
	l.tail = r
}

func (l *reqList) pop() *Req {
	if l == nil || l.head == nil {
		return nil
	}
	r := l.head
	l.head = r.next
	if l.head == nil {
		l.tail = nil
	}
	r.next = nil
	return r
}

func (l *reqList) remove(r *Req) {
	var prev *Req
	for c := l.head; c != nil; prev, c = c, c.next {
		if c == r {
			if prev == nil {
				l.head = c.next
			} else {
				prev.next = c.next
			}
			if l.tail == c {
				l.tail = prev
			}
			c.next = nil
			return
		}
	}
}

// msg is a message that arrived before its receive was posted.
type msg struct {
	src    int
	tag    uint64
	seq    uint64
	buf    []byte
	ready  bool
	err    error
	waiter *Req
	next   *msg
}

type msgList struct{ head, tail *msg }

func (l *msgList) push(mg *msg) {
	mg.next = nil
	if l.tail == nil {
		l.head, l.tail = mg, mg
		return
	}
	l.tail.next = mg
	l.tail = mg
}

func (l *msgList) pop() *msg {
	if l == nil || l.head == nil {
		return nil
	}
	mg := l.head
	l.head = mg.next
	if l.head == nil {
		l.tail = nil
	}
	mg.next = nil
	return mg
}
