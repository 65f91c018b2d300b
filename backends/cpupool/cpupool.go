// Package cpupool is gocoll's CPU backend, in the role of PyTorch's Gloo
// backend: collectives on host tensors, run by a pool of worker goroutines
// over a full mesh of TCP connections between the ranks. Ranks on one host
// move their data through shared memory instead (Options.Transport,
// GOCOLL_CPUPOOL_TRANSPORT); the TCP connections then only carry the
// setup and detect a peer's death (see internal/tcpmesh).
//
// Link it with a blank import; it registers itself as "cpupool":
//
//	import _ "github.com/gocoll/gocoll/backends/cpupool"
//
// Ordering. The op's tag (the number of collectives issued so far) is taken
// on the caller's goroutine when the op is issued, so ops that run
// concurrently on different workers never mix on the wire, as long as every
// rank issues its collectives in the same order (the c10d contract). Sends
// to one peer leave in issue order; receives are posted in issue order.
//
// Works. Every op returns at once with a Work that a worker completes, or
// that Wait runs on the caller's goroutine when no worker has picked it up
// yet and it is next in the queue (so issue order is kept). Wait blocks the
// host until the work completes; the op's own timeout (Meta.Timeout, measured
// from issue) bounds it. A timed-out collective fails with ErrTimeout
// naming the ranks that had not issued it (each peer is asked how many
// collectives it has issued). A dead peer fails every pending work with
// ErrRemote naming it, at once; the backend is unusable afterwards, as a
// Gloo context is.
//
// On one host (every peer in shared memory) allreduce takes fast paths
// (lanes.go): up to LaneBytes, recursive doubling over the mesh's lanes
// on the op's own goroutine, reducing straight out of shared memory
// (every size at 2 ranks); beyond, direct reads of the peers' buffers
// (process_vm_readv) where the ranks may read each other's memory.
//
// Algorithms live in internal/coll: recursive doubling for small
// allreduces, pipelined ring reduce-scatter + all-gather for large ones,
// binomial trees for broadcast, reduce, gather and scatter, pairwise
// exchange for all-to-all, a dissemination barrier that first waits for
// every earlier work, and Gloo's monitored barrier.
package cpupool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/internal/reduce"
	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/internal/watch"
	"github.com/gocoll/gocoll/tensor"
)

// Name is the registered backend name.
const Name = "cpupool"

// Environment variables read when the matching option is left zero.
const (
	// EnvSocketIfname names the network interface whose first IPv4 address
	// peers dial when Options.Host is empty (PyTorch's GLOO_SOCKET_IFNAME,
	// also accepted, after it).
	EnvSocketIfname = "GOCOLL_SOCKET_IFNAME"
	// EnvThreads sets Options.Threads.
	EnvThreads = "GOCOLL_CPUPOOL_THREADS"
	// EnvTransport sets Options.Transport ("auto", "tcp" or "shm").
	EnvTransport = "GOCOLL_CPUPOOL_TRANSPORT"
	// EnvLaneCopies sets Options.LaneCopies ("auto", "cached" or "streamed").
	EnvLaneCopies = "GOCOLL_CPUPOOL_LANE_COPIES"
	// EnvBind sets Options.Bind ("auto" or "none").
	EnvBind = "GOCOLL_CPUPOOL_BIND"
	// EnvTiming sets Options.EnableTiming (a boolean).
	EnvTiming = "GOCOLL_CPUPOOL_ENABLE_TIMING"
)

// The values of Options.Bind.
const (
	// BindAuto keeps each rank of a host whose ranks outnumber its CPUs
	// on a CPU of its own choosing, the ranks spread evenly (the default).
	BindAuto = "auto"
	// BindNone leaves the ranks' placement to the kernel.
	BindNone = "none"
)

// The values of Options.LaneCopies.
const (
	// CopiesAuto picks cached or streamed copies per size from the times
	// of the ops before (the default).
	CopiesAuto = "auto"
	// CopiesCached copies into the lanes through the cache.
	CopiesCached = "cached"
	// CopiesStreamed copies large lane messages past the cache.
	CopiesStreamed = "streamed"
)

