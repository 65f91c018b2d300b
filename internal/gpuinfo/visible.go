package gpuinfo

import (
	"fmt"
	"strconv"
	"strings"
)

// Visible returns the GPUs that a CUDA process sees, in CUDA's order
// (device 0 first), given the machine's GPUs in NVML order and the value
// of CUDA_VISIBLE_DEVICES (set says whether the variable is set at all:
// unset shows every GPU, set to "" shows none). Entries are NVML indices
// or UUIDs ("GPU-…", a unique prefix is enough), as CUDA takes them.
// Indices count in NVML's PCI bus order, which is CUDA's when
// CUDA_DEVICE_ORDER=PCI_BUS_ID or the GPUs are all of one kind.
//
// As CUDA does, the list ends at the first entry that names no GPU; note
// then says so. An entry naming a GPU that an earlier entry named is an
// error: two CUDA devices (two ranks) would be one GPU, which NCCL refuses.
// MIG instances ("MIG-…") are refused: a MIG slice cannot host an NCCL rank.
func Visible(gpus []GPU, env string, set bool) (vis []GPU, note string, err error) {
	if !set {
		return gpus, "", nil
	}
	seen := map[int]int{} // NVML index → entry number
	for n, raw := range strings.Split(env, ",") {
		e := strings.TrimSpace(raw)
		if e == "" && n == 0 && strings.TrimSpace(env) == "" {
			return nil, "", nil
		}
		if strings.HasPrefix(e, "MIG-") {
			return nil, "", fmt.Errorf("CUDA_VISIBLE_DEVICES=%q: entry %d %q is a MIG instance; NCCL ranks need whole GPUs", env, n+1, e)
		}
		g, why := match(gpus, e)
		if why != "" {
			if n == 0 {
				note = fmt.Sprintf("CUDA_VISIBLE_DEVICES=%q: entry 1 %q %s, so CUDA sees no GPU", env, e, why)
			} else {
				note = fmt.Sprintf("CUDA_VISIBLE_DEVICES=%q: entry %d %q %s; CUDA ignores it and the entries after it", env, n+1, e, why)
			}
			return vis, note, nil
		}
		if first, dup := seen[g.Index]; dup {
			return nil, "", fmt.Errorf("CUDA_VISIBLE_DEVICES=%q names GPU%d (%s) twice (entries %d and %d): two ranks would share one GPU, which NCCL refuses; name each GPU once",
				env, g.Index, g.UUID, first, n+1)
		}
		seen[g.Index] = n + 1
		vis = append(vis, g)
	}
	return vis, note, nil
}

// match finds the GPU an entry names, or says why it names none.
func match(gpus []GPU, e string) (GPU, string) {
	if i, err := strconv.Atoi(e); err == nil {
		for _, g := range gpus {
			if g.Index == i {
				return g, ""
			}
		}
		return GPU{}, fmt.Sprintf("names no GPU (NVML sees %d)", len(gpus))
	}
	if !strings.HasPrefix(e, "GPU-") {
		return GPU{}, "is neither an index nor a GPU UUID"
	}
	var found []GPU
	for _, g := range gpus {
		if strings.HasPrefix(strings.ToLower(g.UUID), strings.ToLower(e)) {
			found = append(found, g)
		}
	}
	switch len(found) {
	case 1:
		return found[0], ""
	case 0:
		return GPU{}, "matches no GPU's UUID"
	}
	return GPU{}, fmt.Sprintf("is a prefix of %d GPUs' UUIDs", len(found))
}

// CheckRanks refuses nproc ranks on fewer visible GPUs, before any rank
// starts: LOCAL_RANK picks each rank's GPU, so two ranks would share one,
// and NCCL refuses that later with a less clear error ("Duplicate GPU
// detected"). visible are the GPUs the ranks would see; env describes
// CUDA_VISIBLE_DEVICES for the message.
func CheckRanks(nproc int, visible []GPU, env string, set bool) error {
	if nproc <= len(visible) {
		return nil
	}
	cvd := "unset"
	if set {
		cvd = strconv.Quote(env)
	}
	names := make([]string, len(visible))
	for i, g := range visible {
		names[i] = fmt.Sprintf("GPU%d %s", g.Index, g.UUID)
	}
	seen := "no GPU is visible"
	if len(visible) > 0 {
		seen = fmt.Sprintf("%d visible (%s)", len(visible), strings.Join(names, ", "))
	}
	return fmt.Errorf("%d ranks need %d GPUs (one per rank), but %s with CUDA_VISIBLE_DEVICES %s: "+
		"two ranks on one GPU are refused (NCCL would fail later with \"Duplicate GPU detected\"); "+
		"use --nproc %d, or leave --nproc out to start one rank per visible GPU", nproc, nproc, seen, cvd, len(visible))
}
