//go:build cgo

package gpuinfo

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/gocoll/gocoll/internal/frtrace"
)

// proc is the outcome of the process's one NVML open and XID registration
// (process-wide and set once, as backends/nccl's libnccl handle: NVML is a
// process-wide library, and one event set serves every group), and the
// GPUs the process's groups use.
var proc struct {
	once  sync.Once
	ready chan struct{}
	mon   *Monitor
	err   error
	start time.Time // when Start first ran: a dump's XIDs count from here

	mu    sync.Mutex
	inUse []string // normalised bus ids, in first-use order
}

func init() { proc.ready = make(chan struct{}) }

// Start opens NVML and registers the XID events of every GPU for the
// process, in the background, once; the backends call it when a group
// starts, so that NVML's initialisation (which can take a second on a
// machine without persistence mode) never delays the group.
func Start() {
	proc.once.Do(func() {
		proc.start = time.Now()
		frtrace.RegisterSection("nvml", dumpSection)
		go func() {
			defer close(proc.ready)
			lib, err := Open(Options{})
			if err != nil {
				proc.err = err
				return
			}
			proc.mon, proc.err = lib.NewMonitor(MonitorOptions{})
		}()
	})
}

// Process returns the process's monitor, waiting for Start's open until
// ctx ends. The error wraps ErrUnavailable when NVML cannot be used.
func Process(ctx context.Context) (*Monitor, error) {
	Start()
	select {
	case <-proc.ready:
		return proc.mon, proc.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// UseGPU records that a group of this process runs on the GPU at PCI bus
// id bus, for Snapshots.
func UseGPU(bus string) {
	key := NormalizeBusID(bus)
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if !slices.Contains(proc.inUse, key) {
		proc.inUse = append(proc.inUse, key)
	}
}

// Snapshots returns a snapshot of every GPU the process's groups use
// (UseGPU), each bounded by ctx, with the XID events since since. It is
// what a metrics exporter's GPU gauges and a flight-recorder dump read.
func Snapshots(ctx context.Context, since time.Time) ([]Snapshot, error) {
	m, err := Process(ctx)
	if err != nil {
		return nil, err
	}
	proc.mu.Lock()
	buses := slices.Clone(proc.inUse)
	proc.mu.Unlock()
	out := make([]Snapshot, 0, len(buses))
	for _, b := range buses {
		out = append(out, m.Snapshot(ctx, b, since))
	}
	return out, nil
}

// dumpSection is the "nvml" section of the process's flight-recorder
// dumps: the snapshots of the GPUs its groups use, with the XID events
// since the first group started, or the one line saying why there are none.
func dumpSection(ctx context.Context) any {
	snaps, err := Snapshots(ctx, proc.start)
	if err != nil {
		return map[string]string{"unavailable": err.Error()}
	}
	return snaps
}
