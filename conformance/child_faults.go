package conformance

// The child side of the fault specs of spec_faults.go: a killed rank of
// four named by every survivor, a rank that never joins, and ranks that
// pass one collective different dtypes.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/tensor"
)

// Timeouts of the fault scenarios.
const (
	childNoJoinTimeout = 2 * time.Second // the Init timeout of "nojoin"
	killOneAfter       = 20              // "killone-v": rank v dies before this many loop ops
)

// killOne ("killone-<v>"): every rank loops allreduces; rank v records the
// time in the store and kills itself before loop op killOneAfter. Each
// survivor reports its error, whom it names and how long after the kill
// it failed, then aborts its group, as a training script would: its
// peers must still name v, not it.
func (c *Child) killOne() error {
	bg := context.Background()
	victim, err := strconv.Atoi(strings.TrimPrefix(c.Scenario, "killone-"))
	if err != nil {
		return err
	}
	for i := 0; ; i++ {
		if c.Rank == victim && i == killOneAfter {
			if err := c.Store.Set(bg, "test/killed_at", []byte(strconv.FormatInt(time.Now().UnixNano(), 10))); err != nil {
				return err
			}
			return syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		_, err := c.Allreduce(childKillTimeout)
		if err == nil {
			continue
		}
		at := time.Now()
		c.ResultErr("err", err)
		v, gerr := c.Store.Get(bg, "test/killed_at")
		if gerr == nil {
			ns, _ := strconv.ParseInt(string(v), 10, 64)
			c.Result("detect", at.Sub(time.Unix(0, ns)).Seconds())
		}
		c.ResultErr("abort", c.PG.Abort(bg, err))
		return nil
	}
}

// noJoin: the last rank never calls Init; the others Init with
// childNoJoinTimeout and report how long it took and whom the error names.
func (c *Child) noJoin(dcfg dispatcher.Config) error {
	if c.Rank == c.World-1 {
		return nil
	}
	dcfg.Timeout = childNoJoinTimeout
	t0 := time.Now()
	pg, err := dispatcher.Init(context.Background(), dcfg)
	c.Result("elapsed", time.Since(t0).Seconds())
	c.ResultErr("err", err)
	if pg != nil {
		_ = pg.Close(context.Background())
	}
	return nil
}

// mismatch ("mismatch-dtype"): rank 0 allreduces 1024 float32 elements,
// the others 1024 int32 ones (the same bytes); then every rank runs a
// matching allreduce, which must work.
//
// "mismatch-size": rank 0 allreduces 1024 float32 elements, the others
// 1000; "mismatch-size4m": 4 MiB (1 Mi elements) against 1 Mi - 1024.
//
// With the suffix "-ahead" every rank first runs three allreduces of rank
// 0's op (float32, its size), so that the mismatched op equals the last
// op the group agreed on at rank 0: a backend may post it there before
// the peers' fingerprints are in (ucc's FingerprintsAhead), and the
// mismatch must still fail on every rank, in the same words, with the
// group working on.
func (c *Child) mismatch() error {
	dt, n := tensor.Int32, 1024
	if c.Rank == 0 {
		dt = tensor.Float32
	}
	scenario, ahead := strings.CutSuffix(c.Scenario, "-ahead")
	if ahead {
		n0 := 1024
		if scenario == "mismatch-size4m" {
			n0 = 1 << 20
		}
		for range 3 {
			if err := c.allreduceOf(tensor.Float32, n0); err != nil {
				return fmt.Errorf("a matching allreduce before the mismatch: %w", err)
			}
		}
	}
	switch scenario {
	case "mismatch-size":
		dt = tensor.Float32
		if c.Rank != 0 {
			n = 1000
		}
	case "mismatch-size4m":
		dt, n = tensor.Float32, 1<<20
		if c.Rank != 0 {
			n -= 1024
		}
	}
	x, err := c.tensorOf(dt, n)
	if err != nil {
		return err
	}
	w, err := c.PG.Allreduce(c.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Timeout: ChildOKTimeout})
	if err == nil {
		ctx, cancel := context.WithTimeout(c.Ctx, 20*time.Second)
		err = w.WaitHost(ctx)
		cancel()
	}
	c.ResultErr("err", err)
	c.Result("invalid", errors.Is(err, backend.ErrInvalidArgument))
	var oe *backend.OpError
	if errors.As(err, &oe) {
		c.Result("detail", oe.Detail)
	}
	_, err = c.Allreduce(ChildOKTimeout)
	c.ResultErr("next", err)
	return nil
}

// allreduceOf runs one allreduce of n ones of dt and waits for it.
func (c *Child) allreduceOf(dt tensor.DType, n int) error {
	x, err := c.tensorOf(dt, n)
	if err != nil {
		return err
	}
	w, err := c.PG.Allreduce(c.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Timeout: ChildOKTimeout})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Ctx, 20*time.Second)
	defer cancel()
	return w.WaitHost(ctx)
}

// tensorOf makes n ones of dt on the child's device.
func (c *Child) tensorOf(dt tensor.DType, n int) (*tensor.Tensor, error) {
	v := make([]float64, n)
	for i := range v {
		v[i] = 1
	}
	h, err := tensor.FromFloat64s(dt, v)
	if err != nil || c.Dev == nil {
		return h, err
	}
	t, err := cuda.FromHost(c.Ctx, c.GPU, h)
	if err != nil {
		return nil, fmt.Errorf("tensor on GPU %d: %w", c.GPU, err)
	}
	return t, nil
}
