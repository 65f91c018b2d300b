package nccl

import (
	"context"
	"strings"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/gpuinfo"
)

// maxSnapshotBound caps the NVML snapshot's bound when the watchdog
// interval is long: a failure's error should not wait on a sick GPU for
// seconds.
const maxSnapshotBound = 250 * time.Millisecond

// snapshotBound is how long a failure's NVML snapshot may take: half the
// watchdog interval (50 ms by default), since the watchdog takes it and
// NVML calls can hang on a sick GPU; what NVML has not answered by then
// is reported as such (gpuinfo.Monitor.Snapshot).
func (b *Backend) snapshotBound() time.Duration {
	return min(max(b.opts.WatchdogInterval/2, time.Millisecond), maxSnapshotBound)
}

// startNVML opens NVML and registers the XID events of the process's GPUs
// in the background when the first group starts (gpuinfo.Start), and
// notes when this group started, the origin of its snapshots' XIDs.
func (b *Backend) startNVML() {
	b.started = time.Now()
	gpuinfo.Start()
}

// useGPU tells gpuinfo that this process runs a communicator on c's GPU,
// so that flight-recorder dumps (and metrics) snapshot it.
func useGPU(c *comm) {
	if c == nil || c.dev == nil {
		return
	}
	if bus, err := c.dev.PCIBusID(); err == nil {
		gpuinfo.UseGPU(bus)
	}
}

// addGPUSnapshot appends the NVML snapshot of w's GPU to the error of a
// timed-out or failed op: XID events since the group started, throttling,
// utilisation, memory in use and ECC counts, so that a rank stuck behind a
// sick GPU says so. It takes at most snapshotBound.
func (b *Backend) addGPUSnapshot(err *backend.OpError, w *Work) {
	if w == nil || w.c == nil || w.c.dev == nil {
		return
	}
	s := b.gpuSnapshot(w.c)
	if !strings.HasPrefix(s, "NVML") {
		s = "NVML: " + s
	}
	if err.Detail != "" {
		err.Detail += "; "
	}
	err.Detail += s
}

// gpuSnapshot renders the snapshot of c's GPU, bounded by snapshotBound.
func (b *Backend) gpuSnapshot(c *comm) string {
	ctx, cancel := context.WithTimeout(context.Background(), b.snapshotBound())
	defer cancel()
	bus, err := c.dev.PCIBusID()
	if err != nil {
		return "no PCI bus id for the device: " + err.Error()
	}
	mon, err := gpuinfo.Process(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return "NVML was still starting after " + b.snapshotBound().String()
		}
		return err.Error() // "NVML unavailable: ..."
	}
	return mon.Snapshot(ctx, bus, b.started).String()
}
