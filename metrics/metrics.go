// Package metrics exports gocoll's metrics to Prometheus, through the
// maintained client library (github.com/prometheus/client_golang). It
// implements dispatcher.Metrics: the dispatcher reports to it through that
// interface and never imports it, so that a program without metrics links
// no Prometheus code and its ops cost one nil check.
//
// Turn it on by linking it and naming an address:
//
//	import _ "github.com/gocoll/gocoll/metrics"
//	GOCOLL_METRICS_ADDR=:9400 ./train   # rank r of a host serves :940r/metrics
//
// or with a registry of the program's own:
//
//	m := metrics.New(metrics.Options{Registry: reg})
//	pg, err := dispatcher.Init(ctx, dispatcher.Config{..., Metrics: m})
//
// The series (every one carries the label rank, the process's rank in the
// default group):
//
//	gocoll_ops_issued_total{group,group_desc,backend,op}            ops numbered and handed to the backend
//	gocoll_ops_completed_total{group,group_desc,backend,op}         ops that completed successfully
//	gocoll_op_duration_seconds{group,group_desc,backend,op}         issue to completion of the timed ops that succeeded (Options.TimeEvery)
//	gocoll_op_failures_total{group,group_desc,backend,op,kind}      ops that failed, at issue or later, by error kind (timeout, aborted, remote, …)
//	gocoll_ops_captured_total{group,group_desc,backend,op}          ops captured into a CUDA graph (they run at each replay, never complete here)
//	gocoll_timeouts_total{group,group_desc,backend}                 ops that timed out
//	gocoll_aborts_total{group,group_desc}                           ProcessGroup.Abort calls
//	gocoll_watchdog_heartbeat_age_seconds{group,group_desc,backend} time since a backend's watchdog last advanced, as seen at scrapes
//	gocoll_flight_recorder_dumps_total                              flight-recorder dumps written
//	gocoll_store_server_request_duration_seconds{op}                TCPStore server requests (this process hosts the store) and their handling time
//	gocoll_store_server_connections                                 its open connections
//	gocoll_store_server_sending_bytes                               reply bytes it is writing to clients that have not taken them
//	gocoll_gpu_*{gpu,uuid}                                          NVML's gauges of the GPUs the process's groups use (GPUSource)
//
// What an op's duration measures: from the dispatcher numbering it to its
// completion. A host backend's Work (backend.HostWork: cpupool, ucc)
// stamps its own completion (CompletedAt), so its figure is exact however
// late it is looked at; a stream backend's (nccl) is polled, at intervals
// that double from 10 µs to Options.Poll (1 ms), so its figure is within
// the interval of the truth. One op in Options.TimeEvery is timed. Works
// that are not complete at issue are followed, in issue order (the order a
// group's collectives complete in), by a goroutine per group and device
// type, which the issuing goroutine does not wake per op (see follower).
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/store"
)

func init() {
	dispatcher.RegisterMetrics(func() (dispatcher.Metrics, error) { return New(Options{}), nil })
}

// DefaultBuckets are the store's request latency buckets, in seconds:
// powers of 4 from 1 µs to 67 s. The op latency buckets are the same
// powers of 4, from 1.024 µs (2^10 ns) to 68.7 s, fixed, since they are
// found from a latency's bit length.
var DefaultBuckets = prometheus.ExponentialBuckets(1e-6, 4, 14)

// DefaultTimeEvery is Options.TimeEvery's default: a latency sample every
// 8th op of a group. Timing an op costs two clock reads (~45 ns each on a
// virtual machine), the rest of an op's metrics one or two atomic adds;
// sampling keeps the dispatcher's cost within its budget (docs/perf.md),
// and since a stalled collective holds back the ones behind it, a stall
// still shows in the sampled ones.
const DefaultTimeEvery = 8

// Options configure an Exporter. The zero value is the defaults.
type Options struct {
	// Registry receives the series; nil means a registry of the
	// Exporter's own. Handler and the listener at dispatcher.Config's
	// MetricsAddr serve it.
	Registry *prometheus.Registry
	// StoreBuckets are the store request latency buckets in seconds (nil:
	// DefaultBuckets).
	StoreBuckets []float64
	// TimeEvery: the latency histogram times one op in TimeEvery of each
	// group, those whose sequence number is a multiple of it, so that
	// every rank times the same ops (zero: DefaultTimeEvery; 1 times every
	// op; rounded up to a power of two). The counts are of every op.
	TimeEvery int
	// Poll is the longest interval between two completion checks of a
	// Work that is not a backend.HostWork (zero: 1 ms; negative is
	// invalid and is taken as the default).
	Poll time.Duration
	// GPUTimeout bounds one scrape's call of the GPU source (zero: 2 s):
	// NVML calls can hang on a sick GPU, and a scrape must not.
	GPUTimeout time.Duration
	// Logger gets the listener's address and its errors (nil:
	// slog.Default()).
	Logger *slog.Logger
}

