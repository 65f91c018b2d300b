package dispatcher

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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

	mu      sync.Mutex
	ring    []frEntry
	nextID  uint64
	groups  map[string]frtrace.PGConfig
	status  map[string]*frtrace.PGStatus
	pending int         // entries whose work is not yet retired
	dumps   watch.Dumps // when to dump, other than on demand
	ndumps  int         // dumps written
	runID   string      // the job: Config.RunID and the default group's uid
	pgUID   string

	// refreshMu serialises refresh (the poll goroutine's and Snapshot's),
	// which owns polls between its two holds of mu.
	refreshMu sync.Mutex
	polls     []frPoll

	stop chan struct{}
	done sync.WaitGroup
}

type frEntry struct {
	e    frtrace.Entry
	work backend.Work // nil once retired
	// name is what e.ProfilingName is made of, at a snapshot: building the
	// string per op would allocate on the issue path.
	name opName
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

// attach records the ops of pg.
func (fr *FlightRecorder) attach(pg *ProcessGroup) {
	fr.mu.Lock()
	fr.groups[pg.name] = frtrace.PGConfig{Name: pg.name, Desc: pg.desc, Ranks: pg.Ranks()}
	fr.status[pg.name] = &frtrace.PGStatus{LastStarted: -1}
	fr.mu.Unlock()
	pg.AddHooks(Hooks{Post: fr.record})
}

// record adds an op to the ring once the backend has accepted (or refused)
// it; it runs as the group's post hook.
func (fr *FlightRecorder) record(ctx context.Context, info OpInfo, w backend.Work, err error) {
	e := frtrace.Entry{
		PGID: info.Group, ProcessGroup: [2]string{info.Group, info.GroupDesc},
		P2PSeqID:      info.P2PSeq,
		TimeCreatedNs: info.Issued.UnixNano(), State: frtrace.StateScheduled,
		TimeoutMs: info.Timeout.Milliseconds(), IsP2P: info.Op.Info().Kind == backend.P2P,
		ThreadName: "dispatcher",
	}
	if !e.IsP2P {
		e.CollectiveSeqID = info.Seq
	}
	if err != nil {
		e.Error = err.Error()
	}
	fr.mu.Lock()
	e.RecordID = fr.nextID
	e.OpID = fr.nextID
	fr.nextID++
	if st := fr.status[info.Group]; st != nil && !e.IsP2P {
		st.LastEnqueued = int64(info.Seq)
	}
	var slot *frEntry
	if len(fr.ring) < cap(fr.ring) {
		fr.ring = append(fr.ring, frEntry{})
		slot = &fr.ring[len(fr.ring)-1]
	} else {
		slot = &fr.ring[e.RecordID%uint64(cap(fr.ring))]
		if slot.work != nil {
			fr.pending--
		}
	}
	// The sizes go into the slot's own slices, reused from the entry it
	// overwrites, so a full ring records without allocating.
	e.InputSizes, e.InputDtypes = fillSizes(slot.e.InputSizes, slot.e.InputDtypes, info.Inputs)
	e.OutputSizes, e.OutputDtypes = fillSizes(slot.e.OutputSizes, slot.e.OutputDtypes, info.Outputs)
	if c, ok := w.(backend.CaptureReporter); ok && c.Captured() {
		// Captured into a CUDA graph: the op did not run and runs at each
		// replay, so there is nothing to poll (its events may not even be
		// queried). The entry stays scheduled, retired, marked captured.
		e.Retired, e.Captured, w = true, true, nil
	}
	slot.e, slot.work = e, w
	slot.name = opName{op: info.Op, backend: info.Backend, rank: info.Rank, peer: info.Peer}
	if w != nil {
		fr.pending++
	}
	fr.mu.Unlock()
	if err != nil && isFault(err) {
		fr.onError(err)
	}
}

// fillSizes writes the shapes and dtypes of ts into dst and dts, reusing
// their storage, inner slices included.
func fillSizes(dst [][]int, dts []string, ts []*tensor.Tensor) ([][]int, []string) {
	dst, dts = dst[:0], dts[:0]
	for _, t := range ts {
		var s []int
		if len(dst) < cap(dst) {
			s = dst[:len(dst)+1][len(dst)][:0]
		}
		if t != nil {
			s = t.AppendShape(s)
			dts = append(dts, t.DType().String())
		} else {
			dts = append(dts, "")
		}
		dst = append(dst, s)
	}
	return dst, dts
}

// cloneEntry copies e with slices of its own, since the ring reuses its
// slices for later entries.
func cloneEntry(e frtrace.Entry) frtrace.Entry {
	cp := func(ss [][]int) [][]int {
		out := make([][]int, len(ss))
		for i, s := range ss {
			out[i] = append([]int{}, s...)
		}
		return out
	}
	e.InputSizes, e.OutputSizes = cp(e.InputSizes), cp(e.OutputSizes)
	e.InputDtypes = append([]string{}, e.InputDtypes...)
	e.OutputDtypes = append([]string{}, e.OutputDtypes...)
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
			polls = append(polls, frPoll{slot: i, id: fe.e.RecordID, work: fe.work, sched: fe.e.State == frtrace.StateScheduled})
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
	now := time.Now().UnixNano()
	for k := range polls {
		p := &polls[k]
		fe := &fr.ring[p.slot]
		if fe.work != p.work || fe.e.RecordID != p.id {
			continue // overwritten by a newer op meanwhile
		}
		if p.started && fe.e.State == frtrace.StateScheduled {
			fe.e.State, fe.e.TimeStartedNs = frtrace.StateStarted, now
			if st := fr.status[fe.e.PGID]; st != nil && !fe.e.IsP2P && int64(fe.e.CollectiveSeqID) > st.LastStarted {
				st.LastStarted = int64(fe.e.CollectiveSeqID)
			}
		}
		if !p.completed {
			continue
		}
		fe.e.State, fe.e.TimeCompletedNs, fe.e.Retired = frtrace.StateCompleted, now, true
		if fe.e.TimeStartedNs == 0 {
			fe.e.TimeStartedNs = now
		}
		if p.durErr == nil {
			ms := float64(p.dur) / float64(time.Millisecond)
			fe.e.DurationMs = &ms
		}
		if p.err != nil {
			fe.e.Error = p.err.Error()
			if firstErr == nil {
				firstErr = p.err
			}
		}
		if st := fr.status[fe.e.PGID]; st != nil && !fe.e.IsP2P && int64(fe.e.CollectiveSeqID) > st.LastCompleted {
			st.LastCompleted = int64(fe.e.CollectiveSeqID)
		}
		fe.work = nil
		fr.pending--
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

// isFault reports whether an op's error is a fault worth a dump (a
// timeout, a remote error, an abort, …) rather than the caller's: an op
// refused for its arguments or as unsupported tells nothing the error does
// not already say, and a dump per refused call would litter the dump
// directory with files that analyze then reads as a failed job.
func isFault(err error) bool {
	return !errors.Is(err, backend.ErrInvalidArgument) && !errors.Is(err, backend.ErrUnsupported)
}

// onError dumps once, on the first failed op, unless turned off.
func (fr *FlightRecorder) onError(err error) {
	fr.mu.Lock()
	acts := fr.dumps.Error(err.Error())
	fr.mu.Unlock()
	fr.perform(acts)
}

// peerSignal dumps once per dump signal a peer posted.
func (fr *FlightRecorder) peerSignal(v string) {
	fr.mu.Lock()
	acts := fr.dumps.PeerSignal(v)
	fr.mu.Unlock()
	fr.perform(acts)
}

// ownSignal notes the signal this rank posts after its own dump.
func (fr *FlightRecorder) ownSignal(v string) {
	fr.mu.Lock()
	fr.dumps.OwnSignal(v)
	fr.mu.Unlock()
}

// perform carries out the dump decisions (watch.Dumps returns only dumps).
func (fr *FlightRecorder) perform(acts []watch.Action[struct{}]) {
	for _, a := range acts {
		if a.Kind == watch.Dump {
			_, _ = fr.Dump(a.Reason)
		}
	}
}

// servePipe dumps each time a line is written to the FIFO at path.
func (fr *FlightRecorder) servePipe(path string) {
	defer os.Remove(path)
	for {
		// Opening a FIFO blocks until a writer comes; O_NONBLOCK plus a
		// poll keeps Close from hanging on it.
		f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return
		}
		sc := bufio.NewScanner(f)
		for {
			select {
			case <-fr.stop:
				f.Close()
				return
			default:
			}
			if sc.Scan() {
				if sc.Text() == "1" {
					_, _ = fr.Dump("on demand (pipe)")
				}
				continue
			}
			// EOF or EAGAIN: wait a little and reopen to get new writers.
			break
		}
		f.Close()
		select {
		case <-fr.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Snapshot returns the recorder's content as a dump, after noting the
// latest completions.
func (fr *FlightRecorder) Snapshot(reason string) frtrace.Dump {
	fr.refresh()
	// The sections of linked packages (the NVML snapshots of the GPUs),
	// bounded: the watchdog that dumps must not wait on a sick GPU.
	sctx, cancel := context.WithTimeout(context.Background(), sectionBound)
	sections := frtrace.CollectSections(sctx)
	cancel()
	fr.mu.Lock()
	defer fr.mu.Unlock()
	d := frtrace.Dump{Version: frtrace.Version, CommLibVersion: frtrace.Producer, Rank: fr.rank, WorldSize: fr.size,
		PGConfig: map[string]frtrace.PGConfig{}, PGStatus: map[string]frtrace.PGStatus{}, DumpReason: reason,
		RunID: fr.runID, PGUID: fr.pgUID, Sections: sections}
	now := time.Now()
	d.DumpTimeNs, d.DumpTime = now.UnixNano(), now.UTC().Format(time.RFC3339Nano)
	for k, v := range fr.groups {
		d.PGConfig[k] = v
	}
	for k, v := range fr.status {
		d.PGStatus[k] = *v
	}
	// Oldest first: after wrapping, the oldest entry is at nextID % cap.
	n := len(fr.ring)
	start := 0
	if n == cap(fr.ring) {
		start = int(fr.nextID % uint64(n))
	}
	for i := range n {
		fe := &fr.ring[(start+i)%n]
		e := cloneEntry(fe.e)
		e.ProfilingName = fe.name.String()
		d.Entries = append(d.Entries, e)
	}
	return d
}

// sectionBound bounds the dump sections' collection (frtrace.Sections):
// the default watchdog interval, so that a dump taken by a watchdog never
// holds it past one round.
const sectionBound = 100 * time.Millisecond

// DumpPath is the file this rank dumps to.
func (fr *FlightRecorder) DumpPath() string { return fr.opts.DumpPrefix + strconv.Itoa(fr.rank) }

// Dump writes the snapshot to DumpPath, atomically (write then rename), and
// returns the path.
func (fr *FlightRecorder) Dump(reason string) (string, error) {
	// Profiling names hold "->" and "<-"; keep them readable.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(fr.Snapshot(reason)); err != nil {
		return "", err
	}
	path := fr.DumpPath()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("dispatcher: flight recorder dump: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("dispatcher: flight recorder dump: %w", err)
	}
	fr.mu.Lock()
	fr.ndumps++
	fr.mu.Unlock()
	fr.opts.Logger.Info("flight recorder dumped", "rank", fr.rank, "path", path, "reason", reason)
	return path, nil
}

// Dumps returns how many dumps the recorder has written, for whatever
// reason: a program (or a test) can check that nothing went wrong enough
// to dump.
func (fr *FlightRecorder) Dumps() int {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return fr.ndumps
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