// Options are cpupool's backend options (backend.Config.Options, as
// *Options or Options; nil is Options{}). The zero value of every field is
// its default, which the field's variable, when set to a non-empty value,
// replaces; a set field wins over the variable (internal/knob's rule, as
// in the dispatcher and the nccl backend). Invalid values, of fields or
// variables, fail New (and so dispatcher.Init) with an error naming them.
// Sizes and durations may not be negative, except PollSpin, where negative
// means "never".
type Options struct {
	// Threads is the number of worker goroutines that run collectives
	// (GOCOLL_CPUPOOL_THREADS; default 2, as Gloo's).
	Threads int
	// Host is the address peers connect to. Default: the first IPv4 address
	// of GOCOLL_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME); else the host name's
	// address when it is local; else 127.0.0.1, as Gloo falls back.
	Host string
	// ConnectTimeout bounds building the mesh, on every rank (default: the
	// group timeout, or 5 minutes).
	ConnectTimeout time.Duration
	// SegmentBytes is the piece large messages are cut into so that sending,
	// receiving and reducing overlap (default 1 MiB, as Gloo's maxSegmentSize).
	SegmentBytes int
	// SmallBytes is the size up to which allreduce uses recursive doubling
	// rather than the ring (default 256 KiB).
	SmallBytes int
	// LaneBytes is the size up to which an allreduce between ranks of one
	// host runs recursive doubling over the lanes (shared memory, in
	// chunks; at 3 or more ranks, beyond 128 KiB, a reduce-scatter and
	// allgather) rather than direct reads of the peers' buffers. Default:
	// every size at 2 ranks, and at more when they outnumber the host's
	// cores, where the lanes' streamed copies beat the kernel's
	// page-by-page reads; SmallBytes otherwise.
	LaneBytes int
	// RawLaneBytes, when > 0, is the size from which a direct-read
	// allreduce of 2 ranks sends the raw half of the buffer over the
	// lanes (coll.AllreduceDirectLanes: a user-space copy, no page
	// pinned) and reads only the reduced half in place. Default 0: both
	// halves by direct reads. An experiment's switch: on a shared 2-core
	// machine it took 16 MiB in 8 % less time and 4 MiB in 10 % more
	// (docs/perf.md, issue 17 sixth pass); a quiet machine decides.
	RawLaneBytes int
	// Window is how many segment receives are posted ahead (default 4).
	Window int
	// SocketBufferBytes, when > 0, sets SO_SNDBUF and SO_RCVBUF of the
	// connections (default: the kernel's autotuning).
	SocketBufferBytes int
	// MaxMessageBytes bounds a message that arrives before its receive is
	// posted (default 4 GiB).
	MaxMessageBytes int64
	// Transport is the data path to peers on this host (GOCOLL_CPUPOOL_TRANSPORT):
	// "auto" (default) uses shared memory where both ranks are on one host
	// (same host name and boot id) and it can be set up, TCP otherwise;
	// "tcp" always uses TCP; "shm" requires shared memory to every peer.
	// The TCP connections exist in every mode: they carry the setup and
	// detect a peer's death.
	Transport string
	// ShmRingBytes is the capacity of each direction of a shared-memory
	// pair (a power of two; default 4 MiB).
	ShmRingBytes int
	// LaneCopies is how a lane allreduce of 32 KiB or more copies its
	// messages into shared memory (GOCOLL_CPUPOOL_LANE_COPIES): "cached"
	// (plain stores; the peer reads the lines from this core's cache),
	// "streamed" (non-temporal stores past the cache; the peer reads
	// memory), or "auto" (default), which times both on the first ops of
	// each size, takes streamed copies only when they cost more than an
	// eighth less than cached ones (else cached), and tries the other way
	// again on 2 ops in 32. Which is faster depends on whether the ranks'
	// cores share a cache, which a virtual machine cannot see; the margin
	// keeps ranks that nearly tie from switching ways on noise. It changes
	// speed only, never results.
	LaneCopies string
	// Bind is whether the ranks of a host that has fewer CPUs than ranks
	// keep to a CPU each (GOCOLL_CPUPOOL_BIND): "auto" (default) binds
	// each thread that posts the rank's small ops on the shared board to
	// the rank's home CPU, the ranks spread evenly over the CPUs the
	// process may use (rank r on the (r mod n)-th), and gives the threads
	// their old affinity back when the group is closed; "none" leaves
	// placement to the kernel. Why: such ranks poll with sched_yield, so
	// the kernel sees every one as busy and cache hot, and it kept three
	// of four on one of two CPUs for whole runs, where an 8 B allreduce
	// took half as long again or more. A thread already bound to fewer
	// CPUs (by the user, taskset or another group) is left as it is. It
	// changes speed only, never results.
	Bind string
	// EnableTiming stamps each op's start, so that Work.Duration reports
	// how long it ran (GOCOLL_CPUPOOL_ENABLE_TIMING; default off, as
	// nccl's EnableTiming and PyTorch's TORCH_NCCL_ENABLE_TIMING: Gloo
	// has no Duration at all). Off, Duration returns backend.ErrNoTiming
	// and the flight recorder leaves duration_ms out; the start's clock
	// read, a twentieth of a 2-rank 8 B allreduce on a virtual machine,
	// is saved.
	EnableTiming bool
	// PollSpin is how long a receive from a shared-memory peer, and a Wait
	// on a work, poll before they park (negative: never). Polling trades a
	// little CPU for the goroutine wake-ups that dominate small-message
	// latency. Default: 50 µs, or never when more ranks share this host
	// than it has CPUs (a spinning rank would take a peer's core); the
	// default depends on the mesh, so Backend.Options keeps it zero. A
	// lane op's waits start from it and adapt, up to 16 times it: one
	// that slept and was woken soon after doubles the next waits' spin,
	// one that slept longer sets it back (shm.SpinBudget).
	PollSpin time.Duration
}

