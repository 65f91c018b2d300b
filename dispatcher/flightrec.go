package dispatcher

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/frtrace"
	"github.com/gocoll/gocoll/internal/watch"
)

// Defaults of the flight recorder, PyTorch's.
const (
	DefaultTraceEntries = 2000
	DefaultDumpPrefix   = "/tmp/gocoll_trace_rank_"
)

// FlightRecorderOptions configure the flight recorder. A zero field takes
// its variable's value (GOCOLL_ name, or its TORCH_NCCL_ alias), else its
// default; a set field wins over the variable.
type FlightRecorderOptions struct {
	// Entries is the ring buffer's size; negative disables the recorder.
	// 0 means GOCOLL_TRACE_BUFFER_SIZE (where 0 disables it), else
	// DefaultTraceEntries.
	Entries int
	// DumpPrefix is the dump file's path without the rank: rank r dumps to
	// DumpPrefix + r. Empty means GOCOLL_DEBUG_INFO_TEMP_FILE, else
	// DefaultDumpPrefix.
	DumpPrefix string
	// PipeFile, when set, makes a FIFO at PipeFile + rank + ".pipe"; writing
	// "1" and a newline to it dumps on demand (GOCOLL_DEBUG_INFO_PIPE_FILE).
	PipeFile string
	// NoDumpOnError stops the automatic dump when an op fails or times out
	// (GOCOLL_DUMP_ON_TIMEOUT=0).
	NoDumpOnError bool
	// Poll is how often completions are noticed (zero: 100 ms, the
	// watchdog's period; negative is invalid).
	Poll time.Duration
	// Logger gets one line per dump. Nil means slog.Default().
	Logger *slog.Logger
}

// FlightRecorder keeps the last ops of every group of a process in a ring
// buffer, with their state, and dumps them as JSON in PyTorch's flight
// recorder schema: on error or timeout, on demand, or when a peer asks.
// `conftest fr analyze` reads the dumps of every rank.
type FlightRecorder struct {
	// What every op's record touches comes first, in one cache line
	// (they were three): mu and what it guards on the issue path.
	mu     sync.Mutex
	ring   []frEntry
	nextID uint64
	scan   uint64 // the next entry retireDone looks at
	// head and scanAt are nextID and scan modulo cap(ring), kept as they
	// move (a 64-bit division per op, for an entries count that need
	// not be a power of two, was ~2 % of an op).
	head, scanAt int32
	pending      int // entries whose work is not yet retired

	opts       FlightRecorderOptions
	rank, size int

	// wall0 and mono0 are one time.Now, and it on the backend.Mono clock:
	// wallNs's anchor.
	wall0 time.Time
	mono0 time.Duration

	groups map[string]frtrace.PGConfig
	status map[string]*frtrace.PGStatus
	dumps  watch.Dumps // when to dump, other than on demand
	ndumps int         // dumps written
	runID  string      // the job: Config.RunID and the default group's uid
	pgUID  string

	// refreshMu serialises refresh (the poll goroutine's and Snapshot's),
	// which owns polls between its two holds of mu.
	refreshMu sync.Mutex
	polls     []frPoll
	// querying: a refresh is querying works outside mu, between its two
	// holds of mu (guarded by mu). retire leaves the works alone meanwhile;
	// a flag it reads under the mu it takes anyway, where a TryLock of
	// refreshMu was two more atomic instructions on every blocking op.
	querying bool

	stop chan struct{}
	done sync.WaitGroup
}

// frGroup is what the recorder knows of one group: looked up once, at
// attach, so that recording an op needs no map lookup.
type frGroup struct {
	// status is the group's pg_status (in fr.status too), guarded by
	// fr.mu: st, for the groups attach made, which every op writes, in
	// the same cache line as the pointer the op reads.
	status *frtrace.PGStatus
	st     frtrace.PGStatus
	rank   int // this process's rank in the group, for the profiling names
	name   string
	desc   string
}

// opName is the parts of an op's profiling name (OpInfo.ProfilingName).
type opName struct {
	op         backend.Op
	backend    string
	rank, peer int
}

func (n opName) String() string {
	return OpInfo{Op: n.op, Backend: n.backend, Rank: n.rank, Peer: n.peer}.ProfilingName()
}

// frPoll is one pending entry's state, queried outside fr.mu by refresh.
type frPoll struct {
	slot      int
	id        uint64
	work      backend.Work
	sched     bool // scheduled when collected: IsStarted is asked
	started   bool
	completed bool
	dur       time.Duration
	durErr    error
	err       error
}

