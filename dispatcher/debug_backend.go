package dispatcher

import (
	"context"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// checked is a group's backend under Config.Debug "detail": each
// collective's fingerprint is checked across the ranks (checkFingerprint)
// before the backend sees the op, whatever the backend, so that a
// mismatch that NCCL or UCC would turn into a hang or wrong numbers fails
// on every rank naming the ranks. Point-to-point ops and monitored_barrier
// (whose purpose is to find ranks that do not come) go straight through.
// The group's other users (the heartbeat monitor, Backend) see the bare
// backend.
type checked struct {
	backend.Backend
	pg *ProcessGroup
}

func (c *checked) check(ctx context.Context, m backend.Meta, fp fingerprint) error {
	fp.op = m.Op
	return c.pg.checkFingerprint(ctx, m, fp)
}

func flat2(lists [][]*tensor.Tensor) []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

func reduceName(r backend.ReduceOp) string { return r.String() }

// Broadcast implements backend.Backend.
func (c *checked) Broadcast(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.BroadcastOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(tensors...), count: sum(tensors...), root: opts.RootRank}); err != nil {
		return nil, err
	}
	return c.Backend.Broadcast(ctx, m, tensors, opts)
}

// Allreduce implements backend.Backend.
func (c *checked) Allreduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(tensors...), count: sum(tensors...), root: -1, reduce: reduceName(opts.ReduceOp)}); err != nil {
		return nil, err
	}
	return c.Backend.Allreduce(ctx, m, tensors, opts)
}

// AllreduceCoalesced implements backend.Backend.
func (c *checked) AllreduceCoalesced(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.AllreduceCoalescedOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(tensors...), count: sum(tensors...), root: -1, reduce: reduceName(opts.ReduceOp)}); err != nil {
		return nil, err
	}
	return c.Backend.AllreduceCoalesced(ctx, m, tensors, opts)
}

// Reduce implements backend.Backend.
func (c *checked) Reduce(ctx context.Context, m backend.Meta, tensors []*tensor.Tensor, opts backend.ReduceOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(tensors...), count: sum(tensors...), root: opts.RootRank, reduce: reduceName(opts.ReduceOp)}); err != nil {
		return nil, err
	}
	return c.Backend.Reduce(ctx, m, tensors, opts)
}

// Allgather implements backend.Backend.
func (c *checked) Allgather(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(inputs...), count: sum(flat2(outputs)...), root: -1}); err != nil {
		return nil, err
	}
	return c.Backend.Allgather(ctx, m, outputs, inputs, opts)
}

// AllgatherIntoTensor implements backend.Backend.
func (c *checked) AllgatherIntoTensor(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AllgatherIntoTensorOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(input), count: sum(output), root: -1}); err != nil {
		return nil, err
	}
	return c.Backend.AllgatherIntoTensor(ctx, m, output, input, opts)
}

// AllgatherCoalesced implements backend.Backend.
func (c *checked) AllgatherCoalesced(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherCoalescedOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(inputs...), count: sum(flat2(outputs)...), root: -1}); err != nil {
		return nil, err
	}
	return c.Backend.AllgatherCoalesced(ctx, m, outputs, inputs, opts)
}

// AllgatherIntoTensorCoalesced implements backend.Backend.
func (c *checked) AllgatherIntoTensorCoalesced(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AllgatherIntoTensorCoalescedOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(inputs...), count: sum(outputs...), root: -1}); err != nil {
		return nil, err
	}
	return c.Backend.AllgatherIntoTensorCoalesced(ctx, m, outputs, inputs, opts)
}

// ReduceScatter implements backend.Backend.
func (c *checked) ReduceScatter(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs [][]*tensor.Tensor, opts backend.ReduceScatterOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(outputs...), count: sum(flat2(inputs)...), root: -1, reduce: reduceName(opts.ReduceOp)}); err != nil {
		return nil, err
	}
	return c.Backend.ReduceScatter(ctx, m, outputs, inputs, opts)
}

// ReduceScatterTensor implements backend.Backend.
func (c *checked) ReduceScatterTensor(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.ReduceScatterTensorOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(output), count: sum(input), root: -1, reduce: reduceName(opts.ReduceOp)}); err != nil {
		return nil, err
	}
	return c.Backend.ReduceScatterTensor(ctx, m, output, input, opts)
}

// ReduceScatterTensorCoalesced implements backend.Backend.
func (c *checked) ReduceScatterTensorCoalesced(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.ReduceScatterTensorCoalescedOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(inputs...), count: sum(inputs...), root: -1, reduce: reduceName(opts.ReduceOp)}); err != nil {
		return nil, err
	}
	return c.Backend.ReduceScatterTensorCoalesced(ctx, m, outputs, inputs, opts)
}

// Alltoall implements backend.Backend; the ranks' counts may differ.
func (c *checked) Alltoall(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs []*tensor.Tensor, opts backend.AlltoallOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(inputs...), count: -1, root: -1}); err != nil {
		return nil, err
	}
	return c.Backend.Alltoall(ctx, m, outputs, inputs, opts)
}

// AlltoallBase implements backend.Backend; the ranks' counts may differ.
func (c *checked) AlltoallBase(ctx context.Context, m backend.Meta, output *tensor.Tensor, input *tensor.Tensor, opts backend.AlltoallBaseOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(input), count: -1, root: -1}); err != nil {
		return nil, err
	}
	return c.Backend.AlltoallBase(ctx, m, output, input, opts)
}

// Gather implements backend.Backend: every rank's input has one size.
func (c *checked) Gather(ctx context.Context, m backend.Meta, outputs [][]*tensor.Tensor, inputs []*tensor.Tensor, opts backend.GatherOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(inputs...), count: sum(inputs...), root: opts.RootRank}); err != nil {
		return nil, err
	}
	return c.Backend.Gather(ctx, m, outputs, inputs, opts)
}

// Scatter implements backend.Backend: every rank's output has one size.
func (c *checked) Scatter(ctx context.Context, m backend.Meta, outputs []*tensor.Tensor, inputs [][]*tensor.Tensor, opts backend.ScatterOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{dtype: dtypeOf(outputs...), count: sum(outputs...), root: opts.RootRank}); err != nil {
		return nil, err
	}
	return c.Backend.Scatter(ctx, m, outputs, inputs, opts)
}

// Barrier implements backend.Backend.
func (c *checked) Barrier(ctx context.Context, m backend.Meta, opts backend.BarrierOptions) (backend.Work, error) {
	if err := c.check(ctx, m, fingerprint{root: -1}); err != nil {
		return nil, err
	}
	return c.Backend.Barrier(ctx, m, opts)
}