func init() {
	backend.Register(backend.Driver{Name: Name, Devices: servedDevices, New: newServed})
}

// Backend is the cpupool backend of one group.
type Backend struct {
	backend.Unimplemented

	cfg  backend.Config
	opts Options
	args backend.HostChecker[reduce.Kernel] // the ops' common argument checks
	mesh *tcpmesh.Mesh
	comm *coll.Comm
	pool coll.Pool

	spin  time.Duration // the mesh's PollSpin in effect
	jobs  jobPool       // the jobs of completed lane allreduces (work.go)
	works workSlab      // the Works of small lane allreduces, under mu (work.go)
	flat  bool          // small lane allreduces take one exchange (lanes.go, flatFor)
	board bool          // and post on the mesh's board (tcpmesh.Mesh.Board), fixed at set-up
	lanes int           // the largest allreduce that takes the lanes (laneBytes), fixed at set-up
	// scratch is the flat lane allreduce's copy of this rank's
	// contribution; lane ops run one at a time, so one is enough.
	scratch []byte
	streams streamChooser // the copy mode of large lane allreduces (stream.go); the lane ops'

	issued atomic.Uint64 // collectives issued; the next one's tag is issued+1
	ended  atomic.Uint64 // collectives run to their end, ok or not (probeValue)
	q      queue
	wg     sync.WaitGroup

	mu          sync.Mutex
	outstanding []backend.Work
	sweepAt     int   // track sweeps outstanding when it is this long
	holds       int   // barriers waiting on lists of works (trackEarlier)
	stopped     error // set by Close (ErrClosed) or Abort
	senders     []*sender

	// The lane ops' turns (lanes.go): tickets are taken under mu with
	// the tag; laneDone is the ticket whose turn it is; laneSkip holds
	// tickets that gave up waiting for it; laneWake, when not nil, is
	// closed at the next turn, waking the parked waiters.
	laneMu     sync.Mutex
	laneIssued uint64 // guarded by mu
	laneDone   atomic.Uint64
	laneSkip   map[uint64]bool
	laneWake   chan struct{}

	// The deferred lane ops (deferred.go): dq holds them until a Wait
	// or a flush takes them; dRuns counts the ops run from it (the
	// nudge's sign of progress).
	dq    deferRing
	dRuns atomic.Uint64

	// wd decides what a timed-out op leads to (the dump, once per backend:
	// the first timeout is the one worth it), as it does for nccl's
	// watchdog; cpupool finds its timeouts itself, as the op's deadline
	// ends its job, and reports them. Its policy is NoHandling: like a
	// Gloo context, the backend only fails the op. Guarded by wdMu.
	wdMu sync.Mutex
	wd   *watch.Watchdog[*job]
}

