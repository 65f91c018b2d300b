package tcpmesh

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/internal/shm"
)

// Direct reads: ranks of one host that may read each other's memory
// (process_vm_readv: same user, no ptrace restriction in the way) run
// large allreduces by reading their peers' buffers in place
// (coll.AllreduceDirect), one copy where the rings cost two. Whether a
// pair can is found out when its lane is set up: each side reads a word
// that the other published, and both must succeed.

const probeMagic = 0x676f636f6c6c4d41 // "gocollMA"

// probeDirect finds out whether this rank and p can read each other's
// memory; the lane is set up.
func (m *Mesh) probeDirect(p *peer) error {
	c := p.conn
	word := new(uint64)
	*word = probeMagic
	var out [12]byte
	binary.LittleEndian.PutUint32(out[0:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint64(out[4:], uint64(uintptr(unsafe.Pointer(word))))
	if _, err := c.Write(out[:]); err != nil {
		return err
	}
	var in [12]byte
	if _, err := io.ReadFull(c, in[:]); err != nil {
		return err
	}
	pid := int(binary.LittleEndian.Uint32(in[0:]))
	var got [8]byte
	ok := shm.ReadPeer(pid, got[:], uintptr(binary.LittleEndian.Uint64(in[4:]))) == nil && binary.LittleEndian.Uint64(got[:]) == probeMagic
	ack := []byte{0}
	if ok {
		ack[0] = 1
	}
	if _, err := c.Write(ack); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, ack); err != nil {
		return err
	}
	// word must stay alive until the peer has read it, which its ack says.
	if ok && ack[0] == 1 && *word == probeMagic {
		p.pid = pid
	}
	return nil
}

// Direct reports whether every peer has a lane and this rank and it can
// read each other's memory (ReadPeer).
func (m *Mesh) Direct() bool { return m.direct }

// ReadPeer copies len(dst) bytes at addr in peer's memory into dst. The
// peer must keep them there until this rank says it is done (over the
// lanes). A failure (the peer died) breaks the mesh, naming the peer.
func (m *Mesh) ReadPeer(peer int, dst []byte, addr uintptr) error {
	p := m.peers[peer]
	if err := shm.ReadPeer(p.pid, dst, addr); err != nil {
		perr := &PeerError{Rank: peer, Err: fmt.Errorf("direct read: %w", err)}
		m.fail(perr)
		return m.errOr(perr)
	}
	return nil
}

// agreeDirect makes m.direct the same on every rank: each publishes its
// own answer under "tcpmesh/direct/<rank>" and reads the others'.
func (m *Mesh) agreeDirect(ctx context.Context) error {
	mine := []byte{'0'}
	if m.direct {
		mine[0] = '1'
	}
	if err := m.cfg.Store.Set(ctx, "tcpmesh/direct/"+strconv.Itoa(m.rank), mine); err != nil {
		return fmt.Errorf("tcpmesh: publishing direct reads: %w", err)
	}
	for r := range m.size {
		if r == m.rank {
			continue
		}
		v, err := m.cfg.Store.Get(ctx, "tcpmesh/direct/"+strconv.Itoa(r))
		if err != nil {
			return fmt.Errorf("tcpmesh: rank %d waiting for rank %d's direct reads: %w", m.rank, r, err)
		}
		if len(v) != 1 || v[0] != '1' {
			m.direct = false
		}
	}
	return nil
}

// Waits of a direct allreduce. Its peers are busy with the same op for
// as long as the op takes (milliseconds), so a rank that arrives first at
// a sync point waits for up to the ranks' imbalance. It polls with
// sched_yield for directYield before it parks: a parked wait's wake-up,
// on a virtual machine whose idle CPU halts, took 100-400 µs per sync
// point at 16 MiB, a third of the op; and a poll that yields gives the
// core to whoever else may run on it, the peer it waits for above all
// when ranks (or other programs) share a core: a plain spin there held
// the core from that peer, and 4 MiB took 7 ms instead of 0.7 on a loaded
// machine. On an idle core sched_yield returns at once, so the poll sees
// the message within a microsecond.
const directYield = 2 * time.Millisecond

// LaneExpect waits until peer's next lane message is there, polling as a
// large op should (directYield); the LaneRecv that follows
// finds it at once. check, when not nil, is called while the wait is
// parked, as LaneRecv's.
func (m *Mesh) LaneExpect(ctx context.Context, peer int, check func() error) error {
	p := m.peers[peer]
	p.laneMu.RLock()
	defer p.laneMu.RUnlock()
	if p.laneGone {
		return m.errOr(ErrClosed)
	}
	if err := p.lane.In.AwaitYield(ctx, laneHdr, -1, directYield, laneSlice, check); err != nil {
		return m.laneErr(p, err)
	}
	return nil
}
