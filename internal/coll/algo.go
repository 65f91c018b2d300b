package coll

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"sort"
	"strings"
	"time"

	"github.com/gocoll/gocoll/internal/reduce"
)

// Comm is a transport plus the tuning of the algorithms that run over it.
type Comm struct {
	T Transport
	// Pool supplies scratch buffers; nil means allocate.
	Pool *Pool
	// Segment is the size in bytes of the pieces large messages are cut
	// into, so that sending, receiving and reducing overlap (default 1 MiB, as Gloo's maxSegmentSize).
	Segment int
	// Window is how many segment receives are posted ahead (default 4).
	Window int
	// Small is the size in bytes up to which allreduce uses recursive
	// doubling instead of the ring (default 256 KiB).
	Small int
}

// Defaults of Comm.
const (
	DefaultSegment = 1 << 20
	DefaultWindow  = 4
	DefaultSmall   = 256 << 10
)

func (c *Comm) seg(elem int) int {
	s := c.Segment
	if s <= 0 {
		s = DefaultSegment
	}
	if elem > 1 {
		s -= s % elem
		if s == 0 {
			s = elem
		}
	}
	return s
}

func (c *Comm) window() int {
	if c.Window <= 0 {
		return DefaultWindow
	}
	return c.Window
}

func (c *Comm) get(n int) []byte {
	if c.Pool == nil {
		return make([]byte, n)
	}
	return c.Pool.Get(n)
}

func (c *Comm) put(b []byte) {
	if c.Pool != nil {
		c.Pool.Put(b)
	}
}

func mod(a, n int) int { return ((a % n) + n) % n }

// SplitEven cuts buf into n blocks of whole elements whose sizes differ by
// at most one element, the first ones larger.
func SplitEven(buf []byte, n, elem int) [][]byte {
	count := len(buf) / elem
	base, extra := count/n, count%n
	out := make([][]byte, n)
	off := 0
	for i := range out {
		l := base
		if i < extra {
			l++
		}
		out[i] = buf[off : off+l*elem]
		off += l * elem
	}
	return out
}

// Allreduce reduces buf across ranks in place with k.Combine. It does not
// apply k.Pre or k.Post; the caller does, so that it can scale a copy.
// Every rank ends with bit-identical bytes.
func Allreduce(ctx context.Context, c *Comm, tag uint64, buf []byte, k reduce.Kernel) error {
	n := c.T.Size()
	if n == 1 || len(buf) == 0 {
		return nil
	}
	small := c.Small
	if small <= 0 {
		small = DefaultSmall
	}
	if len(buf) <= small || len(buf)/k.ElemSize < n {
		return allreduceRD(ctx, c, tag, buf, k)
	}
	blocks := SplitEven(buf, n, k.ElemSize)
	if err := ring(ctx, c, tag, blocks, -1, &k, true); err != nil {
		return err
	}
	return ring(ctx, c, tag, blocks, 0, nil, false)
}

// SizeError is a collective's failure because a peer passed a buffer of
// another size than this rank's.
type SizeError struct {
	Rank, Bytes         int // this rank and its size
	PeerRank, PeerBytes int
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("rank %d passed %d bytes, rank %d passed %d bytes", e.PeerRank, e.PeerBytes, e.Rank, e.Bytes)
}

// sizeCheck is the exchange of total sizes that precedes a ring's data: each
// rank tells its right neighbour its total and checks its left
// neighbour's. Without it, ranks whose sizes differ but cut into segments
// of equal length would pair up the wrong messages: one rank would finish
// with garbage and another wait forever. Small messages need no check: a
// mismatch there shows as a message of the wrong length, which the
// transport fails. Cost: one 8-byte message per ring op, sent with the
// first data and checked before the first data is used.
type sizeCheck struct {
	q            Request
	mine, theirs [8]byte
	total        int
}

func (s *sizeCheck) start(ctx context.Context, t Transport, tag uint64, total int) error {
	n, r := t.Size(), t.Rank()
	s.total = total
	binary.LittleEndian.PutUint64(s.mine[:], uint64(total))
	s.q = t.Irecv(mod(r-1, n), tag, s.theirs[:])
	if err := t.Send(ctx, mod(r+1, n), tag, s.mine[:]); err != nil {
		s.q.Cancel()
		s.q = nil
		return err
	}
	return nil
}

