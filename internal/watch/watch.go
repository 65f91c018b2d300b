// Package watch holds the failure decisions of gocoll's backends and of the
// dispatcher as pure units, in the shape of etcd's raft: a unit is fed
// events (an op enqueued, its completion, an asynchronous error, a peer's
// signal through the store, an abort, a blocking wait's check) and the
// time (Tick(now)), and it returns the actions to take, in order: dump the
// flight recorder, fail works, signal the peers, abort the communicators,
// log a fatal line, exit the process. The caller (a thin goroutine in the
// backend) performs them.
//
// Nothing here reads a clock, sleeps, starts a goroutine, does I/O or ends
// the process, so every policy × event can be tested as a table, without a
// GPU and without sleeps. The units are not safe for concurrent use: the
// driver serialises its calls (a backend calls its Watchdog under the lock
// that guards its pending works).
//
// The units know nothing of a particular backend: works and communicators
// are opaque keys, errors of the native library are carried through as
// values. backends/nccl drives a Watchdog from its watchdog goroutine and
// its blocking waits; backends/cpupool reports its expired deadlines to one;
// the dispatcher's heartbeat monitor and flight recorder use Heartbeat and
// Dumps.
package watch

import (
	"fmt"
	"time"
)

// Policy says what follows a failure that the watchdog finds (PyTorch's
// TORCH_NCCL_ASYNC_ERROR_HANDLING). The unit's own enum: a backend converts
// its option to it, so that the option may be numbered as it likes.
type Policy int

// The policies.
const (
	// NoHandling only fails the work.
	NoHandling Policy = iota
	// TearDown aborts the communicators, logs one fatal line and ends the
	// process.
	TearDown
	// CleanUpOnly aborts the communicators (which fails the pending works
	// with ErrAborted); the process lives on.
	CleanUpOnly
	// SkipCleanUp logs one fatal line and ends the process without an abort
	// (which can hang).
	SkipCleanUp
)

// String returns the policy's name.
func (p Policy) String() string {
	switch p {
	case NoHandling:
		return "NoHandling"
	case TearDown:
		return "TearDown"
	case CleanUpOnly:
		return "CleanUpOnly"
	case SkipCleanUp:
		return "SkipCleanUp"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// Kind is what went wrong with a work.
type Kind int

// The kinds of failure.
const (
	// Timeout: the op was still running its timeout after it was enqueued
	// (ErrTimeout).
	Timeout Kind = iota + 1
	// Async: the native library reported an asynchronous error on the op's
	// communicator (ErrAborted).
	Async
	// AsyncRemote: the same, attributed by the library to a peer
	// (ErrRemote). It is not this rank's to tell the peers about.
	AsyncRemote
	// Remote: a peer published its own failure through the store
	// (ErrRemote naming that peer).
	Remote
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case Timeout:
		return "timeout"
	case Async:
		return "async"
	case AsyncRemote:
		return "async-remote"
	case Remote:
		return "remote"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Failure is one work's failure, as the unit decided it. The driver turns
// it into the backend's error (an *backend.OpError) once, and every action
// that points at the same Failure uses that error.
type Failure[W comparable] struct {
	Kind Kind
	Work W
	// Comm is the communicator of an Async or AsyncRemote failure.
	Comm string
	// Elapsed is, for a Timeout, how long after enqueue the op was seen
	// still running.
	Elapsed time.Duration
	// Blocking is set when a blocking wait, in the caller, found the
	// failure rather than the watchdog.
	Blocking bool
	// Peer and Message are, for Remote, the rank that failed and its error.
	Peer    int
	Message string
	// Cause is the native library's error of an Async or AsyncRemote
	// failure, carried through for the driver.
	Cause error
}

// String is a short form, for logs and tests: "timeout w1 1.5s".
func (f *Failure[W]) String() string {
	if f == nil {
		return "user"
	}
	s := fmt.Sprintf("%v %v", f.Kind, f.Work)
	switch f.Kind {
	case Timeout:
		s += " " + f.Elapsed.String()
	case Async, AsyncRemote:
		s += " on " + f.Comm
	case Remote:
		s += fmt.Sprintf(" from rank %d", f.Peer)
	}
	if f.Blocking {
		s += " (blocking wait)"
	}
	return s
}

// ActionKind is what an action does.
type ActionKind int

// The actions.
const (
	// Dump the flight recorder, and ask every peer to dump theirs, with the
	// failure's error (or Reason) as the reason; the dump file goes into
	// that error.
	Dump ActionKind = iota + 1
	// Fail the failure's work with its error.
	Fail
	// Signal tells the peers through the store that this rank failed, with
	// the failure's error.
	Signal
	// Abort aborts every communicator of the backend, marks it unusable
	// with the failure's error as the reason (the caller's reason when
	// Failure is nil: a user's Abort), and fails each pending work that has
	// not completed with ErrAborted wrapping that reason.
	Abort
	// Fatal logs one fatal line naming the failure (or Reason).
	Fatal
	// Stacks writes every goroutine's stack next to the dump.
	Stacks
	// Exit ends the process with Code, after waiting Grace.
	Exit
)

// String returns the action kind's name.
func (k ActionKind) String() string {
	switch k {
	case Dump:
		return "dump"
	case Fail:
		return "fail"
	case Signal:
		return "signal"
	case Abort:
		return "abort"
	case Fatal:
		return "fatal"
	case Stacks:
		return "stacks"
	case Exit:
		return "exit"
	}
	return fmt.Sprintf("ActionKind(%d)", int(k))
}

// Action is one thing for the driver to do.
type Action[W comparable] struct {
	Kind ActionKind
	// Failure is the failure acted on: Fail's work and error, and the
	// reason of Dump, Signal, Abort and Fatal. Nil for a user's Abort and
	// for the monitor's actions, which carry Reason instead.
	Failure *Failure[W]
	// Reason is the reason of a Dump or Fatal that answers no failure (the
	// heartbeat monitor's, a peer's dump signal).
	Reason string
	// Background is set on an Abort that the caller must not wait for: a
	// blocking wait returns its error at once, the abort goes on.
	Background bool
	// Code is Exit's status.
	Code int
	// Grace is how long Exit waits first, so that the peers asked to dump
	// see the signal while this process (which may host the store) is up.
	Grace time.Duration
}

// String is a short form, for logs and tests: "fail(timeout w1 1.5s)".
func (a Action[W]) String() string {
	switch {
	case a.Kind == Exit:
		return fmt.Sprintf("exit(%d, grace %v)", a.Code, a.Grace)
	case a.Kind == Stacks:
		return "stacks"
	case a.Failure == nil && a.Reason != "":
		return fmt.Sprintf("%v(%s)", a.Kind, a.Reason)
	case a.Kind == Abort && a.Background:
		return fmt.Sprintf("abort(%v, background)", a.Failure)
	}
	return fmt.Sprintf("%v(%v)", a.Kind, a.Failure)
}

// Errors builds the error of each failure once, however many actions name
// it: a failure's Dump comes before its Fail, and both must hold the same
// error, so that the dump path added to it is there before any waiter
// sees it. Drivers keep one per batch of actions.
type Errors[W comparable, E any] struct {
	// Build makes the error of a failure.
	Build func(*Failure[W]) E
	built []errorOf[W, E]
}

type errorOf[W comparable, E any] struct {
	f *Failure[W]
	e E
}

// Of returns f's error, building it on first use.
func (m *Errors[W, E]) Of(f *Failure[W]) E {
	for _, x := range m.built {
		if x.f == f {
			return x.e
		}
	}
	e := m.Build(f)
	m.built = append(m.built, errorOf[W, E]{f, e})
	return e
}
