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

// hooked reports whether the group has hooks (AddHooks): only then is
// the OpInfo built.
func (pg *ProcessGroup) hooked() bool {
	h := pg.hooks.Load()
	return h != nil && len(*h) > 0
}

// observed reports whether anything looks at the op's tensors and peer:
// the flight recorder or hooks. The generated methods fill opCall's in,
// out and peer only then.
func (pg *ProcessGroup) observed() bool {
	return pg.frg != nil || pg.hooked()
}

// opCall is one op in flight through the dispatcher. It lives on the
// issuing goroutine's stack: nothing of it is allocated.
type opCall struct {
	meta    backend.Meta
	backend backend.Backend
	// info is built only while hooks are set.
	info OpInfo
	// Set only while observed: the op's tensor arguments (its inputs and
	// its outputs, each as the generated method passes them) and its peer
	// (-1 for an op without one).
	in, out targ
	peer    int
	// p2pSeq is the p2p counter after this op (OpInfo.P2PSeq).
	p2pSeq uint64
	// mono is when the op was numbered, on the backend.Mono clock: the
	// one clock read per op, shared by the recorder and the metrics; 0
	// when neither needs it.
	mono time.Duration
	// Set only while metrics are on: the device type, and mono when the
	// metrics time the op (else 0).
	dt     tensor.DeviceType
	issued time.Duration
}

// checker starts the argument checks of op, failing at once when the group
// is closed or this process is not a member.
func (pg *ProcessGroup) checker(op backend.Op) checker {
	c := checker{op: op, rank: pg.rank, size: pg.size}
	if pg.rank < 0 || pg.closed.Load() {
		c.err = pg.refusal(op) // out of line, so that checker inlines
	}
	return c
}

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
// zero opCall on the caller's stack).
func (pg *ProcessGroup) begin(ctx context.Context, call *opCall, op backend.Op, dev tensor.Device, timeout time.Duration) error {
	b, err := pg.Backend(dev.Type)
	if err != nil {
		return &backend.OpError{Op: op.String(), Rank: pg.rank, Kind: backend.ErrUnavailable, Err: err}
	}
	if ops := pg.backends[dev.Type].ops; ops != nil {
		b = ops // the debug check, when it is on
	}
	if timeout == 0 {
		timeout = pg.timeout
	}
	var seq, coll, p2p uint64
	if op.Info().Kind == backend.P2P {
		seq = pg.p2pSeq.Add(1)
		coll, p2p = pg.collSeq.Load(), seq
	} else {
		seq = pg.collSeq.Add(1)
		coll, p2p = seq, pg.p2pSeq.Load()
	}
	call.meta = backend.Meta{Op: op, Seq: seq, Timeout: timeout}
	call.backend, call.peer, call.p2pSeq = b, -1, p2p
	// The metrics time one op in metricsEvery (a power of two) by its
	// sequence number, so every rank times the same ops, and a clock read
	// (~45 ns on a virtual machine) is not paid for each.
	timed := pg.metrics != nil && seq&(pg.metricsEvery-1) == 0
	if pg.metrics != nil {
		call.dt = dev.Type
	}
	if pg.hooked() {
		now := time.Now()
		call.info = OpInfo{Group: pg.name, GroupDesc: pg.desc, GroupSize: pg.size, Rank: pg.rank, Op: op,
			Backend: b.Name(), Device: dev, Seq: seq, CollSeq: coll, P2PSeq: p2p, Peer: -1, Timeout: timeout, Issued: now}
		// The hooks' time serves the recorder and the metrics too: its
		// monotonic reading makes MonoOf read no clock.
		call.mono = backend.MonoOf(now)
	} else if pg.frg != nil || timed {
		call.mono = backend.Mono() // the monotonic clock alone: half of time.Now
	}
	if timed {
		call.issued = call.mono
	}
	call.meta.Issued = call.mono
	return nil
}

// pre runs the pre-op hooks, after giving the OpInfo the op's tensors and
// peer.
func (pg *ProcessGroup) pre(ctx context.Context, c *opCall) {
	if h := pg.hooks.Load(); h != nil && len(*h) > 0 {
		c.info.Inputs, c.info.Outputs, c.info.Peer = flatten(&c.in), flatten(&c.out), c.peer
		for _, hk := range *h {
			if hk.Pre != nil {
				hk.Pre(ctx, c.info)
			}
		}
	}
}

// post labels a backend error with the op, its number, the rank and the
// backend, and runs the post hooks.
func (pg *ProcessGroup) post(ctx context.Context, c *opCall, w backend.Work, err error) (backend.Work, error) {
	if err == nil && w == nil {
		err = fmt.Errorf("backend %s returned neither a Work nor an error", c.backend.Name())
	}
	if err != nil {
		w = nil
		var oe *backend.OpError
		if errors.As(err, &oe) {
			if oe.Seq == 0 {
				oe.Seq = c.meta.Seq
			}
			if oe.Backend == "" {
				oe.Backend = c.backend.Name()
			}
		} else {
			err = &backend.OpError{Op: c.meta.Op.String(), Seq: c.meta.Seq, Rank: pg.rank, Backend: c.backend.Name(), Kind: kindOf(err), Err: err}
		}
	}
	if m := pg.metrics; m != nil {
		m.Op(c.meta.Op, c.dt, c.issued, w, err)
	}
	if g := pg.frg; g != nil {
		pg.recorder.add(g, c, c.backend.Name(), pg.rank, w, err)
	}
	if h := pg.hooks.Load(); h != nil {
		for _, hk := range *h {
			if hk.Post != nil {
				hk.Post(ctx, c.info, w, err)
			}
		}
	}
	return w, err
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
