// Package uring is a minimal io_uring for sockets: one submission and one
// completion queue shared with the kernel, SEND, RECV, READ and TIMEOUT
// entries, and one system call per batch.
//
// A Ring belongs to one OS thread: it is set up with SINGLE_ISSUER and
// DEFER_TASKRUN, so the kernel runs completions only when that thread
// enters the ring. Callers lock their goroutine to its thread
// (runtime.LockOSThread) before New and keep it there.
//
// Buffers given to Send and Recv must stay reachable, and must not be
// reused, until their completion is reaped: the kernel writes and reads
// them after the call returns. Go's collector does not move heap objects,
// so keeping a reference is enough.
package uring

import "errors"

// ErrUnsupported is returned by New where the kernel has no io_uring, or has
// it switched off (kernel.io_uring_disabled), or lacks the flags used here
// (Linux < 6.1), and on every other system.
var ErrUnsupported = errors.New("uring: io_uring not available")
