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
	"github.com/gocoll/gocoll/tensor"
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
	opts       FlightRecorderOptions
	rank, size int

	// wall0 and mono0 are one time.Now, and it on the backend.Mono clock:
	// wallNs's anchor.
	wall0 time.Time
	mono0 time.Duration

	mu     sync.Mutex
	ring   []frEntry
	nextID uint64
	scan   uint64 // the next entry retireDone looks at
	// head and scanAt are nextID and scan modulo cap(ring), kept as they
	// move (a 64-bit division per op, for an entries count that need
	// not be a power of two, was ~2 % of an op).
	head, scanAt int
	groups       map[string]frtrace.PGConfig
	status       map[string]*frtrace.PGStatus
	pending      int         // entries whose work is not yet retired
	dumps        watch.Dumps // when to dump, other than on demand
	ndumps       int         // dumps written
	runID        string      // the job: Config.RunID and the default group's uid
	pgUID        string

	// refreshMu serialises refresh (the poll goroutine's and Snapshot's),
	// which owns polls between its two holds of mu.
	refreshMu sync.Mutex
	polls     []frPoll

	stop chan struct{}
	done sync.WaitGroup
}

// frEntry is one op in the ring, in the compact form the issue path
// writes: the dump's frtrace.Entry is built from it at a snapshot, so that
// recording an op copies a few words rather than the whole entry, builds
// no string and reads no wall clock. What most ops do not have (an error,
// shapes of several tensors) is in the slot's side record, so that an
// op's record writes 168 bytes (it was 360: six cache lines of a 720 KB
// ring, each a miss on the issuing goroutine; the recorder was 0.1-0.2 us
// of a GPU op's ~1.2 us in `conftest bench hostcost`, issue 16).
type frEntry struct {
	id   uint64       // RecordID and OpID
	g    *frGroup     // the op's group
	work backend.Work // nil once retired
	// ho is work as a hostOutcome, when it is one (nil once retired):
	// asked once, at add, so that retireDone asserts nothing.
	ho hostOutcome
	// CollectiveSeqID (0 for p2p ops) and P2PSeqID
	seq, p2p uint64
	// created is when the dispatcher numbered the op, on the backend.Mono
	// clock; started and completed are when refresh noticed, likewise
	// (0: not yet). FlightRecorder.wallNs makes them Unix times.
	created, started, completed time.Duration
	timeout                     time.Duration
	durMs                       float64
	// What the profiling name is made of (opName).
	backend                          string
	rank, peer                       int32
	op                               backend.Op
	state                            frState
	isP2P, retired, captured, hasDur bool
	hasErr                           bool     // side.err is the op's error
	in, out                          frShapes // the shapes and dtypes of the op's tensors
	side                             *frSide  // kept from op to op; nil until a slot first needs it
}

// frSide is the part of a slot that most ops leave alone: the error, and
// the shapes and dtypes of ops whose sides are not a lone tensor of up
// to frInlineDims dimensions, in slices the slot keeps from op to op (a
// full ring records without allocating).
type frSide struct {
	err                 string
	inSizes, outSizes   [][]int
	inDtypes, outDtypes []tensor.DType
}

// frShapes are the shapes and dtypes of one side of an op: a lone tensor
// of up to frInlineDims dimensions (most ops') inline, else n is -1 and
// the slot's side holds them.
type frShapes struct {
	n     int8 // tensors: 0, 1 (below) or -1 (the side's)
	ndim  uint8
	dtype tensor.DType
	dims  [frInlineDims]int32
}

const frInlineDims = 4

// name is the entry's profiling name's parts.
func (fe *frEntry) name() opName {
	return opName{op: fe.op, backend: fe.backend, rank: int(fe.rank), peer: int(fe.peer)}
}

// sideOf returns fe's side record, made on first use.
func (fe *frEntry) sideOf() *frSide {
	if fe.side == nil {
		fe.side = &frSide{}
	}
	return fe.side
}

