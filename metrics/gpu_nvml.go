package metrics

import (
	"context"
	"time"

	"github.com/gocoll/gocoll/internal/gpuinfo"
)

// The default GPU source: the NVML layer's snapshots of the GPUs the
// process's groups run on (the nccl backend names them with
// gpuinfo.UseGPU when a group starts), each bounded by the scrape's ctx.
// A scrape opens NVML if no group has (a CPU-only job on a GPU host): the
// list is then empty. Without NVML (no cgo, no driver, GOCOLL_NVML=0) the
// error says so, once.
func init() { RegisterGPUSource(NVMLSource) }

// NVMLSource is the default GPUSource: gpuinfo's snapshots of the GPUs
// the process's groups use, with every XID event the layer holds.
func NVMLSource(ctx context.Context) ([]GPUReading, error) {
	snaps, err := gpuinfo.Snapshots(ctx, time.Time{})
	if err != nil {
		return nil, err
	}
	out := make([]GPUReading, 0, len(snaps))
	for _, s := range snaps {
		out = append(out, readingOf(s))
	}
	return out, nil
}

// readingOf converts one snapshot. NVML's unknowns are gpuinfo.Unknown
// (negative), which the collector leaves out.
func readingOf(s gpuinfo.Snapshot) GPUReading {
	r := GPUReading{Index: s.Index, UUID: s.UUID, Name: s.Name, Lost: s.Lost, UtilGPU: s.UtilGPU, UtilMemory: s.UtilMemory,
		MemoryUsed: s.MemoryUsed, MemoryTotal: int64(s.MemoryTotal), TempC: s.TempC, PowerMW: s.PowerMW,
		ECCCorrected: s.ECC.VolatileCorrected, ECCUncorrected: s.ECC.VolatileUncorrected,
		XIDs: int64(len(s.XIDs)), Throttle: s.Throttle, Stale: s.Stale != ""}
	if s.MemoryTotal == 0 {
		r.MemoryTotal = gpuinfo.Unknown
	}
	if n := len(s.XIDs); n > 0 {
		r.LastXID = s.XIDs[n-1].Code
	}
	if s.Time.IsZero() && s.Stale != "" {
		// Never read: nothing but the staleness and the XIDs is known.
		r.UtilGPU, r.UtilMemory, r.MemoryUsed, r.MemoryTotal = gpuinfo.Unknown, gpuinfo.Unknown, gpuinfo.Unknown, gpuinfo.Unknown
		r.TempC, r.PowerMW, r.ECCCorrected, r.ECCUncorrected = gpuinfo.Unknown, gpuinfo.Unknown, gpuinfo.Unknown, gpuinfo.Unknown
	}
	return r
}
