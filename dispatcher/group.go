// Package dispatcher is what applications import: process groups over a
// store, one method per collective, routed by the tensors' device to the
// backend that serves it.
//
// A job starts each rank with Init (or InitFromEnv, which reads torchrun's
// variables), then issues ops on the returned *ProcessGroup:
//
//	pg, err := dispatcher.Init(ctx, dispatcher.Config{Store: st, Rank: r, WorldSize: n, Backend: "cpu:cpupool,cuda:nccl"})
//	w, err := pg.Allreduce(ctx, []*tensor.Tensor{t}, backend.AllreduceOptions{ReduceOp: backend.MAX})
//	err = w.Wait(ctx)
//
// The dispatcher validates every op's arguments against spec/ops.yaml,
// numbers it (collectives and p2p ops have separate counters, as in
// PyTorch), runs the pre- and post-op hooks that the flight recorder and
// metrics attach to, and calls the backend. Backends are linked by blank
// import (e.g. _ "github.com/gocoll/gocoll/backends/cpupool"); the
// dispatcher never imports one.
package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// DefaultTimeout is the op timeout of a group that was given none: 10
// minutes, PyTorch's default for NCCL and Gloo.
const DefaultTimeout = 10 * time.Minute

// Config describes the default process group of a job. Its zero knobs
// mean the defaults, as the environment may change them; a set field wins
// over its variable (internal/knob's rule, the same in every backend), and
// an invalid value, of a field, a variable or a backend's options, fails
// Init with an error naming it.
type Config struct {
	// Store is where the ranks meet. Required.
	Store store.Store
	// Rank is this process's rank, in [0, WorldSize).
	Rank int
	// WorldSize is the number of ranks, at least 1.
	WorldSize int
	// Backend is a PyTorch backend string: one backend name, or
	// "device:backend" pairs such as "cpu:cpupool,cuda:nccl".
	Backend string
	// Timeout is the default op timeout; 0 means DefaultTimeout, negative
	// is invalid. It also bounds the store barrier at Init.
	Timeout time.Duration
	// Device, when set, initialises that device's backend eagerly (for
	// NCCL: creates the communicator now, as PyTorch's device_id does).
	Device *tensor.Device
	// BackendOptions maps a backend name to its options (e.g.
	// "nccl": &nccl.Options{...}, whose zero fields are the defaults);
	// backends get nil for defaults.
	BackendOptions map[string]any
	// SkipInitBarrier skips the store barrier that Init runs to make sure
	// every rank has arrived. PyTorch has the same switch
	// (TORCH_DIST_INIT_BARRIER=0).
	SkipInitBarrier bool
	// FlightRecorder configures the flight recorder, which is on by default;
	// the GOCOLL_TRACE_BUFFER_SIZE, GOCOLL_DEBUG_INFO_TEMP_FILE,
	// GOCOLL_DEBUG_INFO_PIPE_FILE and GOCOLL_DUMP_ON_TIMEOUT variables (or
	// their TORCH_NCCL_ names) stand in for its zero fields.
	FlightRecorder FlightRecorderOptions
	// RunID names the run in flight-recorder dumps, with the default
	// group's uid (which rank 0 draws at Init), so that `conftest fr
	// analyze` tells one job's dumps from another's. InitFromEnv sets it
	// from TORCHELASTIC_RUN_ID when empty.
	RunID string
	// Debug is PyTorch's TORCH_DISTRIBUTED_DEBUG: "off" (the default),
	// "info" or "detail", case-insensitive (GOCOLL_DEBUG, or
	// TORCH_DISTRIBUTED_DEBUG). Under "detail" every collective's
	// fingerprint (op, dtype, element count, root, reduce op) is compared
	// across the ranks through the group's store before the backend sees
	// the op, for every backend: ranks that disagree fail the op on every
	// rank with ErrInvalidArgument naming them and what each passed. It
	// costs a few store round trips per collective and makes issuing wait
	// for every rank: a debugging aid.
	Debug string
	// Monitor configures the heartbeat monitor, on by default; the
	// GOCOLL_ENABLE_MONITORING, GOCOLL_HEARTBEAT_TIMEOUT_SEC and
	// GOCOLL_COORD_CHECK_MILSEC variables (or their TORCH_NCCL_ names)
	// stand in for its zero fields.
	Monitor MonitorOptions
	// Metrics, when set, receives the counts of every op, abort and dump
	// of the process; Init takes it over and Close closes it. Nil means
	// off, unless MetricsAddr is set.
	Metrics Metrics
	// MetricsAddr, host:port (GOCOLL_METRICS_ADDR), serves Prometheus
	// metrics at http://MetricsAddr/metrics from Metrics, else from the
	// linked implementation (a blank import of package metrics). The port
	// moves by the local rank (LOCAL_RANK, else Rank), so the ranks of a
	// host given one address each get their own; port 0 takes a free one.
	// Empty, with Metrics nil, means metrics are off and cost nothing.
	MetricsAddr string
}

