//go:build cgo

package cpupool

import (
	"context"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/stage/cudastage"
	"github.com/gocoll/gocoll/tensor"
)

// With cgo, cpupool also serves CUDA tensors, staged through pinned host
// memory (internal/stage), as Gloo does: "cpu:cpupool,cuda:cpupool", and
// "cpupool" alone, route them here.
var servedDevices = []tensor.DeviceType{tensor.CPU, tensor.CUDA}

// newServed is the registered factory: New, behind the staging wrapper
// when the group routes CUDA tensors here and a CUDA device can be used.
func newServed(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
	b, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return cudastage.Wrap(b, cfg)
}