// Exporter is the Prometheus side of gocoll's metrics; it implements
// dispatcher.Metrics. Make one with New and give it to dispatcher.Config
// (or let GOCOLL_METRICS_ADDR make one).
type Exporter struct {
	opts Options
	reg  *prometheus.Registry

	failures *prometheus.CounterVec
	timeouts *prometheus.CounterVec
	aborts   *prometheus.CounterVec
	store    *prometheus.HistogramVec

	mu         sync.Mutex
	groups     []*group
	storeStats func() store.ServerStats // nil: this process hosts no store
	rank       int
	dumps      func() int
	registered []prometheus.Collector
	wrapped    prometheus.Registerer
	srv        *http.Server
	ln         net.Listener
	closed     bool
	stop       chan struct{} // closed by Close: every follower ends
	wg         sync.WaitGroup
	beats      beatTracker
	gpuOnce    sync.Once // the GPU source's failure is logged once at info level
}

var _ dispatcher.Metrics = (*Exporter)(nil)

// New returns an Exporter; nothing is registered or served until
// dispatcher.Init starts it.
func New(opts Options) *Exporter {
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.StoreBuckets == nil {
		opts.StoreBuckets = DefaultBuckets
	}
	if opts.TimeEvery <= 0 {
		opts.TimeEvery = DefaultTimeEvery
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Millisecond
	}
	if opts.GPUTimeout <= 0 {
		opts.GPUTimeout = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	e := &Exporter{opts: opts, reg: opts.Registry, stop: make(chan struct{}), rank: -1,
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gocoll_op_failures_total",
			Help: "Ops that failed, at issue or later, by error kind."}, append(opLabels, "kind")),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gocoll_timeouts_total",
			Help: "Ops that timed out."}, []string{"group", "group_desc", "backend"}),
		aborts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gocoll_aborts_total",
			Help: "ProcessGroup.Abort calls."}, []string{"group", "group_desc"}),
		store: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gocoll_store_server_request_duration_seconds",
			Help: "Requests the TCPStore server of this process handled, and its time on each; _count is the requests.", Buckets: opts.StoreBuckets},
			[]string{"op"}),
	}
	return e
}

// Registry returns the registry the Exporter's series are in.
func (e *Exporter) Registry() *prometheus.Registry { return e.reg }

// Handler serves the registry in Prometheus's text format, as the
// listener does at /metrics.
func (e *Exporter) Handler() http.Handler {
	return promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(e.opts.Logger.Handler(), slog.LevelWarn)})
}

// Addr returns the address the listener is bound to (useful with port 0),
// or nil when there is none.
func (e *Exporter) Addr() net.Addr {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ln == nil {
		return nil
	}
	return e.ln.Addr()
}

// Start implements dispatcher.Metrics: it registers the series, labelled
// with the rank, and serves /metrics at p.Addr when set. An address it
// cannot listen on is logged, not returned: the job goes on without the
// listener.
func (e *Exporter) Start(p dispatcher.MetricsProcess) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.wrapped != nil || e.closed {
		return errors.New("metrics: this Exporter was started already; each dispatcher.Init needs a new one")
	}
	e.rank, e.dumps = p.Rank, p.Dumps
	e.wrapped = prometheus.WrapRegistererWith(prometheus.Labels{"rank": strconv.Itoa(p.Rank)}, e.reg)
	cs := []prometheus.Collector{e.failures, e.timeouts, e.aborts, e.store,
		stateCollector{e}}
	for _, c := range cs {
		if err := e.wrapped.Register(c); err != nil {
			e.unregisterLocked()
			return fmt.Errorf("metrics: registering: %w", err)
		}
		e.registered = append(e.registered, c)
	}
	if p.Addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", p.Addr)
	if err != nil {
		// Metrics must not take a job down: a port that another process
		// holds (a stale rank, a failure spec's child beside its parent)
		// costs the listener, not Init. A malformed address failed Init
		// already, in the dispatcher.
		e.opts.Logger.Error("gocoll metrics: cannot serve /metrics; the series are still counted (Exporter.Handler serves them)",
			"rank", p.Rank, "addr", p.Addr, "variable", dispatcher.MetricsAddrEnv, "err", err)
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", e.Handler())
	e.ln = ln
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(e.opts.Logger.Handler(), slog.LevelWarn)}
	e.opts.Logger.Info("gocoll metrics: serving", "rank", p.Rank, "url", "http://"+ln.Addr().String()+"/metrics")
	srv := e.srv
	e.wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.opts.Logger.Warn("gocoll metrics: listener ended", "rank", p.Rank, "addr", ln.Addr().String(), "err", err)
		}
	})
	return nil
}

