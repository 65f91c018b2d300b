package cpupool

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/reduce"
	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/tensor"
)

// The lane fast path. When every peer shares this host (and memory), an
// allreduce of up to laneBytes runs over the mesh's lanes
// (tcpmesh.HoldLanes, LaneSendHeld, LaneRecvHeld; coll.AllreduceLanes): recursive doubling
// whose receives reduce straight out of shared memory on the op's own
// goroutine, which is the caller's when it waits for the op (work.Wait
// runs the job inline), so a small allreduce crosses no goroutine and no
// system call. Lane ops are serialized in issue order by a ticket taken
// with the tag, since the lanes carry one op's messages at a time; every
// rank decides the same way (the decision depends on the op and its size
// only), and a rank that decided otherwise because its size differs is
// caught (laneCheck sees its ring message and names it).

// laneBytes is the largest allreduce that takes the lanes (Options.LaneBytes;
// beyond rsagMin at 3 or more ranks, a reduce-scatter and allgather),
// worked out once at set-up into b.lanes, which every op reads. Beyond
// it, direct reads (or the ring) move fewer bytes than recursive
// doubling. Two ranks exchange the whole buffer once either way, and
// there the lanes win at every size: their copies into shared memory
// stream past the cache (shm's copyNT), so the peer reads memory rather
// than lines another core holds modified, where the direct reads pin and
// copy the peer's pages one by one in the kernel. On the dev machine,
// 2 ranks, 4 and 16 MiB took 282-303 and 1351-1361 µs over the lanes
// against 405-1018 and 3337-3455 by direct reads (docs/perf.md, issue 17,
// fourteenth pass).
func (b *Backend) laneBytes() int {
	if b.opts.LaneBytes > 0 {
		return b.opts.LaneBytes
	}
	if b.cfg.WorldSize == 2 {
		return defaultLaneBytes2
	}
	lanes := min(b.comm.Small, b.opts.SmallBytes)
	if b.mesh.Oversubscribed() {
		// With more ranks than cores, the lanes beat the direct reads at
		// every size once their copies streamed past the cache: 4 ranks
		// on 2 cores, 4 rounds taking turns, 2, 4 and 16 MiB took
		// 887-1148, 1704-2532 and 8432-10669 µs against 1300-1498,
		// 2384-3175 and 13520-16677 (docs/perf.md, issue 17, fourteenth
		// pass). With a core per rank, the direct reads won or tied at
		// 512 KiB and 1 MiB, and keep everything beyond SmallBytes.
		return defaultLaneBytesOversubscribed
	}
	return lanes
}

// defaultLaneBytesOversubscribed is laneBytes' default at 3 or more
// ranks when they outnumber the host's cores: every size.
const defaultLaneBytesOversubscribed = math.MaxInt

// defaultLaneBytes2 is laneBytes' default at 2 ranks: every size.
const defaultLaneBytes2 = math.MaxInt

// rsagMin is the size beyond which a lane allreduce of 3 or more ranks is
// a reduce-scatter and allgather (coll.AllreduceLanesRSAG) rather than
// recursive doubling: it copies and reduces less (1.5 and 0.75 buffers a
// rank at 4 ranks, against 2 and 2), which counts when ranks share
// cores; recursive doubling sends fewer messages, which counts below. At
// 4 ranks on 2 cores, 256 KiB took 134-180 µs (median 165) against
// recursive doubling's 181-303 (208) and direct reads' 164-218 (170)
// (docs/perf.md).
const rsagMin = 128 << 10

// rsagFor reports whether a lane allreduce of n bytes is a reduce-scatter
// and allgather: 3 or more ranks, beyond rsagMin (in rounds beyond
// RSAGMax a block: coll.AllreduceLanesRSAG).
func (b *Backend) rsagFor(n int) bool {
	return b.cfg.WorldSize >= 3 && n > rsagMin
}

// lanesFor reports whether an allreduce of n bytes takes the lanes.
func (b *Backend) lanesFor(n int) bool {
	return b.cfg.WorldSize > 1 && b.mesh.Lanes() && n > 0 && n <= b.lanes
}

// directFor reports whether an allreduce of n bytes reads its peers'
// buffers in place (coll.AllreduceDirect): beyond the lanes' size, on a
// host whose ranks may read each other's memory.
func (b *Backend) directFor(n int) bool {
	return b.cfg.WorldSize > 1 && b.mesh.Direct() && n > b.lanes
}

// rawLanesFor reports whether a direct allreduce of n bytes sends its raw
// half over the lanes (Options.RawLaneBytes; 2 ranks only, where it was
// measured).
func (b *Backend) rawLanesFor(n int) bool {
	return b.cfg.WorldSize == 2 && b.opts.RawLaneBytes > 0 && n >= b.opts.RawLaneBytes
}