// fill notes a's tensors in f (fe.in or fe.out), and in f2 too when it
// is not nil (an in-place op's other side), or in the side's sizes and
// dtypes when they are not a lone tensor that fits inline.
func (fe *frEntry) fill(f, f2 *frShapes, a *targ) {
	if a == nil || a.shape == 0 {
		f.n = 0
		if f2 != nil {
			f2.n = 0
		}
		return
	}
	var t *tensor.Tensor
	switch {
	case a.shape == 'o':
		t = a.one
	case a.shape == 'l' && len(a.list) == 1:
		t = a.list[0]
	}
	if t != nil && t.Dim() <= frInlineDims {
		var buf [frInlineDims]int
		sh := t.AppendShape(buf[:0])
		fits := true
		for i, d := range sh {
			if d > math.MaxInt32 {
				fits = false
				break
			}
			f.dims[i] = int32(d)
			if f2 != nil {
				f2.dims[i] = int32(d)
			}
		}
		if fits {
			dt := t.DType()
			f.n, f.ndim, f.dtype = 1, uint8(len(sh)), dt
			if f2 != nil {
				f2.n, f2.ndim, f2.dtype = 1, uint8(len(sh)), dt
			}
			return
		}
	}
	sd := fe.sideOf()
	if f == &fe.in || f2 == &fe.in {
		fe.in.n = -1
		sd.inSizes, sd.inDtypes = fillSizes(sd.inSizes, sd.inDtypes, a)
	}
	if f == &fe.out || f2 == &fe.out {
		fe.out.n = -1
		sd.outSizes, sd.outDtypes = fillSizes(sd.outSizes, sd.outDtypes, a)
	}
}

// dump returns the shapes and dtypes as the dump writes them, in slices
// of their own; sizes and dtypes are the side's, for n -1.
func (f *frShapes) dump(sizes [][]int, dtypes []tensor.DType) ([][]int, []string) {
	dtype := func(d tensor.DType) string {
		if d == noDType {
			return ""
		}
		return d.String()
	}
	switch f.n {
	case 0:
		return [][]int{}, []string{}
	case 1:
		dims := make([]int, f.ndim)
		for i := range dims {
			dims[i] = int(f.dims[i])
		}
		return [][]int{dims}, []string{dtype(f.dtype)}
	}
	out, outTypes := make([][]int, len(sizes)), make([]string, len(dtypes))
	for i, s := range sizes {
		out[i] = append([]int{}, s...)
	}
	for i, d := range dtypes {
		outTypes[i] = dtype(d)
	}
	return out, outTypes
}

// frState is an entry's state: frtrace.StateScheduled and the others.
type frState uint8

const (
	frScheduled frState = iota
	frStarted
	frCompleted
)

var frStateNames = [...]string{frScheduled: frtrace.StateScheduled, frStarted: frtrace.StateStarted, frCompleted: frtrace.StateCompleted}

// noDType stands for a nil tensor in an entry's dtypes; the dump writes
// "" for it, as before.
const noDType = tensor.DType(255)

// frGroup is what the recorder knows of one group: looked up once, at
// attach, so that recording an op needs no map lookup.
type frGroup struct {
	name, desc string
	status     *frtrace.PGStatus // guarded by fr.mu
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
	st := &frtrace.PGStatus{LastStarted: -1}
	fr.mu.Lock()
	fr.groups[pg.name] = frtrace.PGConfig{Name: pg.name, Desc: pg.desc, Ranks: pg.Ranks()}
	fr.status[pg.name] = st
	fr.mu.Unlock()
	pg.frg = &frGroup{name: pg.name, desc: pg.desc, status: st}
}

// record adds the op info describes, as a post hook would see it: the
// tests' way in (the dispatcher calls add).
func (fr *FlightRecorder) record(ctx context.Context, info OpInfo, w backend.Work, err error) {
	fr.mu.Lock()
	g := &frGroup{name: info.Group, desc: info.GroupDesc, status: fr.status[info.Group]}
	fr.mu.Unlock()
	in, out := list("inputs", info.Inputs), list("outputs", info.Outputs)
	c := opCall{meta: backend.Meta{Op: info.Op, Seq: info.Seq, Timeout: info.Timeout, Issued: backend.MonoOf(info.Issued)},
		bname: info.Backend, p2pSeq: info.P2PSeq, peer: info.Peer}
	fr.add(g, &c, &in, &out, info.Rank, w, err)
}