var _ backend.Backend = (*Backend)(nil)

// New is the backend.Factory of cpupool: it resolves the options (the
// first error is returned before anything starts), connects the mesh
// through cfg.Store and starts the workers.
func New(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
	var opts Options
	switch o := cfg.Options.(type) {
	case nil:
	case Options:
		opts = o
	case *Options:
		if o != nil {
			opts = *o
		}
	default:
		return nil, fmt.Errorf("%w: cpupool: options of type %T (want *cpupool.Options)", backend.ErrInvalidArgument, cfg.Options)
	}
	opts, ifname, err := resolveOptions(opts, cfg.Timeout, knob.OS)
	if err != nil {
		return nil, err
	}
	if opts.Host == "" {
		if opts.Host, err = defaultHost(ifname); err != nil {
			return nil, err
		}
	}
	b := &Backend{cfg: cfg, opts: opts, args: hostChecker(cfg.Rank), wd: watch.NewWatchdog[*job](watch.Config{Policy: watch.NoHandling, Rank: cfg.Rank, Dump: cfg.DumpAll != nil})}
	b.q.init(lazyWake)
	b.q.ready = b.laneReady
	b.q.owner = b
	mesh, err := tcpmesh.Connect(ctx, tcpmesh.Config{
		Rank: cfg.Rank, Size: cfg.WorldSize, Store: cfg.Store, Host: opts.Host,
		ConnectTimeout: opts.ConnectTimeout, MaxMessage: opts.MaxMessageBytes, Pool: &b.pool,
		SocketBuffer: opts.SocketBufferBytes,
		OnProbe:      b.probeValue,
		Transport:    opts.Transport, ShmRingBytes: opts.ShmRingBytes, PollSpin: opts.PollSpin,
		BindRanks: opts.Bind == BindAuto,
	})
	if err != nil {
		return nil, &backend.OpError{Op: "init", Rank: cfg.Rank, Backend: Name, Kind: backend.ErrUnavailable, Err: err}
	}
	b.mesh = mesh
	b.spin = mesh.PollSpin()
	b.flat = mesh.Oversubscribed()
	b.board = mesh.Board()
	b.comm = &coll.Comm{T: mesh, Pool: &b.pool, Segment: opts.SegmentBytes, Window: opts.Window, Small: opts.SmallBytes}
	b.lanes = b.laneBytes()
	b.mesh.StreamLanes(b.opts.LaneCopies == CopiesStreamed)
	for range opts.Threads {
		b.wg.Add(1)
		go b.worker()
	}
	b.senders = make([]*sender, cfg.WorldSize)
	for p := range b.senders {
		if p != cfg.Rank {
			s := &sender{}
			s.cond.L = &s.mu
			b.senders[p] = s
			b.wg.Add(1)
			go b.sendLoop(p, s)
		}
	}
	return b, nil
}