// ProcessGroup is a set of ranks that run collectives together. Its methods
// are safe for concurrent use, but, as in every collective library, the
// ranks must issue the same collectives in the same order.
type ProcessGroup struct {
	// What every op reads (or, for the counters, writes) comes first,
	// in two cache lines: spread over the struct (cfg alone is 248
	// bytes) they were six, each a miss once a real backend's op has
	// run through the caches between two ops.
	rank, size   int         // in this group; rank is -1 on a non-member
	closed       atomic.Bool // ops are refused
	collSeq      atomic.Uint64
	p2pSeq       atomic.Uint64
	hooks        atomic.Pointer[[]Hooks]
	timeout      time.Duration
	frg          *frGroup        // this group in the recorder; nil when off or not a member
	recorder     *FlightRecorder // shared by every group of the process; nil when off
	metrics      GroupMetrics    // this group's; nil when metrics are off
	metricsEvery uint64          // the metrics time the ops whose seq is a multiple of it (a power of two)
	backends     []slot          // indexed by tensor.DeviceType

	globalRank  int   // this process's rank in the default group
	ranks       []int // global rank of each group rank
	name, desc  string
	store       store.Store // prefixed for this group
	ownedStore  store.Store // the store InitFromEnv made; closed with the group
	cfg         Config
	root        *ProcessGroup   // the default group; itself for the default group
	pubMu       sync.Mutex      // guards published
	published   progress        // last progress written to the store
	groups      []*ProcessGroup // on the default group: every group this process is a member of
	stopPub     chan struct{}   // on the default group: stops the progress publisher
	monitor     *monitor        // on the default group: the heartbeat monitor; nil when off
	metricsRoot Metrics         // on the default group: the process's metrics; nil when off
	metricsOnce sync.Once       // closes metricsRoot once

	nextGroupID atomic.Uint64
	mu          sync.Mutex            // guards released and groups
	released    bool                  // Close has released the backends
	abortReason atomic.Pointer[error] // why Abort was called, kept for later ops
	joinedEarly atomic.Pointer[[]int] // Init: the ranks not joined shortly before its deadline (lookBeforeDeadline)
}

// slot holds the backend of one device type, or why it could not be made.
type slot struct {
	// serve is what the ops go to: ops when set, else b; nil when the
	// slot cannot serve (no backend, or it failed). With bname it is all
	// that an op reads of the slot, so the two come first, in one line.
	serve backend.Backend
	// bname is b's Name, asked once: the flight recorder labels every op
	// with it.
	bname string
	name  string
	b     backend.Backend
	err   error
	// ops, when not nil, is what the ops go to instead of b: b behind the
	// fingerprint check (Config.Debug "detail").
	ops backend.Backend
}

// Init creates the default process group: it checks the config, builds a
// backend for every device type of the backend string, and waits in a store
// barrier until every rank has arrived (unless SkipInitBarrier). The
// backends' wire-up and the barrier share one deadline, Config.Timeout
// from the call; a rank that never called Init is named in the error.
func Init(ctx context.Context, cfg Config) (*ProcessGroup, error) {
	return initGroup(ctx, cfg, nil)
}

