package backend

import (
	"fmt"

	"github.com/gocoll/gocoll/tensor"
)

// HostChecker is the argument check that the host backends (cpupool, ucc)
// run at the top of every op. The dispatcher has checked the arguments
// against spec/ops.yaml already; what is left is what it cannot know (that
// a tensor is in host memory, how this backend runs a reduction) and the
// guards that keep a direct caller, such as a backend's own tests, from
// reaching the wire with nonsense. Its errors are *OpError values that
// name the backend, the rank, the op and its sequence number.
//
// K is what the backend's reduction lookup yields (a kernel, a UCC
// datatype and op): the checker only carries it, so that package backend
// imports no backend's kernels.
type HostChecker[K any] struct {
	// Backend is the backend's registered name, the OpError's Backend.
	Backend string
	// Rank is this process's rank, the OpError's Rank.
	Rank int
	// Lookup says how the backend runs reduce op r on dtype dt. An
	// error that is an *OpError keeps its Kind, Detail and Err (the
	// checker fills in op, seq, rank and backend); any other error is
	// reported as ErrInvalidArgument wrapping it.
	Lookup func(dt tensor.DType, r ReduceOp) (K, error)
	// OffHostKind is the sentinel of the error for a tensor outside host
	// memory: ErrInvalidArgument when nil. A backend that could serve the
	// device with other components says ErrUnsupported.
	OffHostKind error
	// OffHostDetail says why such a tensor is refused; when nil, the detail
	// is "unsupported device type <device>: <Backend> serves CPU tensors".
	OffHostDetail func(tensor.Device) string
}

// Invalid returns an ErrInvalidArgument *OpError for op with a formatted
// detail.
func (c *HostChecker[K]) Invalid(op Op, m Meta, format string, args ...any) error {
	return &OpError{Op: op.String(), Seq: m.Seq, Rank: c.Rank, Backend: c.Backend, Kind: ErrInvalidArgument, Detail: fmt.Sprintf(format, args...)}
}

// Host returns the bytes of host tensors, or an error for a nil, device or
// non-contiguous one.
func (c *HostChecker[K]) Host(op Op, m Meta, ts ...*tensor.Tensor) ([][]byte, error) {
	return c.hostInto(make([][]byte, 0, len(ts)), op, m, ts)
}

// hostInto is Host appending the bytes to dst[:0]: into the caller's
// storage when it has room.
func (c *HostChecker[K]) hostInto(dst [][]byte, op Op, m Meta, ts []*tensor.Tensor) ([][]byte, error) {
	out := dst[:0]
	for _, t := range ts {
		if t == nil {
			return nil, c.Invalid(op, m, "nil tensor")
		}
		if t.Device().Type != tensor.CPU {
			return nil, c.offHost(op, m, t.Device())
		}
		if !t.IsContiguous() {
			return nil, c.Invalid(op, m, "Tensors must be contiguous")
		}
		out = append(out, t.Bytes())
	}
	return out, nil
}

func (c *HostChecker[K]) offHost(op Op, m Meta, d tensor.Device) error {
	kind, detail := c.OffHostKind, ""
	if kind == nil {
		kind = ErrInvalidArgument
	}
	if c.OffHostDetail != nil {
		detail = c.OffHostDetail(d)
	} else {
		detail = fmt.Sprintf("unsupported device type %s: %s serves CPU tensors", d, c.Backend)
	}
	return &OpError{Op: op.String(), Seq: m.Seq, Rank: c.Rank, Backend: c.Backend, Kind: kind, Detail: detail}
}

// List is Host for an op that needs at least one tensor (allreduce's
// list).
func (c *HostChecker[K]) List(op Op, m Meta, ts []*tensor.Tensor) ([][]byte, error) {
	bufs, err := c.Host(op, m, ts...)
	if err != nil {
		return nil, err
	}
	if len(bufs) == 0 {
		return nil, c.Invalid(op, m, "requires non-empty tensor list")
	}
	return bufs, nil
}

// Rooted is Host for a list with a root tensor (broadcast, reduce): an
// error unless 0 <= rootTensor < len(ts).
func (c *HostChecker[K]) Rooted(op Op, m Meta, ts []*tensor.Tensor, rootTensor int) ([][]byte, error) {
	bufs, err := c.Host(op, m, ts...)
	if err != nil {
		return nil, err
	}
	if len(bufs) == 0 || rootTensor < 0 || rootTensor >= len(bufs) {
		return nil, c.Invalid(op, m, "invalid root tensor")
	}
	return bufs, nil
}

// Reduction returns the backend's reduction of r on dt, through Lookup,
// with its error as an *OpError for op.
func (c *HostChecker[K]) Reduction(op Op, m Meta, dt tensor.DType, r ReduceOp) (K, error) {
	k, err := c.Lookup(dt, r)
	if err == nil {
		return k, nil
	}
	var zero K
	if oe, ok := err.(*OpError); ok {
		e := *oe
		e.Op, e.Seq, e.Rank, e.Backend = op.String(), m.Seq, c.Rank, c.Backend
		return zero, &e
	}
	return zero, &OpError{Op: op.String(), Seq: m.Seq, Rank: c.Rank, Backend: c.Backend, Kind: ErrInvalidArgument, Err: err}
}

// ReduceList is the preamble of an op that reduces a list of tensors
// together (allreduce, allreduce_coalesced): List, then Reduction on
// the first tensor's dtype.
func (c *HostChecker[K]) ReduceList(op Op, m Meta, ts []*tensor.Tensor, r ReduceOp) ([][]byte, K, error) {
	bufs, err := c.List(op, m, ts)
	return c.thenReduction(op, m, ts, bufs, err, r)
}

// ReduceListInto is ReduceList with the buffers appended to dst[:0], the
// caller's storage: with room for ts (a one-tensor list into a local
// array), the check allocates nothing, which an 8 B allreduce notices.
func (c *HostChecker[K]) ReduceListInto(dst [][]byte, op Op, m Meta, ts []*tensor.Tensor, r ReduceOp) ([][]byte, K, error) {
	bufs, err := c.hostInto(dst, op, m, ts)
	if err == nil && len(bufs) == 0 {
		err = c.Invalid(op, m, "requires non-empty tensor list")
	}
	return c.thenReduction(op, m, ts, bufs, err, r)
}

// ReduceRooted is the preamble of reduce: Rooted, then Reduction on the
// first tensor's dtype.
func (c *HostChecker[K]) ReduceRooted(op Op, m Meta, ts []*tensor.Tensor, rootTensor int, r ReduceOp) ([][]byte, K, error) {
	bufs, err := c.Rooted(op, m, ts, rootTensor)
	return c.thenReduction(op, m, ts, bufs, err, r)
}

// thenReduction adds Reduction on ts[0]'s dtype to a list check's result.
func (c *HostChecker[K]) thenReduction(op Op, m Meta, ts []*tensor.Tensor, bufs [][]byte, err error, r ReduceOp) ([][]byte, K, error) {
	var k K
	if err == nil {
		k, err = c.Reduction(op, m, ts[0].DType(), r)
	}
	if err != nil {
		return nil, k, err
	}
	return bufs, k, nil
}