func (e *Exporter) unregisterLocked() {
	for _, c := range e.registered {
		e.wrapped.Unregister(c)
	}
	e.registered = nil
}

// Close implements dispatcher.Metrics: it stops the listener and the
// completion followers, and takes the series out of the registry (a later
// Exporter may use the same one). Calling it twice does nothing.
func (e *Exporter) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	close(e.stop)
	var err error
	if e.srv != nil {
		err = e.srv.Close()
	}
	if e.wrapped != nil {
		e.unregisterLocked()
	}
	e.mu.Unlock()
	e.wg.Wait()
	return err
}

// StoreServer implements dispatcher.Metrics: the observer counts the
// server's requests; stats feeds the connection and queued-bytes gauges.
func (e *Exporter) StoreServer(stats func() store.ServerStats) store.ServerObserver {
	e.mu.Lock()
	e.storeStats = stats
	e.mu.Unlock()
	return storeObserver{e}
}

// storeObserver counts a TCPStore server's requests.
type storeObserver struct{ e *Exporter }

// Request implements store.ServerObserver.
func (o storeObserver) Request(op string, d time.Duration) {
	o.e.store.WithLabelValues(op).Observe(d.Seconds())
}

// stateCollector reports, at each scrape, what is read rather than
// counted: the watchdog heartbeats' age, the flight recorder's dumps, the
// store server's connections and queued bytes, the GPUs.
type stateCollector struct{ e *Exporter }

var (
	descBeatAge = prometheus.NewDesc("gocoll_watchdog_heartbeat_age_seconds",
		"Time since the backend's watchdog counter last moved, as seen at scrapes (the heartbeat monitor ends the process past GOCOLL_HEARTBEAT_TIMEOUT_SEC).",
		[]string{"group", "group_desc", "backend"}, nil)
	descDumps = prometheus.NewDesc("gocoll_flight_recorder_dumps_total",
		"Flight-recorder dumps this process wrote.", nil, nil)
	descStoreConns = prometheus.NewDesc("gocoll_store_server_connections",
		"Open connections of the TCPStore server of this process.", nil, nil)
	descStoreSending = prometheus.NewDesc("gocoll_store_server_sending_bytes",
		"Reply bytes the TCPStore server is writing to clients that have not taken them yet.", nil, nil)
)

// Describe implements prometheus.Collector. The GPU series depend on the
// source, so the collector is unchecked for them (DescribeByCollect would
// call NVML at registration).
func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descIssued
	ch <- descDone
	ch <- descLatency
	ch <- descCaptured
	ch <- descBeatAge
	ch <- descDumps
	ch <- descStoreConns
	ch <- descStoreSending
	for _, d := range gpuDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.e
	e.mu.Lock()
	groups := append([]*group(nil), e.groups...)
	stats, dumps := e.storeStats, e.dumps
	e.mu.Unlock()
	now := time.Now()
	for _, g := range groups {
		g.collect(ch)
		if g.closed.Load() {
			continue
		}
		for name, beat := range g.info.Heartbeats() {
			age := e.beats.age(g.info.Name+"/"+name, beat, now)
			ch <- prometheus.MustNewConstMetric(descBeatAge, prometheus.GaugeValue, age.Seconds(), g.info.Name, g.info.Desc, name)
		}
	}
	if dumps != nil {
		ch <- prometheus.MustNewConstMetric(descDumps, prometheus.CounterValue, float64(dumps()))
	}
	if stats != nil {
		s := stats()
		ch <- prometheus.MustNewConstMetric(descStoreConns, prometheus.GaugeValue, float64(s.Conns))
		ch <- prometheus.MustNewConstMetric(descStoreSending, prometheus.GaugeValue, float64(s.SendingBytes))
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.GPUTimeout)
	defer cancel()
	collectGPUs(ctx, e.opts.Logger, &e.gpuOnce, ch)
}

// beatTracker remembers when each watchdog counter last moved.
type beatTracker struct {
	mu   sync.Mutex
	last map[string]beatSeen
}

type beatSeen struct {
	beat  uint64
	moved time.Time
}

// age returns how long key's counter has stood at beat: zero when it
// moved since the last scrape (or is new), else the time since the scrape
// that first saw it at beat.
func (b *beatTracker) age(key string, beat uint64, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last == nil {
		b.last = map[string]beatSeen{}
	}
	s, ok := b.last[key]
	if !ok || s.beat != beat {
		b.last[key] = beatSeen{beat: beat, moved: now}
		return 0
	}
	return now.Sub(s.moved)
}