// laneOp is one lane op's view of the mesh: its tag and fingerprint bound
// to coll.Lanes' calls.
type laneOp struct {
	b   *Backend
	tag uint64
	fp  tcpmesh.Fingerprint
}

func (l *laneOp) Rank() int { return l.b.cfg.Rank }
func (l *laneOp) Size() int { return l.b.cfg.WorldSize }

// Send, Recv and RecvInto run within runLane's HoldLanes.
func (l *laneOp) Send(ctx context.Context, peer int, buf []byte) error {
	return l.b.mesh.LaneSendHeld(ctx, peer, l.tag, l.fp, buf)
}

func (l *laneOp) ReadPeer(peer int, dst []byte, addr uintptr) error {
	return l.b.mesh.ReadPeer(peer, dst, addr)
}

func (l *laneOp) Expect(ctx context.Context, peer, n int) error {
	return l.b.mesh.LaneExpect(ctx, peer, func() error { return l.b.mesh.LaneCheck(peer, l.tag, l.fp, n) })
}

func (l *laneOp) Recv(ctx context.Context, peer int, n, unit int, fn func(off int, src []byte)) error {
	return l.b.mesh.LaneRecvHeld(ctx, peer, l.tag, l.fp, n, unit, fn, func() error { return l.b.mesh.LaneCheck(peer, l.tag, l.fp, n) })
}

func (l *laneOp) RecvInto(ctx context.Context, peer int, buf []byte, unit int, fn func(dst, src []byte)) error {
	// The closures do not escape (LaneRecvHeld only calls them): no allocation.
	return l.b.mesh.LaneRecvHeld(ctx, peer, l.tag, l.fp, len(buf), unit, func(off int, src []byte) { fn(buf[off:off+len(src)], src) },
		func() error { return l.b.mesh.LaneCheck(peer, l.tag, l.fp, len(buf)) })
}

// BoardPost and BoardRecvInto (coll.Board) run within runLane's HoldLanes.
func (l *laneOp) BoardPost(ctx context.Context, buf []byte) error {
	return l.b.mesh.BoardPostHeld(ctx, l.tag, l.fp, buf)
}

func (l *laneOp) BoardRecvInto(ctx context.Context, peer int, buf []byte, fn func(dst, src []byte)) error {
	return l.b.mesh.BoardRecvHeld(ctx, peer, l.tag, l.fp, buf, fn)
}

// laneTurn waits until the lane op with ticket t may run: every earlier
// one has finished or given up. Workers pop jobs in issue order, so the
// earlier ones are running already and the wait is short: it polls a
// little, then parks until laneEnd broadcasts (a sleep would oversleep:
// timers on a busy machine fire tens of microseconds late, and ops issued
// back to back wait here one after another).
func (b *Backend) laneTurn(ctx context.Context, t uint64) error {
	for i := 0; i < 64; i++ {
		if b.laneDone.Load() == t {
			return nil
		}
		runtime.Gosched()
	}
	for {
		b.laneMu.Lock()
		if b.laneDone.Load() == t {
			b.laneMu.Unlock()
			return nil
		}
		if b.laneWake == nil {
			b.laneWake = make(chan struct{})
		}
		ch := b.laneWake
		b.laneMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			b.laneGiveUp(t)
			b.q.kick()
			return fmt.Errorf("cpupool: waiting for the earlier lane ops: %w", ctx.Err())
		}
	}
}

// laneEnd passes the turn on after the lane op whose turn it was, past
// the tickets that gave up waiting, and wakes the parked waiters.
func (b *Backend) laneEnd() {
	b.laneMu.Lock()
	defer b.laneMu.Unlock()
	d := b.laneDone.Load() + 1
	for b.laneSkip[d] {
		delete(b.laneSkip, d)
		d++
	}
	b.laneDone.Store(d)
	if b.laneWake != nil {
		close(b.laneWake)
		b.laneWake = nil
	}
}

// laneGiveUp gives ticket t's turn up without running: if it has come
// meanwhile it is passed on, else it will be skipped.
func (b *Backend) laneGiveUp(t uint64) {
	b.laneMu.Lock()
	if b.laneDone.Load() != t {
		if b.laneSkip == nil {
			b.laneSkip = map[uint64]bool{}
		}
		b.laneSkip[t] = true
		b.laneMu.Unlock()
		return
	}
	b.laneMu.Unlock()
	b.laneEnd()
}

// allreduceLanes issues an allreduce that takes the lanes.
// Its buffers and reduction ride in the job (laneRun nil: runLane calls
// runAllreduceLanes), so that it costs no closure.
func (b *Backend) allreduceLanes(ctx context.Context, m backend.Meta, fp tcpmesh.Fingerprint, tensors []*tensor.Tensor, bufs [][]byte, k reduce.Kernel) (backend.Work, error) {
	return b.collectiveLane(ctx, backend.OpAllreduce, m, fp, tensors, nil, bufs, k)
}