// initGroup is Init; made, when not nil, is the process's Metrics, which
// InitFromEnv made first for its store server. It owns made either way.
func initGroup(ctx context.Context, cfg Config, made Metrics) (pg *ProcessGroup, err error) {
	m := made // closed here on failure until the group owns it
	defer func() {
		if err != nil && m != nil {
			_ = m.Close()
		}
	}()
	if cfg.Store == nil {
		return nil, fmt.Errorf("dispatcher: %w: Config.Store is nil", backend.ErrInvalidArgument)
	}
	if cfg.WorldSize < 1 {
		return nil, fmt.Errorf("dispatcher: %w: world size %d must be at least 1", backend.ErrInvalidArgument, cfg.WorldSize)
	}
	if cfg.Rank < 0 || cfg.Rank >= cfg.WorldSize {
		return nil, fmt.Errorf("dispatcher: %w: rank %d outside [0, %d)", backend.ErrInvalidArgument, cfg.Rank, cfg.WorldSize)
	}
	cfg, err = resolveConfig(cfg, knob.OS)
	if err != nil {
		return nil, err
	}
	ranks := make([]int, cfg.WorldSize)
	for i := range ranks {
		ranks[i] = i
	}
	pg = &ProcessGroup{rank: cfg.Rank, size: cfg.WorldSize, globalRank: cfg.Rank, ranks: ranks,
		name: "0", desc: "default_pg", timeout: cfg.Timeout, cfg: cfg}
	pg.root = pg
	st, err := store.NewPrefixStore("default_pg", cfg.Store)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	pg.store = st
	// One deadline for everything Init waits for (the backends' wire-up and
	// the barrier): a rank that never comes is named once the timeout has
	// passed, not after each wait's own timeout in turn.
	deadline := time.Now().Add(cfg.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl // the caller's (InitFromEnv's, counting its rendezvous)
	}
	ictx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if !cfg.SkipInitBarrier {
		if err := pg.announce(ictx); err != nil {
			return nil, err
		}
		// Who has joined, looked at shortly before the deadline: the
		// barrier's error falls back on it when the store is gone by the
		// deadline (rank 0 of InitFromEnv hosts it, and its deadline may
		// come first).
		stopLook := pg.lookBeforeDeadline(deadline)
		defer stopLook()
	}
	fro, mono := cfg.FlightRecorder, cfg.Monitor
	if fro.Entries > 0 {
		if pg.recorder, err = newFlightRecorder(fro, cfg.Rank, cfg.WorldSize); err != nil {
			return nil, err
		}
		pg.recorder.attach(pg)
	}
	if m == nil {
		if m, err = newMetrics(cfg); err != nil {
			pg.stopRecorder()
			return nil, err
		}
	}
	if m != nil {
		var dumps func() int
		if pg.recorder != nil {
			dumps = pg.recorder.Dumps
		}
		if err = startMetrics(m, cfg, knob.OS, dumps); err != nil {
			pg.stopRecorder()
			return nil, err
		}
	}
	pg.metricsRoot = m
	if err := pg.build(ictx, nil); err != nil {
		pg.stopRecorder()
		return nil, err
	}
	pg.attachMetrics()
	m = nil // pg closes it from here on
	pg.groups = []*ProcessGroup{pg}
	pg.stopPub = make(chan struct{})
	go pg.publisher(pg.stopPub)
	if !mono.Disable {
		pg.monitor = startMonitor(pg, mono)
	}
	pg.publishUID(ctx)
	if !cfg.SkipInitBarrier {
		if err := pg.storeBarrier(ictx, "init", deadline); err != nil {
			pg.Abort(ctx, err)
			pg.Close(ctx)
			return nil, err
		}
	}
	pg.learnUID(ctx, !cfg.SkipInitBarrier)
	return pg, nil
}