// add puts an op in the ring once the backend has accepted (or refused)
// it. It runs on the issuing goroutine: one uncontended lock, no
// allocation once the ring is full, no clock read (c.meta.Issued is the
// dispatcher's).
func (fr *FlightRecorder) add(g *frGroup, c *opCall, in, out *targ, rank int, w backend.Work, err error) {
	isP2P := c.meta.Op.Kind() == backend.P2P
	captured := false
	// A host work (hostOutcome) runs on the host: it is never captured,
	// so that most ops make one type assertion here.
	ho, _ := w.(hostOutcome)
	if ho == nil {
		if cr, ok := w.(backend.CaptureReporter); ok && cr.Captured() {
			// Captured into a CUDA graph: the op did not run and runs at
			// each replay, so there is nothing to poll (its events may not
			// even be queried). The entry stays scheduled, retired, marked
			// captured.
			captured, w = true, nil
		}
	}
	var es string
	if err != nil {
		es = err.Error()
	}
	fr.mu.Lock()
	id := fr.nextID
	fr.nextID++
	if g.status != nil && !isP2P {
		g.status.LastEnqueued = int64(c.meta.Seq)
	}
	var slot *frEntry
	if len(fr.ring) < cap(fr.ring) {
		fr.ring = append(fr.ring, frEntry{})
		slot = &fr.ring[len(fr.ring)-1]
	} else {
		slot = &fr.ring[fr.head]
		if slot.work != nil {
			fr.pending--
		}
	}
	if fr.head++; fr.head == cap(fr.ring) {
		fr.head = 0
	}
	slot.id, slot.g, slot.p2p = id, g, c.p2pSeq
	slot.seq = 0
	if !isP2P {
		slot.seq = c.meta.Seq
	}
	slot.created, slot.started, slot.completed, slot.timeout = c.meta.Issued, 0, 0, c.meta.Timeout
	slot.backend, slot.rank, slot.peer, slot.op = c.bname, int32(rank), int32(c.peer), c.meta.Op
	slot.state, slot.isP2P, slot.retired, slot.captured = frScheduled, isP2P, captured, captured
	slot.hasDur, slot.durMs, slot.hasErr = false, 0, err != nil
	if err != nil {
		slot.sideOf().err = es
	}
	// An in-place op (most) has the same view on both sides: one pass
	// fills both (copying the in side's freshly written bytes whole
	// would stall on the narrow stores that wrote them).
	if in == out && in != nil {
		slot.fill(&slot.in, &slot.out, in)
	} else {
		slot.fill(&slot.in, nil, in)
		slot.fill(&slot.out, nil, out)
	}
	slot.work, slot.ho = w, ho
	if w != nil {
		fr.pending++
	}
	failed := fr.retireDone()
	fr.mu.Unlock()
	if err != nil && isFault(err) {
		fr.onError(err)
	} else if failed != nil && isFault(failed) {
		fr.onError(failed)
	}
}

// hostOutcome is a Work that stamps its completion on the backend.Mono
// clock and tells its outcome in one call: backend.HostWork and the host
// backends' works built on it, whose state is a few atomic words, cheap
// to read on the issuing goroutine.
type hostOutcome interface {
	Outcome() (at, dur time.Duration, timed bool, err error)
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
		if fe.state == frScheduled { // a completed host work has started
			fe.state, fe.started = frStarted, at
			if st := fe.g.status; st != nil && !fe.isP2P && int64(fe.seq) > st.LastStarted {
				st.LastStarted = int64(fe.seq)
			}
		}
		var durErr error
		if !timed {
			durErr = backend.ErrNoTiming
		}
		if err := fr.complete(fe, at, dur, durErr, err); err != nil && first == nil {
			first = err
		}
		fr.advanceScan()
	}
	return first
}

