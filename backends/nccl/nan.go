package nccl

/*
#include "nccl_dl.h"
*/
import "C"

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
)

// ErrNaN is wrapped, with backend.ErrInvalidArgument, by the error of an op
// whose input holds a NaN while the NaN check is on (Options.NaNCheck).
var ErrNaN = errors.New("NaN in the input")

// NaNCheckPTXEnv names a variable that, when set, points at a PTX file
// loaded instead of the committed kernels/nan_check.ptx (for regenerating
// and testing it on a GPU machine).
const NaNCheckPTXEnv = "GOCOLL_NCCL_NAN_CHECK_PTX"

// nanCheckPTX is kernels/nan_check.cu compiled by scripts/gen-nan-ptx.sh.
//
//go:embed kernels/nan_check.ptx
var nanCheckPTX []byte

// nanChecker is a communicator's NaN check: the kernel and a flag word in
// device-mapped pinned memory.
type nanChecker struct {
	fn   *cuda.Function
	flag *cuda.HostBuffer
}

func newNaNChecker(d *cuda.Device) (*nanChecker, error) {
	img := nanCheckPTX
	if p := os.Getenv(NaNCheckPTXEnv); p != "" {
		var err error
		if img, err = os.ReadFile(p); err != nil {
			return nil, fmt.Errorf("nccl: NaN check: %w", err)
		}
	}
	if len(img) == 0 {
		return nil, fmt.Errorf("%w: nccl: NaN check: no PTX (run scripts/gen-nan-ptx.sh on a GPU machine, or set %s)", backend.ErrUnavailable, NaNCheckPTXEnv)
	}
	mod, err := d.LoadModule(img)
	if err != nil {
		return nil, fmt.Errorf("nccl: NaN check: %w", err)
	}
	fn, err := mod.Function("gocoll_nan_check")
	if err != nil {
		mod.Unload()
		return nil, fmt.Errorf("nccl: NaN check: %w", err)
	}
	flag, err := d.HostAlloc(64, cuda.HostDeviceMap|cuda.HostPortable)
	if err != nil {
		mod.Unload()
		return nil, fmt.Errorf("nccl: NaN check: %w", err)
	}
	return &nanChecker{fn: fn, flag: flag}, nil
}

// nanKind maps an ncclDataType_t to the kernel's kind; false for types
// without NaN.
func nanKind(dt C.int) (int32, bool) {
	switch dt {
	case 7:
		return 0, true
	case 8:
		return 1, true
	case 6:
		return 2, true
	case 9:
		return 3, true
	case 10:
		return 4, true
	case 11:
		return 5, true
	}
	return 0, false
}

// sends reports whether call k reads its send buffer on this rank: a
// receive, a broadcast or scatter on a non-root rank only write theirs.
func (k call) sends(commRank int) bool {
	switch k.kind {
	case C.GN_RECV:
		return false
	case C.GN_BROADCAST, C.GN_SCATTER:
		return k.root == commRank
	}
	return k.count > 0
}

// checkNaN runs the NaN kernel over every buffer the op sends, on the
// current stream (where the inputs were produced), and waits for it on the
// host. An input with a NaN fails the op on this rank before anything is
// issued, so the NaN never reaches the peers. Ops captured into a graph
// are not checked: the host cannot wait during a capture.
func (b *Backend) checkNaN(ctx context.Context, m backend.Meta, c *comm, cur *cuda.Stream, calls []call) error {
	nc := c.nan
	if nc == nil {
		return nil
	}
	if st, err := cur.CaptureStatus(); err != nil || st != cuda.CaptureNone {
		return nil
	}
	c.nanMu.Lock()
	defer c.nanMu.Unlock()
	word := (*uint32)(nc.flag.Pointer())
	atomic.StoreUint32(word, 0)
	launched := false
	for _, k := range calls {
		kind, ok := nanKind(k.dt)
		if !ok || !k.sends(c.rank) || k.count == 0 {
			continue
		}
		const block = 256
		grid := min((k.count+block-1)/block, 1024)
		args := new(cuda.KernelArgs).Ptr(k.send).U64(uint64(k.count)).I32(kind).Ptr(nc.flag.DevicePtr())
		if err := cur.Launch(nc.fn, [3]uint32{uint32(grid), 1, 1}, [3]uint32{block, 1, 1}, 0, args); err != nil {
			return b.opError(m, backend.ErrAborted, err)
		}
		launched = true
	}
	if !launched {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, opTimeout(m))
	defer cancel()
	if err := cur.SynchronizeContext(wctx); err != nil {
		return &backend.OpError{Op: m.Op.String(), Seq: m.Seq, Rank: b.rank, Backend: Name, Kind: backend.ErrTimeout, Err: err,
			Detail: "waiting for the NaN check of the inputs", Timeout: m.Timeout}
	}
	if atomic.LoadUint32(word) != 0 {
		return &backend.OpError{Op: m.Op.String(), Seq: m.Seq, Rank: b.rank, Backend: Name, Kind: backend.ErrInvalidArgument, Err: ErrNaN,
			Detail: fmt.Sprintf("rank %d's input of %s seq %d holds a NaN (NaN check on; the op was not issued)", b.rank, m.Op, m.Seq)}
	}
	return nil
}
