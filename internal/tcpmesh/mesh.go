// Package tcpmesh is a coll.Transport over a full mesh of TCP connections,
// one per pair of ranks, set up through a key-value store (KV).
//
// Rendezvous: every rank listens on an ephemeral port and publishes
// "host:port" under "tcpmesh/addr/<rank>"; rank 0 publishes a random
// session id. Each rank dials every lower rank and accepts every higher
// one; the dialer's hello carries the session id, its rank and the world
// size, so connections from another job or group are refused. Both sides
// give up at the connect deadline.
//
// Wire: every message is one frame, a 32-byte header (kind, the op's
// fingerprint, source rank, tag, payload length, the op's element count;
// little-endian) and the payload. The fingerprint (Fingerprint: op, dtype,
// reduce op, count) lets a receiver refuse a message of an op described
// differently before it reads the payload. One reader
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
//
// Lanes and direct reads: every shared-memory peer also gets a lane, a
// second pair of rings that only the running op's goroutine reads (the
// backend runs small ops over them in issue order, one at a time), and
// ranks that may read each other's memory run large ops by reading the
// peers' buffers in place (lanes.go, direct.go).
//
// The source follows these concerns: mesh.go (config, set-up, close),
// rendezvous.go, shm.go (the shared-memory hand-off and ring readers),
// lanes.go and direct.go (the fast paths of one host),
// poll.go (receives that poll a ring themselves), framing.go (the wire),
// matching.go (messages to receives), requests.go (Req), failure.go
// (errors and how failures spread) and list.go (the queues of matching).
package tcpmesh

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/shm"
)

// KV is the part of a key-value store that the rendezvous uses: rank 0
// publishes the session id, and every rank but the last its address, with
// Set; the others wait for them with Get. store.Store satisfies it as it
// is. Asking for these two methods only keeps tcpmesh independent of the
// store package, so any launcher that can publish and wait can set a mesh
// up.
type KV interface {
	// Set stores value under key, waking the Gets that wait for it.
	Set(ctx context.Context, key string, value []byte) error
	// Get blocks until key exists (or ctx is done), then returns its value.
	Get(ctx context.Context, key string) ([]byte, error)
}

// Config sets up a mesh.
type Config struct {
	// Rank and Size place this process in the group.
	Rank, Size int
	// Store is where addresses are exchanged; it should be prefixed for the
	// group, as the dispatcher's is.
	Store KV
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
	// The lane and board waits start from it and adapt, up to spinGrowth
	// times it (shm.SpinBudget).
	PollSpin time.Duration
	// BindRanks, where more ranks share this host than it has CPUs, keeps
	// each rank's posting thread on a home CPU of its own, the ranks
	// spread evenly (shm.Board.KeepHome).
	BindRanks bool
}

// Transport values of Config.
const (
	TransportAuto = "auto"
	TransportTCP  = "tcp"
	TransportShm  = "shm"
)

// spinGrowth is how far the lane and board waits' spin may grow past
// Config.PollSpin (shm.SpinBudget's ceiling): 800 µs from the default 50,
// well past the 60-150 µs that a halted virtual CPU's wake-up took on the
// dev machine, and short of a scheduler tick, past which a peer that has
// not come is busy elsewhere.
const spinGrowth = 16

