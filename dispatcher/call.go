package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// OpInfo describes one op to the hooks.
type OpInfo struct {
	Group     string // the group's name ("0" for the default group)
	GroupDesc string
	GroupSize int
	Rank      int // this process's rank in the group
	Op        backend.Op
	Backend   string // the backend's registered name
	Device    tensor.Device
	// Seq is the op's number in its counter: CollSeq for collectives and
	// barriers, P2PSeq for send and recv. Both start at 1.
	Seq     uint64
	CollSeq uint64 // the collective counter after this op
	P2PSeq  uint64 // the p2p counter after this op
	Peer    int    // the peer of send and recv; -1 otherwise
	Inputs  []*tensor.Tensor
	Outputs []*tensor.Tensor
	Timeout time.Duration
	Issued  time.Time
}

// ProfilingName returns the flight recorder's name for the op, e.g.
// "nccl:all_reduce", or for p2p ops "nccl:send 0->1" and "nccl:recv 1<-0",
// as PyTorch's flight recorder writes them.
func (i OpInfo) ProfilingName() string {
	n := i.Op.ProfilingName(i.Backend)
	switch i.Op {
	case backend.OpSend:
		return fmt.Sprintf("%s %d->%d", n, i.Rank, i.Peer)
	case backend.OpRecv:
		return fmt.Sprintf("%s %d<-%d", n, i.Rank, i.Peer)
	}
	return n
}

// Hooks run around every op of a group. Pre runs after validation, once the
// op is numbered, before the backend is called; Post runs after the backend
// returned, with its Work (nil on error). Hooks run on the issuing
// goroutine, so they must be quick; to act on completion, use
// w.Future().Then. Inputs and Outputs are filled only while hooks are set;
// they may be the caller's own slices, so hooks must not change them.
type Hooks struct {
	Pre  func(ctx context.Context, info OpInfo)
	Post func(ctx context.Context, info OpInfo, w backend.Work, err error)
}

// AddHooks registers hooks on the group. They see every op issued after the
// call returns.
func (pg *ProcessGroup) AddHooks(h Hooks) {
	for {
		old := pg.hooks.Load()
		var next []Hooks
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, h)
		if pg.hooks.CompareAndSwap(old, &next) {
			return
		}
	}
}

// opCall is one op in flight through the dispatcher. It lives on the
// issuing goroutine's stack: nothing of it is allocated. It is kept small
// and filled in place (begin), field by field: the generated methods zero
// it once, and no part of it is copied whole.
type opCall struct {
	meta    backend.Meta
	backend backend.Backend
	// bname is the backend's Name, asked once when its slot was filled:
	// the recorder's label, with no call per op.
	bname string
	// hooks are the group's hooks as begin found them (nil for none):
	// the op's pre and post hooks are the same set.
	hooks *[]Hooks
	// p2p is whether the op is a send or recv (its Kind is backend.P2P).
	p2p bool
	// peer is the op's peer, -1 for an op without one. (The op's tensor
	// arguments are not here: the generated methods pass pre and post
	// pointers to their views, on their stacks. A pointer to them in an
	// opCall would move them to the heap, as escape analysis follows the
	// struct's fields as one: its strings and hooks leak to the hooks.)
	peer int
	// collSeq and p2pSeq are the counters after this op (OpInfo's), set
	// only while the recorder or hooks are on.
	collSeq, p2pSeq uint64
	// Set only while metrics are on: the device type, and the op's
	// meta.Issued when the metrics time the op (else 0).
	dt     tensor.DeviceType
	issued time.Duration
	// quiet is set when no recorder, metrics or hooks look at the op:
	// the generated method then returns the backend's Work itself,
	// without post's call, unless the backend failed.
	quiet bool
	// Set only while hooked: the op's device and the hooks' issue time
	// (OpInfo.Device and Issued; its monotonic reading is meta.Issued).
	dev tensor.Device
	now time.Time
}

// info builds the OpInfo the hooks see, of the op c with the tensor
// arguments in and out (nil for a role the op lacks).
func (pg *ProcessGroup) info(c *opCall, in, out *targ) OpInfo {
	return OpInfo{Group: pg.name, GroupDesc: pg.desc, GroupSize: pg.size, Rank: pg.rank, Op: c.meta.Op,
		Backend: c.bname, Device: c.dev, Seq: c.meta.Seq, CollSeq: c.collSeq, P2PSeq: c.p2pSeq, Peer: c.peer,
		Inputs: flatten(in), Outputs: flatten(out), Timeout: c.meta.Timeout, Issued: c.now}
}

