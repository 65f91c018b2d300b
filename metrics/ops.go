package metrics

import (
	"errors"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/tensor"
)

// numDev is the number of device types an op can be routed by.
const numDev = int(tensor.CUDA) + 1

// group is one group's metrics: the series of each (op, device type),
// made at the op's first use, and a follower per device type for the
// works that were not complete at issue.
type group struct {
	e      *Exporter
	info   dispatcher.MetricsGroup
	nops   int
	series []atomic.Pointer[opSeries] // [op*numDev+dt]
	mu     sync.Mutex                 // guards the making of series and followers
	follow [numDev]*follower
	stop   chan struct{} // closed by Close
	closed atomic.Bool
}

// opSeries are the counts of one (group, backend, op), kept in atomics of
// their own and read by the Exporter's collector at each scrape, so that
// an op touches no label map and no lock: an issued count, a captured
// count and the latency histogram.
type opSeries struct {
	// inline counts the ops whose Work was complete, successfully, at
	// issue: issued and completed at once, in one atomic add; issued and
	// completed count the others. The exported counts add inline in.
	inline    atomic.Uint64
	issued    atomic.Uint64
	completed atomic.Uint64
	captured  atomic.Uint64
	latency   latency
	labels    []string // group, group_desc, backend, op
}

// The latency buckets: upper bounds of 2^(10+2i) ns, i = 0 … numBuckets-1,
// that is powers of 4 from 1.024 µs to 68.7 s, and +Inf after them. A
// bucket is found from the bit length of the latency, with no search.
const (
	numBuckets  = 14
	firstBucket = 10 // log2 of the first bound, in ns
)

// bucketBounds are the bounds in seconds, as exported.
var bucketBounds = func() []float64 {
	b := make([]float64, numBuckets)
	for i := range b {
		b[i] = float64(uint64(1)<<(firstBucket+2*i)) / 1e9
	}
	return b
}()

// latency is a histogram of op latencies in atomics: a count per bucket
// (not cumulative; the collector sums them) and the sum in ns.
type latency struct {
	counts [numBuckets + 1]atomic.Uint64 // the last is +Inf
	sumNs  atomic.Int64
}

// bucketOf returns the bucket of a latency of ns nanoseconds: the first i
// with ns <= 2^(firstBucket+2i), or numBuckets (+Inf).
func bucketOf(ns int64) int {
	if ns <= 1<<firstBucket {
		return 0
	}
	l := bits.Len64(uint64(ns - 1)) // ns <= 2^l
	i := (l - firstBucket + 1) / 2
	return min(i, numBuckets)
}

func (h *latency) observe(d time.Duration) {
	ns := max(int64(d), 0)
	h.counts[bucketOf(ns)].Add(1)
	h.sumNs.Add(ns)
}

// snapshot returns the count, the sum in seconds and the cumulative
// bucket counts by bound, as prometheus.NewConstHistogram takes them.
func (h *latency) snapshot() (uint64, float64, map[float64]uint64) {
	cum := make(map[float64]uint64, numBuckets)
	var n uint64
	for i := range numBuckets {
		n += h.counts[i].Load()
		cum[bucketBounds[i]] = n
	}
	n += h.counts[numBuckets].Load()
	return n, float64(h.sumNs.Load()) / 1e9, cum
}

// Group implements dispatcher.Metrics.
func (e *Exporter) Group(info dispatcher.MetricsGroup) dispatcher.GroupMetrics {
	n := len(backend.Ops())
	g := &group{e: e, info: info, nops: n, series: make([]atomic.Pointer[opSeries], n*numDev), stop: make(chan struct{})}
	e.mu.Lock()
	e.groups = append(e.groups, g)
	e.mu.Unlock()
	return g
}

