//go:build cgo

// Package cudastage is package stage's Engine over the CUDA driver
// (package cuda): per device, one internal non-blocking stream, pooled
// pinned host buffers, events and stream gates. Everything an op needs is
// taken from the pools, or made, at issue; nothing is freed before Close,
// since freeing pinned memory (cuMemFreeHost) may synchronise the device,
// which hangs while a stream is held (GPU.md's trap).
//
// Wrap is the hook the host backends call from their factory.
package cudastage

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/internal/stage"
	"github.com/gocoll/gocoll/tensor"
)

// Wrap returns inner behind a stage.Backend when cfg says it serves CUDA
// tensors and a CUDA device can be used; else inner itself. With
// cfg.Device on CUDA the engine of that device is made now (eager init),
// so that its stream, buffers and gates exist before any stream is held.
func Wrap(inner backend.Backend, cfg backend.Config) (backend.Backend, error) {
	if !slices.Contains(cfg.Devices, tensor.CUDA) || cuda.Available() != nil {
		return inner, nil
	}
	w := stage.Wrap(inner, NewEngine)
	if d := cfg.Device; d != nil && d.Type == tensor.CUDA {
		if _, err := w.Stream(d.Index); err != nil {
			_ = inner.Close(context.Background())
			return nil, &backend.OpError{Op: "init", Rank: cfg.Rank, Backend: inner.Name(), Kind: backend.ErrUnavailable, Err: err,
				Detail: "making the staging stream of " + d.String()}
		}
	}
	return w, nil
}

// Pool sizes made when an engine starts (before any stream can be held).
const (
	minClass    = 12 // the smallest host buffer: 4 KiB
	warmBuffers = 64 // 4 KiB buffers made up front
	warmOps     = 32 // gates and event triples made up front
)

// Engine is the stage.Engine of one CUDA device.
type Engine struct {
	dev *cuda.Device
	s   *cuda.Stream

	mu     sync.Mutex // orders Stage's queueing on s, and guards the pools
	free   map[int][][]byte
	pinned []*cuda.HostBuffer
	gates  []*cuda.Gate
	all    []*cuda.Gate
	events []*cuda.Event
	evAll  []*cuda.Event
}

// NewEngine makes the engine of CUDA device dev: its stream and warm pools.
func NewEngine(dev int) (stage.Engine, error) {
	d, err := cuda.GetDevice(dev)
	if err != nil {
		return nil, err
	}
	s, err := d.NewStream(cuda.StreamOptions{})
	if err != nil {
		return nil, err
	}
	e := &Engine{dev: d, s: s, free: map[int][][]byte{}}
	if err := e.warm(); err != nil {
		_ = e.Close()
		return nil, err
	}
	return e, nil
}

func (e *Engine) warm() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	h, err := e.dev.HostAlloc(warmBuffers<<minClass, cuda.HostPortable)
	if err != nil {
		return err
	}
	e.pinned = append(e.pinned, h)
	all := h.Bytes()
	for i := range warmBuffers {
		e.free[minClass] = append(e.free[minClass], all[i<<minClass:(i+1)<<minClass:(i+1)<<minClass])
	}
	for range warmOps {
		g, err := e.dev.NewGate()
		if err != nil {
			return err
		}
		e.gates, e.all = append(e.gates, g), append(e.all, g)
	}
	evs, err := e.dev.NewEvents(3*warmOps, false)
	if err != nil {
		return err
	}
	e.events, e.evAll = append(e.events, evs...), append(e.evAll, evs...)
	return nil
}

// Stream implements stage.Engine: the internal stream, a *cuda.Stream.
func (e *Engine) Stream() backend.Stream { return e.s }

// Close implements stage.Engine.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	errs := []error{e.s.Destroy()}
	for _, ev := range e.evAll {
		errs = append(errs, ev.Destroy())
	}
	for _, g := range e.all {
		errs = append(errs, g.Free())
	}
	for _, h := range e.pinned {
		errs = append(errs, h.Free())
	}
	e.evAll, e.events, e.all, e.gates, e.pinned, e.free = nil, nil, nil, nil, nil, map[int][][]byte{}
	return errors.Join(errs...)
}

// class is the size class of n bytes: the power of two at or above it.
func class(n int) int { return max(minClass, bits.Len(uint(n-1))) }

// bufLocked returns a pinned buffer of at least n > 0 bytes.
func (e *Engine) bufLocked(n int) ([]byte, error) {
	c := class(n)
	if l := e.free[c]; len(l) > 0 {
		b := l[len(l)-1]
		e.free[c] = l[:len(l)-1]
		return b[:n], nil
	}
	h, err := e.dev.HostAlloc(1<<c, cuda.HostPortable)
	if err != nil {
		return nil, err
	}
	e.pinned = append(e.pinned, h)
	return h.Bytes()[:n], nil
}

func (e *Engine) gateLocked() (*cuda.Gate, error) {
	if n := len(e.gates); n > 0 {
		g := e.gates[n-1]
		e.gates = e.gates[:n-1]
		return g, nil
	}
	g, err := e.dev.NewGate()
	if err != nil {
		return nil, err
	}
	e.all = append(e.all, g)
	return g, nil
}

