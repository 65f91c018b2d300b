// Package ncclconform is the nccl backend's part of the conformance suite:
// the GPU specs that port backends/nccl's stream-gate proofs (labels
// stream, async, lifetime, coalescing, p2p, dtypes), the child-process
// failure specs that need nccl's own knobs (the watchdog hang hook, the NaN
// check, a rank's error through the store), and the run setup (options,
// skips, the NCCL version line). It registers all of them with the generic
// suite from init, so a program links it with a blank import:
//
//	import _ "github.com/gocoll/gocoll/backends/nccl/ncclconform"
//
// It lives under backends/nccl so that it may use the backend's test-only
// knobs (backends/nccl/internal/ncclhook), which are not public API.
package ncclconform

import (
	"cmp"
	"fmt"
	"os"
	"strconv"

	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/internal/gpuinfo"
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

func init() {
	conformance.Register(conformance.Extension{
		Backend:     nccl.Name,
		Setup:       setup,
		Child:       childSetup,
		Scenarios:   scenarios,
		Policies:    &policies,
		CheckKilled: checkKilled,
	})
}

// setup runs once conformance.Setup has put the rank's tensors on its GPU:
// it sets the backend's options (the run's error policy is CleanUpOnly
// unless GOCOLL_NCCL_ASYNC_ERROR_HANDLING says otherwise, so that timeout
// specs fail works instead of ending the process), the skips of
// NCCLSkips, and an Info line naming the NCCL library.
func setup(cfg *conformance.RankConfig) error {
	v, err := nccl.Version()
	if err != nil {
		return err
	}
	cfg.Info = append(cfg.Info, fmt.Sprintf("nccl: %s (%s), NCCL_NVLS_ENABLE=%q", nccl.VersionString(v), nccl.LibraryPath(), os.Getenv("NCCL_NVLS_ENABLE")))
	// The machine section (NVML): the GPUs of this host's ranks, their
	// topology, driver and NCCL versions, recorded in every rank's report.
	cfg.Info = append(cfg.Info, gpuinfo.SectionLines(localWorld(), nccl.VersionString(v))...)
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

// localWorld is the number of ranks on this host: torchrun's
// LOCAL_WORLD_SIZE, else WORLD_SIZE (conftest starts every rank here).
func localWorld() int {
	n, _ := strconv.Atoi(cmp.Or(os.Getenv("LOCAL_WORLD_SIZE"), os.Getenv("WORLD_SIZE")))
	return n
}
