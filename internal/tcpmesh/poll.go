package tcpmesh

import (
	"context"
	"encoding/binary"
	"runtime"
	"time"
)

// OpPoll is an op's announcement, made with BeginOp, that its goroutine
// will read its shared-memory messages itself (Req.Wait polls): while it
// holds, peers do not wake this rank's ring readers, which would
// otherwise race the op's goroutine for the frames and cost a thread
// wake-up per message. Wait and Send release it while they block.
type OpPoll struct {
	// Tag and FP, when FP.Op is set, are the op's tag and fingerprint:
	// its data frames carry FP, and receives under Tag compare the
	// senders' fingerprints with it (see Fingerprint).
	Tag uint64
	FP  Fingerprint

	m          *Mesh
	held       bool
	registered bool
}

type opPollKey struct{}

// BeginOp makes the announcement for an op run on this goroutine with ctx
// (under which the op must then call Send and Wait) and returns that
// context. op is the caller's storage, so the announcement allocates only
// the context. It does nothing when polling is off or no peer shares
// memory.
//
// With op.FP set, it also registers the op's fingerprint under op.Tag
// until EndOp: the op's frames carry it, and its receives check theirs.
func (m *Mesh) BeginOp(ctx context.Context, op *OpPoll) context.Context {
	poll := m.cfg.PollSpin >= 0 && m.shmPeers > 0
	if op.FP.Op != 0 && m.size > 1 {
		m.mu.Lock()
		m.fps[op.Tag] = op.FP
		m.mu.Unlock()
		op.registered = true
	}
	if !poll && !op.registered {
		return ctx
	}
	op.m = m
	if poll {
		op.acquire()
	}
	return context.WithValue(ctx, opPollKey{}, op)
}

// EndOp ends BeginOp's announcement.
func (m *Mesh) EndOp(op *OpPoll) {
	if op.m != nil && op.held {
		op.release()
	}
	if op.registered {
		m.mu.Lock()
		delete(m.fps, op.Tag)
		m.mu.Unlock()
		op.registered = false
	}
}

func (op *OpPoll) acquire() { op.hold(true) }

func (op *OpPoll) release() { op.hold(false) }

// hold makes (held) or withdraws the announcement on every ring this rank
// reads from that is still mapped.
func (op *OpPoll) hold(held bool) {
	op.held = held
	for _, p := range op.m.peers {
		if p != nil && p.pair != nil {
			p.mapMu.RLock()
			if !p.unmapped {
				if held {
					p.pair.In.BeginPoll()
				} else {
					p.pair.In.EndPoll()
				}
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