// defaultHost picks the address peers dial when Options.Host is empty:
// the interface's, when resolveOptions found one named; see Options.Host.
func defaultHost(ifi iface) (string, error) {
	if ifi.name != "" {
		nif, err := net.InterfaceByName(ifi.name)
		if err != nil {
			return "", fmt.Errorf("%w: cpupool: %s=%q: %v", backend.ErrInvalidArgument, ifi.variable, ifi.name, err)
		}
		addrs, _ := nif.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
		}
		return "", fmt.Errorf("%w: cpupool: %s=%q has no IPv4 address", backend.ErrInvalidArgument, ifi.variable, ifi.name)
	}
	if hn, err := os.Hostname(); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if ips, err := net.DefaultResolver.LookupIPAddr(ctx, hn); err == nil {
			local, _ := net.InterfaceAddrs()
			for _, ip := range ips {
				if ip.IP.To4() == nil {
					continue
				}
				for _, a := range local {
					if ipn, ok := a.(*net.IPNet); ok && ipn.IP.Equal(ip.IP) {
						return ip.IP.String(), nil
					}
				}
			}
		}
	}
	return "127.0.0.1", nil
}

// Name implements backend.Core.
func (b *Backend) Name() string { return Name }

// Capabilities implements backend.Core.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Devices:           []tensor.DeviceType{tensor.CPU},
		DTypes:            tensor.DTypes(),
		BitwiseReductions: true,
		Timing:            true,
		UnevenSizes:       true,
		MismatchChecks:    true,
	}
}

// Rank implements backend.Core.
func (b *Backend) Rank() int { return b.cfg.Rank }

// Size implements backend.Core.
func (b *Backend) Size() int { return b.cfg.WorldSize }

// Options returns the options in effect, defaults filled in.
func (b *Backend) Options() Options { return b.opts }

// Close implements backend.Core: it waits (bounded by ctx) for the issued
// ops, then stops the workers and closes the connections.
func (b *Backend) Close(ctx context.Context) error {
	b.mu.Lock()
	if b.stopped != nil {
		b.mu.Unlock()
		return nil
	}
	b.stopped = backend.ErrClosed
	works := append([]backend.Work(nil), b.outstanding...)
	b.mu.Unlock()
	var err error
	for _, w := range works {
		if werr := w.WaitHost(ctx); werr != nil && ctx.Err() != nil {
			err = fmt.Errorf("cpupool: close: %w", ctx.Err())
			break
		}
	}
	b.shutdown(&backend.OpError{Op: "close", Rank: b.cfg.Rank, Backend: Name, Kind: backend.ErrClosed})
	return err
}

// Abort implements backend.Core: pending works fail with ErrAborted
// wrapping reason, at once; later ops fail with it too.
func (b *Backend) Abort(ctx context.Context, reason error) error {
	if reason == nil {
		reason = errors.New("abort requested")
	}
	aerr := &backend.OpError{Op: "abort", Rank: b.cfg.Rank, Backend: Name, Kind: backend.ErrAborted, Err: reason}
	b.mu.Lock()
	if b.stopped == nil || errors.Is(b.stopped, backend.ErrClosed) {
		b.stopped = aerr
	}
	works := append([]backend.Work(nil), b.outstanding...)
	b.mu.Unlock()
	// The peers blame the rank that reason blames, or this one.
	root, ok := backend.RootCause(reason, b.cfg.Rank)
	if !ok {
		root = b.cfg.Rank
	}
	b.mesh.AbortBecause(aerr, root)
	for _, w := range works {
		w.Abort(reason)
	}
	b.shutdown(aerr)
	return nil
}

func (b *Backend) shutdown(err error) {
	b.q.close(err)
	for _, s := range b.senders {
		if s != nil {
			s.close()
		}
	}
	_ = b.mesh.Close()
	b.wg.Wait()
}

