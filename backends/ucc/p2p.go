package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import (
	"context"
	"fmt"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/tensor"
)

// maxTag is the largest user tag a point-to-point op may carry: UCC's tag
// field is 16 bits, of which tl/ucp keeps 15 for the message tag and
// reserves the top 8 of those values for its own service messages
// (UCC_TL_UCP_MAX_COLL_TAG).
const maxTag = 1<<15 - 1 - 8

// Send implements backend.Backend. UCC has no send and recv: as PyTorch's
// ProcessGroupUCC does, a send is a broadcast rooted at this rank over the
// active set {this rank, dst} (UCC_COLL_ARGS_FIELD_ACTIVE_SET), carrying
// the user tag (UCC_COLL_ARGS_FIELD_TAG), so that only the two peers take
// part and tl/ucp matches it by tag with the peer's receive (tl/ucp marks
// user-tagged messages with a bit of their own, so they cannot match a
// collective's sequence tag). Posts are in
// issue order, and UCX matches equal tags between two ranks in order, so
// sends and receives of one pair and tag pair up first to first.
func (b *Backend) Send(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, dst int, opts backend.SendOptions) (backend.Work, error) {
	return b.p2p(ctx, backend.OpSend, m, tensors, dst, opts.Tag)
}

// Recv implements backend.Backend: the peer's broadcast over the active
// set {src, this rank}; see Send.
func (b *Backend) Recv(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, src int, opts backend.RecvOptions) (backend.Work, error) {
	return b.p2p(ctx, backend.OpRecv, m, tensors, src, opts.Tag)
}

// RecvAnysource implements backend.Backend with ErrUnsupported: a UCC
// broadcast names its root when it is posted, and a posted one cannot be
// cancelled, so a receive from whichever rank sends first has nothing to
// be built on (ProcessGroupUCC has none either).
func (b *Backend) RecvAnysource(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.RecvAnysourceOptions) (backend.Work, error) {
	return nil, &backend.OpError{Op: backend.OpRecvAnysource.String(), Seq: m.Seq, Rank: b.cfg.Rank, Backend: Name, Kind: backend.ErrUnsupported,
		Detail: "UCC has no point-to-point receive from any source: its broadcasts name their root when posted and cannot be cancelled"}
}

// p2p posts one two-rank active-set broadcast per non-empty tensor: rooted
// here for a send, at peer for a receive.
func (b *Backend) p2p(ctx context.Context, op backend.Op, m backend.Meta, tensors []*tensor.Tensor, peer, tag int) (backend.Work, error) {
	bufs, err := b.args.Host(op, m, tensors...)
	if err != nil {
		return nil, err
	}
	me, world := b.cfg.Rank, b.cfg.WorldSize
	if peer < 0 || peer >= world || peer == me {
		return nil, b.args.Invalid(op, m, "invalid peer rank %d (rank %d of %d)", peer, me, world)
	}
	if tag < 0 || tag > maxTag {
		return nil, &backend.OpError{Op: op.String(), Seq: m.Seq, Rank: me, Backend: Name, Kind: backend.ErrUnsupported,
			Detail: fmt.Sprintf("tag %d: UCC carries user tags from 0 to %d", tag, maxTag)}
	}
	root := me
	var outputs []*tensor.Tensor
	if op == backend.OpRecv {
		root, outputs = peer, tensors
	}
	// The active set lists the root first: start root, stride to the other.
	other := peer + me - root
	p := b.plan(op, m, outputs)
	for _, buf := range bufs {
		if len(buf) == 0 {
			continue
		}
		p.add(C.gu_desc{coll_type: collBcast, root: cu(root), dt: C.uint64_t(dtBytes), src: p.buf(buf), src_count: cu(len(buf)),
			as_start: cu(root), as_stride: C.int64_t(other - root), as_size: 2, tag: C.uint16_t(tag)})
	}
	return b.submit(ctx, p)
}

// MonitoredBarrier implements backend.Backend with Gloo's scheme (rank 0
// arbitrates) over the group's store rather than UCC: a UCC collective
// that hangs, which is what a monitored barrier is for finding, cannot
// hold it back, and the store tells which ranks have arrived. Every other
// rank sets its arrival key and waits for rank 0's verdict; rank 0 waits
// up to the op's timeout for the arrivals, then sets the verdict and names
// the ranks that did not arrive (the first, or all with WaitAllRanks).
func (b *Backend) MonitoredBarrier(ctx context.Context, m backend.Meta, opts backend.MonitoredBarrierOptions) (backend.Work, error) {
	op := backend.OpMonitoredBarrier
	b.lockOut()
	err := b.usableLocked(op, m.Seq)
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}
	w := b.newHandle(op, m)
	w.enq = b.issued(m)
	go func() { w.complete(nil, b.monitored(m, opts.WaitAllRanks)) }()
	return w, nil
}

