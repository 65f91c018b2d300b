package store

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
)

// serverState is the data of a server, shared by its connections: the
// values (counters are values too, in decimal, as in PyTorch), the queues
// and the pending waits.
//
// It knows nothing of sockets or of the wire: each operation takes the
// session that asked, queues that session's reply, and returns the sessions
// whose waits it completed, which the caller flushes once the state is
// unlocked. So the semantics of every opcode can be tested by driving a
// serverState directly (server_state_test.go), and both engines, which
// share the parser, share this too.
//
// Lock order: st.mu, then a session's outMu. A reply that shows stored bytes
// is queued under st.mu, because values may be overwritten in place
// (setLocked).
type serverState struct {
	mu      sync.Mutex
	kv      map[string][]byte
	queues  map[string][][]byte
	waiters map[string][]*waitReq
	// deadWaits counts, per key of waiters, the entries whose wait ended
	// (cancelled or its session gone) and that are still in the list: a
	// list is compacted once half of it is dead, so that dropping a
	// session's waits costs O(its keys) amortised, not O(every waiter of
	// those keys) each time.
	deadWaits map[string]int

	// Limits that depend on what is stored, not only on the request:
	// maxValueLen bounds the value an APPEND makes, maxReplyBytes the reply
	// of a MULTI_GET or LIST_KEYS, maxWaitKeys the keys one session may
	// wait on at once.
	maxValueLen, maxReplyBytes, maxWaitKeys int

	// budget is the server-wide memory budget of queued replies; nil
	// (tests) means none.
	budget *memBudget
}

// session is one client of a serverState: the replies queued for it and
// its pending waits. A connection embeds one; tests use one alone.
type session struct {
	outMu sync.Mutex
	out   []byte

	// guarded by the state's mu
	waits    []*waitReq // pending; each knows its index (waitReq.idx)
	waitKeys int        // the keys of waits, counted against maxWaitKeys
	dead     bool

	// sending is the length of the replies handed to the socket and not
	// yet sent (the engine's send in flight, or the goroutine's write),
	// under outMu. charged says how many of out's and sending's bytes the
	// budget holds: written under outMu, read without it on every request
	// (overShare). budget is set before the session is used; released
	// (under outMu) once the connection has given its memory back.
	sending int
	charged atomic.Int64 // stored under outMu (no read-modify-write), loaded anywhere
	// uncharged is the part of charged not yet added to the budget's
	// shared counter: small replies are added in batches (chargeBatch, and
	// before every send), so that a reply costs no atomic operation.
	uncharged int
	budget    *memBudget
	released  bool

	// conn is the connection to flush when another session's write
	// completes one of this one's waits; nil in tests.
	conn *srvConn
}

// waitReq is one pending WAIT of one session.
type waitReq struct {
	s         *session
	keys      []string
	remaining int
	idx       int // in s.waits while pending
	done      bool
}

// newServerState returns an empty state with the limits of o (filled).
func newServerState(o *ServerOptions) *serverState {
	return &serverState{
		kv: map[string][]byte{}, queues: map[string][][]byte{}, waiters: map[string][]*waitReq{}, deadWaits: map[string]int{},
		maxValueLen: o.MaxValueLen, maxReplyBytes: o.MaxRequestBytes, maxWaitKeys: o.MaxWaitKeysPerConn,
	}
}

// queued returns the length of the replies waiting to be sent.
func (s *session) queued() int {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	return len(s.out)
}

// reply queues response bytes.
func (s *session) reply(b ...byte) {
	s.outMu.Lock()
	s.out = append(s.out, b...)
	s.grewLocked(len(b))
	s.outMu.Unlock()
}

// replyI64 queues an int64 reply.
func (s *session) replyI64(v int64) {
	s.outMu.Lock()
	s.out = appendI64(s.out, v)
	s.grewLocked(8)
	s.outMu.Unlock()
}

// replyStr queues a length-prefixed string reply.
func (s *session) replyStr(v []byte) {
	s.outMu.Lock()
	s.out = appendStr(s.out, v)
	s.grewLocked(8 + len(v))
	s.outMu.Unlock()
}

// set is SET: it stores a copy of v under k.
func (st *serverState) set(k, v []byte) (wake []*session) {
	st.mu.Lock()
	st.setLocked(k, v)
	wake = st.wakeLockedB(k, nil)
	st.mu.Unlock()
	return wake
}

