package shm

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// Presence: whether a process's stamped-frame waits are getting anywhere,
// as its peers see it, so that a waiter can tell a peer that will send
// soon from one that cannot (AwaitStamped).
//
// With more ranks than cores, a wait whose peer is not sending has two
// ways to go: spin, which is right when the peer runs on another core and
// is about to send, and sched_yield, which is right when the peer needs
// this core. A waiter cannot see where its peer runs, but it can see what
// the peer said about itself: each side of a pair file has a word (after
// the rings' control blocks, on a line of its own) that holds presWaiting
// while that side is in a wait that had to give the core up (it yields or
// sleeps) and presRunning otherwise. A waiter spins while its peer is
// running and yields while the peer waits: a peer that waits cannot send
// before it has run again, and if it shares this core, it runs only when
// this wait yields. 4 ranks on 2 cores: docs/perf.md, issue 17.
//
// The word is a hint: a peer that the kernel preempted still reads as
// running, which the spin's bound (AwaitStamped) covers, and a stale word
// costs time, never correctness.

const (
	// offPresence is where a pair file keeps its sides' presence words:
	// side s at offPresence + s*64, after the rings' control blocks.
	offPresence = 3 * ctrlSize

	presRunning = 0 // fresh memory: a peer that never waited runs
	presWaiting = 1
)

// Presence is one process's presence word in every pair that it joined
// (Add): a wait on any of those pairs' rings says so in all of them, since
// every peer may be waiting for this process. Its methods are safe for
// concurrent use.
type Presence struct {
	state atomic.Uint32 // what the words hold

	mu    sync.Mutex       // orders set with add and remove (Unmap)
	words []*atomic.Uint32 // this side's word in each joined pair
	pairs []*Pair
}

// Add makes p's In ring report its waits to pres and read its producer's
// word. A pair joins at most one Presence; Unmap leaves it.
func (pres *Presence) Add(p *Pair) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mem == nil || p.presence != nil {
		return
	}
	pres.mu.Lock()
	defer pres.mu.Unlock()
	self, peer := p.presenceWords()
	self.Store(pres.state.Load())
	pres.words = append(pres.words, self)
	pres.pairs = append(pres.pairs, p)
	p.presence = pres
	p.In.presence, p.In.peerState = pres, peer
}

// remove drops p's word; p.mu is held (Unmap).
func (pres *Presence) remove(p *Pair) {
	pres.mu.Lock()
	defer pres.mu.Unlock()
	for i, q := range pres.pairs {
		if q == p {
			last := len(pres.pairs) - 1
			pres.pairs[i], pres.words[i] = pres.pairs[last], pres.words[last]
			pres.pairs[last], pres.words[last] = nil, nil
			pres.pairs, pres.words = pres.pairs[:last], pres.words[:last]
			return
		}
	}
}

// set writes v to every word unless they hold it already. Two waits of
// one process may race here; the words then hold either's value, which
// the next set mends (a hint, as above).
func (pres *Presence) set(v uint32) {
	if pres == nil || pres.state.Load() == v {
		return
	}
	pres.mu.Lock()
	pres.state.Store(v)
	for _, w := range pres.words {
		w.Store(v)
	}
	pres.mu.Unlock()
}

// Waiting reports whether this process says it waits (tests).
func (pres *Presence) Waiting() bool { return pres.state.Load() == presWaiting }

// presenceWords returns this side's and the peer's presence words; p.mu
// is held and p is mapped.
func (p *Pair) presenceWords() (self, peer *atomic.Uint32) {
	side := p.side
	at := func(s int) *atomic.Uint32 {
		return (*atomic.Uint32)(unsafe.Pointer(&p.mem[offPresence+64*s]))
	}
	return at(side), at(1 - side)
}

// PeerWaiting reports whether the producer of r says it waits (its
// presence word); false when r's pair joined no Presence.
func (r *Ring) PeerWaiting() bool { return r.peerState != nil && r.peerState.Load() == presWaiting }
