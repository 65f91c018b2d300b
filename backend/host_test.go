package backend

import (
	"errors"
	"testing"

	"github.com/gocoll/gocoll/tensor"
)

// deviceMem labels a tensor as device memory; HostChecker reads only the
// tensor's device, never the memory.
type deviceMem struct{ n int }

func (m deviceMem) Ptr() uintptr { return 0x1000 }
func (m deviceMem) Len() int     { return m.n }
func (m deviceMem) Free() error  { return nil }

// sizeLookup is a reduction lookup that yields the element size, with
// ReduceOp.ValidFor's error.
func sizeLookup(dt tensor.DType, r ReduceOp) (int, error) { return dt.Size(), r.ValidFor(dt) }

func TestHostCheckerErrors(t *testing.T) {
	m := Meta{Op: OpAllreduce, Seq: 3}
	plain := &HostChecker[int]{Backend: "cpupool", Rank: 1, Lookup: sizeLookup}
	ucc := &HostChecker[int]{Backend: "ucc", Rank: 2, Lookup: sizeLookup, OffHostKind: ErrUnsupported,
		OffHostDetail: func(d tensor.Device) string { return "tensor on " + d.String() + ": host only" }}
	x := tensor.New(tensor.Float32, 4)
	dev, err := tensor.FromDevice(tensor.CUDADevice(0), tensor.Float32, deviceMem{16}, 4)
	if err != nil {
		t.Fatal(err)
	}
	strided, err := tensor.New(tensor.Float32, 8).AsStrided([]int{4}, []int{2})
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, err error, kind error, want string) {
		t.Helper()
		var oe *OpError
		if !errors.As(err, &oe) || !errors.Is(err, kind) || err.Error() != want {
			t.Errorf("%s: %v (%T), want %v: %q", name, err, err, kind, want)
		}
	}
	_, err = plain.Host(OpAllreduce, m, x, nil)
	check("nil", err, ErrInvalidArgument, "cpupool allreduce seq 3 on rank 1: invalid argument: nil tensor")
	_, err = plain.Host(OpAllreduce, m, dev)
	check("device", err, ErrInvalidArgument, "cpupool allreduce seq 3 on rank 1: invalid argument: unsupported device type cuda:0: cpupool serves CPU tensors")
	_, err = ucc.Host(OpBroadcast, m, x, dev)
	check("device, own kind", err, ErrUnsupported, "ucc broadcast seq 3 on rank 2: unsupported: tensor on cuda:0: host only")
	_, err = plain.Host(OpAllreduce, m, strided)
	check("strided", err, ErrInvalidArgument, "cpupool allreduce seq 3 on rank 1: invalid argument: Tensors must be contiguous")
	_, err = plain.List(OpAllreduce, m, nil)
	check("empty", err, ErrInvalidArgument, "cpupool allreduce seq 3 on rank 1: invalid argument: requires non-empty tensor list")
	for _, root := range []int{-1, 1} {
		_, err = plain.Rooted(OpBroadcast, m, []*tensor.Tensor{x}, root)
		check("root tensor", err, ErrInvalidArgument, "cpupool broadcast seq 3 on rank 1: invalid argument: invalid root tensor")
	}
	_, err = plain.Rooted(OpBroadcast, m, nil, 0)
	check("root tensor of none", err, ErrInvalidArgument, "cpupool broadcast seq 3 on rank 1: invalid argument: invalid root tensor")
	err = plain.Invalid(OpSend, Meta{Seq: 9}, "invalid peer rank %d", 5)
	check("invalid", err, ErrInvalidArgument, "cpupool send seq 9 on rank 1: invalid argument: invalid peer rank 5")

	// A lookup's plain error is an invalid argument that wraps it.
	band := ReduceOp{Type: BAnd}
	_, err = plain.Reduction(OpAllreduce, m, tensor.Float32, band)
	cause := band.ValidFor(tensor.Float32)
	if !errors.Is(err, ErrInvalidArgument) || err.Error() != "cpupool allreduce seq 3 on rank 1: invalid argument: "+cause.Error() {
		t.Errorf("BAND on float32: %v", err)
	}
	// A lookup's OpError keeps its kind and detail; the checker names the
	// op, and the lookup's error is not changed.
	own := Errorf(ErrUnsupported, "", "no such datatype")
	odd := &HostChecker[int]{Backend: "ucc", Rank: 2, Lookup: func(tensor.DType, ReduceOp) (int, error) { return 0, own }}
	_, err = odd.Reduction(OpReduce, m, tensor.Float32, ReduceOp{})
	check("lookup's OpError", err, ErrUnsupported, "ucc reduce seq 3 on rank 2: unsupported: no such datatype")
	if own.Op != "" || own.Rank != 0 || own.Backend != "" {
		t.Errorf("the lookup's error was changed: %+v", own)
	}
}

func TestHostCheckerPreambles(t *testing.T) {
	m := Meta{Op: OpAllreduce, Seq: 1}
	calls := 0
	c := &HostChecker[int]{Backend: "cpupool", Lookup: func(dt tensor.DType, r ReduceOp) (int, error) {
		calls++
		return sizeLookup(dt, r)
	}}
	a, b := tensor.New(tensor.Float64, 2), tensor.New(tensor.Float64, 3)
	bufs, k, err := c.ReduceList(OpAllreduce, m, []*tensor.Tensor{a, b}, ReduceOp{Type: Max})
	if err != nil || len(bufs) != 2 || len(bufs[0]) != 16 || len(bufs[1]) != 24 || k != 8 {
		t.Fatalf("ReduceList: %d buffers, kernel %d, %v", len(bufs), k, err)
	}
	bufs, k, err = c.ReduceRooted(OpReduce, m, []*tensor.Tensor{a, b}, 1, ReduceOp{})
	if err != nil || len(bufs) != 2 || k != 8 {
		t.Fatalf("ReduceRooted: %d buffers, kernel %d, %v", len(bufs), k, err)
	}
	if calls != 2 {
		t.Fatalf("%d lookups, want 2", calls)
	}
	// A failed list check comes first: no lookup, no buffers.
	if bufs, _, err := c.ReduceList(OpAllreduce, m, nil, ReduceOp{}); bufs != nil || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("ReduceList of none: %v, %v", bufs, err)
	}
	if bufs, _, err := c.ReduceRooted(OpReduce, m, []*tensor.Tensor{a}, 2, ReduceOp{}); bufs != nil || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("ReduceRooted past the list: %v, %v", bufs, err)
	}
	if calls != 2 {
		t.Fatalf("%d lookups after failed list checks, want 2", calls)
	}
	// A failed lookup gives no buffers.
	if bufs, _, err := c.ReduceList(OpAllreduce, m, []*tensor.Tensor{a}, ReduceOp{Type: BXor}); bufs != nil || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("BXOR on float64: %v, %v", bufs, err)
	}
}