type job struct {
	op      backend.Op
	seq     uint64
	tag     uint64
	peer    int             // the peer of a p2p op, else -1
	ctx     context.Context // &jc
	jc      jobCtx
	timeout time.Duration
	h       *work             // the op's Work, which outlives the job (work.go)
	w       *backend.HostWork // &h.HostWork
	outputs []*tensor.Tensor
	run     func(ctx context.Context, tag uint64) error
	poll    tcpmesh.OpPoll
	fp      tcpmesh.Fingerprint                         // what the op's frames say about it
	lane    bool                                        // the op runs over the lanes (lanes.go)
	ticket  uint64                                      // its turn among the lane ops
	laneRun func(ctx context.Context, lo *laneOp) error // a lane op's run (runLane); nil: allreduceLanes's
	bufs    [][]byte                                    // a lane allreduce's buffers, when laneRun is nil
	buf1    [1][]byte                                   // bufs' storage for one tensor
	k       reduce.Kernel                               // and its reduction
	lo      laneOp                                      // its view of the lanes
	waited  atomic.Bool                                 // a goroutine waits for this lane op (help)
	// atOnce: its caller waits as soon as the issue returns
	// (backend.Meta.Waited), and its Wait runs it: push sets no nudge
	// timer for it.
	atOnce bool
}

func (b *Backend) worker() {
	defer b.wg.Done()
	for {
		j := b.q.pop()
		if j == nil {
			return
		}
		// Read before the run: once it completes, the job may be back
		// in the pool (work.go).
		lane := j.lane
		b.runJob(j)
		if lane {
			b.runLanes()
		}
	}
}

func (b *Backend) runJob(j *job) {
	j.w.MarkStarted()
	ctx := j.ctx
	if j.tag != 0 && j.tag < p2pBit && !j.lane {
		// This goroutine reads the op's messages itself (see OpPoll), and
		// the op's frames carry its fingerprint.
		j.poll.Tag, j.poll.FP = j.tag, j.fp
		ctx = b.mesh.BeginOp(ctx, &j.poll)
	}
	var err error
	if j.lane {
		err = b.runLane(ctx, j)
	} else {
		err = j.run(ctx, j.tag)
	}
	b.mesh.EndOp(&j.poll)
	if err != nil {
		raw := err
		err = b.wrap(j, err)
		if code, peer, ok := mismatchOf(raw); ok && j.tag != 0 && j.tag < p2pBit {
			// The peers may wait for messages this rank will not send
			// now: tell them, so that every rank fails, not only this one,
			// with the same words.
			b.mesh.FailTag(j.tag, code, peer, errors.New(detailOf(err)))
		}
	}
	// A lane allreduce that succeeded, and whose context nobody derived
	// from (no Done channel), leaves nothing behind that could still
	// reach its job: it may go back to the pool once its Work's methods
	// are out of it (work.release). Its Work keeps the op's outcome.
	// Nothing can look at such a context any more (the run is over, and
	// an abort cancels it itself), so only the others are cancelled.
	h := j.h
	reuse := err == nil && j.lane && j.laneRun == nil && !j.jc.made.Load()
	if !reuse {
		j.cancel()
	}
	if j.tag != 0 && j.tag < p2pBit {
		b.ended.Add(1)
	}
	j.w.Complete(j.outputs, err)
	h.release(reuse) // the run's reference: j is not touched after this
}

func (b *Backend) usable(op backend.Op, seq uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.usableLocked(op, seq)
}

// usableLocked is usable with b.mu held.
func (b *Backend) usableLocked(op backend.Op, seq uint64) error {
	if b.stopped != nil {
		return &backend.OpError{Op: op.String(), Seq: seq, Rank: b.cfg.Rank, Backend: Name, Kind: kindOf(b.stopped), Err: b.stopped}
	}
	if err := b.mesh.Err(); err != nil {
		return b.wrap(&job{op: op, seq: seq}, err)
	}
	return nil
}

func kindOf(err error) error {
	if errors.Is(err, backend.ErrAborted) {
		return backend.ErrAborted
	}
	return backend.ErrClosed
}

// newJob builds the job and Work of an op; the caller takes the tag.
// The job runs under m.Timeout, which the dispatcher resolved (the op's
// option, else the group's default); zero, from a caller that bypasses the
// dispatcher, means none.
func (b *Backend) newJob(ctx context.Context, op backend.Op, m backend.Meta, outputs []*tensor.Tensor, run func(ctx context.Context, tag uint64) error) *job {
	return b.newJobWork(ctx, op, m, outputs, run, new(work))
}