// Flat lane allreduces (coll.AllreduceLanesFlat): one exchange with every
// peer rather than recursive doubling's log2(n) steps, for buffers of up
// to flatBytes in worlds of up to flatRanks, when more ranks than cores
// share the host (Backend.flat; every rank of the host sees the same).
// 4 ranks on 2 cores at 8 B: docs/perf.md, issue 17.
// With a board (tcpmesh.Mesh.Board: 3 to 8 ranks), each rank posts its
// buffer there once rather than sending it to every peer
// (coll.AllreduceBoard).
const (
	flatBytes = tcpmesh.BoardMax
	flatRanks = tcpmesh.BoardRanks
)

// flatFor reports whether a lane allreduce of n bytes takes one exchange.
func (b *Backend) flatFor(n int) bool {
	return b.flat && n <= flatBytes && b.cfg.WorldSize <= flatRanks
}

// runAllreduceLanes is the run of a lane allreduce of bufs with k.
func (b *Backend) runAllreduceLanes(ctx context.Context, lo *laneOp, bufs [][]byte, k reduce.Kernel) error {
	buf := combineLocal(k, bufs, 0)
	if len(buf) < streamMin || b.opts.LaneCopies != CopiesAuto {
		// Small, or a fixed way (set on the mesh at set-up).
		if err := b.laneAlgo(ctx, lo, buf, k); err != nil {
			return err
		}
	} else {
		// A large one: its copies cached or streamed, as the ops of its
		// size before it found faster (stream.go).
		class, stream := b.streams.pick(len(buf))
		b.mesh.StreamLanes(stream)
		start := time.Now()
		if err := b.laneAlgo(ctx, lo, buf, k); err != nil {
			return err
		}
		b.streams.observe(class, stream, time.Since(start))
	}
	b.post(k, buf, b.cfg.WorldSize*len(bufs))
	for _, o := range bufs[1:] {
		copy(o, buf)
	}
	return nil
}

// laneAlgo runs the lane allreduce of buf (its local part combined,
// its pre-scaling done) with the algorithm its size and the group take;
// the lane op's turn and the lanes' hold are the caller's.
func (b *Backend) laneAlgo(ctx context.Context, lo *laneOp, buf []byte, k reduce.Kernel) error {
	switch {
	case b.flatFor(len(buf)) && b.board:
		return coll.AllreduceBoard(ctx, lo, buf, k)
	case b.flatFor(len(buf)):
		if len(b.scratch) < len(buf) {
			b.scratch = make([]byte, flatBytes)
		}
		return coll.AllreduceLanesFlat(ctx, lo, buf, k, b.scratch)
	case b.rsagFor(len(buf)):
		return coll.AllreduceLanesRSAG(ctx, lo, buf, k)
	default:
		return coll.AllreduceLanes(ctx, lo, buf, k)
	}
}

// allreduceDirect issues an allreduce that reads its peers' buffers in
// place; it is a lane op (its addresses and barriers go over the lanes).
func (b *Backend) allreduceDirect(ctx context.Context, m backend.Meta, fp tcpmesh.Fingerprint, tensors []*tensor.Tensor, bufs [][]byte, k reduce.Kernel) (backend.Work, error) {
	return b.collectiveLane(ctx, backend.OpAllreduce, m, fp, tensors, func(ctx context.Context, lo *laneOp) error {
		buf := combineLocal(k, bufs, 0)
		if b.rawLanesFor(len(buf)) {
			if err := coll.AllreduceDirectLanes(ctx, lo, buf, k); err != nil {
				return err
			}
		} else {
			scratch := b.pool.Get(coll.DirectPiece(b.cfg.WorldSize))
			defer b.pool.Put(scratch)
			if err := coll.AllreduceDirect(ctx, lo, buf, k, scratch); err != nil {
				return err
			}
		}
		b.post(k, buf, b.cfg.WorldSize*len(bufs))
		for _, o := range bufs[1:] {
			copy(o, buf)
		}
		return nil
	}, nil, reduce.Kernel{})
}

