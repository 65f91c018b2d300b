package cpupool

import (
	"math/bits"
	"slices"
	"time"
)

// Whether a large lane allreduce's copies into the lanes stream past the
// cache (tcpmesh.Mesh.StreamLanes) is chosen per op by streamChooser, from
// the times of the ops before it. Why not a constant: on the dev machine
// (two virtual CPUs whose places on the host change from minute to
// minute) a 2-rank 1 MiB allreduce took 70 µs with cached copies and 95
// streamed in one phase, and 193 cached against 70 streamed in the next:
// where the cores share a cache, the reader takes a modified line from it
// faster than from memory; where they do not, memory is faster. The
// guest cannot see where its CPUs are, so the ops' own times decide.

// streamMin is the smallest allreduce whose copies may stream: below it no
// lane message reaches shm's threshold (ntMin) anyway.
const streamMin = 32 << 10

// streamClasses are the size classes streamChooser keeps apart (powers of
// two from streamMin): where a buffer fits in a cache matters as much as
// where the cores are.
const streamClasses = 16

// streamExplore is how often (two ops in streamExplore of a class) the
// chooser tries the way it does not prefer, so that it sees a change of
// phase. Every rank counts the same ops of a class (collectives run in
// one order everywhere), so their tries fall on the same ops, and a try
// times every rank's copies done that way. A try costs the difference
// between the ways (up to 3x, in the phases above) twice in
// streamExplore ops.
const streamExplore = 32

// streamChooser picks the copy mode of each large lane allreduce and
// learns from its time. It is the lane ops' (one at a time, in their
// turns), so it needs no lock. The zero value is ready.
type streamChooser struct {
	cls [streamClasses]streamClass
}

// streamClass is what streamChooser knows of one size class.
type streamClass struct {
	ops  uint32                       // ops of the class picked so far
	prev bool                         // the way of the class's last op
	seen [2]uint32                    // samples of each way, cached [0] and streamed [1]
	last [2][streamKeep]time.Duration // each way's last samples, by seen mod streamKeep
}

// streamKeep is how many of a way's samples its cost is the least of.
// Why the least: what slows an op down here (a rank descheduled, a peer
// late) only ever adds time, so the fastest recent op is the way's own
// cost; and a change of phase shows in streamKeep ops of the preferred
// way, or in the first try of the other that is faster.
const streamKeep = 4

// cost is way m's cost: the least of its last samples.
func (s *streamClass) cost(m int) time.Duration {
	n := min(int(s.seen[m]), streamKeep)
	return slices.Min(s.last[m][:n])
}

// streamClassOf is the size class of an allreduce of n >= streamMin bytes.
func streamClassOf(n int) int {
	return min(bits.Len(uint(n))-bits.Len(streamMin), streamClasses-1)
}

// streamMargin: streamed copies are preferred only when they are cheaper
// by more than 1/streamMargin. Why: where the ways cost about the same
// (nvidia-h200's host at 64 KiB, 4 ranks: 20 and 21 µs), ranks that
// prefer different ways by noise change way often, and a change costs
// an op; cached copies are the usual way, and the tie is theirs.
const streamMargin = 8

// streamFirst is how many timed samples of each way the first choice of
// a class waits for. Why more than one: the first ops of a size still
// fault pages in and warm caches; with one sample each, a rank whose
// second op took 226 µs against a steady 60 (cached) took streamed
// copies at 130 for its next 30 ops while its peer kept cached copies
// (docs/perf.md, issue 17, sixteenth pass).
const streamFirst = 2

// pick returns the class of an allreduce of n >= streamMin bytes and
// whether its copies stream: cached until streamFirst of their ops are
// timed, then streamed likewise, then the cheaper way (streamed by more
// than streamMargin), and the other for two ops in streamExplore.
func (c *streamChooser) pick(n int) (class int, stream bool) {
	class = streamClassOf(n)
	s := &c.cls[class]
	i := s.ops
	s.ops++
	switch {
	case s.seen[0] < streamFirst:
		return class, false
	case s.seen[1] < streamFirst:
		return class, true
	}
	c0 := s.cost(0)
	better := s.cost(1) < c0-c0/streamMargin
	if i%streamExplore < 2 {
		return class, !better
	}
	return class, better
}

// observe records that an op of class took d with its copies streamed
// or not. Only an op whose way was its class's last op's counts: the
// first op after a change of way finds the lanes' lines where the other
// way left them (in memory after streamed copies, in a core's cache
// after cached ones) and pays for the change, and the first op of a
// size faults its buffers in.
func (c *streamChooser) observe(class int, stream bool, d time.Duration) {
	s := &c.cls[class]
	m := 0
	if stream {
		m = 1
	}
	if s.ops >= 2 && s.prev == stream {
		s.last[m][s.seen[m]%streamKeep] = d
		s.seen[m]++
	}
	s.prev = stream
}