func (g *group) seriesOf(op backend.Op, dt tensor.DeviceType) *opSeries {
	i := int(op)*numDev + int(dt)
	if s := g.series[i].Load(); s != nil {
		return s
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if s := g.series[i].Load(); s != nil {
		return s
	}
	s := &opSeries{labels: []string{g.info.Name, g.info.Desc, g.info.Backends[dt], op.String()}}
	g.series[i].Store(s)
	return s
}

// Op implements dispatcher.GroupMetrics. A host work that is complete
// already (an op the backend finished inline, or the op of a blocking
// call, which the dispatcher shows after its Wait) is recorded here, and
// not kept: its backend may reuse it (backend.Releaser). Any other Work
// goes to the follower of its device type, so that the issuing goroutine
// never queries a device.
func (g *group) Op(op backend.Op, dt tensor.DeviceType, issued time.Duration, w backend.Work, err error) {
	if int(op) >= g.nops || int(dt) >= numDev {
		return
	}
	s := g.seriesOf(op, dt)
	if err == nil {
		if o, ok := w.(backend.OutcomeReporter); ok {
			if at, _, _, oerr := o.Outcome(); at != 0 {
				if err = oerr; err == nil {
					s.inline.Add(1)
					if issued != 0 {
						s.latency.observe(at - issued)
					}
					return
				}
			}
		}
	}
	s.issued.Add(1)
	if err != nil {
		g.failed(s, err)
		return
	}
	if c, ok := w.(backend.CaptureReporter); ok && c.Captured() {
		s.captured.Add(1)
		return
	}
	g.follower(dt).push(pendingOp{w: w, s: s, issued: issued})
}

// completedAter is a Work that knows when it completed
// (backend.HostWork, and the works that embed one).
type completedAter interface{ CompletedAt() time.Duration }

// finished records w, which has completed; issued, on the backend.Mono
// clock, is 0 for an op the dispatcher did not time. A host work's latency
// ends when it completed, however late it is looked at; another's (nccl)
// when it was seen complete, now.
func (g *group) finished(s *opSeries, issued time.Duration, w backend.Work) {
	if err := w.Exception(); err != nil {
		g.failed(s, err)
		return
	}
	s.completed.Add(1)
	if issued == 0 {
		return
	}
	var end time.Duration
	if c, ok := w.(completedAter); ok {
		end = c.CompletedAt()
	}
	if end == 0 {
		end = backend.Mono()
	}
	s.latency.observe(end - issued)
}

// kinds are the error kinds of the failures series, in the order they are
// tested (an error wraps one sentinel; the first that matches names it).
var kinds = []struct {
	err  error
	name string
}{
	{backend.ErrTimeout, "timeout"}, {backend.ErrAborted, "aborted"}, {backend.ErrRemote, "remote"},
	{backend.ErrUnsupported, "unsupported"}, {backend.ErrInvalidArgument, "invalid_argument"},
	{backend.ErrUnavailable, "unavailable"}, {backend.ErrClosed, "closed"},
}

// kindOf names the sentinel err wraps, or "other".
func kindOf(err error) string {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "other"
}

func (g *group) failed(s *opSeries, err error) {
	k := kindOf(err)
	g.e.failures.WithLabelValues(append(s.labels[:4:4], k)...).Inc()
	if k == "timeout" {
		g.e.timeouts.WithLabelValues(s.labels[:3]...).Inc()
	}
}

// Aborted implements dispatcher.GroupMetrics.
func (g *group) Aborted(error) {
	g.e.aborts.WithLabelValues(g.info.Name, g.info.Desc).Inc()
}

// TimeEvery implements dispatcher.GroupMetrics: Options.TimeEvery.
func (g *group) TimeEvery() uint64 { return uint64(g.e.opts.TimeEvery) }

// Close implements dispatcher.GroupMetrics: the followers stop, and works
// still in flight are no longer followed. The group's series stay.
func (g *group) Close() {
	if g.closed.CompareAndSwap(false, true) {
		close(g.stop)
	}
}

func (g *group) follower(dt tensor.DeviceType) *follower {
	g.mu.Lock()
	defer g.mu.Unlock()
	f := g.follow[dt]
	if f == nil {
		f = &follower{g: g, wake: make(chan struct{}, 1)}
		g.follow[dt] = f
		g.e.wg.Go(f.run)
	}
	return f
}

// pendingOp is an op whose Work had not completed at issue.
type pendingOp struct {
	w      backend.Work
	s      *opSeries
	issued time.Duration
}

// follower waits for the works of one group and device type, in issue
// order, on a goroutine of its own. It holds each work until it completes:
// no longer than the backend itself holds it.
//
// A push does not wake it: waking a parked goroutine costs the issuing
// one a few µs (measured: ~3 µs on the 2-core machine), more than an op's
// whole budget. With nothing to follow it looks again at intervals that
// double from 10 µs to Options.Poll, and parks only after idleLimit with
// no push; only a push onto a parked follower wakes it.
type follower struct {
	g      *group
	mu     sync.Mutex
	q      []pendingOp   // pushed, not yet taken; guarded by mu
	parked bool          // the follower waits on wake; guarded by mu
	wake   chan struct{} // a push onto the parked follower
	batch  []pendingOp   // the follower's own: taken from q
	at     int           // the next of batch
}

// idleLimit is how long a follower looks for work before it parks.
const idleLimit = 100 * time.Millisecond

func (f *follower) push(p pendingOp) {
	f.mu.Lock()
	f.q = append(f.q, p)
	wake := f.parked
	f.parked = false
	f.mu.Unlock()
	if wake {
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
}

// next returns the oldest pending op, looking for one as the type says;
// false once the group or the Exporter is closed. It takes the queue a
// batch at a time, swapping its slice for the drained one, so that the
// issuing goroutine meets the lock once per batch and appends without
// allocating.
func (f *follower) next(timer *time.Timer) (pendingOp, bool) {
	poll := 10 * time.Microsecond
	var idle time.Duration // since the queue was last found empty, roughly
	for {
		if f.at < len(f.batch) {
			p := f.batch[f.at]
			f.batch[f.at] = pendingOp{}
			f.at++
			return p, true
		}
		f.mu.Lock()
		if len(f.q) > 0 {
			f.batch, f.q = f.q, f.batch[:0]
			f.at = 0
			f.mu.Unlock()
			continue
		}
		if cap(f.batch) > 4096 { // a burst grew it: let it go
			f.batch = nil
		}
		park := idle >= idleLimit
		f.parked = park
		f.mu.Unlock()
		var tick <-chan time.Time
		if !park {
			timer.Reset(poll)
			tick = timer.C
			idle += poll
			poll = min(2*poll, f.g.e.opts.Poll)
		}
		select {
		case <-f.wake:
			poll, idle = 10*time.Microsecond, 0
		case <-tick:
		case <-f.g.stop:
			timer.Stop()
			return pendingOp{}, false
		case <-f.g.e.stop:
			timer.Stop()
			return pendingOp{}, false
		}
	}
}

func (f *follower) run() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		p, ok := f.next(timer)
		if !ok {
			return
		}
		if !f.await(p.w, timer) {
			return
		}
		f.g.finished(p.s, p.issued, p.w)
	}
}