// start begins the argument checks of op (c is the generated method's
// zero checker), failing at once when the group is closed or this
// process is not a member.
func (c *checker) start(pg *ProcessGroup, op backend.Op) {
	c.pg, c.op = pg, op
	if pg.rank < 0 || pg.closed.Load() {
		c.refuse() // out of line, so that start inlines
	}
}

// refuse fails c with the group's refusal.
func (c *checker) refuse() { c.err = c.pg.refusal(c.op) }

// refusal is the error of an op on a group this process is not a member
// of, or that is closed.
func (pg *ProcessGroup) refusal(op backend.Op) error {
	var err error
	switch {
	case pg.rank < 0:
		err = pg.notMember(op.String())
	case pg.closed.Load():
		if r := pg.abortReason.Load(); r != nil {
			err = &backend.OpError{Op: op.String(), Rank: pg.rank, Kind: backend.ErrAborted, Err: *r,
				Detail: fmt.Sprintf("group %s %q was aborted", pg.name, pg.desc)}
		} else {
			err = &backend.OpError{Op: op.String(), Rank: pg.rank, Kind: backend.ErrClosed,
				Detail: fmt.Sprintf("group %s %q is closed", pg.name, pg.desc)}
		}
	}
	return err
}

// deviceOf returns the device of the first tensor among args, or the host.
func (pg *ProcessGroup) deviceOf(args ...*targ) tensor.Device {
	if t := first(args); t != nil {
		return t.Device()
	}
	return tensor.Host
}

// barrierDevice picks the device of an op without tensors. Explicit device
// ids mean CUDA; monitored_barrier is host-only, as in PyTorch; otherwise
// the group's eager device, then the host backend, then whatever the group
// has.
func (pg *ProcessGroup) barrierDevice(op backend.Op, deviceIDs []int) tensor.Device {
	switch {
	case len(deviceIDs) > 0:
		return tensor.CUDADevice(deviceIDs[0])
	case op == backend.OpMonitoredBarrier:
		return tensor.Host
	case pg.cfg.Device != nil:
		return *pg.cfg.Device
	case pg.backends[tensor.CPU].name != "":
		return tensor.Host
	}
	return tensor.CUDADevice(0)
}

// begin picks the backend for dev and numbers the op, filling call (a
// zero opCall on the caller's stack). p2p is whether op is a send or recv
// (backend.P2P): the generated method knows, so that neither begin nor the
// recorder reads the op table for it.
func (pg *ProcessGroup) begin(ctx context.Context, call *opCall, op backend.Op, p2p bool, dev tensor.Device, timeout time.Duration) error {
	var s *slot
	if int(dev.Type) < len(pg.backends) {
		s = &pg.backends[dev.Type]
	}
	if s == nil || s.serve == nil {
		_, err := pg.Backend(dev.Type)
		return &backend.OpError{Op: op.String(), Rank: pg.rank, Kind: backend.ErrUnavailable, Err: err}
	}
	call.backend, call.bname = s.serve, s.bname // serve is behind the debug check, when it is on
	if timeout == 0 {
		timeout = pg.timeout
	}
	var seq uint64
	call.p2p = p2p
	if p2p {
		seq = pg.p2pSeq.Add(1)
	} else {
		seq = pg.collSeq.Add(1)
	}
	call.meta.Op, call.meta.Seq, call.meta.Timeout = op, seq, timeout
	call.peer = -1
	hooks := pg.hooks.Load()
	if hooks != nil && len(*hooks) == 0 {
		hooks = nil
	}
	if pg.frg != nil || hooks != nil {
		if p2p {
			call.collSeq, call.p2pSeq = pg.collSeq.Load(), seq
		} else {
			call.collSeq, call.p2pSeq = seq, pg.p2pSeq.Load()
		}
	}
	// The metrics time one op in metricsEvery (a power of two) by its
	// sequence number, so every rank times the same ops, and a clock read
	// (~45 ns on a virtual machine) is not paid for each.
	timed := false
	if pg.metrics != nil {
		call.dt = dev.Type
		timed = seq&(pg.metricsEvery-1) == 0
	}
	if hooks != nil {
		call.hooks, call.dev = hooks, dev
		call.now = time.Now()
		// The hooks' time serves the recorder and the metrics too: its
		// monotonic reading makes MonoOf read no clock.
		call.meta.Issued = backend.MonoOf(call.now)
	} else if pg.frg != nil || timed {
		call.meta.Issued = backend.Mono() // the monotonic clock alone: half of time.Now
	}
	if timed {
		call.issued = call.meta.Issued
	}
	call.quiet = hooks == nil && pg.frg == nil && pg.metrics == nil
	return nil
}