// advanceScan moves retireDone's scan to the next entry. fr.mu is held.
func (fr *FlightRecorder) advanceScan() {
	fr.scan++
	if fr.scanAt++; fr.scanAt == cap(fr.ring) {
		fr.scanAt = 0
	}
}

// complete marks fe completed at now (backend.Mono), with the work's
// duration and error, and drops its work. fr.mu is held.
func (fr *FlightRecorder) complete(fe *frEntry, now, dur time.Duration, durErr, err error) error {
	fe.state, fe.completed, fe.retired = frCompleted, now, true
	if fe.started == 0 {
		fe.started = now
	}
	if durErr == nil {
		fe.hasDur, fe.durMs = true, float64(dur)/float64(time.Millisecond)
	}
	if err != nil {
		fe.sideOf().err, fe.hasErr = err.Error(), true
	}
	if st := fe.g.status; st != nil && !fe.isP2P && int64(fe.seq) > st.LastCompleted {
		st.LastCompleted = int64(fe.seq)
	}
	fe.work, fe.ho = nil, nil
	fr.pending--
	return err
}

// fillSizes writes the shapes and dtypes of a's tensors into dst and dts,
// reusing their storage, inner slices included.
func fillSizes(dst [][]int, dts []tensor.DType, a *targ) ([][]int, []tensor.DType) {
	dst, dts = dst[:0], dts[:0]
	add := func(t *tensor.Tensor) {
		var s []int
		if len(dst) < cap(dst) {
			s = dst[:len(dst)+1][len(dst)][:0]
		}
		if t != nil {
			s = t.AppendShape(s)
			dts = append(dts, t.DType())
		} else {
			dts = append(dts, noDType)
		}
		dst = append(dst, s)
	}
	switch a.shape {
	case 'o':
		add(a.one)
	case 'l':
		for _, t := range a.list {
			add(t)
		}
	case 'L':
		for _, l := range a.lists {
			for _, t := range l {
				add(t)
			}
		}
	}
	return dst, dts
}

// entry builds the dump's form of fe, with slices of its own (the ring
// reuses its slices for later entries).
func (fr *FlightRecorder) entry(fe *frEntry) frtrace.Entry {
	e := frtrace.Entry{RecordID: fe.id, OpID: fe.id, PGID: fe.g.name, ProcessGroup: [2]string{fe.g.name, fe.g.desc},
		CollectiveSeqID: fe.seq, P2PSeqID: fe.p2p, ProfilingName: fe.name().String(), TimeCreatedNs: fr.wallNs(fe.created),
		State: frStateNames[fe.state], TimeStartedNs: fr.wallNs(fe.started), TimeCompletedNs: fr.wallNs(fe.completed),
		Retired: fe.retired, TimeoutMs: fe.timeout.Milliseconds(), IsP2P: fe.isP2P, ThreadName: "dispatcher",
		Captured: fe.captured}
	var sd frSide
	if fe.side != nil {
		sd = *fe.side
	}
	if fe.hasErr {
		e.Error = sd.err
	}
	e.InputSizes, e.InputDtypes = fe.in.dump(sd.inSizes, sd.inDtypes)
	e.OutputSizes, e.OutputDtypes = fe.out.dump(sd.outSizes, sd.outDtypes)
	if fe.hasDur {
		ms := fe.durMs
		e.DurationMs = &ms
	}
	return e
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
		if fe.work != nil {
			polls = append(polls, frPoll{slot: i, id: fe.id, work: fe.work, sched: fe.state == frScheduled})
		}
	}
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
	var firstErr error
	now := backend.Mono()
	for k := range polls {
		p := &polls[k]
		fe := &fr.ring[p.slot]
		if fe.work != p.work || fe.id != p.id {
			continue // overwritten by a newer op meanwhile
		}
		if p.started && fe.state == frScheduled {
			fe.state, fe.started = frStarted, now
			if st := fe.g.status; st != nil && !fe.isP2P && int64(fe.seq) > st.LastStarted {
				st.LastStarted = int64(fe.seq)
			}
		}
		if !p.completed {
			continue
		}
		if err := fr.complete(fe, now, p.dur, p.durErr, p.err); err != nil && firstErr == nil {
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
