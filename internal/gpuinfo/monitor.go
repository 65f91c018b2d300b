//go:build cgo

package gpuinfo

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MonitorOptions configure NewMonitor. The zero value is the defaults.
type MonitorOptions struct {
	// Poll is how long one wait for an event lasts, and so how soon Close
	// returns (default 200 ms).
	Poll time.Duration
	// Reuse: a snapshot asked for within Reuse of the last complete read
	// of that GPU returns that read (default 500 ms), so that a failure's
	// error and its dump cost one NVML round.
	Reuse time.Duration
	// Keep is how many XID events the monitor remembers (default 256).
	Keep int
}

// Monitor holds an XID event set registered on every GPU, a goroutine that
// receives its events, and the last complete read of each GPU, for
// time-bounded snapshots. Its methods are safe for concurrent use.
type Monitor struct {
	lib   *Lib
	opts  MonitorOptions
	set   nvml.EventSet
	gpus  map[string]GPU // by normalised bus id
	byID  map[string]GPU // by UUID
	notes []string
	stop  chan struct{}
	done  chan struct{}
	now   func() time.Time

	mu   sync.Mutex
	xids []XID
	err  string               // the listener's last wait error
	last map[string]Snapshot  // last complete read, by bus id
	busy map[string]time.Time // reads in flight, by bus id
}

// NewMonitor creates an event set, registers every GPU's XID events on it
// (register at group start, so that none is missed) and starts the
// listener. A GPU that cannot deliver XID events is noted (Notes), not an
// error.
func (l *Lib) NewMonitor(opts MonitorOptions) (*Monitor, error) {
	if opts.Poll <= 0 {
		opts.Poll = 200 * time.Millisecond
	}
	if opts.Reuse <= 0 {
		opts.Reuse = 500 * time.Millisecond
	}
	if opts.Keep <= 0 {
		opts.Keep = 256
	}
	devs, gpus, err := l.devices()
	if err != nil {
		return nil, err
	}
	set, ret := l.n.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, nvErr("nvmlEventSetCreate", ret)
	}
	m := &Monitor{lib: l, opts: opts, set: set, gpus: map[string]GPU{}, byID: map[string]GPU{}, stop: make(chan struct{}),
		done: make(chan struct{}), now: time.Now, last: map[string]Snapshot{}, busy: map[string]time.Time{}}
	for i, d := range devs {
		g := gpus[i]
		m.gpus[NormalizeBusID(g.BusID)], m.byID[g.UUID] = g, g
		types := uint64(nvml.EventTypeXidCriticalError)
		if sup, ret := d.GetSupportedEventTypes(); ret == nvml.SUCCESS && sup&types == 0 {
			m.notes = append(m.notes, fmt.Sprintf("GPU%d does not report XID events", g.Index))
			continue
		}
		if ret := d.RegisterEvents(types, set); ret != nvml.SUCCESS {
			m.notes = append(m.notes, fmt.Sprintf("GPU%d: registering XID events: %v", g.Index, nvml.ErrorString(ret)))
		}
	}
	go m.listen()
	return m, nil
}

// Notes says which GPUs deliver no XID events, and why.
func (m *Monitor) Notes() []string { return slices.Clone(m.notes) }

// Close stops the listener (within Poll) and frees the event set.
func (m *Monitor) Close() {
	select {
	case <-m.stop:
		return
	default:
		close(m.stop)
	}
	select {
	case <-m.done:
		m.set.Free()
	case <-time.After(2 * m.opts.Poll):
		// The wait hangs in NVML: leave the set to it.
	}
}

// listen receives events until Close.
func (m *Monitor) listen() {
	defer close(m.done)
	for {
		select {
		case <-m.stop:
			return
		default:
		}
		ev, ret := m.set.Wait(uint32(m.opts.Poll / time.Millisecond))
		switch ret {
		case nvml.SUCCESS:
			if ev.EventType&nvml.EventTypeXidCriticalError != 0 {
				m.record(ev)
			}
		case nvml.ERROR_TIMEOUT:
		default:
			m.mu.Lock()
			m.err = "nvmlEventSetWait: " + nvml.ErrorString(ret)
			m.mu.Unlock()
			select {
			case <-m.stop:
				return
			case <-time.After(m.opts.Poll):
			}
		}
	}
}