// finish waits for the left neighbour's size and compares it.
func (s *sizeCheck) finish(ctx context.Context, t Transport) error {
	q := s.q
	s.q = nil
	if err := q.Wait(ctx); err != nil {
		return err
	}
	if got := int(binary.LittleEndian.Uint64(s.theirs[:])); got != s.total {
		return &SizeError{Rank: t.Rank(), Bytes: s.total, PeerRank: mod(t.Rank()-1, t.Size()), PeerBytes: got}
	}
	return nil
}

// cancel withdraws the size receive if it is still posted.
func (s *sizeCheck) cancel() {
	if s.q != nil {
		s.q.Cancel()
		s.q = nil
	}
}

// allreduceRD is recursive doubling. With a world size that is not a power
// of two, the first 2*rem ranks fold pairwise into rem ranks first and get
// the result back at the end (MPICH's scheme).
func allreduceRD(ctx context.Context, c *Comm, tag uint64, buf []byte, k reduce.Kernel) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	p := 1 << (bits.Len(uint(n)) - 1)
	rem := n - p
	scratch := c.get(len(buf))
	defer c.put(scratch)
	newrank := r - rem
	if r < 2*rem {
		if r%2 == 0 {
			if err := t.Send(ctx, r+1, tag, buf); err != nil {
				return err
			}
			newrank = -1
		} else {
			if err := t.Irecv(r-1, tag, scratch).Wait(ctx); err != nil {
				return err
			}
			k.Combine(buf, scratch)
			newrank = r / 2
		}
	}
	if newrank >= 0 {
		for mask := 1; mask < p; mask <<= 1 {
			nd := newrank ^ mask
			dst := nd + rem
			if nd < rem {
				dst = nd*2 + 1
			}
			q := t.Irecv(dst, tag, scratch)
			if err := t.Send(ctx, dst, tag, buf); err != nil {
				q.Cancel()
				return err
			}
			if err := q.Wait(ctx); err != nil {
				return err
			}
			k.Combine(buf, scratch)
		}
	}
	if r < 2*rem {
		if r%2 == 0 {
			return t.Irecv(r+1, tag, buf).Wait(ctx)
		}
		return t.Send(ctx, r-1, tag, buf)
	}
	return nil
}

// ReduceScatter reduces, in place, the blocks of a buffer that every rank
// holds in full, leaving the fully reduced blocks[r] on rank r. blocks may
// have different sizes (uneven reduce-scatter); every rank passes the same
// sizes. It does not apply k.Pre or k.Post.
func ReduceScatter(ctx context.Context, c *Comm, tag uint64, blocks [][]byte, k reduce.Kernel) error {
	if c.T.Size() == 1 {
		return nil
	}
	return ring(ctx, c, tag, blocks, -1, &k, true)
}

func total(blocks [][]byte) int {
	n := 0
	for _, b := range blocks {
		n += len(b)
	}
	return n
}

// Allgather fills every blocks[i] from rank i, given that each rank has
// filled its own blocks[r]. Blocks may differ in size; every rank passes
// the same sizes.
func Allgather(ctx context.Context, c *Comm, tag uint64, blocks [][]byte) error {
	if c.T.Size() == 1 {
		return nil
	}
	return ring(ctx, c, tag, blocks, 0, nil, true)
}

type ringItem struct {
	blk, off, len int
	dep           int // the receive a send waits for; -1 for none
}

