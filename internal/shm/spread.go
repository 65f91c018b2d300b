package shm

import (
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// Keeping the ranks of an oversubscribed host spread over its CPUs.
//
// Ranks that outnumber the CPUs poll with sched_yield, so each keeps its
// CPU busy, and Linux's load balancer leaves a task where it is while it
// counts as cache hot, which a polling rank always does. A 4-rank job on
// 2 CPUs could then sit for whole runs with three ranks on one CPU and
// one on the other, and its 8 B allreduce took 7-12 µs there against 5-6
// µs two and two; when the ranks moved their threads two and two and let
// them go again, the kernel moved them back within milliseconds
// (docs/perf.md, issue 17, sixteenth pass). So each rank keeps to a home
// CPU: the thread that posts on the board is bound to allowed[rank %
// len(allowed)], where allowed is the affinity of the thread that called
// KeepHome, and Close gives every thread it bound its old affinity back.
//
// A thread that is bound already (to fewer CPUs than allowed: by the
// user, taskset, or another board of this process) is left alone, so two
// groups never fight over one thread, and a rank that the user placed
// stays where it was put.

// spreadEvery is how many posts apart a rank checks the thread it posts
// from.
const spreadEvery = 32

// spreader is one rank's home-keeping state (Board.Post).
type spreader struct {
	mask  unix.CPUSet // the affinity of KeepHome's thread
	count int         // CPUs in mask
	home  int         // the CPU this rank keeps to; -1: none
	quiet int         // posts before the next check

	mu    sync.Mutex // orders check with restore (Close)
	bound []int      // threads bound to home, given back at restore
	left  []int      // threads found bound by someone else
	done  bool       // restored: bind no more
}

// newSpreader picks rank's home among the CPUs the calling thread may
// run on; with one CPU or none readable, it has none.
func newSpreader(rank int) *spreader {
	s := &spreader{home: -1}
	if unix.SchedGetaffinity(0, &s.mask) != nil {
		return s
	}
	s.count = s.mask.Count()
	if s.count < 2 {
		return s
	}
	k := rank % s.count
	for c := 0; c < len(s.mask)*64; c++ {
		if s.mask.IsSet(c) {
			if k == 0 {
				s.home = c
				break
			}
			k--
		}
	}
	return s
}

// check is called on every post: every spreadEvery posts it binds the
// calling thread to home, unless it did so already or the thread is
// bound by someone else. (A goroutine may move to another thread, which
// the next check then binds; one gettid per check costs a few ns a post.)
func (s *spreader) check() {
	if s.home < 0 {
		return
	}
	if s.quiet > 0 {
		s.quiet--
		return
	}
	s.quiet = spreadEvery - 1
	tid := unix.Gettid()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done || slices.Contains(s.bound, tid) || slices.Contains(s.left, tid) {
		return
	}
	var now unix.CPUSet
	if unix.SchedGetaffinity(0, &now) != nil || now.Count() < s.count {
		s.left = append(s.left, tid) // bound already (or unreadable): not ours to move
		return
	}
	var one unix.CPUSet
	one.Set(s.home)
	if unix.SchedSetaffinity(0, &one) != nil {
		s.home = -1 // not allowed here: stop trying
		return
	}
	s.bound = append(s.bound, tid)
}

// restore gives every thread bound to home its old affinity back and
// stops further binding.
func (s *spreader) restore() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	for _, tid := range s.bound {
		_ = unix.SchedSetaffinity(tid, &s.mask) // a thread that exited is gone
	}
	s.bound = nil
}