func (e *Engine) eventLocked() (*cuda.Event, error) {
	if n := len(e.events); n > 0 {
		ev := e.events[n-1]
		e.events = e.events[:n-1]
		return ev, nil
	}
	ev, err := e.dev.NewEvent(false)
	if err != nil {
		return nil, err
	}
	e.evAll = append(e.evAll, ev)
	return ev, nil
}

// Stage implements stage.Engine. The internal stream's queue for one op,
// in order: wait for an event of ctx's current stream; copy each tensor to
// its pinned buffer; record copied; wait on the gate; copy the outputs
// back; record end.
func (e *Engine) Stage(ctx context.Context, ts []*tensor.Tensor, back []bool) (stage.Staged, error) {
	for _, t := range ts {
		if t.Device().Type != tensor.CUDA || t.Device().Index != e.dev.Ordinal() {
			return nil, fmt.Errorf("cudastage: %v on the engine of cuda:%d", t.Device(), e.dev.Ordinal())
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st := &Staged{e: e}
	fail := func(err error) (stage.Staged, error) {
		if st.gate != nil {
			st.gate.Open() // never leave the stream held
		}
		return nil, err
	}
	var err error
	for _, p := range []**cuda.Event{&st.start, &st.copied, &st.end} {
		if *p, err = e.eventLocked(); err != nil {
			return fail(err)
		}
	}
	if st.gate, err = e.gateLocked(); err != nil {
		return fail(err)
	}
	if err := e.s.WaitStream(cuda.StreamFor(ctx, e.dev), st.start); err != nil {
		return fail(err)
	}
	for _, t := range ts {
		var b []byte
		if n := t.NBytes(); n > 0 {
			if b, err = e.bufLocked(n); err != nil {
				return fail(err)
			}
			st.bufs = append(st.bufs, b)
			if err := e.s.CopyDtoH(unsafe.Pointer(&b[0]), t.Ptr(), n); err != nil {
				return fail(err)
			}
		}
		h, err := tensor.FromBytes(t.DType(), b, t.Shape()...)
		if err != nil {
			return fail(err)
		}
		st.host = append(st.host, h)
	}
	if err := st.copied.Record(e.s); err != nil {
		return fail(err)
	}
	if err := st.gate.Hold(e.s); err != nil {
		return fail(err)
	}
	for i, t := range ts {
		if back[i] && t.NBytes() > 0 {
			if err := e.s.CopyHtoD(t.Ptr(), st.host[i].HostPtr(), t.NBytes()); err != nil {
				return fail(err)
			}
		}
	}
	if err := st.end.Record(e.s); err != nil {
		return fail(err)
	}
	for _, t := range ts {
		if r, ok := t.Memory().(cuda.Retainer); ok {
			r.Retain()
			st.stash = append(st.stash, r)
		}
	}
	return st, nil
}

// Staged is one op staged by an Engine; it implements stage.Staged.
type Staged struct {
	e                  *Engine
	start, copied, end *cuda.Event
	gate               *cuda.Gate
	bufs               [][]byte
	host               []*tensor.Tensor
	stash              []cuda.Retainer
	freed              bool
}

// Host implements stage.Staged.
func (st *Staged) Host() []*tensor.Tensor { return st.host }

// WaitCopied implements stage.Staged.
func (st *Staged) WaitCopied(ctx context.Context) error { return st.copied.Wait(ctx) }

// Release implements stage.Staged.
func (st *Staged) Release() { st.gate.Open() }

// WaitDone implements stage.Staged.
func (st *Staged) WaitDone(ctx context.Context) error { return st.end.Wait(ctx) }

// Done implements stage.Staged.
func (st *Staged) Done() bool {
	done, err := st.end.Query()
	return done || err != nil
}

// OrderCurrent implements stage.Staged.
func (st *Staged) OrderCurrent(ctx context.Context) error {
	return cuda.StreamFor(ctx, st.e.dev).WaitEvent(st.end)
}

// OrderStream implements stage.Staged.
func (st *Staged) OrderStream(s backend.Stream) error {
	cs, ok := s.(*cuda.Stream)
	if !ok || cs == nil || cs.Device() != st.e.dev.Ordinal() {
		return fmt.Errorf("%w: BlockStream takes a *cuda.Stream of cuda:%d, got %T", backend.ErrInvalidArgument, st.e.dev.Ordinal(), s)
	}
	return cs.WaitEvent(st.end)
}

// Free implements stage.Staged: the buffers, events and gate go back to
// the pools (the end event has completed, so no stream waits on the gate
// any more) and the stash is released.
func (st *Staged) Free() {
	e := st.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if st.freed {
		return
	}
	st.freed = true
	for _, b := range st.bufs {
		c := class(len(b))
		e.free[c] = append(e.free[c], b[:cap(b)])
	}
	st.gate.Reset()
	e.gates = append(e.gates, st.gate)
	e.events = append(e.events, st.start, st.copied, st.end)
	for _, r := range st.stash {
		_ = r.Release()
	}
}