// ring runs n-1 steps around the ring: at step s rank r sends block
// (r-s+a) to its right and receives block (r-s-1+a) from its left. With a
// kernel it receives into scratch slots and combines into the block (the
// reduce-scatter phase, a = -1, leaving block r complete on rank r);
// without, it receives straight into the block (the all-gather phase,
// a = 0). Blocks are cut into segments; the send of a segment at step s+1
// follows as soon as that segment has been received at step s, so sending,
// receiving and reducing overlap.
//
// With check, the ring first exchanges total sizes (sizeCheck) and fails
// with a *SizeError before it uses any received data if they differ.
func ring(ctx context.Context, c *Comm, tag uint64, blocks [][]byte, a int, k *reduce.Kernel, check bool) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	right, left := mod(r+1, n), mod(r-1, n)
	elem := 1
	if k != nil {
		elem = k.ElemSize
	}
	seg := c.seg(elem)
	var sends, recvs []ringItem
	recvStart := make([]int, n)
	for s := 0; s < n-1; s++ {
		sb := mod(r-s+a, n)
		rb := mod(r-s-1+a, n)
		for j, off := 0, 0; off < len(blocks[sb]); j, off = j+1, off+seg {
			dep := -1
			if s > 0 {
				dep = recvStart[s-1] + j
			}
			sends = append(sends, ringItem{sb, off, min(seg, len(blocks[sb])-off), dep})
		}
		recvStart[s] = len(recvs)
		for off := 0; off < len(blocks[rb]); off += seg {
			recvs = append(recvs, ringItem{rb, off, min(seg, len(blocks[rb])-off), -1})
		}
	}
	w := c.window()
	var slots []byte
	rr, direct := t.(ReduceReceiver)
	direct = direct && k != nil
	if k != nil && !direct {
		slots = c.get(w * seg)
		defer c.put(slots)
	}
	var sc sizeCheck
	if check {
		// Posted before the data receives: messages from one peer under
		// one tag match in posting order, so the size comes first.
		if err := sc.start(ctx, t, tag, total(blocks)); err != nil {
			return err
		}
		defer sc.cancel()
	}
	var pending reqs
	defer pending.cancel()
	posted, done, si := 0, 0, 0
	post := func() {
		for posted < len(recvs) && (k == nil || posted-done < w) {
			it := recvs[posted]
			switch {
			case direct: // combined into the block as it arrives
				pending.push(rr.IrecvReduce(left, tag, blocks[it.blk][it.off:it.off+it.len], k.ElemSize, k.Combine))
			case k != nil:
				slot := posted % w
				pending.push(t.Irecv(left, tag, slots[slot*seg:slot*seg+it.len]))
			default:
				pending.push(t.Irecv(left, tag, blocks[it.blk][it.off:it.off+it.len]))
			}
			posted++
		}
	}
	post()
	for done < len(recvs) || si < len(sends) {
		for si < len(sends) && sends[si].dep < done && si-done < w {
			it := sends[si]
			if err := t.Send(ctx, right, tag, blocks[it.blk][it.off:it.off+it.len]); err != nil {
				return err
			}
			si++
		}
		if done < len(recvs) {
			if sc.q != nil {
				if err := sc.finish(ctx, t); err != nil {
					return err
				}
			}
			if err := pending.wait(ctx); err != nil {
				return err
			}
			if k != nil && !direct {
				it := recvs[done]
				slot := done % w
				k.Combine(blocks[it.blk][it.off:it.off+it.len], slots[slot*seg:slot*seg+it.len])
			}
			done++
			post()
		}
	}
	return nil
}

// lowbit returns the lowest set bit of v, or the power of two at or above
// n for v == 0 (the root's subtree is everything).
func lowbit(v, n int) int {
	if v == 0 {
		return 1 << bits.Len(uint(n-1))
	}
	return v & -v
}

// Broadcast copies root's buf to every rank's buf along a binomial tree,
// segment by segment, so that inner ranks forward a segment while the next
// one arrives.
func Broadcast(ctx context.Context, c *Comm, tag uint64, buf []byte, root int) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	if n == 1 || len(buf) == 0 {
		return nil
	}
	vr := mod(r-root, n)
	lb := lowbit(vr, n)
	seg := c.seg(1)
	var pending reqs
	defer pending.cancel()
	if vr != 0 {
		parent := mod(vr-lb+root, n)
		for off := 0; off < len(buf); off += seg {
			pending.push(t.Irecv(parent, tag, buf[off:min(off+seg, len(buf))]))
		}
	}
	for off := 0; off < len(buf); off += seg {
		if vr != 0 {
			if err := pending.wait(ctx); err != nil {
				return err
			}
		}
		for mask := lb >> 1; mask > 0; mask >>= 1 {
			if vr+mask < n {
				if err := t.Send(ctx, mod(vr+mask+root, n), tag, buf[off:min(off+seg, len(buf))]); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Reduce combines every rank's buf into root's buf along a binomial tree,
// segment by segment. Other ranks' buffers are clobbered (their partial
// results). It does not apply k.Pre or k.Post.
func Reduce(ctx context.Context, c *Comm, tag uint64, buf []byte, k reduce.Kernel, root int) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	if n == 1 || len(buf) == 0 {
		return nil
	}
	vr := mod(r-root, n)
	var children []int
	parent := -1
	for mask := 1; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			parent = mod(vr-mask+root, n)
			break
		}
		if vr+mask < n {
			children = append(children, mod(vr+mask+root, n))
		}
	}
	seg := c.seg(k.ElemSize)
	nseg := (len(buf) + seg - 1) / seg
	total := nseg * len(children)
	w := c.window()
	var slots []byte
	if total > 0 {
		slots = c.get(w * seg)
		defer c.put(slots)
	}
	var pending reqs
	defer pending.cancel()
	posted, done := 0, 0
	piece := func(i int) []byte { // segment of receive i
		off := (i / max(len(children), 1)) * seg
		return buf[off:min(off+seg, len(buf))]
	}
	post := func() {
		for posted < total && posted-done < w {
			p := piece(posted)
			slot := posted % w
			pending.push(t.Irecv(children[posted%len(children)], tag, slots[slot*seg:slot*seg+len(p)]))
			posted++
		}
	}
	post()
	for j := 0; j < nseg; j++ {
		for range children {
			if err := pending.wait(ctx); err != nil {
				return err
			}
			p := piece(done)
			slot := done % w
			k.Combine(p, slots[slot*seg:slot*seg+len(p)])
			done++
			post()
		}
		if parent >= 0 {
			off := j * seg
			if err := t.Send(ctx, parent, tag, buf[off:min(off+seg, len(buf))]); err != nil {
				return err
			}
		}
	}
	return nil
}

