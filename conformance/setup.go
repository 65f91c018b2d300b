package conformance

import (
	"cmp"
	"context"
	"fmt"
	"os"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// Setup places a rank's tensors and applies the extension of the backend
// that serves them. When cfg.Backend routes CUDA tensors to a backend
// ("nccl", "cpu:cpupool,cuda:nccl"), the rank gets one GPU, device
// localRank (torchrun's LOCAL_RANK), created eagerly; tensors are uploaded
// and read back through the cuda package on the device's default stream.
// Then the registered Extension of the backend serving cfg.Device, if any,
// sets that backend's options, skips and Info lines (for nccl:
// backends/nccl/ncclconform).
//
// Without a usable GPU, a backend string that also serves the CPU runs the
// suite on CPU tensors (the GPU specs skip with "no CUDA device"); one that
// serves only CUDA tensors is an error.
func Setup(cfg *RankConfig, localRank int) error {
	devmap, err := backend.ParseBackendString(cmp.Or(cfg.Backend, "cpupool"))
	if err != nil {
		return err
	}
	if _, ok := devmap[tensor.CUDA]; ok {
		if err := setupCUDA(cfg, devmap, localRank); err != nil {
			return err
		}
	}
	if ext, ok := extension(devmap[cfg.Device.Type]); ok && ext.Setup != nil {
		return ext.Setup(cfg)
	}
	return nil
}

// setupCUDA puts the rank's tensors on GPU localRank, or leaves them on
// the CPU when there is none and the backend string serves the CPU too.
func setupCUDA(cfg *RankConfig, devmap backend.DeviceMap, localRank int) error {
	gpuErr := cuda.Available()
	if gpuErr == nil {
		if n, _ := cuda.DeviceCount(); localRank >= n {
			gpuErr = fmt.Errorf("%w: local rank %d, but %d CUDA devices", cuda.ErrNoDevice, localRank, n)
		}
	}
	if gpuErr != nil {
		if _, cpu := devmap[tensor.CPU]; cpu {
			cfg.Info = append(cfg.Info, fmt.Sprintf("no CUDA device (%v): the suite runs on CPU tensors", gpuErr))
			return nil
		}
		return fmt.Errorf("conformance: backend %q serves only CUDA tensors, and there is no CUDA device for local rank %d: %w", cfg.Backend, localRank, gpuErr)
	}
	d, err := cuda.GetDevice(localRank)
	if err != nil {
		return err
	}
	cfg.Device = tensor.CUDADevice(localRank)
	cfg.Upload = func(h *tensor.Tensor) (*tensor.Tensor, error) {
		if h.Device().Type == tensor.CUDA {
			return h, nil
		}
		return cuda.FromHost(context.Background(), localRank, h)
	}
	cfg.Download = func(t *tensor.Tensor) (*tensor.Tensor, error) {
		if t.Device().Type != tensor.CUDA {
			return t, nil
		}
		return cuda.ToHost(context.Background(), t)
	}
	devName, _ := d.Name()
	pci, _ := d.PCIBusID()
	drv, _ := cuda.DriverVersion()
	cfg.Info = append(cfg.Info, fmt.Sprintf("device: cuda:%d %s (PCI %s), CUDA driver %d.%d, CUDA_VISIBLE_DEVICES=%q",
		localRank, devName, pci, drv/1000, drv%1000/10, os.Getenv("CUDA_VISIBLE_DEVICES")))
	return nil
}