// compareSet is COMPARE_SET: k becomes des if it holds exp, or if it is
// missing and exp is empty. The reply is the value k then holds, or exp
// for a missing key (PyTorch's documented quirk). des is kept, not copied.
func (st *serverState) compareSet(s *session, k string, exp, des []byte) (wake []*session, err error) {
	var res []byte
	st.mu.Lock()
	defer st.mu.Unlock()
	cur, ok := st.kv[k]
	// The reply may be the stored value, which the request did not pay for.
	if err := s.admitReply(8 + max(len(cur), len(exp), len(des))); err != nil {
		return nil, err
	}
	switch {
	case !ok && len(exp) == 0, ok && bytes.Equal(cur, exp):
		st.kv[k] = des
		res = des
		wake = st.wakeLocked(k, nil)
	case !ok:
		res = exp
	default:
		res = cur
	}
	s.replyStr(res)
	return wake, nil
}

// get is GET: it replies k's value and reports whether k exists. A missing
// key gets an empty reply when replyMissing (DialectV2), none otherwise.
func (st *serverState) get(s *session, k []byte, replyMissing bool) (bool, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	v, ok := st.kv[string(k)]
	if err := s.admitReply(8 + len(v)); err != nil {
		return ok, err
	}
	if ok || replyMissing {
		s.replyStr(v)
	}
	return ok, nil
}

// add is ADD: it adds delta to the decimal value of k (0 when missing),
// wrapping as the C++ server does, stores the sum in decimal and replies
// it. A value that is not a decimal integer is an errMalformed error,
// with no reply and nothing stored.
func (st *serverState) add(s *session, k []byte, delta int64) (wake []*session, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	var cur int64
	if v, ok := st.kv[string(k)]; ok {
		if cur, err = parseStoll(v); err != nil {
			return nil, fmt.Errorf("%w: ADD to key %q: %w", errMalformed, k, err)
		}
	}
	cur += delta
	var num [24]byte
	st.setLocked(k, strconv.AppendInt(num[:0], cur, 10))
	wake = st.wakeLockedB(k, nil)
	s.replyI64(cur)
	return wake, nil
}

// check is CHECK: it replies replyReady when every key exists (as a value
// or a non-empty queue), else replyNotReady.
func (st *serverState) check(s *session, keys [][]byte) {
	st.mu.Lock()
	r := replyReady
	for _, k := range keys {
		if !st.hasLocked(k) {
			r = replyNotReady
			break
		}
	}
	st.mu.Unlock()
	s.reply(r)
}

// wait is WAIT: it replies replyStopWait at once when every key exists;
// otherwise it registers a wait that a later write of the last missing key
// completes (completeLocked). A wait that would take the session's
// pending keys past maxWaitKeys is refused with replyWaitCancel, which no
// client takes for success, and errTooManyWaits.
func (st *serverState) wait(s *session, keys [][]byte) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	missing := 0
	for _, kb := range keys {
		if !st.hasLocked(kb) {
			missing++
		}
	}
	if missing == 0 {
		s.reply(replyStopWait)
		return nil
	}
	if st.maxWaitKeys > 0 && s.waitKeys+missing > st.maxWaitKeys {
		s.reply(replyWaitCancel)
		return fmt.Errorf("%w: a WAIT for %d more keys, over the limit of %d pending per connection (%d pending)", errTooManyWaits, missing, st.maxWaitKeys, s.waitKeys)
	}
	wr := &waitReq{s: s, remaining: missing, keys: make([]string, 0, missing), idx: len(s.waits)}
	for _, kb := range keys {
		if !st.hasLocked(kb) {
			k := string(kb)
			wr.keys = append(wr.keys, k)
			st.waiters[k] = append(st.waiters[k], wr)
		}
	}
	s.waits = append(s.waits, wr)
	s.waitKeys += missing
	return nil
}

// numKeys is GETNUMKEYS: it replies the number of values (not queues).
func (st *serverState) numKeys(s *session) {
	st.mu.Lock()
	n := len(st.kv)
	st.mu.Unlock()
	s.replyI64(int64(n))
}

// deleteKey is DELETE_KEY: it replies 1 when k existed, 0 otherwise.
func (st *serverState) deleteKey(s *session, k []byte) {
	st.mu.Lock()
	_, ok := st.kv[string(k)]
	if ok {
		delete(st.kv, string(k))
	}
	st.mu.Unlock()
	var r int64
	if ok {
		r = 1
	}
	s.replyI64(r)
}

// appendValue is APPEND: it appends v to k's value (creating it). A
// result over maxValueLen is an errMalformed error and changes nothing.
func (st *serverState) appendValue(k string, v []byte) (wake []*session, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	old := st.kv[k]
	if len(old)+len(v) > st.maxValueLen {
		return nil, fmt.Errorf("%w: APPEND to key %q would make a value of %d bytes, over the limit %d", errMalformed, k, len(old)+len(v), st.maxValueLen)
	}
	nv := make([]byte, 0, len(old)+len(v))
	st.kv[k] = append(append(nv, old...), v...)
	return st.wakeLocked(k, nil), nil
}