// monitored runs the monitored barrier of m; see MonitoredBarrier.
func (b *Backend) monitored(m backend.Meta, waitAll bool) error {
	op := backend.OpMonitoredBarrier
	me, n := b.cfg.Rank, b.cfg.WorldSize
	key := func(who string) string { return fmt.Sprintf("ucc/monitored_barrier/%d/%s", m.Seq, who) }
	verdict := key("verdict")
	fail := func(kind error, ranks []int, detail string, cause error) error {
		return &backend.OpError{Op: op.String(), Seq: m.Seq, Rank: me, Backend: Name, Kind: kind, Ranks: ranks, Timeout: m.Timeout,
			Detail: detail, Err: cause}
	}
	to := m.Timeout
	if to <= 0 {
		to = 1 << 62 // no limit, as in Gloo
	}
	if me != 0 {
		if err := b.storeDo(func(ctx context.Context) error { return b.cfg.Store.Set(ctx, key(fmt.Sprint(me)), []byte{1}) }); err != nil {
			return fail(backend.ErrRemote, []int{0}, (&coll.ArbiterError{Rank: me}).Error(), err)
		}
		// Rank 0 answers within its timeout; the margin covers its store
		// round trips.
		var v []byte
		ok, err := b.poll(time.Now().Add(2*min(to, 1<<61)+storeBound), verdict)
		if err == nil && ok {
			err = b.storeDo(func(ctx context.Context) (e error) { v, e = b.cfg.Store.Get(ctx, verdict); return e })
		}
		switch {
		case err != nil:
			return fail(backend.ErrRemote, []int{0}, (&coll.ArbiterError{Rank: me, Err: err}).Error(), err)
		case !ok:
			return fail(backend.ErrTimeout, []int{0}, (&coll.ArbiterError{Rank: me}).Error()+" (no verdict came)", nil)
		case len(v) != 1 || v[0] != 0:
			return fail(backend.ErrRemote, []int{0}, (&coll.ArbiterError{Rank: me}).Error(), nil)
		}
		return nil
	}
	keys := make([]string, 0, n-1)
	for r := 1; r < n; r++ {
		keys = append(keys, key(fmt.Sprint(r)))
	}
	ok, err := b.poll(time.Now().Add(to), keys...)
	var late []int
	if err == nil && !ok {
		for r := 1; r < n; r++ {
			var here bool
			err = b.storeDo(func(ctx context.Context) (e error) { here, e = b.cfg.Store.Check(ctx, key(fmt.Sprint(r))); return e })
			if err != nil {
				break
			}
			if !here {
				late = append(late, r)
			}
		}
	}
	v := []byte{0}
	if err != nil || len(late) > 0 {
		v[0] = 1
	}
	// Best effort: the verdict lets the ranks that did arrive go.
	verr := b.storeDo(func(ctx context.Context) error { return b.cfg.Store.Set(ctx, verdict, v) })
	switch {
	case err != nil:
		return fail(backend.ErrUnavailable, nil, "monitored_barrier: the store failed", err)
	case len(late) > 0:
		if !waitAll {
			late = late[:1]
		}
		return fail(backend.ErrTimeout, late, (&coll.LateRanksError{Ranks: late, Timeout: to}).Error(), nil)
	case verr != nil:
		return fail(backend.ErrUnavailable, nil, "monitored_barrier: the verdict could not be published", verr)
	}
	return nil
}

// storeDo runs one store call bounded by storeBound.
func (b *Backend) storeDo(f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), storeBound)
	defer cancel()
	return f(ctx)
}

// poll checks, without blocking the store's connection (the progress
// goroutine shares it), until every key exists or the deadline passes. It
// fails with ErrAborted or ErrClosed once the backend stops.
func (b *Backend) poll(deadline time.Time, keys ...string) (bool, error) {
	park := 100 * time.Microsecond
	for {
		var ok bool
		if err := b.storeDo(func(ctx context.Context) (e error) { ok, e = b.cfg.Store.Check(ctx, keys...); return e }); err != nil {
			return false, err
		}
		if ok {
			return true, nil
		}
		if !time.Now().Before(deadline) {
			return false, nil
		}
		select {
		case <-b.stop:
			b.lockOut()
			err := b.stopped
			b.mu.Unlock()
			return false, err
		case <-time.After(min(park, time.Until(deadline))):
		}
		park = min(2*park, 10*time.Millisecond)
	}
}
