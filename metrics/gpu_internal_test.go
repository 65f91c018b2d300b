package metrics

import (
	"testing"
	"time"

	"github.com/gocoll/gocoll/internal/gpuinfo"
)

// A snapshot of the NVML layer becomes a reading field by field; one that
// was never read (NVML hung at the first read) keeps only what is known.
func TestReadingOf(t *testing.T) {
	s := gpuinfo.Snapshot{Time: time.Now(), XIDs: []gpuinfo.XID{{Code: 13}, {Code: 79}}}
	s.GPU = gpuinfo.GPU{Index: 1, Name: "NVIDIA H200", UUID: "GPU-1", MemoryTotal: 141 << 30}
	s.UtilGPU, s.UtilMemory, s.MemoryUsed, s.TempC, s.PowerMW = 97, 40, 5<<30, 61, 650000
	s.ECC = gpuinfo.ECC{VolatileCorrected: 2, VolatileUncorrected: gpuinfo.Unknown}
	s.Throttle = []string{"sw_power_cap"}
	r := readingOf(s)
	want := GPUReading{Index: 1, UUID: "GPU-1", Name: "NVIDIA H200", UtilGPU: 97, UtilMemory: 40, MemoryUsed: 5 << 30, MemoryTotal: 141 << 30,
		TempC: 61, PowerMW: 650000, ECCCorrected: 2, ECCUncorrected: gpuinfo.Unknown, XIDs: 2, LastXID: 79, Throttle: []string{"sw_power_cap"}}
	if r.Index != want.Index || r.UUID != want.UUID || r.UtilGPU != want.UtilGPU || r.UtilMemory != want.UtilMemory ||
		r.MemoryUsed != want.MemoryUsed || r.MemoryTotal != want.MemoryTotal || r.TempC != want.TempC || r.PowerMW != want.PowerMW ||
		r.ECCCorrected != want.ECCCorrected || r.ECCUncorrected != want.ECCUncorrected || r.XIDs != want.XIDs ||
		r.LastXID != want.LastXID || len(r.Throttle) != 1 || r.Stale {
		t.Errorf("got %+v\nwant %+v", r, want)
	}
	never := gpuinfo.Snapshot{Stale: "NVML did not answer within 50ms", XIDs: []gpuinfo.XID{{Code: 79}}}
	never.GPU = gpuinfo.GPU{Index: 0, UUID: "GPU-0"}
	r = readingOf(never)
	if !r.Stale || r.UtilGPU >= 0 || r.MemoryUsed >= 0 || r.MemoryTotal >= 0 || r.TempC >= 0 || r.XIDs != 1 || r.LastXID != 79 {
		t.Errorf("never read: %+v", r)
	}
}