// multiGet is MULTI_GET: it replies every key's value in order, empty for
// a missing key. A reply over maxReplyBytes is an errMalformed error and
// nothing is replied: one small request must not make an unbounded reply
// (the same key many times over a large value).
func (st *serverState) multiGet(s *session, keys [][]byte) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	size := 0
	for _, k := range keys {
		size += 8 + len(st.kv[string(k)])
	}
	if size > st.maxReplyBytes {
		return fmt.Errorf("%w: MULTI_GET of %d keys would reply %d bytes, over the limit %d", errMalformed, len(keys), size, st.maxReplyBytes)
	}
	if err := s.admitReply(size); err != nil {
		return err
	}
	s.outMu.Lock()
	s.out = slices.Grow(s.out, size)
	for _, k := range keys {
		s.out = appendStr(s.out, st.kv[string(k)])
	}
	s.grewLocked(size)
	s.outMu.Unlock()
	return nil
}

// multiSet is MULTI_SET: it stores every vals[i] under keys[i], in order.
// The values are kept, not copied.
func (st *serverState) multiSet(keys []string, vals [][]byte) (wake []*session) {
	st.mu.Lock()
	for i, k := range keys {
		st.kv[k] = vals[i]
		wake = st.wakeLocked(k, wake)
	}
	st.mu.Unlock()
	return wake
}

// cancelWait is CANCEL_WAIT: it drops every pending wait of s and replies
// replyWaitCancel.
func (st *serverState) cancelWait(s *session) {
	st.mu.Lock()
	st.dropWaitsLocked(s)
	s.reply(replyWaitCancel)
	st.mu.Unlock()
}

// queuePush is QUEUE_PUSH: it appends v (kept, not copied) to queue k and
// counts it for the oldest wait on k only.
func (st *serverState) queuePush(k string, v []byte) (wake []*session) {
	st.mu.Lock()
	st.queues[k] = append(st.queues[k], v)
	wake = st.wakeOneLocked(k)
	st.mu.Unlock()
	return wake
}

// queuePop is QUEUE_POP: it replies the queue's length before the pop,
// then, when that is not 0, the item popped from its head.
func (st *serverState) queuePop(s *session, k string) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	q := st.queues[k]
	n := len(q)
	if n > 0 {
		if err := s.admitReply(16 + len(q[0])); err != nil {
			return err
		}
	}
	var v []byte
	if n > 0 {
		v = q[0]
		q[0] = nil
		if n == 1 {
			delete(st.queues, k)
		} else {
			st.queues[k] = q[1:]
		}
	}
	s.outMu.Lock()
	s.out = appendI64(s.out, int64(n))
	s.grewLocked(8)
	if n > 0 {
		s.out = appendStr(s.out, v)
		s.grewLocked(8 + len(v))
	}
	s.outMu.Unlock()
	return nil
}

// queueLen is QUEUE_LEN: it replies the length of queue k.
func (st *serverState) queueLen(s *session, k string) {
	st.mu.Lock()
	n := len(st.queues[k])
	st.mu.Unlock()
	s.replyI64(int64(n))
}

// listKeys is LIST_KEYS: it replies the number of values, then their keys
// in map order. A reply over maxReplyBytes is an errMalformed error, as
// for MULTI_GET: a one-byte request must not make an unbounded reply.
func (st *serverState) listKeys(s *session) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	size := 8 + 8*len(st.kv)
	if size <= st.maxReplyBytes {
		for k := range st.kv {
			if size += len(k); size > st.maxReplyBytes {
				break
			}
		}
	}
	if size > st.maxReplyBytes {
		return fmt.Errorf("%w: LIST_KEYS of %d keys would reply over %d bytes, the limit", errMalformed, len(st.kv), st.maxReplyBytes)
	}
	if err := s.admitReply(size); err != nil {
		return err
	}
	s.outMu.Lock()
	s.out = slices.Grow(s.out, size)
	s.out = appendI64(s.out, int64(len(st.kv)))
	for k := range st.kv {
		s.out = appendStr(s.out, k)
	}
	s.grewLocked(size)
	s.outMu.Unlock()
	return nil
}

// drop ends s: its pending waits are cancelled and none of its waits is
// completed later. The connection calls it when it closes.
func (st *serverState) drop(s *session) {
	st.mu.Lock()
	s.dead = true
	st.dropWaitsLocked(s)
	st.mu.Unlock()
}