func (m *Monitor) record(ev nvml.EventData) {
	x := XID{Time: m.now(), Code: ev.EventData, Meaning: XIDMeaning(ev.EventData), Index: -1}
	if ev.Device != nil {
		if uuid, ret := ev.Device.GetUUID(); ret == nvml.SUCCESS {
			x.UUID = uuid
			if g, ok := m.byID[uuid]; ok {
				x.Index = g.Index
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.xids = append(m.xids, x)
	if len(m.xids) > m.opts.Keep {
		m.xids = slices.Delete(m.xids, 0, len(m.xids)-m.opts.Keep)
	}
}

// XIDs returns the XID events received since since; uuid "" means every
// GPU's.
func (m *Monitor) XIDs(uuid string, since time.Time) []XID {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []XID
	for _, x := range m.xids {
		if !x.Time.Before(since) && (uuid == "" || x.UUID == uuid) {
			out = append(out, x)
		}
	}
	return out
}

// GPU returns the GPU at PCI bus id bus (CUDA's or NVML's spelling).
func (m *Monitor) GPU(bus string) (GPU, bool) {
	g, ok := m.gpus[NormalizeBusID(bus)]
	return g, ok
}

// Snapshot reads the health of the GPU at PCI bus id bus, with its XID
// events since since. It returns by ctx's deadline whatever NVML does: the
// read runs on its own goroutine, and a read that has not answered by then
// leaves the last complete read (or only the identity and the XIDs, which
// need no NVML call), marked Stale. While a read of that GPU hangs, later
// snapshots start no new one: a sick GPU costs one stuck goroutine, never
// more.
func (m *Monitor) Snapshot(ctx context.Context, bus string, since time.Time) Snapshot {
	key := NormalizeBusID(bus)
	g, ok := m.gpus[key]
	if !ok {
		return Snapshot{Health: Health{GPU: GPU{Index: Unknown, BusID: bus}}, Stale: fmt.Sprintf("NVML has no GPU at PCI %s", bus)}
	}
	now := m.now()
	m.mu.Lock()
	last, have := m.last[key]
	started, busy := m.busy[key]
	fresh := have && now.Sub(last.Time) < m.opts.Reuse
	if !fresh && !busy {
		m.busy[key] = now
	}
	m.mu.Unlock()
	var s Snapshot
	switch {
	case fresh:
		s = last
	case busy:
		s = m.stale(g, last, have, fmt.Sprintf("NVML has not answered a read started %v ago", now.Sub(started).Round(time.Millisecond)))
	default:
		ch := make(chan Snapshot, 1)
		go func() {
			s := m.read(g)
			m.mu.Lock()
			delete(m.busy, key)
			m.last[key] = s
			m.mu.Unlock()
			ch <- s
		}()
		select {
		case s = <-ch:
		case <-ctx.Done():
			why := "NVML did not answer in time"
			if dl, ok := ctx.Deadline(); ok {
				why = fmt.Sprintf("NVML did not answer within %v", dl.Sub(now).Round(time.Millisecond))
			}
			s = m.stale(g, last, have, why)
		}
	}
	s.XIDsSince = since
	s.XIDs = m.XIDs(g.UUID, since)
	if s.XIDs == nil {
		s.XIDs = []XID{}
	}
	return s
}

func (m *Monitor) stale(g GPU, last Snapshot, have bool, why string) Snapshot {
	if !have {
		return Snapshot{Health: Health{GPU: g}, Stale: why}
	}
	last.Stale = why
	return last
}

// read is one NVML round of a GPU's health.
func (m *Monitor) read(g GPU) Snapshot {
	d, ret := m.lib.n.DeviceGetHandleByIndex(g.Index)
	if ret != nvml.SUCCESS {
		return Snapshot{Time: m.now(), Health: Health{GPU: g, Lost: ret == nvml.ERROR_GPU_IS_LOST,
			Errors: []string{"nvmlDeviceGetHandleByIndex: " + nvml.ErrorString(ret)}}}
	}
	return Snapshot{Time: m.now(), Health: readHealth(d, g)}
}

// ListenError is the listener's last failed wait ("" when none).
func (m *Monitor) ListenError() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}
