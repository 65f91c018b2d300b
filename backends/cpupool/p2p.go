package cpupool

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/tensor"
)

// p2pBit marks the tags of send and recv: collectives number their tags
// from 1 upwards, user tags of P2P ops live above this bit, so the two
// never meet.
const p2pBit = 1 << 63

// sender is the FIFO of one peer's sends. P2P ops do not take pool
// workers: a receive that waits for a late peer must not starve the
// collectives, and sends to one peer must leave in issue order, which one
// goroutine per peer guarantees.
type sender struct {
	mu     sync.Mutex
	cond   sync.Cond
	items  []*job
	closed bool
}

func (s *sender) push(j *job) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.items = append(s.items, j)
	s.cond.Signal()
	return true
}

func (s *sender) close() {
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
}

func (b *Backend) sendLoop(peer int, s *sender) {
	defer b.wg.Done()
	for {
		s.mu.Lock()
		for len(s.items) == 0 && !s.closed {
			s.cond.Wait()
		}
		if len(s.items) == 0 {
			s.mu.Unlock()
			return
		}
		j := s.items[0]
		s.items[0] = nil
		s.items = s.items[1:]
		s.mu.Unlock()
		b.runJob(j)
	}
}

// anyPeer is p2pBuffer's peer for RecvAnysource, which names none.
const anyPeer = -1

// p2pBuffer checks the arguments of a point-to-point op (the backend may be
// called without the dispatcher's checks) and returns the tensor's host
// buffer. peer is checked against the world, unless it is anyPeer.
func (b *Backend) p2pBuffer(op backend.Op, m backend.Meta, tensors []*tensor.Tensor, peer int, badPeer string, tag int) ([]byte, error) {
	if len(tensors) != 1 {
		return nil, b.args.Invalid(op, m, "requires a single-element tensor list")
	}
	if peer != anyPeer && (peer < 0 || peer >= b.cfg.WorldSize || peer == b.cfg.Rank) {
		return nil, b.args.Invalid(op, m, "%s", badPeer)
	}
	if tag < 0 {
		return nil, b.args.Invalid(op, m, "tag must not be negative")
	}
	bufs, err := b.args.Host(op, m, tensors...)
	if err != nil {
		return nil, err
	}
	if err := b.usable(op, m.Seq); err != nil {
		return nil, err
	}
	return bufs[0], nil
}

// Send implements backend.Backend. The work completes once the data is
// handed to the connection (Gloo's send semantics), not when the peer has
// received it.
func (b *Backend) Send(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, dst int, opts backend.SendOptions) (backend.Work, error) {
	op := backend.OpSend
	buf, err := b.p2pBuffer(op, m, tensors, dst, "invalid destination rank", opts.Tag)
	if err != nil {
		return nil, err
	}
	j := b.newJob(ctx, op, m, nil, nil)
	j.tag, j.peer = p2pBit|uint64(opts.Tag), dst
	j.run = func(ctx context.Context, tag uint64) error { return b.mesh.Send(ctx, dst, tag, buf) }
	w := j.w // read before the push: see collective
	b.track(w)
	if !b.senders[dst].push(j) {
		j.cancel()
		return nil, b.usable(op, m.Seq)
	}
	return w, nil
}

// Recv implements backend.Backend. The receive is posted at once, on the
// caller's goroutine, so receives with one tag match in issue order.
func (b *Backend) Recv(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, src int, opts backend.RecvOptions) (backend.Work, error) {
	op := backend.OpRecv
	buf, err := b.p2pBuffer(op, m, tensors, src, "invalid source rank", opts.Tag)
	if err != nil {
		return nil, err
	}
	j := b.newJob(ctx, op, m, tensors, nil)
	j.tag, j.peer = p2pBit|uint64(opts.Tag), src
	req := b.mesh.Irecv(src, j.tag, buf)
	j.run = func(ctx context.Context, _ uint64) error { return req.Wait(ctx) }
	w := j.w // read before the run starts: see collective
	b.track(w)
	go b.runJob(j)
	return w, nil
}

// anyWork is the Work of RecvAnysource: a HostWork that also names the
// sender (backend.SourceRanker).
type anyWork struct {
	*backend.HostWork
	src atomic.Int64
}

// SourceRank implements backend.SourceRanker.
func (w *anyWork) SourceRank() (int, error) {
	if !w.IsCompleted() {
		return -1, &backend.OpError{Op: backend.OpRecvAnysource.String(), Backend: Name, Kind: backend.ErrInvalidArgument, Detail: "source rank requested before the receive completed"}
	}
	if err := w.Exception(); err != nil {
		return -1, err
	}
	return int(w.src.Load()), nil
}

// RecvAnysource implements backend.Backend.
func (b *Backend) RecvAnysource(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.RecvAnysourceOptions) (backend.Work, error) {
	op := backend.OpRecvAnysource
	buf, err := b.p2pBuffer(op, m, tensors, anyPeer, "", opts.Tag)
	if err != nil {
		return nil, err
	}
	j := b.newJob(ctx, op, m, tensors, nil)
	j.tag = p2pBit | uint64(opts.Tag)
	w := &anyWork{HostWork: j.w}
	w.src.Store(-1)
	var req *tcpmesh.Req = b.mesh.IrecvAny(j.tag, buf)
	j.run = func(ctx context.Context, _ uint64) error {
		src, err := req.WaitSource(ctx)
		w.src.Store(int64(src))
		return err
	}
	b.track(w)
	go b.runJob(j)
	return w, nil
}