// build makes the group's backends. A backend that cannot be made (its
// native library is missing, say) is recorded, and ops on its device fail
// with that error; the other devices still work. A backend whose options
// are invalid (its error wraps ErrInvalidArgument) fails build, so that a
// bad value is reported at Init, not at the first op. With cfg.Device set,
// that device's backend must succeed.
func (pg *ProcessGroup) build(ctx context.Context, parent *ProcessGroup) error {
	devmap, err := backend.ParseBackendString(pg.cfg.Backend)
	if err != nil {
		return fmt.Errorf("dispatcher: %w", err)
	}
	pg.backends = make([]slot, tensor.CUDA+1)
	// One instance per backend name, serving every device type mapped to
	// it (PyTorch's rule): two instances of one backend would wire up
	// twice over the same store keys.
	served := map[string][]tensor.DeviceType{}
	for dt := tensor.CPU; dt <= tensor.CUDA; dt++ {
		if name, ok := devmap[dt]; ok {
			served[name] = append(served[name], dt)
		}
	}
	for dt := tensor.CPU; dt <= tensor.CUDA; dt++ {
		name, ok := devmap[dt]
		if !ok {
			continue
		}
		if first := served[name][0]; first != dt {
			pg.backends[dt] = pg.backends[first]
			continue
		}
		drv, _ := backend.Lookup(name)
		bcfg := backend.Config{
			Store: pg.store, Rank: pg.rank, WorldSize: pg.size, GroupName: pg.name, GroupDesc: pg.desc,
			Timeout: pg.timeout, Options: pg.cfg.BackendOptions[name],
			Desync: pg.Desync, DumpAll: pg.DumpAll, Devices: served[name],
		}
		if pg != pg.root {
			bcfg.GlobalRanks = pg.ranks
		}
		if d := pg.cfg.Device; d != nil && slices.Contains(served[name], d.Type) {
			bcfg.Device = d
		}
		if parent != nil && int(dt) < len(parent.backends) {
			bcfg.Parent = parent.backends[dt].b
		}
		b, err := drv.New(ctx, bcfg)
		if err != nil {
			// A factory may return a typed nil with its error; keep no
			// backend, so that Close and Abort skip it.
			b = nil
			err = fmt.Errorf("dispatcher: group %s: backend %q for %s: %w", pg.desc, name, dt, err)
			if bcfg.Device != nil || errors.Is(err, backend.ErrInvalidArgument) {
				pg.closeBackends(ctx)
				return err
			}
		}
		pg.backends[dt] = slot{name: name, b: b, err: err}
		if b != nil {
			pg.backends[dt].bname = b.Name()
		}
		if b != nil && pg.cfg.Debug == DebugDetail {
			pg.backends[dt].ops = &checked{Backend: b, pg: pg}
		}
		if s := &pg.backends[dt]; s.name != "" && s.err == nil && s.b != nil {
			s.serve = s.b
			if s.ops != nil {
				s.serve = s.ops
			}
		}
	}
	return nil
}

// Rank returns this process's rank in the group, or -1 if it is not a
// member.
func (pg *ProcessGroup) Rank() int { return pg.rank }

// Size returns the number of ranks in the group.
func (pg *ProcessGroup) Size() int { return pg.size }

// Ranks returns the global rank of each group rank.
func (pg *ProcessGroup) Ranks() []int { return slices.Clone(pg.ranks) }

// Name returns the group's unique id: "0" for the default group, then "1",
// "2", … in creation order, the same on every rank.
func (pg *ProcessGroup) Name() string { return pg.name }

// Desc returns the group's description, e.g. "default_pg".
func (pg *ProcessGroup) Desc() string { return pg.desc }

// Timeout returns the group's default op timeout.
func (pg *ProcessGroup) Timeout() time.Duration { return pg.timeout }

// Store returns the group's store (prefixed for the group).
func (pg *ProcessGroup) Store() store.Store { return pg.store }

// IsMember reports whether this process belongs to the group.
func (pg *ProcessGroup) IsMember() bool { return pg.rank >= 0 }

// SeqNum returns the number of collectives (barriers included) issued so
// far, which is the sequence number of the last one; 0 before the first.
func (pg *ProcessGroup) SeqNum() uint64 { return pg.collSeq.Load() }

// P2PSeqNum returns the number of point-to-point ops issued so far.
func (pg *ProcessGroup) P2PSeqNum() uint64 { return pg.p2pSeq.Load() }

// GroupRank converts a global rank to this group's rank.
func (pg *ProcessGroup) GroupRank(global int) (int, error) {
	if i := slices.Index(pg.ranks, global); i >= 0 {
		return i, nil
	}
	return -1, fmt.Errorf("dispatcher: %w: global rank %d is not part of group %s (ranks %v)", backend.ErrInvalidArgument, global, pg.name, pg.ranks)
}