// newJobWork is newJob with the op's Work given: a zero work, from new or
// from the Backend's slab (workSlab).
func (b *Backend) newJobWork(ctx context.Context, op backend.Op, m backend.Meta, outputs []*tensor.Tensor, run func(ctx context.Context, tag uint64) error, h *work) *job {
	to := m.Timeout
	j := b.jobs.get()
	j.op, j.seq, j.peer, j.timeout, j.outputs, j.run = op, m.Seq, -1, to, outputs, run
	j.atOnce = m.Waited
	j.jc.init(ctx, to, m.Issued) // the timeout runs from the dispatcher's issue
	j.ctx = &j.jc
	// The Work is the op's one allocation (docs/perf.md, issue 17): the
	// job comes from the pool, and goes back to it once the op is done.
	h.b, h.j, h.op, h.timeout = b, j, op, to
	if dl, ok := j.jc.Deadline(); ok {
		h.deadline = backend.MonoOf(dl)
	}
	h.refs.Store(1) // the run's
	h.Init(m.Seq, b.opts.EnableTiming, h)
	j.h, j.w = h, &h.HostWork
	return j
}

// cancel ends the job's context (its waits fail with Canceled), unless
// it ended already.
func (j *job) cancel() { j.jc.cancel() }

// track records w for barriers and Close. Completed works are dropped
// only when the list has grown (to twice what was live at the last
// sweep), so that an op pays no scan and no copy (Close and Abort wait
// for, and abort, completed works at no cost).
func (b *Backend) track(w backend.Work) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.trackLocked(w)
}

// trackLocked is track with b.mu held.
func (b *Backend) trackLocked(w backend.Work) {
	if len(b.outstanding) >= b.sweepAt {
		b.sweepLocked()
	}
	b.outstanding = append(b.outstanding, w)
}

// trackEarlier is track for a barrier: it also returns the works issued
// before w that have not completed. A nil w (a lane barrier, whose lane
// op tracks itself) is not tracked. Until the barrier calls unhold, no
// Work is reused (sweepLocked): one of those could otherwise become a
// later op's while the barrier waits for it.
func (b *Backend) trackEarlier(w backend.Work) []backend.Work {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sweepLocked()
	b.holds++
	earlier := append([]backend.Work(nil), b.outstanding...)
	if w != nil {
		b.outstanding = append(b.outstanding, w)
	}
	return earlier
}

// unhold ends a barrier's hold on the outstanding works (trackEarlier).
func (b *Backend) unhold() {
	b.mu.Lock()
	b.holds--
	b.mu.Unlock()
}

// sweepLocked drops the completed works, and gives the slab back those
// their callers gave back (work.Release) while no barrier holds a list
// of works; b.mu is held. (Close and Abort take their lists once the
// backend is stopped, when no op takes a Work any more.)
func (b *Backend) sweepLocked() {
	live := b.outstanding[:0]
	for _, o := range b.outstanding {
		if !o.IsCompleted() {
			live = append(live, o)
		} else if w, ok := o.(*work); ok && b.holds == 0 && w.released.Load() {
			b.works.recycle(w)
		}
	}
	clear(b.outstanding[len(live):])
	b.outstanding = live
	b.sweepAt = max(64, 2*len(live))
}

// collective issues a collective: it takes the tag on the caller's
// goroutine and queues the job for the workers.
func (b *Backend) collective(ctx context.Context, op backend.Op, m backend.Meta, fp tcpmesh.Fingerprint, outputs []*tensor.Tensor, run func(ctx context.Context, tag uint64) error) (backend.Work, error) {
	if err := b.usable(op, m.Seq); err != nil {
		return nil, err
	}
	j := b.newJob(ctx, op, m, outputs, run)
	j.fp = fp
	j.tag = b.issued.Add(1)
	b.track(j.w)
	h := j.h // read before the push: once queued, the job may run, complete and be reused
	if !b.q.push(j) {
		j.cancel()
		return nil, b.usable(op, m.Seq)
	}
	return h, nil
}