// Gather collects every rank's in (all of one size) into out on root: out
// has Size blocks of len(in) bytes, in rank order, and is only used on
// root. Inner ranks of the binomial tree forward their subtree's blocks in
// one message.
func Gather(ctx context.Context, c *Comm, tag uint64, in []byte, out []byte, root int) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	B := len(in)
	if n == 1 {
		copy(out, in)
		return nil
	}
	vr := mod(r-root, n)
	sub := min(lowbit(vr, n), n-vr)
	tmp := out
	if vr != 0 || root != 0 {
		tmp = c.get(sub * B)
		defer c.put(tmp)
	}
	copy(tmp, in)
	var pending reqs
	defer pending.cancel()
	for mask := 1; mask < n && vr&mask == 0; mask <<= 1 {
		if child := vr + mask; child < n {
			cnt := min(mask, n-child)
			pending.push(t.Irecv(mod(child+root, n), tag, tmp[mask*B:(mask+cnt)*B]))
		}
	}
	for len(pending.q) > 0 {
		if err := pending.wait(ctx); err != nil {
			return err
		}
	}
	if vr != 0 {
		return t.Send(ctx, mod(vr-lowbit(vr, n)+root, n), tag, tmp[:sub*B])
	}
	if root != 0 { // rotate from relative to absolute rank order
		for v := 0; v < n; v++ {
			copy(out[mod(v+root, n)*B:], tmp[v*B:(v+1)*B])
		}
	}
	return nil
}

// Scatter sends block i of root's in (Size blocks of len(out) bytes, rank
// order) to rank i's out, along a binomial tree.
func Scatter(ctx context.Context, c *Comm, tag uint64, in []byte, out []byte, root int) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	B := len(out)
	if n == 1 {
		copy(out, in)
		return nil
	}
	vr := mod(r-root, n)
	lb := lowbit(vr, n)
	sub := min(lb, n-vr)
	var tmp []byte
	switch {
	case vr == 0 && root == 0:
		tmp = in
	case vr == 0:
		tmp = c.get(n * B)
		defer c.put(tmp)
		for v := 0; v < n; v++ {
			copy(tmp[v*B:(v+1)*B], in[mod(v+root, n)*B:])
		}
	case sub == 1:
		tmp = out // a leaf receives its own block only
	default:
		tmp = c.get(sub * B)
		defer c.put(tmp)
	}
	if vr != 0 {
		if err := t.Irecv(mod(vr-lb+root, n), tag, tmp[:sub*B]).Wait(ctx); err != nil {
			return err
		}
	}
	for mask := lb >> 1; mask > 0; mask >>= 1 {
		if child := vr + mask; child < n {
			cnt := min(mask, n-child)
			if err := t.Send(ctx, mod(child+root, n), tag, tmp[mask*B:(mask+cnt)*B]); err != nil {
				return err
			}
		}
	}
	if sub != 1 || vr == 0 {
		copy(out, tmp[:B])
	}
	return nil
}

