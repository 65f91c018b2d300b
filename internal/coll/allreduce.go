package coll

import (
	"context"

	"github.com/gocoll/gocoll/internal/reduce"
)

// Allreduce reduces buf across ranks in place with k.Combine. It does not
// apply k.Pre or k.Post; the caller does, so that it can scale a copy.
// Every rank ends with bit-identical bytes.
func Allreduce(ctx context.Context, c *Comm, tag uint64, buf []byte, k reduce.Kernel) error {
	n := c.T.Size()
	if n == 1 || len(buf) == 0 {
		return nil
	}
	small := c.Small
	if small <= 0 {
		small = DefaultSmall
	}
	if len(buf) <= small || len(buf)/k.ElemSize < n {
		return allreduceRD(ctx, c, tag, buf, k)
	}
	blocks := SplitEven(buf, n, k.ElemSize)
	if err := ring(ctx, c, tag, blocks, -1, &k, true); err != nil {
		return err
	}
	return ring(ctx, c, tag, blocks, 0, nil, false)
}