// outlasts reports whether a wait under ctx would last at least as long as
// job j may run: only then may the waiting goroutine run j itself, since
// once it runs the op it cannot leave it when ctx ends (the op goes on for
// the peers).
func outlasts(ctx context.Context, j *job) bool {
	if ctx.Done() == nil {
		return true
	}
	dl, ok := ctx.Deadline()
	jdl, jok := j.ctx.Deadline()
	return ok && jok && !dl.Before(jdl)
}

// help speeds up a wait for j: it runs j on the waiting goroutine when
// inline(j) allows and j is next in the queue, and a lane op j together
// with the lane ops queued before it (in their order, each if inline
// allows it), so that a caller that issues several small allreduces and
// waits for them wakes no worker; else it polls for PollSpin.
func (b *Backend) help(j *job, inline func(*job) bool) {
	if j.w.IsCompleted() {
		return
	}
	if j.lane {
		// Marked first: the goroutine that runs the op before this one
		// then kicks a worker for it if this wait cannot run it itself.
		j.waited.Store(true)
		for !j.w.IsCompleted() {
			h := b.q.takeLane(j.ticket, inline)
			if h == nil {
				break
			}
			b.runJob(h)
		}
		if j.w.IsCompleted() {
			b.q.kick() // the job behind: a worker may take it
			return
		}
	} else if inline(j) && b.q.take(j) {
		b.runJob(j)
		return
	}
	if b.spin < 0 {
		return
	}
	start := backend.Mono()
	for i := 0; !j.w.IsCompleted(); i++ {
		if i&15 == 15 && backend.Mono()-start > b.spin {
			return
		}
		runtime.Gosched()
	}
}

// wrap turns an algorithm's error into an *OpError of the right kind.
func (b *Backend) wrap(j *job, err error) error {
	var oe *backend.OpError
	if errors.As(err, &oe) && oe.Op == j.op.String() {
		return err
	}
	e := &backend.OpError{Op: j.op.String(), Seq: j.seq, Rank: b.cfg.Rank, Backend: Name, Err: err}
	var pe *tcpmesh.PeerError
	var ce *tcpmesh.CauseError
	var roe *tcpmesh.RemoteOpError
	var late *coll.LateRanksError
	var arb *coll.ArbiterError
	switch {
	case b.mismatchKind(e, j, err):
		// ErrInvalidArgument naming the two ranks (mismatch.go).
	case errors.As(err, &late):
		e.Kind, e.Ranks, e.Timeout, e.Err = backend.ErrTimeout, late.Ranks, late.Timeout, nil
		e.Detail = late.Error()
	case errors.As(err, &arb) && !errors.As(err, &pe):
		e.Kind, e.Ranks = backend.ErrRemote, []int{0}
	case errors.Is(err, backend.ErrAborted):
		e.Kind = backend.ErrAborted
	case errors.Is(err, tcpmesh.ErrClosed):
		e.Kind = backend.ErrClosed
	case errors.As(err, &ce):
		// A peer gave the mesh up because of ce.Rank: that rank is at fault.
		e.Kind, e.Ranks = backend.ErrRemote, []int{ce.Rank}
	case errors.As(err, &pe):
		e.Kind, e.Ranks = backend.ErrRemote, []int{pe.Rank}
	case errors.As(err, &roe):
		e.Kind, e.Ranks = backend.ErrRemote, []int{roe.Rank}
	case j.ctx != nil && errors.Is(j.ctx.Err(), context.DeadlineExceeded):
		e.Kind, e.Timeout = backend.ErrTimeout, j.timeout
		b.explainTimeout(e, j) // diagnose.go
	case j.ctx != nil && errors.Is(j.ctx.Err(), context.Canceled):
		e.Kind = backend.ErrAborted
	default:
		e.Kind = backend.ErrRemote
	}
	return e
}
