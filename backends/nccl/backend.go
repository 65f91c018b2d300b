// Package nccl is gocoll's NCCL backend: collectives on CUDA tensors through
// libnccl.so.2, loaded at run time, with PyTorch ProcessGroupNCCL's
// semantics (reference/000_ba349abf66fc5b71.txt sections 2-6):
//
//   - communicators are created lazily, one per device key, with the unique
//     id broadcast through the store (eagerly when Config.Device is set;
//     through ncclCommSplit when the parent group has one; with several
//     bootstrap roots above Options.RanksPerRoot); P2P ops use one
//     communicator per rank pair ("lo:hi");
//   - sync mode (the default) queues the kernel on ctx's current stream;
//     async mode queues it on an internal stream per device key that first
//     waits on an event of the current stream, records an end event, and
//     stashes the tensors until Work.Wait; with Options.AsyncOnCurrentStream
//     async ops are queued on the current stream too (no sync event, no
//     overlap with that stream's compute), keeping the stash and Wait;
//   - a watchdog goroutine polls every 100 ms for completions, timeouts and
//     NCCL's asynchronous errors, and releases the stashes of works never
//     waited on at the next op.
//
// Importing the package registers the "nccl" backend for CUDA tensors.
package nccl

/*
#include <stdlib.h>
#include "nccl_dl.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl/internal/ncclhook"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/internal/watch"
	"github.com/gocoll/gocoll/tensor"
)

// Name is the registered backend name.
const Name = "nccl"

const maxDevices = 64

func init() {
	backend.Register(backend.Driver{Name: Name, Devices: []tensor.DeviceType{tensor.CUDA}, New: factory})
}

func factory(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
	// Not "return New(ctx, cfg)": a nil *Backend in a backend.Backend is a
	// non-nil interface, which the dispatcher would keep and later Close.
	b, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Backend is the NCCL backend of one process group. Its methods are safe
// for concurrent use, but NCCL needs every rank to issue the ops of one
// communicator in the same order.
type Backend struct {
	backend.Unimplemented

	cfg  backend.Config
	opts Options
	test ncclhook.Knobs // test-only knobs attached to the *Options it was made with
	rank int
	size int

	devComms [maxDevices]atomic.Pointer[comm]
	initMu   sync.Mutex // serialises communicator creation
	p2p      map[[2]int]*comm
	p2pMu    sync.Mutex
	counter  int // communicators created through the store, for the store key

	// all lists every communicator made (comms' and p2p's), copied on
	// write, for the flushes of their fresh works that run under mu: it
	// is read without a lock, where comms takes p2pMu, which
	// getP2PComm holds across a creation that waits on the peer.
	all atomic.Pointer[[]*comm]

	mu sync.Mutex // guards wd, unstash, coal
	// unstashed: unstash is not empty, read without b.mu by the issue
	// path. Set and cleared under mu.
	unstashed atomic.Bool
	wd        *watch.Watchdog[*Work] // the pending works and the failure policy's decisions
	unstash   []cuda.Retainer
	edge      edge // clock, sleep and exit of the watchdog's driver

	coalescing atomic.Bool
	coal       coalBlock

	closed   atomic.Bool
	abortErr atomic.Pointer[error]
	stop     chan struct{}
	wdDone   chan struct{}
	stopOnce sync.Once

	heartbeat atomic.Uint64 // watchdog rounds (backend.Heartbeater)

	started time.Time // when the group started: its NVML snapshots' XIDs count from here (nvml.go)
}

var _ backend.Backend = (*Backend)(nil)
var _ backend.Coalescer = (*Backend)(nil)

// New makes the backend of one group. It loads libnccl (failing with
// ErrUnavailable when it is missing) and starts the watchdog. With
// cfg.Device set it creates the device's communicator now (eager init).
func New(ctx context.Context, cfg backend.Config) (*Backend, error) {
	// Options first, so that an invalid value is reported even where the
	// library is missing.
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
		return nil, fmt.Errorf("%w: nccl: options of type %T, want nccl.Options", backend.ErrInvalidArgument, cfg.Options)
	}
	opts, err := ResolveOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := Load(); err != nil {
		return nil, err
	}
	if cfg.WorldSize <= 0 || cfg.Rank < 0 || cfg.Rank >= cfg.WorldSize {
		return nil, fmt.Errorf("%w: nccl: rank %d of %d", backend.ErrInvalidArgument, cfg.Rank, cfg.WorldSize)
	}
	if cfg.Store == nil {
		return nil, fmt.Errorf("%w: nccl: no store", backend.ErrInvalidArgument)
	}
	b := &Backend{cfg: cfg, opts: opts, rank: cfg.Rank, size: cfg.WorldSize,
		p2p: map[[2]int]*comm{}, stop: make(chan struct{}), wdDone: make(chan struct{}),
		wd: newWatchdog(cfg, opts), edge: realEdge}
	if p, ok := cfg.Options.(*Options); ok {
		b.test = ncclhook.Of(p)
	}
	b.startNVML()
	go b.watchdog()
	if cfg.Device != nil {
		if cfg.Device.Type != tensor.CUDA {
			b.Close(ctx)
			return nil, fmt.Errorf("%w: nccl: eager init on %v, not a CUDA device", backend.ErrInvalidArgument, cfg.Device)
		}
		if _, err := b.getComm(ctx, cfg.Device.Index); err != nil {
			b.Abort(ctx, err)
			return nil, err
		}
	}
	return b, nil
}

// Name implements backend.Core.
func (b *Backend) Name() string { return Name }

// Rank implements backend.Core.
func (b *Backend) Rank() int { return b.rank }

// Size implements backend.Core.
func (b *Backend) Size() int { return b.size }

// Options returns the options the backend runs with.
func (b *Backend) Options() Options { return b.opts }

// Capabilities implements backend.Core.
func (b *Backend) Capabilities() backend.Capabilities {
	dts := []tensor.DType{tensor.Float32, tensor.Float64, tensor.Float16, tensor.BFloat16, tensor.Int8,
		tensor.Uint8, tensor.Int32, tensor.Int64, tensor.Bool}
	if lib.version >= 22400 {
		dts = append(dts, tensor.Float8E4M3, tensor.Float8E5M2)
	}
	return backend.Capabilities{
		Devices: []tensor.DeviceType{tensor.CUDA}, DTypes: dts, StreamSemantics: true, Coalescing: true,
		BitwiseReductions: false, Timing: true, GraphCapture: true, UnevenSizes: true,
	}
}

// comm is one NCCL communicator with its internal stream and events.
type comm struct {
	key    string
	dev    *cuda.Device
	ctx    uintptr
	handle uintptr // ncclComm_t
	rank   int     // rank in this communicator
	size   int
	nb     bool // nonblocking
	stream *cuda.Stream
	syncEv *cuda.Event
	name   *C.char // commName: NCCL keeps the pointer, so it lives as long as the comm

	mu    sync.Mutex // serialises issue on this communicator and guards the pools
	free  []*cuda.Event
	freeT []*cuda.Event
	// retMu guards returned, where completed works hand their events
	// back. It is not mu, which an issue holds across its cgo call: the
	// watchdog retiring works would wait on (and spin for) every issue,
	// and each issue's unlock would wake it. event takes the returned
	// events back in bulk, under mu, when its pool runs dry.
	retMu     sync.Mutex
	returned  []*cuda.Event // untimed, for free
	returnedT []*cuda.Event // timed, for freeT
	// launches numbers the works launched on this communicator, under mu:
	// on one stream, a work with a lower number runs before one with a
	// higher, which is what lets the watchdog retire a stream's works up
	// to its newest completed one with a single query.
	launches uint64
	// works is the rest of the slab newWork takes Works from. Under mu.
	works []Work
	// fresh is the newest of the works launchOne issued since the last
	// probe or flush, each linked to the one before (Work.freshNext), not
	// yet in the watchdog unit: launchOne pushes with one atomic
	// operation, where a hand-over to the unit took b.mu for every op;
	// they are staged at the next probe (every probeEvery launches,
	// retire.go) and Backend.flushLocked moves them into the unit under
	// b.mu (at the watchdog's round, and before anything reads the unit),
	// without c.mu, which an issue stuck in NCCL can hold.
	fresh atomic.Pointer[Work]
	// staged is the newest work of the batch the last probe took from
	// fresh, linked as there: the next probe retires it if it is complete
	// and hands it to the unit if not (Backend.retireStaged). Under b.mu.
	staged *Work

	made    int          // events created for the pools, under mu (tests)
	scratch *cuda.Buffer // one element for barrier

	aborted atomic.Bool
	asyncMu sync.Mutex // ncclCommGetAsyncError is not safe from two threads at once

	nan   *nanChecker // with Options.NaNCheck
	nanMu sync.Mutex  // serialises the NaN check's flag
}

func (c *comm) event(timing bool) (*cuda.Event, error) {
	pool := &c.free
	if timing {
		pool = &c.freeT
	}
	if len(*pool) == 0 {
		c.reclaim()
	}
	if len(*pool) == 0 {
		// Nothing returned yet (the watchdog returns events as it retires
		// works): make events in batches, one cgo crossing per batch.
		evs, err := c.dev.NewEvents(64, timing)
		if err != nil {
			return nil, err
		}
		c.made += len(evs)
		*pool = append(*pool, evs...)
	}
	n := len(*pool)
	e := (*pool)[n-1]
	*pool = (*pool)[:n-1]
	return e, nil
}

// reclaim moves the returned events into the pools; the caller holds c.mu.
func (c *comm) reclaim() {
	c.retMu.Lock()
	c.free = takeEvents(c.free, &c.returned)
	c.freeT = takeEvents(c.freeT, &c.returnedT)
	c.retMu.Unlock()
}

// takeEvents moves the events of *ret into pool: an empty pool (the case
// of event, which reclaims when its pool runs dry) trades its array for
// ret's, with no copy.
func takeEvents(pool []*cuda.Event, ret *[]*cuda.Event) []*cuda.Event {
	if len(pool) == 0 {
		pool, *ret = *ret, pool[:0]
		return pool
	}
	pool = append(pool, *ret...)
	clear(*ret)
	*ret = (*ret)[:0]
	return pool
}

// putEvents returns events (nil ones skipped) to the communicator. It
// needs no lock held: it takes retMu only.
func (c *comm) putEvents(es ...*cuda.Event) {
	c.retMu.Lock()
	for _, e := range es {
		switch {
		case e == nil:
		case e.Timing():
			c.returnedT = append(c.returnedT, e)
		default:
			c.returned = append(c.returned, e)
		}
	}
	c.retMu.Unlock()
}

// asyncError polls ncclCommGetAsyncError.
func (c *comm) asyncError() (int, error) {
	c.asyncMu.Lock()
	defer c.asyncMu.Unlock()
	var st C.int
	if err := result("ncclCommGetAsyncError", C.gn_comm_async_error(C.uintptr_t(c.handle), &st)); err != nil {
		return 0, err
	}
	return int(st), nil
}

// waitReady polls a nonblocking communicator until its last call finished.
func (c *comm) waitReady(ctx context.Context, what string, timeout time.Duration) error {
	if !c.nb {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for {
		st, err := c.asyncError()
		if err != nil {
			return err
		}
		if st != ncclInProgress {
			if st != 0 {
				return &Error{Call: what, Code: st, Detail: C.GoString(C.gn_last_error())}
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: nccl: %s still in progress after %v", backend.ErrTimeout, what, timeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nccl: %s: %w", what, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// usable reports why the backend cannot take ops, if it cannot.
func (b *Backend) usable(op backend.Op) error {
	if p := b.abortErr.Load(); p != nil {
		return &backend.OpError{Op: op.String(), Rank: b.rank, Backend: Name, Kind: backend.ErrAborted, Err: *p}
	}
	if b.closed.Load() {
		return &backend.OpError{Op: op.String(), Rank: b.rank, Backend: Name, Kind: backend.ErrClosed}
	}
	return nil
}

// getComm returns the collective communicator for device dev, creating it
// on first use (PyTorch's getNCCLComm/initNCCLComm).
func (b *Backend) getComm(ctx context.Context, dev int) (*comm, error) {
	if dev < 0 || dev >= maxDevices {
		return nil, fmt.Errorf("%w: nccl: device %d", backend.ErrInvalidArgument, dev)
	}
	if c := b.devComms[dev].Load(); c != nil {
		return c, nil
	}
	b.initMu.Lock()
	defer b.initMu.Unlock()
	if c := b.devComms[dev].Load(); c != nil {
		return c, nil
	}
	c, err := b.initComm(ctx, dev)
	if err != nil {
		return nil, err
	}
	b.addComm(c)
	b.devComms[dev].Store(c)
	useGPU(c)
	return c, nil
}

// Comm returns the ncclComm_t handle of device dev's communicator, creating
// it if needed; for interop and tests.
func (b *Backend) Comm(ctx context.Context, dev int) (uintptr, error) {
	c, err := b.getComm(ctx, dev)
	if err != nil {
		return 0, err
	}
	return c.handle, nil
}

// Stream returns the internal stream of device dev's communicator (the one
// async ops run on), creating the communicator if needed. Tests hold it
// with a cuda.Gate.
func (b *Backend) Stream(ctx context.Context, dev int) (*cuda.Stream, error) {
	c, err := b.getComm(ctx, dev)
	if err != nil {
		return nil, err
	}
	return c.stream, nil
}

func (b *Backend) splitColor() int {
	if b.opts.SplitColor != nil {
		return *b.opts.SplitColor
	}
	h := fnv.New32a()
	for _, r := range b.cfg.GlobalRanks {
		h.Write([]byte(strconv.Itoa(r) + ","))
	}
	return int(h.Sum32() & 0x7fffffff)
}

// initComm creates device dev's communicator: by ncclCommSplit from the
// parent's when the parent has one and every parent rank takes part, else
// through the store.
func (b *Backend) initComm(ctx context.Context, dev int) (*comm, error) {
	d, err := cuda.GetDevice(dev)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
	}
	key := strconv.Itoa(dev)
	c := &comm{key: key, dev: d, ctx: d.Context(), nb: b.opts.NonBlocking,
		name: C.CString(fmt.Sprintf("%s:%s:%s", b.cfg.GroupName, b.cfg.GroupDesc, key))}
	if parent, ok := b.cfg.Parent.(*Backend); ok && parent != nil && (len(b.cfg.GlobalRanks) == parent.size || b.opts.SplitColor != nil) {
		if pc := parent.devComms[dev].Load(); pc != nil {
			if err := b.split(ctx, pc, c); err != nil {
				return nil, err
			}
			return c, b.finishComm(c)
		}
	}
	storeKey := "nccl/uid/" + strconv.Itoa(b.counter)
	b.counter++
	if err := b.createComm(ctx, c, storeKey, b.rank, b.size); err != nil {
		return nil, err
	}
	return c, b.finishComm(c)
}

// split derives c from the parent communicator pc.
func (b *Backend) split(ctx context.Context, pc *comm, c *comm) error {
	// A nonblocking split may write the child handle after the call
	// returns, so the slot is C memory, not Go memory. It is never freed:
	// eight bytes per split.
	h := (*C.uintptr_t)(C.calloc(1, 8))
	blocking := C.int(1)
	if c.nb {
		blocking = 0
	}
	r := C.gn_comm_split(C.uintptr_t(pc.ctx), C.uintptr_t(pc.handle), C.int(b.splitColor()), C.int(b.rank), h, blocking, c.name)
	if err := result("ncclCommSplit", r); err != nil {
		return err
	}
	if c.nb {
		if err := pc.waitReady(ctx, "ncclCommSplit", b.opts.NonBlockingTimeout); err != nil {
			return err
		}
		// The child handle can stay NULL until the parent is ready again
		// (NVIDIA/nccl#1472); PyTorch spins on it too.
		for deadline := time.Now().Add(b.opts.NonBlockingTimeout); atomic.LoadUintptr((*uintptr)(unsafe.Pointer(h))) == 0 && time.Now().Before(deadline); {
			time.Sleep(2 * time.Millisecond)
		}
	}
	handle := atomic.LoadUintptr((*uintptr)(unsafe.Pointer(h)))
	if handle == 0 {
		return fmt.Errorf("nccl: ncclCommSplit gave no communicator")
	}
	c.handle, c.rank, c.size = handle, b.rank, b.size
	return c.waitReady(ctx, "ncclCommSplit", b.opts.NonBlockingTimeout)
}

// PerformNocolorSplit takes part in a parent communicator's ncclCommSplit
// without joining the child: the parent's ranks that are not in a new
// group must call it when the members split (PyTorch's
// perform_nocolor_split), or the members hang.
func (b *Backend) PerformNocolorSplit(ctx context.Context, dev int) error {
	pc, err := b.getComm(ctx, dev)
	if err != nil {
		return err
	}
	h := (*C.uintptr_t)(C.calloc(1, 8)) // see split: C memory, never freed
	blocking := C.int(1)
	if pc.nb {
		blocking = 0
	}
	if err := result("ncclCommSplit", C.gn_comm_split(C.uintptr_t(pc.ctx), C.uintptr_t(pc.handle), -1, C.int(b.rank), h, blocking, nil)); err != nil {
		return err
	}
	return pc.waitReady(ctx, "ncclCommSplit", b.opts.NonBlockingTimeout)
}

// createComm bootstraps c through the store: rank 0 (or each root, for
// scalable init) publishes a unique id under storeKey, the others read it,
// and everyone calls ncclCommInitRank{Config,Scalable}.
func (b *Backend) createComm(ctx context.Context, c *comm, storeKey string, rank, size int) error {
	st := b.cfg.Store
	scalable := b.test.ForceScalableInit || size > b.opts.RanksPerRoot
	nroots := 1
	if scalable {
		nroots = (size + b.opts.RanksPerRoot - 1) / b.opts.RanksPerRoot
	}
	ids := make([]byte, 128*nroots)
	if !scalable {
		if rank == 0 {
			if err := result("ncclGetUniqueId", C.gn_get_unique_id(C.uintptr_t(c.ctx), unsafe.Pointer(&ids[0]))); err != nil {
				return err
			}
			if err := st.Set(ctx, storeKey, ids); err != nil {
				return fmt.Errorf("nccl: publishing the unique id under %q: %w", storeKey, err)
			}
		} else {
			v, err := st.Get(ctx, storeKey)
			if err != nil {
				return &backend.OpError{Op: "init", Rank: b.rank, Backend: Name, Kind: backend.ErrTimeout, Ranks: []int{0}, Err: err,
					Detail: fmt.Sprintf("rank 0 never published the NCCL unique id under store key %q. This may indicate a possible application crash on rank 0 or a network set up issue", storeKey)}
			}
			if len(v) != 128 {
				return fmt.Errorf("nccl: unique id of %d bytes under %q", len(v), storeKey)
			}
			copy(ids, v)
		}
	} else {
		keys := make([]string, nroots)
		for i := range keys {
			keys[i] = storeKey + ":" + strconv.Itoa(i)
		}
		if rank%b.opts.RanksPerRoot == 0 {
			var id [128]byte
			if err := result("ncclGetUniqueId", C.gn_get_unique_id(C.uintptr_t(c.ctx), unsafe.Pointer(&id[0]))); err != nil {
				return err
			}
			if err := st.Set(ctx, keys[rank/b.opts.RanksPerRoot], id[:]); err != nil {
				return fmt.Errorf("nccl: publishing root unique id: %w", err)
			}
		}
		err := st.Wait(ctx, keys...)
		var vals [][]byte
		if err == nil {
			vals, err = st.MultiGet(ctx, keys)
		}
		if err != nil {
			return &backend.OpError{Op: "init", Rank: b.rank, Backend: Name, Kind: backend.ErrTimeout, Err: err,
				Detail: fmt.Sprintf("a bootstrap root (ranks 0, %d, ...) never published its NCCL unique id under %q. This may indicate a possible application crash on a root rank or a network set up issue", b.opts.RanksPerRoot, storeKey)}
		}
		for i, v := range vals {
			if len(v) != 128 {
				return fmt.Errorf("nccl: unique id of %d bytes under %q", len(v), keys[i])
			}
			copy(ids[128*i:], v)
		}
	}
	var netName *C.char
	if b.opts.NetName != "" {
		netName = C.CString(b.opts.NetName) // NCCL copies it
		defer C.free(unsafe.Pointer(netName))
	}
	blocking := C.int(1)
	if c.nb {
		blocking = 0
	}
	sc := C.int(0)
	if scalable {
		sc = 1
	}
	h := (*C.uintptr_t)(C.calloc(1, 8)) // NCCL may write it after returning (nonblocking)
	r := C.gn_comm_init(C.uintptr_t(c.ctx), h, C.int(size), unsafe.Pointer(&ids[0]), C.int(nroots), C.int(rank), sc,
		blocking, C.int(b.opts.cgaClusterSize()), C.int(b.opts.MinCTAs), C.int(b.opts.MaxCTAs), netName, c.name)
	if err := result("ncclCommInitRank", r); err != nil {
		return err
	}
	c.handle, c.rank, c.size = atomic.LoadUintptr((*uintptr)(unsafe.Pointer(h))), rank, size
	return c.waitReady(ctx, "ncclCommInitRank", b.opts.NonBlockingTimeout)
}

// finishComm creates the communicator's internal stream and events.
func (b *Backend) finishComm(c *comm) error {
	var err error
	if c.stream, err = c.dev.NewStream(cuda.StreamOptions{HighPriority: b.opts.HighPriorityStream}); err != nil {
		return err
	}
	if c.syncEv, err = c.dev.NewEvent(false); err != nil {
		return err
	}
	if c.scratch, err = c.dev.AllocOn(c.stream, 4); err != nil {
		return err
	}
	if b.opts.NaNCheck {
		// Loading a module may synchronise the device: do it now, before
		// any stream can be gated.
		if c.nan, err = newNaNChecker(c.dev); err != nil {
			return err
		}
	}
	return c.stream.Memset32(c.scratch.Ptr(), 0, 1)
}

// getP2PComm returns the two-rank communicator of this rank and peer.
func (b *Backend) getP2PComm(ctx context.Context, dev, peer int) (*comm, int, error) {
	lo, hi := min(b.rank, peer), max(b.rank, peer)
	pairRank := 0
	if b.rank == hi {
		pairRank = 1
	}
	k := [2]int{lo, hi}
	b.p2pMu.Lock()
	defer b.p2pMu.Unlock()
	if c := b.p2p[k]; c != nil {
		if c.dev.Ordinal() != dev {
			return nil, 0, fmt.Errorf("%w: nccl: p2p with rank %d on device %d, but its communicator is on device %d", backend.ErrInvalidArgument, peer, dev, c.dev.Ordinal())
		}
		return c, 1 - pairRank, nil
	}
	d, err := cuda.GetDevice(dev)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
	}
	key := strconv.Itoa(lo) + ":" + strconv.Itoa(hi)
	c := &comm{key: key, dev: d, ctx: d.Context(), nb: b.opts.NonBlocking,
		name: C.CString(fmt.Sprintf("%s:%s:p2p:%s", b.cfg.GroupName, b.cfg.GroupDesc, key))}
	if err := b.createComm(ctx, c, "nccl/p2p/"+key, pairRank, 2); err != nil {
		return nil, 0, err
	}
	if err := b.finishComm(c); err != nil {
		return nil, 0, err
	}
	b.addComm(c)
	b.p2p[k] = c
	return c, 1 - pairRank, nil
}

// comms returns every communicator.
func (b *Backend) comms() []*comm {
	var out []*comm
	for i := range b.devComms {
		if c := b.devComms[i].Load(); c != nil {
			out = append(out, c)
		}
	}
	b.p2pMu.Lock()
	for _, c := range b.p2p {
		out = append(out, c)
	}
	b.p2pMu.Unlock()
	return out
}

// Abort implements backend.Core: it aborts every communicator of the group
// at once, bounded by Options.AbortTimeout and ctx, fails pending works
// with ErrAborted wrapping reason, and stops the watchdog. Later ops fail
// with ErrAborted wrapping reason.
func (b *Backend) Abort(ctx context.Context, reason error) error {
	if reason == nil {
		reason = errors.New("aborted")
	}
	b.mu.Lock()
	b.flushAllLocked()
	acts := b.wd.Abort()
	b.mu.Unlock()
	b.perform(ctx, acts, reason)
	b.stopWatchdog()
	return nil
}

// Close implements backend.Core: it waits (bounded by ctx) for issued ops
// to complete, then destroys the communicators. If ctx ends first, it
// aborts them instead.
func (b *Backend) Close(ctx context.Context) error {
	if b.closed.Swap(true) {
		return nil
	}
	var err error
	for {
		busy := false
		for _, w := range b.pendingWorks() {
			if !w.IsCompleted() {
				busy = true
			}
		}
		if !busy {
			break
		}
		select {
		case <-ctx.Done():
			err = fmt.Errorf("nccl: close: %w", ctx.Err())
			b.abortAll(context.Background(), err)
			b.stopWatchdog()
			return err
		case <-time.After(time.Millisecond):
		}
	}
	b.stopWatchdog()
	// The watchdog must be out of its round before the events are destroyed
	// below (it queries them) and before the stashes are released (it may
	// still hand some over, which nothing would release after this).
	select {
	case <-b.wdDone:
	case <-ctx.Done():
		err = fmt.Errorf("nccl: close: waiting for the watchdog: %w", ctx.Err())
		b.abortAll(context.Background(), err)
		return err
	}
	// The stashes the watchdog did not get to, of works never waited on,
	// go too once their kernels are known done; a failed work's kernel may
	// still run, so its stash stays (as the watchdog keeps it).
	for _, w := range b.pendingWorks() {
		if w.isDone() {
			w.releaseStash()
		}
	}
	b.enqueue(nil)
	for _, c := range b.comms() {
		if c.aborted.Swap(true) {
			continue
		}
		if e := result("ncclCommDestroy", C.gn_comm_destroy(C.uintptr_t(c.ctx), C.uintptr_t(c.handle))); e != nil && err == nil {
			err = e
		}
		if c.scratch != nil {
			c.scratch.Free()
		}
		c.syncEv.Destroy()
		c.reclaim()
		for _, e := range append(c.free, c.freeT...) {
			e.Destroy()
		}
		c.stream.Destroy()
	}
	return err
}

func (b *Backend) stopWatchdog() {
	b.stopOnce.Do(func() { close(b.stop) })
}

// lockThread pins the goroutine to its OS thread for an NCCL group, whose
// state is thread-local.
func lockThread() func() {
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}