// pre runs the pre-op hooks (c.hooks is set); in and out are the op's
// tensor arguments, as for post.
func (pg *ProcessGroup) pre(ctx context.Context, c *opCall, in, out *targ) {
	info := pg.info(c, in, out)
	for _, hk := range *c.hooks {
		if hk.Pre != nil {
			hk.Pre(ctx, info)
		}
	}
}

// post labels a backend error with the op, its number, the rank and the
// backend, and hands the op to the metrics, the recorder and the post
// hooks. in and out are the generated method's views of the op's input
// and output tensor arguments (the same view for an in-place op; nil for
// a role the op lacks).
func (pg *ProcessGroup) post(ctx context.Context, c *opCall, in, out *targ, w backend.Work, err error) (backend.Work, error) {
	if err != nil || w == nil {
		w, err = nil, pg.failed(c, err)
	}
	if m := pg.metrics; m != nil {
		m.Op(c.meta.Op, c.dt, c.issued, w, err)
	}
	if g := pg.frg; g != nil {
		pg.recorder.add(g, c, in, out, w, err)
	}
	if c.hooks != nil {
		pg.postHooks(ctx, c, in, out, w, err)
	}
	return w, err
}

// waitOp ends the blocking form of an op (the generated ...Wait methods):
// the recorder and the post hooks see it issued, as post shows them an
// async op, then it waits (Work.Wait) and the metrics see it done. When
// nothing kept the Work (no post hook saw it, and the recorder retired
// it), the Work of an op that succeeded goes back to its backend
// (backend.Releaser): this is how a blocking loop of small host ops
// allocates nothing per op.
func (pg *ProcessGroup) waitOp(ctx context.Context, c *opCall, in, out *targ, w backend.Work, err error) error {
	if err != nil || w == nil {
		_, err = pg.post(ctx, c, in, out, w, err)
		return err
	}
	var s frSlot
	g := pg.frg
	if g != nil {
		s = pg.recorder.add(g, c, in, out, w, nil)
	}
	if c.hooks != nil {
		pg.postHooks(ctx, c, in, out, w, nil)
	}
	err = w.Wait(ctx)
	if m := pg.metrics; m != nil {
		m.Op(c.meta.Op, c.dt, c.issued, w, nil)
	}
	if err != nil || c.hooks != nil || (g != nil && !pg.recorder.retire(s)) {
		return err
	}
	if r, ok := w.(backend.Releaser); ok {
		r.Release()
	}
	return nil
}

// failed is the error of an op the backend refused (err), or for which it
// returned neither a Work nor an error (err nil): an *backend.OpError
// with the op's number and backend.
func (pg *ProcessGroup) failed(c *opCall, err error) error {
	if err == nil {
		err = fmt.Errorf("backend %s returned neither a Work nor an error", c.backend.Name())
	}
	var oe *backend.OpError
	if errors.As(err, &oe) {
		if oe.Seq == 0 {
			oe.Seq = c.meta.Seq
		}
		if oe.Backend == "" {
			oe.Backend = c.backend.Name()
		}
		return err
	}
	return &backend.OpError{Op: c.meta.Op.String(), Seq: c.meta.Seq, Rank: pg.rank, Backend: c.backend.Name(), Kind: kindOf(err), Err: err}
}

// postHooks runs the post-op hooks (c.hooks is set).
func (pg *ProcessGroup) postHooks(ctx context.Context, c *opCall, in, out *targ, w backend.Work, err error) {
	info := pg.info(c, in, out)
	for _, hk := range *c.hooks {
		if hk.Post != nil {
			hk.Post(ctx, info, w, err)
		}
	}
}

// kindOf returns the sentinel err wraps, or ErrUnavailable for an error
// that wraps none (a backend that broke the contract).
func kindOf(err error) error {
	for _, k := range []error{backend.ErrTimeout, backend.ErrAborted, backend.ErrRemote, backend.ErrUnsupported,
		backend.ErrInvalidArgument, backend.ErrUnavailable, backend.ErrClosed} {
		if errors.Is(err, k) {
			return k
		}
	}
	return backend.ErrUnavailable
}
