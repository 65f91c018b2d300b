package dispatcher

import (
	"fmt"
	"math/bits"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// Metrics is what the dispatcher reports to when metrics are on: every op
// of every group, aborts, the watchdogs' heartbeats, the flight
// recorder's dumps and the TCPStore server this process hosts. Package
// metrics implements it over Prometheus; the dispatcher only calls this
// interface, so that a program without metrics links no metrics library
// and its ops pay one nil check.
//
// Init takes ownership of a Metrics: Start is called once, before any
// group exists, and Close when the default group closes.
type Metrics interface {
	// Start is called once by Init with what the process is. With p.Addr
	// set it serves http://p.Addr/metrics. An error fails Init.
	Start(p MetricsProcess) error
	// Group is called once for each group this process is a member of,
	// when the group is made; the group's ops and aborts go to the result.
	Group(g MetricsGroup) GroupMetrics
	// StoreServer is called by InitFromEnv on the rank that hosts the
	// TCPStore, before Start and before the server starts: the returned
	// observer sees its requests (from the first, so before Start too),
	// and stats, once the server runs, returns its connections and queued
	// bytes (zero before).
	StoreServer(stats func() store.ServerStats) store.ServerObserver
	// Close stops the listener and whatever the implementation runs.
	Close() error
}

// MetricsProcess describes the process to Metrics.Start.
type MetricsProcess struct {
	// Rank and WorldSize are the process's in the default group.
	Rank, WorldSize int
	// Addr is where to serve /metrics ("" for no listener): Config.MetricsAddr
	// or GOCOLL_METRICS_ADDR, with the port moved by the local rank.
	Addr string
	// Dumps returns how many dumps the flight recorder has written; nil
	// when the recorder is off.
	Dumps func() int
}

// MetricsGroup describes one group to Metrics.Group.
type MetricsGroup struct {
	Name, Desc string // the group's id ("0") and description ("default_pg")
	Rank, Size int    // this process's rank in the group, and its size
	// Backends names the backend of each device type (indexed by
	// tensor.DeviceType); "" where the group has none.
	Backends [tensor.CUDA + 1]string
	// Heartbeats returns the watchdog counter of each backend of the group
	// that has one (backend.Heartbeater), by backend name.
	Heartbeats func() map[string]uint64
}

// GroupMetrics receives one group's ops.
type GroupMetrics interface {
	// Op is called for every op the group numbered, on the issuing
	// goroutine, after the backend accepted it (w set) or refused it (err
	// set; *backend.OpError). issued is when the dispatcher numbered it,
	// on the backend.Mono clock, for the ops TimeEvery asks to time; 0 for
	// the others. It must be quick and never block: completion is for the
	// implementation to follow, off this goroutine. A Work that has
	// completed when Op is called must not be kept past its return: the
	// blocking forms (AllreduceWait, ...) call Op after their Wait and may
	// then hand the Work back to its backend for reuse (backend.Releaser).
	Op(op backend.Op, dt tensor.DeviceType, issued time.Duration, w backend.Work, err error)
	// TimeEvery is asked once, when the group is made: the dispatcher
	// stamps the ops whose sequence number is a multiple of it (a power of
	// two; 1 stamps every op), so that every rank times the same ops.
	TimeEvery() uint64
	// Aborted is called once per Abort of the group.
	Aborted(reason error)
	// Close is called when the group closes; ops still in flight may be
	// dropped.
	Close()
}

// MetricsAddrEnv names the variable that turns metrics on when
// Config.MetricsAddr and Config.Metrics are unset.
const MetricsAddrEnv = "GOCOLL_METRICS_ADDR"

// metricsFactory makes the Metrics of a Config that names only an
// address: package metrics registers it in init(), as backends register.
var (
	metricsMu      sync.Mutex
	metricsFactory func() (Metrics, error)
)

// RegisterMetrics sets the implementation that Init uses when
// Config.MetricsAddr or GOCOLL_METRICS_ADDR is set and Config.Metrics is
// not. Package metrics calls it in init(), so that a blank import of it is
// enough; a later call replaces the earlier.
func RegisterMetrics(newMetrics func() (Metrics, error)) {
	metricsMu.Lock()
	metricsFactory = newMetrics
	metricsMu.Unlock()
}

var knobMetricsAddr = knob.Knob[string]{Field: "dispatcher.Config.MetricsAddr", Env: []string{MetricsAddrEnv},
	Check: func(s string) error { _, _, err := splitMetricsAddr(s); return err }}

// splitMetricsAddr checks a host:port metrics address.
func splitMetricsAddr(s string) (string, int, error) {
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, knob.Want("host:port or :port (" + err.Error() + ")")
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, knob.Want("a port number in [0, 65535] after the colon")
	}
	return host, port, nil
}

