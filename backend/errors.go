package backend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gocoll/gocoll/reduceop"
)

// Sentinel errors. Every error a backend or the dispatcher returns wraps one
// of these, so callers branch with errors.Is.
var (
	// ErrTimeout: the op did not complete within its timeout.
	ErrTimeout = errors.New("timeout")
	// ErrAborted: the communicator was aborted; the op did not complete.
	ErrAborted = errors.New("aborted")
	// ErrRemote: another rank failed; OpError.Ranks names it.
	ErrRemote = errors.New("remote rank failed")
	// ErrUnsupported: the backend does not implement the op or argument.
	ErrUnsupported = errors.New("unsupported")
	// ErrInvalidArgument: the arguments break one of the op's rules.
	// It is reduceop.ErrInvalid, so the leaf package's errors match too.
	ErrInvalidArgument = reduceop.ErrInvalid
	// ErrUnavailable: a native library or device is missing.
	ErrUnavailable = errors.New("unavailable")
	// ErrClosed: the group or backend was closed.
	ErrClosed = errors.New("closed")
)

// OpError describes a failed op. It wraps one of the sentinel errors (Kind)
// and, where there is one, the underlying cause (Err).
type OpError struct {
	Op      string        // op name as in spec/ops.yaml, e.g. "allreduce"
	Seq     uint64        // collective or p2p sequence number; 0 if not assigned
	Rank    int           // the rank that reports the error
	Backend string        // backend name, e.g. "nccl"
	Ranks   []int         // the ranks at fault (late, dead or remote), if known
	Timeout time.Duration // the op's timeout, for ErrTimeout
	Kind    error         // one of the sentinel errors
	Err     error         // the cause, may be nil
	Detail  string        // extra text, e.g. a desync report or dump file
}

// Error reads, e.g.:
//
//	nccl allreduce seq 42 on rank 0: timeout after 10s: never joined: ranks [1]: <cause>
func (e *OpError) Error() string {
	var b strings.Builder
	if e.Backend != "" {
		b.WriteString(e.Backend)
		b.WriteByte(' ')
	}
	b.WriteString(e.Op)
	if e.Seq != 0 {
		fmt.Fprintf(&b, " seq %d", e.Seq)
	}
	fmt.Fprintf(&b, " on rank %d: ", e.Rank)
	if e.Kind != nil {
		b.WriteString(e.Kind.Error())
	}
	if errors.Is(e.Kind, ErrTimeout) && e.Timeout > 0 {
		fmt.Fprintf(&b, " after %v", e.Timeout)
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if len(e.Ranks) > 0 {
		fmt.Fprintf(&b, ": ranks %v", e.Ranks)
	}
	if e.Err != nil && e.Err != e.Kind {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the sentinel and the cause, so errors.Is matches both.
func (e *OpError) Unwrap() []error {
	out := make([]error, 0, 2)
	if e.Kind != nil {
		out = append(out, e.Kind)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// Errorf returns an *OpError of kind for op, with a formatted detail.
func Errorf(kind error, op string, format string, args ...any) *OpError {
	return &OpError{Op: op, Kind: kind, Detail: fmt.Sprintf(format, args...)}
}

// WaitError is the error of a host wait for an op (WaitHost, a blocking
// Wait) that the caller's context ended: the op itself did not fail, and
// may still complete. The message says which deadline fired, e.g.
//
//	wait for nccl allreduce seq 4 on rank 0: caller's context deadline exceeded after 300ms (op timeout 30s not reached)
//
// It wraps ErrTimeout, as a wait past its deadline always has, and the
// context's error.
type WaitError struct {
	Op      string        // op name; "" when the waiter does not know it
	Seq     uint64        // 0 if not assigned
	Rank    int           // the waiting rank; negative when not known
	Backend string        // "" when not known
	Waited  time.Duration // how long the caller waited
	Timeout time.Duration // the op's own timeout; 0 when not known
	Elapsed time.Duration // the op's age when the wait ended; 0 when not known
	Err     error         // the context's error
}

// Error implements error.
func (e *WaitError) Error() string {
	var b strings.Builder
	b.WriteString("wait for ")
	if e.Backend != "" {
		b.WriteString(e.Backend)
		b.WriteByte(' ')
	}
	if e.Op != "" {
		b.WriteString(e.Op)
	} else {
		b.WriteString("op")
	}
	if e.Seq != 0 {
		fmt.Fprintf(&b, " seq %d", e.Seq)
	}
	if e.Rank >= 0 {
		fmt.Fprintf(&b, " on rank %d", e.Rank)
	}
	b.WriteString(": caller's ")
	switch {
	case errors.Is(e.Err, context.DeadlineExceeded):
		b.WriteString("context deadline exceeded")
	case errors.Is(e.Err, context.Canceled):
		b.WriteString("context canceled")
	case e.Err != nil:
		b.WriteString("context ended: " + e.Err.Error())
	default:
		b.WriteString("context ended")
	}
	fmt.Fprintf(&b, " after %v", roundWait(e.Waited))
	if e.Timeout > 0 {
		if e.Elapsed >= e.Timeout {
			fmt.Fprintf(&b, " (op timeout %v passed too, not yet reported)", e.Timeout)
		} else {
			fmt.Fprintf(&b, " (op timeout %v not reached)", e.Timeout)
		}
	}
	return b.String()
}

// Unwrap returns ErrTimeout and the context's error.
func (e *WaitError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrTimeout}
	}
	return []error{ErrTimeout, e.Err}
}

// roundWait rounds a wait for reading: to the millisecond, or to the
// microsecond below one.
func roundWait(d time.Duration) time.Duration {
	if d >= time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}

// RootCause returns the rank err blames when there is exactly one: an
// *OpError of kind ErrRemote or ErrTimeout naming a single rank other
// than self. A rank that gives up because of a peer (its Abort, its
// mesh's close, the store's error key) passes that rank on, so that every
// survivor names the root cause and never a rank that is merely following
// the failure.
func RootCause(err error, self int) (int, bool) {
	var oe *OpError
	if !errors.As(err, &oe) || len(oe.Ranks) != 1 || oe.Ranks[0] == self {
		return -1, false
	}
	if !errors.Is(oe.Kind, ErrRemote) && !errors.Is(oe.Kind, ErrTimeout) {
		return -1, false
	}
	return oe.Ranks[0], true
}