// Mesh is a coll.Transport over TCP. Its methods are safe for concurrent
// use.
type Mesh struct {
	cfg   Config
	rank  int
	size  int
	peers []*peer
	pool  *coll.Pool

	mu         sync.Mutex
	posted     map[key]fifo[*Req] // lists by value: no allocation per tag
	anyPosted  map[uint64]fifo[*Req]
	unexpected map[key]fifo[*msg]
	arrivals   uint64 // arrival counter, orders unexpected messages for anysource
	broken     error
	isBroken   atomic.Bool            // broken != nil, for Err's look without mu
	gone       []error                // per peer: closed in order
	failed     map[uint64]error       // tags a peer gave up (*RemoteOpError), or whose messages this rank refused
	fps        map[uint64]Fingerprint // the running ops' fingerprints, by tag (BeginOp)
	shmPeers   int                    // peers reached through shared memory
	lanes      bool                   // every peer has a lane (lanes.go)
	direct     bool                   // and may be read directly (direct.go)
	probes     map[uint64]chan uint64
	probeID    atomic.Uint64
	laneHold   sync.RWMutex // read-held by lane ops (HoldLanes); Close takes it to unmap the lanes

	// The board (board.go), nil without one. Its posts and receives run
	// within HoldLanes; the looks of other waits (boardConflict)
	// read-hold boardMu; Close takes both to unmap, after which boardGone
	// is set. boardSeen is, per peer, the greatest stamp seen in its
	// slots (lane ops run one at a time: no lock).
	board     *shm.Board
	boardSeen []uint64
	boardMu   sync.RWMutex
	boardGone bool

	notices sync.WaitGroup // abort notices in flight (notify)
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

	readEnd chan struct{} // closed when the reader goroutine exits

	rhdr [hdrLen]byte // the reader's header buffer (a field: no allocation per frame)
	phdr [hdrLen]byte // poll's peeked header

	wmu  sync.Mutex
	hdr  [hdrLen]byte
	wbuf []byte
	bufs net.Buffers
	dl   bool // a write deadline is set

	// The lane (lanes.go), nil without one. A lane op's messages hold the
	// mesh's laneHold (HoldLanes); the other lane calls (LaneExpect,
	// ReadPeer, laneConflict) read-hold laneMu; closeLane takes both to
	// unmap, after which laneGone is set.
	lane     *shm.Pair
	laneMu   sync.RWMutex
	laneGone bool
	lhdr     [laneHdr]byte // LaneSendHeld's header (one op at a time uses the lanes)
	lrhdr    [laneHdr]byte // LaneRecvHeld's
	pid      int           // the peer's process id when ReadPeer works (direct.go), else 0
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
		posted:     map[key]fifo[*Req]{},
		anyPosted:  map[uint64]fifo[*Req]{},
		unexpected: map[key]fifo[*msg]{},
		probes:     map[uint64]chan uint64{},
		gone:       make([]error, cfg.Size),
		failed:     map[uint64]error{},
		fps:        map[uint64]Fingerprint{},
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
		m.abandon()
		return nil, err
	}
	lanes, direct := 0, 0
	for _, p := range m.peers {
		if p != nil && p.pair != nil {
			m.shmPeers++
		}
		if p != nil && p.lane != nil {
			lanes++
			if p.pid != 0 {
				direct++
			}
		}
	}
	m.lanes = lanes == m.size-1
	m.direct = direct == m.size-1
	if m.lanes {
		// Every rank must take the same path for an op: direct reads only
		// where every pair can.
		if err := m.agreeDirect(ctx); err != nil {
			m.abandon()
			return nil, err
		}
		if m.size >= 3 && m.size <= BoardRanks {
			if err := m.setupBoard(ctx); err != nil {
				m.abandon()
				return nil, err
			}
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
	if oversubscribed && m.board != nil {
		m.board.Yield = laneYield
		if m.cfg.BindRanks {
			m.board.KeepHome()
		}
	}
	var budget *shm.SpinBudget
	if m.cfg.PollSpin > 0 {
		budget = shm.NewSpinBudget(m.cfg.PollSpin, spinGrowth*m.cfg.PollSpin)
		if m.board != nil {
			m.board.Budget = budget
		}
	}
	for _, p := range m.peers {
		if p == nil {
			continue
		}
		if p.pair != nil {
			if oversubscribed {
				p.pair.In.Spin, p.pair.Out.Spin = 0, 0 // sleep at once: yield the core
				if p.lane != nil {
					p.lane.In.Yield = laneYield
				}
			}
			if p.lane != nil {
				p.lane.In.Budget = budget
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

// abandon undoes a setup that failed: connections closed, pairs unmapped.
func (m *Mesh) abandon() {
	for _, p := range m.peers {
		if p != nil {
			_ = p.conn.Close()
			if p.pair != nil {
				_ = p.pair.Unmap()
			}
			if p.lane != nil {
				_ = p.lane.Unmap()
			}
		}
	}
	if m.board != nil {
		_ = m.board.Unmap()
	}
}

// Rank implements coll.Transport.
func (m *Mesh) Rank() int { return m.rank }

// Size implements coll.Transport.
func (m *Mesh) Size() int { return m.size }

// Err returns the error that broke the mesh, or nil. Every op asks, so
// a mesh that is not broken answers without taking mu.
func (m *Mesh) Err() error {
	if !m.isBroken.Load() {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.broken
}

// UsesShm reports whether frames to and from peer go through shared memory.
func (m *Mesh) UsesShm(peer int) bool {
	return peer >= 0 && peer < m.size && m.peers[peer] != nil && m.peers[peer].pair != nil
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
	m.notices.Wait() // a failure's notices go out before the connections close
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
	// The lane ops that hold the lanes (HoldLanes) end once their waits
	// fail: every lane is closed first, then the lanes are unmapped.
	for _, p := range m.peers {
		if p != nil && p.lane != nil {
			p.lane.Close()
		}
	}
	m.closeBoard()
	m.laneHold.Lock()
	for _, p := range m.peers {
		if p != nil {
			p.closeLane()
		}
	}
	m.unmapBoard()
	m.laneHold.Unlock()
	return nil
}
