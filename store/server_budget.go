package store

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// DefaultMemoryBudget is the default of ServerOptions.MemoryBudget.
const DefaultMemoryBudget = 256 << 20

// MemoryBudgetEnv names the environment variable read when
// ServerOptions.MemoryBudget is 0: a byte count, with an optional KiB, MiB
// or GiB suffix.
const MemoryBudgetEnv = "GOCOLL_STORE_MEMORY_BUDGET"

// replyReserve is what a connection may always hold in queued replies and
// request buffers, budget or not, so that small requests are answered
// while large ones wait for the budget. The server's worst case is the
// budget plus this much per connection.
const replyReserve = 64 << 10

// errOverBudget reports that a reply or a request buffer does not fit the
// server's memory budget now: the connection pauses and the request runs
// again once memory is released.
var errOverBudget = errors.New("store server: over the memory budget")

// errTooManyWaits reports a WAIT refused because its connection already
// waits on too many keys; the connection goes on.
var errTooManyWaits = errors.New("too many pending waits")

// memBudget bounds, server-wide, the bytes that clients make the server
// hold on their behalf beyond the stored data: queued replies (a small GET
// for an 8 MiB value, never read, holds 8 MiB) and request buffers.
//
// Why a shared budget rather than a limit per connection: an attacker opens
// as many connections as it likes, so a per-connection bound multiplies; a
// shared one does not. Legitimate clients stay served because each
// connection may always hold replyReserve (their replies are small), and
// an attacker's replies are dropped with its connection once WriteTimeout
// passes without it reading.
type memBudget struct {
	limit int64
	used  atomic.Int64

	mu      sync.Mutex
	freed   chan struct{} // closed when memory is released; replaced on each wait
	waiting atomic.Int32
}

func newMemBudget(limit int64) *memBudget { return &memBudget{limit: limit} }

// admit reports whether n more bytes may be held by a connection that holds
// own already.
func (b *memBudget) admit(own, n int) bool {
	return b == nil || own+n <= replyReserve || b.used.Load()+int64(n) <= b.limit
}

// exhausted reports whether the budget is spent.
func (b *memBudget) exhausted() bool { return b != nil && b.used.Load() >= b.limit }

func (b *memBudget) charge(n int) {
	if b != nil && n != 0 {
		b.used.Add(int64(n))
	}
}

// release gives n bytes back and wakes the goroutines waiting for memory.
func (b *memBudget) release(n int) {
	if b == nil || n == 0 {
		return
	}
	b.used.Add(-int64(n))
	if b.waiting.Load() > 0 {
		b.mu.Lock()
		if b.freed != nil {
			close(b.freed)
			b.freed = nil
		}
		b.mu.Unlock()
	}
}

// released returns a channel closed at the next release; the caller calls
// done when it stops waiting.
func (b *memBudget) released() (ch <-chan struct{}, done func()) {
	b.waiting.Add(1)
	b.mu.Lock()
	if b.freed == nil {
		b.freed = make(chan struct{})
	}
	ch = b.freed
	b.mu.Unlock()
	return ch, func() { b.waiting.Add(-1) }
}

// Used returns the bytes held against the budget (for tests and metrics).
func (b *memBudget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// chargeBatch is how many reply bytes a session queues before it adds
// them to the budget's shared counter; the counter lags by at most this
// much per connection.
const chargeBatch = 4 << 10

// grewLocked counts n more queued reply bytes of s; s.outMu is held.
func (s *session) grewLocked(n int) {
	if s.budget == nil || s.released || n <= 0 {
		return
	}
	s.charged.Store(s.charged.Load() + int64(n))
	if s.uncharged += n; s.uncharged >= chargeBatch {
		s.settleLocked()
	}
}

// settleLocked adds the uncharged bytes to the budget; s.outMu is held. The
// engines call it before handing replies to the socket.
func (s *session) settleLocked() {
	if s.uncharged > 0 {
		s.budget.charge(s.uncharged)
		s.uncharged = 0
	}
}

// sentLocked gives back the budget of n reply bytes sent; s.outMu is held.
func (s *session) sentLocked(n int) {
	s.settleLocked()
	m := min(int64(n), s.charged.Load())
	if m > 0 {
		s.charged.Store(s.charged.Load() - m)
		s.budget.release(int(m))
	}
}

// releaseAll gives back everything s holds; later replies are not counted.
// The connection calls it when it ends.
func (s *session) releaseAll() {
	s.outMu.Lock()
	n := s.charged.Load() - int64(s.uncharged)
	s.charged.Store(0)
	s.uncharged = 0
	s.released = true
	s.outMu.Unlock()
	s.budget.release(int(n))
}

// admitReply reports whether s may queue a reply of n bytes; the caller
// holds the state's mu. A reply larger than the whole budget never fits:
// that is an errMalformed error, which closes the connection, rather than
// a wait that never ends.
func (s *session) admitReply(n int) error {
	b := s.budget
	if b == nil {
		return nil
	}
	if int64(n) > b.limit {
		return fmt.Errorf("%w: a reply of %d bytes is over the server's memory budget of %d bytes", errMalformed, n, b.limit)
	}
	if b.admit(int(s.charged.Load()), n) {
		return nil
	}
	return errOverBudget
}

// overShare reports whether the connection should read no more requests
// until its replies drain: it holds more than maxQueuedReplies, or more
// than its reserve while the server's budget is spent. It takes no lock
// when the session has a budget (the engines' case: once per request).
func (s *session) overShare() bool {
	if b := s.budget; b != nil {
		own := s.charged.Load()
		return own > maxQueuedReplies || (own > replyReserve && b.exhausted())
	}
	s.outMu.Lock()
	own := len(s.out) + s.sending
	s.outMu.Unlock()
	return own > maxQueuedReplies
}

// ParseBytes parses a byte count with an optional KiB, MiB or GiB suffix
// (or k, M, G: powers of 1024 all the same), as MemoryBudgetEnv and
// gocoll-store's --memory-budget take it.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suf  string
		mult int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"k", 1 << 10}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if v, ok := strings.CutSuffix(t, u.suf); ok {
			t, mult = strings.TrimSpace(v), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("store: bad byte count %q (want a positive number, optionally with KiB, MiB or GiB)", s)
	}
	return n * mult, nil
}
