package conformance

import (
	"context"
	"fmt"
	"os"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// NCCLSkips are the behaviours of the backend-generic specs that NCCL does
// not have, by spec id (Suite.Gate), with the reason. Each matches what
// PyTorch's ProcessGroupNCCL does.
var NCCLSkips = map[string]string{
	"p2p/tags": "NCCL has no message tags: it matches sends and receives in issue order " +
		"(PyTorch's ProcessGroupNCCL ignores the tag too)",
	"reduce/bool/AVG": "NCCL refuses AVG of bool tensors (ErrInvalidArgument: " +
		"\"Cannot use ReduceOp.AVG with boolean inputs\", as PyTorch's ProcessGroupNCCL)",
	"reduce/bool/PREMUL_SUM": "NCCL refuses PREMUL_SUM of bool tensors (ErrInvalidArgument: " +
		"\"Cannot use ReduceOp.PREMUL_SUM with boolean inputs\", as PyTorch's ProcessGroupNCCL)",
}

// SetupCUDA points cfg at this rank's GPU when cfg.Backend routes CUDA
// tensors to a backend ("nccl", "cpu:cpupool,cuda:nccl"): one GPU per rank,
// device localRank (torchrun's LOCAL_RANK), created eagerly; tensors are
// uploaded and read back through the cuda package on the device's default
// stream. For nccl it also sets the backend's options (the run's error
// policy is CleanUpOnly unless GOCOLL_NCCL_ASYNC_ERROR_HANDLING says
// otherwise, so that timeout specs fail works instead of ending the
// process), the skips of NCCLSkips, and Info lines naming the device and
// the NCCL library.
//
// Without a usable GPU, a backend string that also serves the CPU runs the
// suite on CPU tensors (the GPU specs skip with "no CUDA device"); one that
// serves only CUDA tensors is an error.
func SetupCUDA(cfg *RankConfig, localRank int) error {
	devmap, err := backend.ParseBackendString(cfg.Backend)
	if err != nil {
		return err
	}
	name, ok := devmap[tensor.CUDA]
	if !ok {
		return nil
	}
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
	if name != nccl.Name {
		return nil
	}
	v, err := nccl.Version()
	if err != nil {
		return err
	}
	cfg.Info = append(cfg.Info, fmt.Sprintf("nccl: %s (%s), NCCL_NVLS_ENABLE=%q", nccl.VersionString(v), nccl.LibraryPath(), os.Getenv("NCCL_NVLS_ENABLE")))
	opts, err := nccl.OptionsFromEnv()
	if err != nil {
		return err
	}
	if os.Getenv("GOCOLL_NCCL_ASYNC_ERROR_HANDLING") == "" && os.Getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "" {
		opts.ErrorPolicy = nccl.CleanUpOnly
	}
	if cfg.BackendOptions == nil {
		cfg.BackendOptions = map[string]any{}
	}
	cfg.BackendOptions[nccl.Name] = &opts
	if cfg.Skip == nil {
		cfg.Skip = map[string]string{}
	}
	for id, why := range NCCLSkips {
		if _, set := cfg.Skip[id]; !set {
			cfg.Skip[id] = why
		}
	}
	return nil
}