// GlobalRank converts a group rank to the global rank.
func (pg *ProcessGroup) GlobalRank(groupRank int) (int, error) {
	if groupRank < 0 || groupRank >= len(pg.ranks) {
		return -1, fmt.Errorf("dispatcher: %w: group rank %d is not part of group %s (size %d)", backend.ErrInvalidArgument, groupRank, pg.name, pg.size)
	}
	return pg.ranks[groupRank], nil
}

// Backend returns the backend that serves device type dt.
func (pg *ProcessGroup) Backend(dt tensor.DeviceType) (backend.Backend, error) {
	if pg.rank < 0 {
		return nil, pg.notMember("backend")
	}
	if int(dt) >= len(pg.backends) || pg.backends[dt].name == "" {
		return nil, fmt.Errorf("dispatcher: %w: no backend for device type %s in group %s (backend string %q)", backend.ErrInvalidArgument, dt, pg.desc, pg.cfg.Backend)
	}
	s := pg.backends[dt]
	return s.b, s.err
}

// GroupOptions are the options of NewGroup.
type GroupOptions struct {
	// Desc describes the group; empty gives "<parent desc>:group:<name>".
	Desc string
	// Timeout overrides the parent's default op timeout when non-zero;
	// negative is invalid.
	Timeout time.Duration
	// KeepOrder keeps the ranks in the order given instead of sorting them
	// (PyTorch's sort_ranks=False).
	KeepOrder bool
}

// NewGroup creates a subgroup of the default group with the given global
// ranks. Every rank of the default group must call it, in the same order
// for every group, as in PyTorch; non-members get a group whose ops fail
// with an error saying so. Empty ranks means every rank. Ranks are sorted
// unless KeepOrder; duplicates and out-of-range ranks are rejected. Where
// the parent's backend supports it, the subgroup derives its communicator
// from the parent's (ncclCommSplit).
func (pg *ProcessGroup) NewGroup(ctx context.Context, ranks []int, opts GroupOptions) (*ProcessGroup, error) {
	root := pg.root
	if root.closed.Load() {
		return nil, fmt.Errorf("dispatcher: new group: %w", backend.ErrClosed)
	}
	if len(ranks) == 0 {
		ranks = root.ranks
	}
	ranks = slices.Clone(ranks)
	if !opts.KeepOrder {
		slices.Sort(ranks)
	}
	seen := map[int]bool{}
	for _, r := range ranks {
		if r < 0 || r >= root.size {
			return nil, fmt.Errorf("dispatcher: new group: %w: rank %d is outside the world [0, %d)", backend.ErrInvalidArgument, r, root.size)
		}
		if seen[r] {
			return nil, fmt.Errorf("dispatcher: new group: %w: duplicate rank %d in %v", backend.ErrInvalidArgument, r, ranks)
		}
		seen[r] = true
	}
	timeout, err := knob.Knob[time.Duration]{Field: "dispatcher.GroupOptions.Timeout", Default: root.timeout,
		Check: knob.NonNegative[time.Duration]}.Resolve(knob.OS, opts.Timeout)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: new group: %w: %w", backend.ErrInvalidArgument, err)
	}
	name := strconv.FormatUint(root.nextGroupID.Add(1), 10)
	desc := opts.Desc
	if desc == "" {
		desc = root.desc + ":group:" + name
	}
	g := &ProcessGroup{rank: slices.Index(ranks, root.globalRank), size: len(ranks), globalRank: root.globalRank,
		ranks: ranks, name: name, desc: desc, timeout: timeout, cfg: root.cfg, root: root, recorder: root.recorder}
	g.cfg.Timeout = timeout
	if g.rank < 0 {
		return g, nil
	}
	if g.recorder != nil {
		g.recorder.attach(g)
	}
	st, err := store.NewPrefixStore("group/"+name, root.cfg.Store)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: new group: %w", err)
	}
	g.store = st
	if err := g.build(ctx, root); err != nil {
		return nil, err
	}
	g.attachMetrics()
	root.mu.Lock()
	root.groups = append(root.groups, g)
	root.mu.Unlock()
	return g, nil
}

