package metrics

import (
	"context"
	"log/slog"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// GPUReading is one GPU's gauges at one scrape. A field NVML did not
// report is negative (gpuinfo.Unknown) and its series is left out.
type GPUReading struct {
	Index       int    // NVML's index (nvidia-smi's GPU number)
	UUID, Name  string // "GPU-…", "NVIDIA H200"
	Lost        bool   // NVML says the GPU fell off the bus or stopped answering
	UtilGPU     int64  // percent
	UtilMemory  int64  // percent
	MemoryUsed  int64  // bytes
	MemoryTotal int64  // bytes
	TempC       int64
	PowerMW     int64
	// ECCCorrected and ECCUncorrected are the volatile ECC error counts
	// (since the driver loaded).
	ECCCorrected, ECCUncorrected int64
	// XIDs is the number of XID events the NVML layer holds for the GPU
	// since the process started listening (it keeps the last 256 of the
	// process), LastXID the code of the latest (0: none).
	XIDs    int64
	LastXID uint64
	// Stale: NVML did not answer within the bound and the values are its
	// last complete read (or none).
	Stale bool
	// Throttle names the current clock event (throttle) reasons.
	Throttle []string
}

// GPUSource reads the GPUs of this process's groups; ctx bounds it. The
// default is the NVML layer's (internal/gpuinfo.Snapshots: the GPUs the
// process's nccl groups run on); RegisterGPUSource replaces it.
type GPUSource func(ctx context.Context) ([]GPUReading, error)

var gpuSource struct {
	mu  sync.Mutex
	src GPUSource
}

// RegisterGPUSource sets the source of the gocoll_gpu_* series, read at
// each scrape within Options.GPUTimeout; nil removes it (then no GPU
// series is exported).
func RegisterGPUSource(src GPUSource) {
	gpuSource.mu.Lock()
	gpuSource.src = src
	gpuSource.mu.Unlock()
}

var gpuLabels = []string{"gpu", "uuid"}

// The GPU series, one per reading field.
var (
	descGPUUtil     = prometheus.NewDesc("gocoll_gpu_utilization_percent", "NVML's GPU utilisation rate.", gpuLabels, nil)
	descGPUMemUtil  = prometheus.NewDesc("gocoll_gpu_memory_utilization_percent", "NVML's memory utilisation rate.", gpuLabels, nil)
	descGPUMemUsed  = prometheus.NewDesc("gocoll_gpu_memory_used_bytes", "Device memory in use.", gpuLabels, nil)
	descGPUMemTotal = prometheus.NewDesc("gocoll_gpu_memory_total_bytes", "Device memory.", gpuLabels, nil)
	descGPUTemp     = prometheus.NewDesc("gocoll_gpu_temperature_celsius", "GPU temperature.", gpuLabels, nil)
	descGPUPower    = prometheus.NewDesc("gocoll_gpu_power_watts", "Board power draw.", gpuLabels, nil)
	descGPUECC      = prometheus.NewDesc("gocoll_gpu_ecc_errors", "Volatile ECC error counts, by type (corrected, uncorrected).",
		append(gpuLabels, "type"), nil)
	descGPUXIDs     = prometheus.NewDesc("gocoll_gpu_xid_events", "XID events the NVML layer holds for the GPU (since the process started listening; the last 256 of the process).", gpuLabels, nil)
	descGPULastXID  = prometheus.NewDesc("gocoll_gpu_last_xid", "Code of the GPU's latest XID event; 0 when there was none.", gpuLabels, nil)
	descGPUStale    = prometheus.NewDesc("gocoll_gpu_reading_stale", "1 when NVML did not answer within the bound and the values are its last complete read.", gpuLabels, nil)
	descGPULost     = prometheus.NewDesc("gocoll_gpu_lost", "1 when NVML says the GPU is lost (off the bus).", gpuLabels, nil)
	descGPUThrottle = prometheus.NewDesc("gocoll_gpu_throttle", "1 for each current clock event (throttle) reason.",
		append(gpuLabels, "reason"), nil)
	gpuDescs = []*prometheus.Desc{descGPUUtil, descGPUMemUtil, descGPUMemUsed, descGPUMemTotal, descGPUTemp,
		descGPUPower, descGPUECC, descGPUXIDs, descGPULastXID, descGPUStale, descGPULost, descGPUThrottle}
)

// collectGPUs sends the registered source's readings. A source that fails
// (NVML absent, a call that hung past ctx) exports no series, absence
// being the signal, and says why once per Exporter (then at debug level).
func collectGPUs(ctx context.Context, log *slog.Logger, once *sync.Once, ch chan<- prometheus.Metric) {
	gpuSource.mu.Lock()
	src := gpuSource.src
	gpuSource.mu.Unlock()
	if src == nil {
		return
	}
	rs, err := src(ctx)
	if err != nil {
		level := slog.LevelDebug
		once.Do(func() { level = slog.LevelInfo })
		log.Log(ctx, level, "gocoll metrics: no GPU gauges", "err", err)
		return
	}
	for _, r := range rs {
		l := []string{strconv.Itoa(r.Index), r.UUID}
		gauge := func(d *prometheus.Desc, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(l[:2:2], extra...)...)
		}
		lost := 0.0
		if r.Lost {
			lost = 1
		}
		gauge(descGPULost, lost)
		stale := 0.0
		if r.Stale {
			stale = 1
		}
		gauge(descGPUStale, stale)
		if r.XIDs >= 0 {
			gauge(descGPUXIDs, float64(r.XIDs))
			gauge(descGPULastXID, float64(r.LastXID))
		}
		if r.Lost {
			continue
		}
		for _, f := range []struct {
			d *prometheus.Desc
			v int64
			k float64
		}{{descGPUUtil, r.UtilGPU, 1}, {descGPUMemUtil, r.UtilMemory, 1}, {descGPUMemUsed, r.MemoryUsed, 1},
			{descGPUMemTotal, r.MemoryTotal, 1}, {descGPUTemp, r.TempC, 1}, {descGPUPower, r.PowerMW, 1e-3}} {
			if f.v >= 0 {
				gauge(f.d, float64(f.v)*f.k)
			}
		}
		if r.ECCCorrected >= 0 {
			gauge(descGPUECC, float64(r.ECCCorrected), "corrected")
		}
		if r.ECCUncorrected >= 0 {
			gauge(descGPUECC, float64(r.ECCUncorrected), "uncorrected")
		}
		for _, t := range r.Throttle {
			gauge(descGPUThrottle, 1, t)
		}
	}
}
