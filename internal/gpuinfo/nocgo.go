//go:build !cgo

package gpuinfo

import (
	"context"
	"fmt"
	"time"

	"github.com/gocoll/gocoll/internal/knob"
)

// errNoCgo is every call's error in a build without cgo: go-nvml needs it.
var errNoCgo = fmt.Errorf("%w: built without cgo (CGO_ENABLED=0)", ErrUnavailable)

// Options configure Open. The zero value is the defaults.
type Options struct {
	// Library is the path of libnvidia-ml.so.1.
	Library string
	// Env looks variables up (default os.LookupEnv).
	Env knob.Env
}

// MonitorOptions configure NewMonitor.
type MonitorOptions struct {
	Poll, Reuse time.Duration
	Keep        int
}

// Lib is an initialised NVML; without cgo there is none.
type Lib struct{}

// Monitor listens for XID events; without cgo there is none.
type Monitor struct{}

// Open fails: NVML needs cgo.
func Open(Options) (*Lib, error) { return nil, errNoCgo }

// Close does nothing.
func (l *Lib) Close() error { return nil }

// Machine fails: NVML needs cgo.
func (l *Lib) Machine() (Machine, error) { return Machine{}, errNoCgo }

// GPUs fails: NVML needs cgo.
func (l *Lib) GPUs() ([]GPU, error) { return nil, errNoCgo }

// Health fails: NVML needs cgo.
func (l *Lib) Health(int) (Health, error) { return Health{}, errNoCgo }

// NewMonitor fails: NVML needs cgo.
func (l *Lib) NewMonitor(MonitorOptions) (*Monitor, error) { return nil, errNoCgo }

// Close does nothing.
func (m *Monitor) Close() {}

// Notes is empty.
func (m *Monitor) Notes() []string { return nil }

// XIDs is empty.
func (m *Monitor) XIDs(string, time.Time) []XID { return nil }

// GPU finds nothing.
func (m *Monitor) GPU(string) (GPU, bool) { return GPU{}, false }

// Snapshot says NVML is unavailable.
func (m *Monitor) Snapshot(_ context.Context, bus string, since time.Time) Snapshot {
	return Snapshot{Health: Health{GPU: GPU{Index: Unknown, BusID: bus}}, XIDsSince: since, Stale: errNoCgo.Error()}
}

// ListenError is empty.
func (m *Monitor) ListenError() string { return "" }

// Start does nothing.
func Start() {}

// Process fails: NVML needs cgo.
func Process(context.Context) (*Monitor, error) { return nil, errNoCgo }

// UseGPU does nothing.
func UseGPU(string) {}

// Snapshots fails: NVML needs cgo.
func Snapshots(context.Context, time.Time) ([]Snapshot, error) { return nil, errNoCgo }
