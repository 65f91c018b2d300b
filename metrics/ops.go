package metrics

import (
	"errors"
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

// opSeries are the children of one (group, backend, op), resolved once so
// that an op touches no label map.
type opSeries struct {
	issued   prometheus.Counter
	latency  prometheus.Observer
	captured prometheus.Counter
	labels   []string // group, group_desc, backend, op
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
	l := []string{g.info.Name, g.info.Desc, g.info.Backends[dt], op.String()}
	s := &opSeries{issued: g.e.issued.WithLabelValues(l...), latency: g.e.latency.WithLabelValues(l...),
		captured: g.e.captured.WithLabelValues(l...), labels: l}
	g.series[i].Store(s)
	return s
}

// Op implements dispatcher.GroupMetrics. A HostWork that is complete
// already (an op the backend finished inline) is recorded here; any other
// Work goes to the follower of its device type, so that the issuing
// goroutine never queries a device.
func (g *group) Op(op backend.Op, dt tensor.DeviceType, issued time.Time, w backend.Work, err error) {
	if int(op) >= g.nops || int(dt) >= numDev {
		return
	}
	s := g.seriesOf(op, dt)
	s.issued.Inc()
	if err != nil {
		g.failed(s, err)
		return
	}
	if hw, ok := w.(*backend.HostWork); ok && hw.IsCompleted() {
		g.finished(s, issued, time.Now(), hw.Exception())
		return
	}
	if c, ok := w.(backend.CaptureReporter); ok && c.Captured() {
		s.captured.Inc()
		return
	}
	g.follower(dt).push(pendingOp{w: w, s: s, issued: issued})
}

// finished records an op that completed at now.
func (g *group) finished(s *opSeries, issued, now time.Time, err error) {
	if err != nil {
		g.failed(s, err)
		return
	}
	s.latency.Observe(now.Sub(issued).Seconds())
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
	issued time.Time
}

// follower waits for the works of one group and device type, in issue
// order, on a goroutine of its own. It holds each work until it completes:
// no longer than the backend itself holds it.
type follower struct {
	g    *group
	mu   sync.Mutex
	q    []pendingOp
	wake chan struct{} // a push since the follower last looked
}

func (f *follower) push(p pendingOp) {
	f.mu.Lock()
	f.q = append(f.q, p)
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// next returns the oldest pending op, waiting for one; false once the
// group or the Exporter is closed.
func (f *follower) next() (pendingOp, bool) {
	for {
		f.mu.Lock()
		if len(f.q) > 0 {
			p := f.q[0]
			f.q[0] = pendingOp{}
			f.q = f.q[1:]
			if len(f.q) == 0 {
				f.q = f.q[:0:0] // let the backing array go once drained
			}
			f.mu.Unlock()
			return p, true
		}
		f.mu.Unlock()
		select {
		case <-f.wake:
		case <-f.g.stop:
			return pendingOp{}, false
		case <-f.g.e.stop:
			return pendingOp{}, false
		}
	}
}

func (f *follower) run() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		p, ok := f.next()
		if !ok {
			return
		}
		if !f.await(p.w, timer) {
			return
		}
		f.g.finished(p.s, p.issued, time.Now(), p.w.Exception())
	}
}

// await waits for w: on its future, which a host backend completes the
// moment the op ends, and, for a backend that completes its futures only
// when it polls (nccl's watchdog, every 100 ms), on IsCompleted at
// intervals that double from 10 µs to Options.Poll. It returns false when
// the group or the Exporter closed first.
func (f *follower) await(w backend.Work, timer *time.Timer) bool {
	done := w.Future().Done()
	if _, host := w.(*backend.HostWork); host {
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