// collectiveLane is collective for a lane op: the ticket is taken with
// the tag, and runJob runs it in its turn (runLane). With run nil, it is
// a lane allreduce of bufs with k (runAllreduceLanes).
func (b *Backend) collectiveLane(ctx context.Context, op backend.Op, m backend.Meta, fp tcpmesh.Fingerprint, outputs []*tensor.Tensor, run func(ctx context.Context, lo *laneOp) error, bufs [][]byte, k reduce.Kernel) (backend.Work, error) {
	// One hold of mu checks the backend, takes the Work (from the slab
	// for a small allreduce), the tag and the ticket together (so that
	// lane ops' turns follow their tags) and tracks the work: a small
	// op's issue takes each lock it needs once.
	b.mu.Lock()
	if err := b.usableLocked(op, m.Seq); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	if run == nil && len(bufs) == 1 {
		if h, ok := b.deferLane(ctx, op, m, fp, outputs, bufs[0], k); ok {
			return h, nil
		}
	}
	var h0 *work
	if run == nil && len(bufs) == 1 && len(bufs[0]) <= slabBytes {
		h0 = b.works.get()
	} else {
		h0 = new(work)
	}
	j := b.newJobWork(ctx, op, m, outputs, nil, h0)
	// Copied: the caller's bufs may be its stack (Allreduce's local).
	j.lane, j.fp, j.laneRun, j.k = true, fp, run, k
	j.bufs = append(j.buf1[:0], bufs...)
	j.tag = b.issued.Add(1)
	j.ticket = b.laneIssued
	b.laneIssued++
	b.trackLocked(j.w)
	b.mu.Unlock()
	h := j.h // read before the push: once queued, the job may run, complete and be reused
	if !b.q.push(j) {
		j.cancel()
		return nil, b.usable(op, m.Seq)
	}
	return h, nil
}

// runLane runs the lane op j in its turn, with its view of the lanes
// (j.lo, in the job so that it costs no allocation of its own).
func (b *Backend) runLane(ctx context.Context, j *job) error {
	if err := b.laneTurn(ctx, j.ticket); err != nil {
		return err
	}
	defer b.laneEnd()
	// One read lock for all of the op's lane messages (tcpmesh.HoldLanes).
	b.mesh.HoldLanes()
	defer b.mesh.ReleaseLanes()
	j.lo = laneOp{b: b, tag: j.tag, fp: j.fp}
	if j.laneRun == nil {
		return b.runAllreduceLanes(ctx, &j.lo, j.bufs, j.k)
	}
	return j.laneRun(ctx, &j.lo)
}

// laneReady is the queue's ready: a lane op may be popped only in its
// turn, so that a worker never waits (parked) for the one before it,
// which the worker running that one takes next itself (runLanes).
func (b *Backend) laneReady(j *job) bool { return !j.lane || b.laneDone.Load() == j.ticket }

// runLanes runs, after a lane op, the lane ops that follow it at the
// head of the queue on this worker: consecutive lane ops then cost no
// hand-off between workers (a wake-up each, several microseconds on a
// busy machine).
func (b *Backend) runLanes() {
	for {
		j := b.q.takeReady() // lane ops only
		if j == nil {
			return
		}
		b.runJob(j)
	}
}

// takeReady removes the head job if it is a lane op in its turn.
func (q *queue) takeReady() *job {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed != nil || q.head == len(q.items) || !q.items[q.head].lane || !q.headReady() {
		if q.closed == nil && q.head < len(q.items) && q.idle > 0 && q.headReady() {
			q.cond.Signal() // another kind of job: a parked worker takes it
		}
		return nil
	}
	return q.popHeadLocked()
}

// takeLane removes the head job if it is a lane op in its turn whose
// ticket is at most t and that inline allows the caller to run.
func (q *queue) takeLane(t uint64, inline func(*job) bool) *job {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed != nil || q.head == len(q.items) {
		return nil
	}
	h := q.items[q.head]
	if !h.lane || h.ticket > t || !q.headReady() || !inline(h) {
		return nil
	}
	return q.popHeadLocked()
}

// kick wakes a parked worker if the head job is ready now and wants one:
// a lane op only when a goroutine waits for it (help marks it), since
// else its caller runs it when it waits, and a worker woken for it would
// cost a wake-up and race that caller for a core (the nudge wakes one
// if nobody comes).
func (q *queue) kick() { q.wakeHead(false) }

// kickReady wakes a parked worker if the head job is ready now, whether
// or not a goroutine waits for it: after a deferred op, whose runner
// returns to its caller rather than run the ops behind.
func (q *queue) kickReady() { q.wakeHead(true) }

// wakeHead is kick (unwaited false) and kickReady (true).
func (q *queue) wakeHead(unwaited bool) {
	if q.n.Load() == 0 {
		// Nothing queued: a job pushed from now on is push's to wake
		// for, and one that a waiter pushed before it looked is counted
		// (n is written before push returns).
		return
	}
	q.mu.Lock()
	if q.closed == nil && q.head < len(q.items) && q.idle > 0 && q.headReady() {
		if h := q.items[q.head]; unwaited || !h.lane || h.waited.Load() {
			q.cond.Signal()
		}
	}
	q.mu.Unlock()
}
