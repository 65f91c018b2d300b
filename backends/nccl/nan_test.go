package nccl

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// nanTensor makes n elements of dt on e's device, NaN at index bad (none
// when bad < 0).
func (e *rankEnv) nanTensor(dt tensor.DType, n, bad int) (*tensor.Tensor, error) {
	if dt == tensor.Float8E4M3 || dt == tensor.Float8E5M2 {
		b := make([]byte, n)
		for i := range b {
			b[i] = 0x38 // 1.0 in e4m3, 0.5 in e5m2
		}
		if bad >= 0 {
			b[bad] = map[tensor.DType]byte{tensor.Float8E4M3: 0x7f, tensor.Float8E5M2: 0x7e}[dt]
		}
		h, err := tensor.FromBytes(dt, b, n)
		if err != nil {
			return nil, err
		}
		return cudaFromHost(e, h)
	}
	return e.fill(dt, n, func(i int) float64 {
		if i == bad {
			return math.NaN()
		}
		return 1
	})
}

// TestNaNCheck: with the NaN check on, an input with a NaN fails the op on
// that rank (ErrInvalidArgument and ErrNaN, naming the rank and the op),
// for every floating dtype; clean inputs pass; a NaN in a receive buffer
// (broadcast on a non-root rank, recv) does not count.
func TestNaNCheck(t *testing.T) {
	gpus(t)
	if len(nanCheckPTX) == 0 && getenv(NaNCheckPTXEnv) == "" {
		t.Skip("no NaN-check PTX committed yet (scripts/gen-nan-ptx.sh)")
	}
	opts := testOpts()
	opts.NaNCheck = true
	envs := newRanks(t, 0, opts)
	dts := []tensor.DType{tensor.Float32, tensor.Float64, tensor.Float16, tensor.BFloat16}
	if lib.version >= 22400 {
		dts = append(dts, tensor.Float8E4M3, tensor.Float8E5M2)
	}
	const n = 1 << 20
	for _, dt := range dts {
		// Clean inputs pass.
		each(t, envs, func(e *rankEnv) error {
			x, err := e.nanTensor(dt, n, -1)
			if err != nil {
				return err
			}
			w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{})
			if err != nil {
				return err
			}
			return w.WaitHost(e.ctx)
		})
		// A NaN in every rank's input (near the end, past the first grid
		// pass) fails every rank's op before it is issued.
		each(t, envs, func(e *rankEnv) error {
			x, err := e.nanTensor(dt, n, n-3)
			if err != nil {
				return err
			}
			_, err = e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{})
			if !errors.Is(err, backend.ErrInvalidArgument) || !errors.Is(err, ErrNaN) || !strings.Contains(err.Error(), "allreduce") ||
				!strings.Contains(err.Error(), "rank "+string(rune('0'+e.r))) {
				return errors.New(dt.String() + ": want a NaN error naming the rank and op, got " + errString(err))
			}
			return nil
		})
	}
	t.Logf("NaN check over %d dtypes, %d elements, %d ranks", len(dts), n, len(envs))
	if len(envs) < 2 {
		t.Log("one GPU: the receive-buffer cases need two")
		return
	}
	// Receive buffers full of NaN do not trigger it.
	each(t, envs, func(e *rankEnv) error {
		bad := -1
		if e.r != 0 {
			bad = 5
		}
		x, err := e.nanTensor(tensor.Float32, 1024, bad)
		if err != nil {
			return err
		}
		w, err := e.b.Broadcast(e.ctx, e.meta(backend.OpBroadcast), []*tensor.Tensor{x}, backend.BroadcastOptions{RootRank: 0})
		if err != nil {
			return err
		}
		if err := w.WaitHost(e.ctx); err != nil {
			return err
		}
		return e.expect(x, func(int) float64 { return 1 })
	})
	each(t, envs[:2], func(e *rankEnv) error {
		x, err := e.nanTensor(tensor.Float32, 1024, map[int]int{0: -1, 1: 7}[e.r])
		if err != nil {
			return err
		}
		m := backend.Meta{Op: backend.OpSend, Seq: 1, Timeout: 20 * time.Second}
		var w backend.Work
		if e.r == 0 {
			w, err = e.b.Send(e.ctx, m, []*tensor.Tensor{x}, 1, backend.SendOptions{})
		} else {
			m.Op = backend.OpRecv
			w, err = e.b.Recv(e.ctx, m, []*tensor.Tensor{x}, 0, backend.RecvOptions{})
		}
		if err != nil {
			return err
		}
		if err := w.WaitHost(e.ctx); err != nil {
			return err
		}
		return e.expect(x, func(int) float64 { return 1 })
	})
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}
