package nccl

import (
	"context"
	"errors"
	"fmt"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// coalBlock is the queue of a coalescing block.
type coalBlock struct {
	dev   int
	async bool
	meta  backend.Meta
	n     int
	ins   []*tensor.Tensor
	outs  []*tensor.Tensor
	calls []call
}

// StartCoalescing implements backend.Coalescer: ops issued until
// EndCoalescing are queued, not launched, and return a nil Work. Unlike
// PyTorch, no ncclGroupStart is issued here: the whole group is launched by
// EndCoalescing on one locked OS thread, so the block may span goroutines
// and threads safely.
func (b *Backend) StartCoalescing(ctx context.Context) error {
	if !b.coalescing.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: nccl: coalescing block already open", backend.ErrInvalidArgument)
	}
	b.mu.Lock()
	b.coal = coalBlock{dev: -1}
	b.mu.Unlock()
	return nil
}

// queue adds an op to the open block.
func (b *Backend) queue(ctx context.Context, m backend.Meta, dev int, async bool, ins, outs []*tensor.Tensor, calls []call) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	cb := &b.coal
	if cb.dev >= 0 && cb.dev != dev {
		return b.opError(m, backend.ErrInvalidArgument, fmt.Errorf("coalesced ops on devices %d and %d", cb.dev, dev))
	}
	if cb.n == 0 {
		cb.meta = m
	}
	cb.dev = dev
	cb.async = cb.async || async
	cb.n++
	cb.ins = append(cb.ins, ins...)
	cb.outs = append(cb.outs, outs...)
	cb.calls = append(cb.calls, calls...)
	return nil
}

// EndCoalescing implements backend.Coalescer: it launches the block as one
// NCCL group and returns its single Work (one sync event, one end event).
// The block runs on the internal stream if any of its ops asked for async.
// An empty block gives an already completed Work.
func (b *Backend) EndCoalescing(ctx context.Context) (backend.Work, error) {
	b.mu.Lock()
	cb := b.coal
	b.coal = coalBlock{dev: -1}
	b.mu.Unlock()
	if !b.coalescing.CompareAndSwap(true, false) {
		return nil, fmt.Errorf("%w: nccl: EndCoalescing without StartCoalescing", backend.ErrInvalidArgument)
	}
	if cb.n == 0 {
		return backend.CompletedWork(0, nil, nil), nil
	}
	c, err := b.getComm(ctx, cb.dev)
	if err != nil {
		return nil, b.wrapErr(cb.meta, err)
	}
	w, err := b.launch(ctx, cb.meta, c, cb.async, cb.ins, cb.outs, cb.calls)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Coalesce runs fn inside a coalescing block of c (a backend, or a process
// group that implements backend.Coalescer) and returns the block's single
// Work: one NCCL group, one event. The ops fn issues return nil Works. If
// fn fails, the block is still closed and its error is returned with the
// Work.
func Coalesce(ctx context.Context, c backend.Coalescer, fn func(ctx context.Context) error) (backend.Work, error) {
	if err := c.StartCoalescing(ctx); err != nil {
		return nil, err
	}
	ferr := fn(ctx)
	w, err := c.EndCoalescing(ctx)
	return w, errors.Join(ferr, err)
}