// Alltoall sends in[i] to rank i and receives rank i's message into out[i]
// by pairwise exchange: at step s rank r sends to r+s and receives from
// r-s. Sizes may differ per pair; both sides pass matching sizes.
func Alltoall(ctx context.Context, c *Comm, tag uint64, out, in [][]byte) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	copy(out[r], in[r])
	var pending reqs
	defer pending.cancel()
	for s := 1; s < n; s++ {
		src := mod(r-s, n)
		pending.push(t.Irecv(src, tag, out[src]))
	}
	for s := 1; s < n; s++ {
		dst := mod(r+s, n)
		if err := t.Send(ctx, dst, tag, in[dst]); err != nil {
			return err
		}
	}
	for len(pending.q) > 0 {
		if err := pending.wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Barrier returns once every rank has entered it: a dissemination barrier
// of empty messages, ceil(log2 n) rounds.
func Barrier(ctx context.Context, c *Comm, tag uint64) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	for k := 1; k < n; k <<= 1 {
		q := t.Irecv(mod(r-k, n), tag, nil)
		if err := t.Send(ctx, mod(r+k, n), tag, nil); err != nil {
			q.Cancel()
			return err
		}
		if err := q.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// LateRanksError is the monitored barrier's failure on rank 0: the ranks
// that did not reach the barrier within the timeout.
type LateRanksError struct {
	Ranks   []int
	Timeout time.Duration
}

func (e *LateRanksError) Error() string {
	ms := e.Timeout.Milliseconds()
	if len(e.Ranks) == 1 {
		return fmt.Sprintf("[Rank 0]: Rank %d failed to pass monitoredBarrier in %d ms", e.Ranks[0], ms)
	}
	s := make([]string, len(e.Ranks))
	for i, r := range e.Ranks {
		s[i] = fmt.Sprint(r)
	}
	return fmt.Sprintf("[Rank 0]: Ranks %s failed to pass monitoredBarrier in %d ms", strings.Join(s, ", "), ms)
}

// ArbiterError is a non-zero rank's monitored-barrier failure: rank 0
// reported that another rank failed, or could not be heard from.
type ArbiterError struct {
	Rank int
	Err  error
}

func (e *ArbiterError) Error() string {
	msg := fmt.Sprintf("Rank %d successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.", e.Rank)
	if e.Err != nil {
		msg += " " + e.Err.Error()
	}
	return msg
}

func (e *ArbiterError) Unwrap() error { return e.Err }

// MonitoredBarrier is Gloo's monitored barrier: every other rank reports to
// rank 0, which waits at most timeout for them and then answers each one
// with the verdict, so that all ranks pass or all fail. On rank 0 a failure
// is a *LateRanksError naming the first late rank, or every late rank with
// waitAll. Other ranks wait for the verdict until ctx is done and fail with
// an *ArbiterError.
func MonitoredBarrier(ctx context.Context, c *Comm, tag uint64, timeout time.Duration, waitAll bool) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	if n == 1 {
		return nil
	}
	if r != 0 {
		var verdict [1]byte
		q := t.Irecv(0, tag, verdict[:])
		if err := t.Send(ctx, 0, tag, []byte{0}); err != nil {
			q.Cancel()
			return &ArbiterError{Rank: r, Err: err}
		}
		if err := q.Wait(ctx); err != nil {
			return &ArbiterError{Rank: r, Err: err}
		}
		if verdict[0] != 0 {
			return &ArbiterError{Rank: r}
		}
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	bufs := make([]byte, n)
	qs := make([]Request, n)
	for i := 1; i < n; i++ {
		qs[i] = t.Irecv(i, tag, bufs[i:i+1])
	}
	var late []int
	var firstErr error
	for i := 1; i < n; i++ {
		if err := qs[i].Wait(dctx); err != nil {
			late = append(late, i)
			if firstErr == nil && ctx.Err() == nil && dctx.Err() == nil {
				firstErr = err // the transport failed, not the clock
			}
		}
	}
	sort.Ints(late)
	verdict := []byte{0}
	if len(late) > 0 {
		verdict[0] = 1
	}
	for i := 1; i < n; i++ {
		_ = t.Send(ctx, i, tag, verdict) // best effort: a late rank may be gone
	}
	if len(late) == 0 {
		return nil
	}
	if !waitAll {
		late = late[:1]
	}
	le := &LateRanksError{Ranks: late, Timeout: timeout}
	if firstErr != nil {
		return fmt.Errorf("%w: %w", le, firstErr)
	}
	return le
}
