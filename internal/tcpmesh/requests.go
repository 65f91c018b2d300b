package tcpmesh

import (
	"context"
	"fmt"
	"time"
)

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
	// fp is this rank's fingerprint of the op under tag (BeginOp), which
	// the message's must match.
	fp Fingerprint
}

// newReq takes a receive from the pool, set up for buf from peer under tag.
func (m *Mesh) newReq(peer int, tag uint64, buf []byte) *Req {
	r := m.reqPool.Get().(*Req)
	r.peer, r.tag, r.buf, r.src, r.err, r.next, r.fp = peer, tag, buf, peer, nil, nil, Fingerprint{}
	return r
}

// failNow completes a receive that was never posted with err.
func (r *Req) failNow(err error) *Req {
	r.state = stateClaimed
	r.complete(err)
	return r
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
	if err := r.await(ctx); err != nil {
		return err
	}
	return r.release()
}

// await blocks until r completes or ctx is done. In the latter case a
// receive still posted is withdrawn and recycled, and await returns the
// ctx error; one that a message matched already is waited for, since the
// reader is filling its buffer.
func (r *Req) await(ctx context.Context) error {
	var tick <-chan time.Time
	if r.m.lanes && r.peer >= 0 {
		// A peer that runs this op over the lanes sends nothing here: look
		// at its lane now and then, so that the mismatch fails fast.
		t := time.NewTicker(laneSlice)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-r.done:
			return nil
		case <-tick:
			err := r.m.laneConflict(r.peer, r.tag, r.fp)
			if err == nil {
				continue
			}
			if r.withdraw() {
				r.m.refuseTag(r.tag, err)
				r.m.reqPool.Put(r.reset())
				return err
			}
			<-r.done
			return nil
		case <-ctx.Done():
			if r.withdraw() {
				// The error is made before the Req goes back to the pool,
				// where another receive may take it at once.
				var err error
				if r.peer < 0 {
					err = fmt.Errorf("tcpmesh: receive from any rank, tag %d: %w", r.tag, ctx.Err())
				} else {
					err = fmt.Errorf("tcpmesh: receive from rank %d, tag %d: %w", r.peer, r.tag, ctx.Err())
				}
				r.m.reqPool.Put(r.reset())
				return err
			}
			<-r.done
			return nil
		}
	}
}

// WaitSource is Wait for a receive from any rank: it also returns the
// source.
func (r *Req) WaitSource(ctx context.Context) (int, error) {
	if err := r.await(ctx); err != nil {
		return -1, err
	}
	src := r.src
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
		removeFrom(m.posted, key{r.peer, r.tag}, r)
	} else {
		removeFrom(m.anyPosted, r.tag, r)
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
