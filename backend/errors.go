package backend

import (
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