// hasLocked reports whether key exists as a value or a non-empty queue.
func (st *serverState) hasLocked(k []byte) bool {
	if _, ok := st.kv[string(k)]; ok {
		return true
	}
	return len(st.queues[string(k)]) > 0
}

// setLocked stores a copy of v under k. An existing value of the same
// length is overwritten in place, so that a repeated set allocates neither
// a key nor a value; every reader of st.kv therefore copies values out
// before it unlocks.
func (st *serverState) setLocked(k, v []byte) {
	if old, ok := st.kv[string(k)]; ok && len(old) == len(v) {
		copy(old, v)
		return
	}
	st.kv[string(k)] = bytes.Clone(v)
}

// wakeLocked counts key k as arrived for every wait on it; sessions whose
// wait is complete get STOP_WAITING queued and are appended to wake, which
// the caller flushes after unlocking.
// Only the waits on k are visited: waiters of other keys are not disturbed.
func (st *serverState) wakeLocked(k string, wake []*session) []*session {
	list, ok := st.waiters[k]
	if !ok {
		return wake
	}
	delete(st.waiters, k)
	delete(st.deadWaits, k)
	return st.wakeListLocked(list, wake)
}

// wakeLockedB is wakeLocked for a key in a scratch buffer; it allocates
// nothing when k has no waiters.
func (st *serverState) wakeLockedB(k []byte, wake []*session) []*session {
	list, ok := st.waiters[string(k)]
	if !ok {
		return wake
	}
	delete(st.waiters, string(k))
	delete(st.deadWaits, string(k))
	return st.wakeListLocked(list, wake)
}

func (st *serverState) wakeListLocked(list []*waitReq, wake []*session) []*session {
	for _, wr := range list {
		if wr.done {
			continue
		}
		if wr.remaining--; wr.remaining == 0 {
			wake = st.completeLocked(wr, wake)
		}
	}
	return wake
}

// wakeOneLocked counts a queue push on k for the oldest wait on it only, so
// that one blocked queue_pop is woken per pushed item.
func (st *serverState) wakeOneLocked(k string) []*session {
	list := st.waiters[k]
	for i, wr := range list {
		if wr.done {
			continue
		}
		// The dead entries before i go with it: the list's head is its
		// oldest live wait.
		clear(list[:i+1])
		rest := list[i+1:]
		if d := st.deadWaits[k] - i; d > 0 && len(rest) > 0 {
			st.deadWaits[k] = d
		} else {
			delete(st.deadWaits, k)
		}
		if len(rest) == 0 {
			delete(st.waiters, k)
		} else {
			st.waiters[k] = rest
		}
		if wr.remaining--; wr.remaining == 0 {
			return st.completeLocked(wr, nil)
		}
		return nil
	}
	delete(st.waiters, k)
	delete(st.deadWaits, k)
	return nil
}

func (st *serverState) completeLocked(wr *waitReq, wake []*session) []*session {
	s := wr.s
	st.unlinkLocked(wr)
	if s.dead {
		return wake
	}
	s.reply(replyStopWait)
	if n := len(wake); n > 0 && wake[n-1] == s {
		return wake // one flush sends all of a session's replies
	}
	return append(wake, s)
}

// unlinkLocked ends wr and takes it out of its session's pending waits in
// O(1). Its entries in the key lists stay, marked done, until the lists are
// woken or compacted.
func (st *serverState) unlinkLocked(wr *waitReq) {
	wr.done = true
	s := wr.s
	last := len(s.waits) - 1
	if wr.idx <= last && s.waits[wr.idx] == wr {
		s.waits[wr.idx] = s.waits[last]
		s.waits[wr.idx].idx = wr.idx
		s.waits[last] = nil
		s.waits = s.waits[:last]
	}
	s.waitKeys -= len(wr.keys)
}

// dropWaitsLocked cancels every pending wait of s, in O(their keys)
// amortised: each key's list is compacted only once half of it is dead.
func (st *serverState) dropWaitsLocked(s *session) {
	for _, wr := range s.waits {
		wr.done = true
		for _, k := range wr.keys {
			list := st.waiters[k]
			if len(list) == 0 {
				continue
			}
			dead := st.deadWaits[k] + 1
			if 2*dead < len(list) {
				st.deadWaits[k] = dead
				continue
			}
			out := list[:0]
			for _, x := range list {
				if !x.done {
					out = append(out, x)
				}
			}
			clear(list[len(out):])
			delete(st.deadWaits, k)
			if len(out) == 0 {
				delete(st.waiters, k)
			} else {
				st.waiters[k] = out
			}
		}
	}
	clear(s.waits)
	s.waits = s.waits[:0]
	s.waitKeys = 0
}