// await waits for w: on its future, which a host backend completes the
// moment the op ends, and, for a backend that completes its futures only
// when it polls (nccl's watchdog, every 100 ms), on IsCompleted at
// intervals that double from 10 µs to Options.Poll. It returns false when
// the group or the Exporter closed first.
func (f *follower) await(w backend.Work, timer *time.Timer) bool {
	done := w.Future().Done()
	if _, host := w.(completedAter); host {
		select {
		case <-done:
			return true
		case <-f.g.stop:
			return false
		case <-f.g.e.stop:
			return false
		}
	}
	poll := 10 * time.Microsecond
	for {
		if w.IsCompleted() {
			return true
		}
		timer.Reset(poll)
		select {
		case <-done:
			timer.Stop()
			return true
		case <-timer.C:
		case <-f.g.stop:
			timer.Stop()
			return false
		case <-f.g.e.stop:
			timer.Stop()
			return false
		}
		poll = min(2*poll, f.g.e.opts.Poll)
	}
}

// The series of the ops, made at each scrape from the atomics.
var (
	opLabels     = []string{"group", "group_desc", "backend", "op"}
	descIssued   = prometheus.NewDesc("gocoll_ops_issued_total", "Ops the dispatcher numbered and handed to the backend.", opLabels, nil)
	descDone     = prometheus.NewDesc("gocoll_ops_completed_total", "Ops that completed successfully.", opLabels, nil)
	descLatency  = prometheus.NewDesc("gocoll_op_duration_seconds", "Issue to completion of the timed ops that succeeded (one in Options.TimeEvery, by sequence number).", opLabels, nil)
	descCaptured = prometheus.NewDesc("gocoll_ops_captured_total", "Ops captured into a CUDA graph: they run at each replay and never complete here.", opLabels, nil)
)

// collect sends the group's op series.
func (g *group) collect(ch chan<- prometheus.Metric) {
	for i := range g.series {
		s := g.series[i].Load()
		if s == nil {
			continue
		}
		inline := s.inline.Load()
		ch <- prometheus.MustNewConstMetric(descIssued, prometheus.CounterValue, float64(inline+s.issued.Load()), s.labels...)
		ch <- prometheus.MustNewConstMetric(descDone, prometheus.CounterValue, float64(inline+s.completed.Load()), s.labels...)
		n, sum, cum := s.latency.snapshot()
		ch <- prometheus.MustNewConstHistogram(descLatency, n, sum, cum, s.labels...)
		if c := s.captured.Load(); c > 0 {
			ch <- prometheus.MustNewConstMetric(descCaptured, prometheus.CounterValue, float64(c), s.labels...)
		}
	}
}