// metricsAddr is the address rank localRank serves on: the port moves by
// the local rank, so that every rank of a host started with the same
// variable (torchrun passes one environment to all) gets its own; port 0
// stays 0 (a free port each).
func metricsAddr(addr string, localRank int) (string, error) {
	if addr == "" {
		return "", nil
	}
	host, port, err := splitMetricsAddr(addr)
	if err != nil {
		return "", err
	}
	if port != 0 {
		port += localRank
	}
	if port > 65535 {
		return "", fmt.Errorf("dispatcher: %w: metrics address %s plus local rank %d is past port 65535", backend.ErrInvalidArgument, addr, localRank)
	}
	return net.JoinHostPort(host, strconv.Itoa(port)), nil
}

// localRank is LOCAL_RANK (torchrun's), else rank.
func localRank(env knob.Env, rank int) int {
	if v, ok := env("LOCAL_RANK"); ok {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			return n
		}
	}
	return rank
}

// newMetrics returns the process's Metrics, not yet started, if they are
// on: cfg.Metrics, else the registered implementation when an address is
// set. It returns nil when they are off.
func newMetrics(cfg Config) (Metrics, error) {
	if cfg.Metrics != nil || cfg.MetricsAddr == "" {
		return cfg.Metrics, nil
	}
	metricsMu.Lock()
	f := metricsFactory
	metricsMu.Unlock()
	if f == nil {
		return nil, fmt.Errorf("dispatcher: %w: metrics address %q is set (Config.MetricsAddr or %s), but no metrics implementation is linked: import _ \"github.com/gocoll/gocoll/metrics\"",
			backend.ErrInvalidArgument, cfg.MetricsAddr, MetricsAddrEnv)
	}
	m, err := f()
	if err != nil {
		return nil, fmt.Errorf("dispatcher: metrics: %w", err)
	}
	return m, nil
}

// startMetrics starts m for the process cfg describes.
func startMetrics(m Metrics, cfg Config, env knob.Env, dumps func() int) error {
	addr, err := metricsAddr(cfg.MetricsAddr, localRank(env, cfg.Rank))
	if err != nil {
		return err
	}
	if err := m.Start(MetricsProcess{Rank: cfg.Rank, WorldSize: cfg.WorldSize, Addr: addr, Dumps: dumps}); err != nil {
		return fmt.Errorf("dispatcher: metrics: %w", err)
	}
	return nil
}

// attachMetrics gives pg its GroupMetrics, when the process has Metrics.
func (pg *ProcessGroup) attachMetrics() {
	m := pg.root.metricsRoot
	if m == nil || pg.rank < 0 {
		return
	}
	g := MetricsGroup{Name: pg.name, Desc: pg.desc, Rank: pg.rank, Size: pg.size, Heartbeats: pg.heartbeats}
	for dt, s := range pg.backends {
		if dt < len(g.Backends) {
			g.Backends[dt] = s.name
		}
	}
	pg.metrics = m.Group(g)
	every := max(pg.metrics.TimeEvery(), 1)
	if every&(every-1) != 0 { // not a power of two: the next one
		every = 1 << bits.Len64(every)
	}
	pg.metricsEvery = every
}

// heartbeats returns the watchdog counter of each of the group's backends
// that has one.
func (pg *ProcessGroup) heartbeats() map[string]uint64 {
	out := map[string]uint64{}
	for _, b := range pg.distinct() {
		if h, ok := b.(backend.Heartbeater); ok {
			out[b.Name()] = h.Heartbeat()
		}
	}
	return out
}