// Close waits for issued ops to finish, bounded by ctx, and releases the
// group's backends. Later ops fail with ErrClosed. Closing the default group
// closes every group of the process, as PyTorch's destroy_process_group
// does. Closing twice is a no-op; Close after Abort releases what Abort
// left.
func (pg *ProcessGroup) Close(ctx context.Context) error {
	var err error
	for _, g := range pg.family() {
		err = errors.Join(err, g.closeOne(ctx))
	}
	return err
}

func (pg *ProcessGroup) closeOne(ctx context.Context) error {
	pg.closed.Store(true)
	pg.mu.Lock()
	already := pg.released
	pg.released = true
	pg.mu.Unlock()
	if already {
		return nil
	}
	// Without pg.mu: the heartbeat monitor, which stopDaemons waits for,
	// takes it to list the groups.
	err := pg.closeBackends(ctx)
	if pg.metrics != nil {
		pg.metrics.Close()
	}
	if pg == pg.root {
		pg.stopDaemons()
		pg.closeMetrics()
	}
	if pg.ownedStore != nil {
		err = errors.Join(err, pg.ownedStore.Close())
	}
	return err
}

func (pg *ProcessGroup) closeBackends(ctx context.Context) error {
	var errs []error
	for _, b := range pg.distinct() {
		errs = append(errs, b.Close(ctx))
	}
	return errors.Join(errs...)
}

// distinct returns the group's backends, each once: one instance may serve
// several device types.
func (pg *ProcessGroup) distinct() []backend.Backend {
	var out []backend.Backend
	for _, s := range pg.backends {
		if s.b != nil && !slices.Contains(out, s.b) {
			out = append(out, s.b)
		}
	}
	return out
}

// family returns the groups a Close or Abort of pg covers: every group of
// the process for the default group, else pg alone.
func (pg *ProcessGroup) family() []*ProcessGroup {
	if pg != pg.root {
		return []*ProcessGroup{pg}
	}
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if len(pg.groups) == 0 { // Init failed before the list was made
		return []*ProcessGroup{pg}
	}
	// Subgroups first: their backends may derive from the default group's.
	out := slices.Clone(pg.groups[1:])
	slices.Reverse(out)
	return append(out, pg)
}

// Abort stops every backend of the group at once, without waiting for
// peers; for the default group, of every group. Pending works fail with
// ErrAborted wrapping reason, and later ops fail with an error that keeps
// it. Call Close afterwards to stop the group's goroutines.
func (pg *ProcessGroup) Abort(ctx context.Context, reason error) error {
	if reason == nil {
		reason = errors.New("aborted by the application")
	}
	var errs []error
	for _, g := range pg.family() {
		if g.abortReason.CompareAndSwap(nil, &reason) {
			slog.Warn("gocoll: group aborted", "group", g.desc, "rank", g.rank, "seq", g.collSeq.Load(), "reason", reason)
			if g.metrics != nil {
				g.metrics.Aborted(reason)
			}
		}
		g.closed.Store(true)
		for _, b := range g.distinct() {
			errs = append(errs, b.Abort(ctx, reason))
		}
	}
	return errors.Join(errs...)
}

// FlightRecorder returns the process's flight recorder, shared by all its
// groups, or nil when it is off.
func (pg *ProcessGroup) FlightRecorder() *FlightRecorder { return pg.recorder }

// closeMetrics closes the process's metrics (the default group's).
func (pg *ProcessGroup) closeMetrics() {
	if pg.metricsRoot != nil {
		pg.metricsOnce.Do(func() { _ = pg.metricsRoot.Close() })
	}
}

func (pg *ProcessGroup) stopRecorder() {
	if pg.recorder != nil {
		pg.recorder.close()
	}
}

// stopDaemons stops the default group's goroutines: the heartbeat monitor,
// the progress publisher and the flight recorder.
func (pg *ProcessGroup) stopDaemons() {
	if pg.monitor != nil {
		pg.monitor.close()
	}
	close(pg.stopPub)
	pg.stopRecorder()
}

func (pg *ProcessGroup) notMember(op string) error {
	return &backend.OpError{Op: op, Rank: pg.globalRank, Kind: backend.ErrInvalidArgument,
		Detail: fmt.Sprintf("global rank %d is not a member of group %s %q (ranks %v)", pg.globalRank, pg.name, pg.desc, pg.ranks)}
}