func newFlightRecorder(opts FlightRecorderOptions, rank, size int) (*FlightRecorder, error) {
	if opts.Entries == 0 {
		opts.Entries = DefaultTraceEntries
	}
	if opts.Entries > math.MaxInt32 {
		return nil, fmt.Errorf("dispatcher: flight recorder entries %d: more than %d", opts.Entries, math.MaxInt32)
	}
	if opts.DumpPrefix == "" {
		opts.DumpPrefix = DefaultDumpPrefix
	}
	if opts.Poll <= 0 {
		opts.Poll = 100 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	fr := &FlightRecorder{opts: opts, rank: rank, size: size, ring: make([]frEntry, 0, opts.Entries), dumps: watch.Dumps{NoDumpOnError: opts.NoDumpOnError},
		groups: map[string]frtrace.PGConfig{}, status: map[string]*frtrace.PGStatus{}, stop: make(chan struct{})}
	// The ring's memory (176 bytes an entry) is written now, once, rather
	// than by the first pass of ops: fresh pages fault on their first
	// write, 1–2 µs each on bare metal and 13–17 µs in some VMs
	// (docs/perf.md, issue 17, eleventh pass, where the ring took 78
	// faults in each rank's first 2000 ops).
	clear(fr.ring[:cap(fr.ring)])
	fr.wall0 = time.Now()
	fr.mono0 = backend.MonoOf(fr.wall0)
	if opts.PipeFile != "" {
		path := opts.PipeFile + strconv.Itoa(rank) + ".pipe"
		_ = os.Remove(path)
		if err := syscall.Mkfifo(path, 0o600); err != nil {
			return nil, fmt.Errorf("dispatcher: flight recorder pipe %s: %w", path, err)
		}
		fr.done.Go(func() { fr.servePipe(path) })
	}
	fr.done.Go(fr.poll)
	return fr, nil
}

// wallNs is the Unix time in ns of m, a backend.Mono reading: the
// recorder's times are read on the monotonic clock (one read per op, which
// the metrics share) and placed on the wall clock by the pair of readings
// taken when the recorder was made, so that they stay in order whatever
// the wall clock does meanwhile.
func (fr *FlightRecorder) wallNs(m time.Duration) int64 {
	if m == 0 {
		return 0
	}
	return fr.wall0.UnixNano() + int64(m-fr.mono0)
}

// attach records the ops of pg: the dispatcher calls add for each (see
// ProcessGroup.post), as the first of its post-op observers.
func (fr *FlightRecorder) attach(pg *ProcessGroup) {
	g := &frGroup{st: frtrace.PGStatus{LastStarted: -1}, rank: pg.rank, name: pg.name, desc: pg.desc}
	g.status = &g.st
	fr.mu.Lock()
	fr.groups[pg.name] = frtrace.PGConfig{Name: pg.name, Desc: pg.desc, Ranks: pg.Ranks()}
	fr.status[pg.name] = g.status
	fr.mu.Unlock()
	pg.frg = g
}

// record adds the op info describes, as a post hook would see it, and
// returns its slot: the tests' way in (the dispatcher calls add).
func (fr *FlightRecorder) record(ctx context.Context, info OpInfo, w backend.Work, err error) frSlot {
	fr.mu.Lock()
	g := &frGroup{name: info.Group, desc: info.GroupDesc, rank: info.Rank, status: fr.status[info.Group]}
	fr.mu.Unlock()
	in, out := list("inputs", info.Inputs), list("outputs", info.Outputs)
	c := opCall{meta: backend.Meta{Op: info.Op, Seq: info.Seq, Timeout: info.Timeout, Issued: backend.MonoOf(info.Issued)},
		bname: info.Backend, p2p: info.Op.Kind() == backend.P2P, p2pSeq: info.P2PSeq, peer: info.Peer}
	return fr.add(g, &c, &in, &out, w, err)
}

// add puts an op in the ring once the backend has accepted (or refused)
// it. It runs on the issuing goroutine: one uncontended lock, no
// allocation once the ring is full, no clock read (c.meta.Issued is the
// dispatcher's), and few stores (frEntry says why).
func (fr *FlightRecorder) add(g *frGroup, c *opCall, in, out *targ, w backend.Work, err error) frSlot {
	op := c.meta.Op
	var flags frMeta
	isP2P := c.p2p
	if isP2P {
		flags = frP2P
	}
	// A host work (backend.OutcomeReporter) runs on the host: it is
	// never captured, so that most ops make one type assertion here.
	ho, _ := w.(backend.OutcomeReporter)
	if ho != nil {
		w = nil // held as ho
	} else if cr, ok := w.(backend.CaptureReporter); ok && cr.Captured() {
		// Captured into a CUDA graph: the op did not run and runs at
		// each replay, so there is nothing to poll (its events may not
		// even be queried). The entry stays scheduled, retired, marked
		// captured.
		flags |= frCaptured | frRetired
		w = nil
	}
	var es string
	if err != nil {
		es = err.Error()
		flags |= frHasErr
	}
	var seq uint64
	if !isP2P {
		seq = c.meta.Seq
	}
	fr.mu.Lock()
	id := fr.nextID
	fr.nextID++
	if g.status != nil && !isP2P {
		g.status.LastEnqueued = int64(seq)
	}
	// The ring fills in order, so head is the new entry's index on the
	// first pass too.
	idx := fr.head
	if len(fr.ring) < cap(fr.ring) {
		fr.ring = append(fr.ring, frEntry{})
	}
	slot := &fr.ring[idx]
	if slot.work != nil || slot.ho != nil { // overwritten while pending
		slot.work, slot.ho = nil, nil
		fr.pending--
	}
	if fr.head++; int(fr.head) == cap(fr.ring) {
		fr.head = 0
	}
	slot.id, slot.g, slot.seq, slot.p2p = id, g, seq, c.p2pSeq
	slot.created, slot.timeout, slot.backend = c.meta.Issued, c.meta.Timeout, c.bname
	slot.m = newFrMeta(c.peer, op, flags)
	if err != nil {
		slot.sideOf().err = es
	}
	slot.fill(&slot.in, in, false)
	if in == out && in != nil {
		slot.out.hdr = frSameAsIn // an in-place op (most): one side's record
	} else {
		slot.fill(&slot.out, out, true)
	}
	if ho != nil {
		slot.ho = ho
		fr.pending++
	} else if w != nil {
		slot.work = w
		fr.pending++
	}
	at := frSlot{id: id, at: idx}
	failed := fr.retireDone()
	fr.mu.Unlock()
	if err != nil && isFault(err) {
		fr.onError(err)
	} else if failed != nil && isFault(failed) {
		fr.onError(failed)
	}
	return at
}

// frSlot names the entry add made: its id, and where it is in the ring.
type frSlot struct {
	id uint64
	at int32
}

// retire retires the entry s of a blocking op (ProcessGroup.waitOp) whose
// Wait has returned, if its host work has completed, and reports whether
// the recorder no longer holds the work: the dispatcher may then hand it
// back to the backend for reuse. It does not while a refresh is querying
// works outside mu (that query may be reading this one), and never for a
// work that is not a host work (a device's, left to the poll).
func (fr *FlightRecorder) retire(s frSlot) bool {
	fr.mu.Lock()
	if fr.querying {
		fr.mu.Unlock()
		return false
	}
	fe := &fr.ring[s.at]
	if fe.id != s.id {
		fr.mu.Unlock()
		return true // overwritten, its work dropped
	}
	if fe.ho == nil {
		fr.mu.Unlock()
		return fe.work == nil // retired already, or a device's work
	}
	at, dur, timed, err := fe.ho.Outcome()
	if at == 0 {
		fr.mu.Unlock()
		return false
	}
	fe.ho = nil
	fr.complete(fe, fe.m, at, dur, timed, err)
	fr.mu.Unlock()
	if err != nil && isFault(err) {
		fr.onError(err)
	}
	return true
}

// retireScan bounds the entries retireDone looks at per op: two keep up
// with one op per op, and a backlog drains over the next ops.
const retireScan = 2

// retireDone retires, oldest first, the entries whose works are host works
// that have completed, so that the ring holds no completed host work (and
// all that it references) until the next poll: with 2000 entries, that is
// megabytes of garbage kept live, which every GC cycle marks. Other works
// (a device's, whose queries are driver calls) are left to the poll. It
// stops at the first host work not yet complete. It returns the first
// error a retired work failed with. fr.mu is held.
func (fr *FlightRecorder) retireDone() error {
	var first error
	n := uint64(cap(fr.ring))
	for k := 0; k < retireScan && fr.scan < fr.nextID; k++ {
		if fr.nextID-fr.scan > n {
			fr.scan, fr.scanAt = fr.nextID-n, fr.head // overwritten meanwhile
		}
		fe := &fr.ring[fr.scanAt]
		if fe.id != fr.scan || fe.ho == nil {
			fr.advanceScan() // retired, or the poll's
			continue
		}
		at, dur, timed, err := fe.ho.Outcome()
		if at == 0 {
			break // not yet: the next op looks again
		}
		m := fe.m
		if m.state() == frScheduled { // a completed host work has started
			m = fr.start(fe, m, at)
		}
		// complete's work, inline: this runs for nearly every op.
		fe.ho, fe.completed = nil, at
		m = m.withState(frCompleted) | frRetired
		if timed {
			fe.dur, m = dur, m|frHasDur
		}
		if err != nil {
			m = fe.failed(m, err)
			if first == nil {
				first = err
			}
		}
		fe.m = m
		if st := fe.g.status; st != nil && m&frP2P == 0 && int64(fe.seq) > st.LastCompleted {
			st.LastCompleted = int64(fe.seq)
		}
		fr.pending--
		fr.advanceScan()
	}
	return first
}

// advanceScan moves retireDone's scan to the next entry. fr.mu is held.
func (fr *FlightRecorder) advanceScan() {
	fr.scan++
	if fr.scanAt++; int(fr.scanAt) == cap(fr.ring) {
		fr.scanAt = 0
	}
}

// start notes that fe (meta m, scheduled) started at now, and returns m
// in the started state; the caller writes it. fr.mu is held.
func (fr *FlightRecorder) start(fe *frEntry, m frMeta, now time.Duration) frMeta {
	fe.started = now
	if st := fe.g.status; st != nil && !m.has(frP2P) && int64(fe.seq) > st.LastStarted {
		st.LastStarted = int64(fe.seq)
	}
	return m.withState(frStarted)
}

// complete marks fe (meta m) completed at now, with the work's duration
// (when timed) and error; the caller has dropped its work. fr.mu is held.
// (refresh's; retireDone does the same inline.)
func (fr *FlightRecorder) complete(fe *frEntry, m frMeta, now, dur time.Duration, timed bool, err error) error {
	if m.state() == frScheduled {
		fe.started = now
	}
	fe.completed = now
	m = m.withState(frCompleted) | frRetired
	if timed {
		fe.dur, m = dur, m|frHasDur
	}
	if err != nil {
		m = fe.failed(m, err)
	}
	fe.m = m
	if st := fe.g.status; st != nil && !m.has(frP2P) && int64(fe.seq) > st.LastCompleted {
		st.LastCompleted = int64(fe.seq)
	}
	fr.pending--
	return err
}

// failed notes that fe's work failed with err, and returns its meta m
// with the flag that says so.
func (fe *frEntry) failed(m frMeta, err error) frMeta {
	fe.sideOf().err = err.Error()
	return m | frHasErr
}

// refresh retires completed works and notes started ones. It returns the
// first error a retired work failed with. The works are queried outside
// fr.mu: a query is a cgo call (an event query, for nccl), and a ring of
// thousands of pending ops would otherwise hold up every op's record for
// as long as the sweep takes.
func (fr *FlightRecorder) refresh() error {
	fr.refreshMu.Lock()
	defer fr.refreshMu.Unlock()
	fr.mu.Lock()
	polls := fr.polls[:0]
	for i := range fr.ring {
		fe := &fr.ring[i]
		w := fe.work
		if fe.ho != nil {
			w, _ = fe.ho.(backend.Work) // it came from one
		}
		if w != nil {
			polls = append(polls, frPoll{slot: i, id: fe.id, work: w, sched: fe.m.state() == frScheduled})
		}
	}
	fr.querying = true
	fr.mu.Unlock()
	for k := range polls {
		p := &polls[k]
		if p.sched {
			ok, err := p.work.IsStarted()
			p.started = err == nil && ok
		}
		if p.completed = p.work.IsCompleted(); p.completed {
			p.dur, p.durErr = p.work.Duration()
			p.err = p.work.Exception()
		}
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	fr.querying = false
	var firstErr error
	now := backend.Mono()
	for k := range polls {
		p := &polls[k]
		fe := &fr.ring[p.slot]
		if fe.id != p.id || (fe.work == nil && fe.ho == nil) {
			continue // retired or overwritten by a newer op meanwhile
		}
		m := fe.m
		if p.started && m.state() == frScheduled {
			m = fr.start(fe, m, now)
			fe.m = m
		}
		if !p.completed {
			continue
		}
		fe.work, fe.ho = nil, nil
		if err := fr.complete(fe, m, now, p.dur, p.durErr == nil, p.err); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	clear(polls) // drop the works, so that the scratch keeps none alive
	fr.polls = polls[:0]
	return firstErr
}

func (fr *FlightRecorder) poll() {
	t := time.NewTicker(fr.opts.Poll)
	defer t.Stop()
	for {
		select {
		case <-fr.stop:
			return
		case <-t.C:
		}
		fr.mu.Lock()
		idle := fr.pending == 0
		fr.mu.Unlock()
		if idle {
			continue
		}
		if err := fr.refresh(); err != nil && isFault(err) {
			fr.onError(err)
		}
	}
}

// close stops the recorder's goroutines.
func (fr *FlightRecorder) close() {
	select {
	case <-fr.stop:
	default:
		close(fr.stop)
	}
	fr.done.Wait()
}
