package dispatcher

// The flight recorder's ring slot: the compact form the issue path writes,
// and the dump's frtrace.Entry built from it at a snapshot.

import (
	"math"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/frtrace"
	"github.com/gocoll/gocoll/tensor"
)

// frEntry is one op in the ring, in the compact form the issue path
// writes: the dump's frtrace.Entry is built from it at a snapshot, so that
// recording an op copies a few words rather than the whole entry, builds
// no string and reads no wall clock. What most ops do not have (an error,
// shapes of several tensors) is in the slot's side record.
//
// Recording an op is mostly stores, right after a backend call that made
// many of its own (a new Work, its job), so it is written with as few as
// can hold it: the op's small fields are one word (m), an in-place op's
// out side is a mark rather than a copy of its in side, the work is held
// once (as a host work or as a Work, not both), and what is valid only in
// later states (started, completed, dur) is not cleared when a slot is
// reused: the state and flags in m say whether it is set (docs/perf.md,
// "Session 7").
type frEntry struct {
	id uint64   // RecordID and OpID
	g  *frGroup // the op's group
	// The op's work until it is retired, nil after: ho when it is a host
	// work (backend.OutcomeReporter, asked once, at add, so that
	// retireDone asserts nothing), else work.
	work backend.Work
	ho   backend.OutcomeReporter
	// CollectiveSeqID (0 for p2p ops) and P2PSeqID
	seq, p2p uint64
	// created is when the dispatcher numbered the op, on the backend.Mono
	// clock; started and completed are when refresh or retireDone
	// noticed, likewise (set from those states on); dur is the work's
	// Duration (set with frHasDur). FlightRecorder.wallNs makes the times
	// Unix times.
	created, started, completed time.Duration
	timeout, dur                time.Duration
	backend                     string // the backend's name, for the profiling name
	m                           frMeta
	in, out                     frShapes // the shapes and dtypes of the op's tensors
	side                        *frSide  // kept from op to op; nil until a slot first needs it
}

// frMeta is an entry's small fields in one word, so that the issue path
// writes them with one store: the peer (int32, -1 for none) in bits 0-31,
// the op in 32-39, the state in 40-47 and the flags (frP2P and the
// others) from bit 48.
type frMeta uint64

const (
	frP2P      frMeta = 1 << (48 + iota) // a send or recv
	frRetired                            // the work is dropped (or there was none to watch)
	frCaptured                           // captured into a CUDA graph
	frHasDur                             // dur is the work's Duration
	frHasErr                             // side.err is the op's error

	frStateShift = 40
)

// newFrMeta is the meta word of a scheduled op.
func newFrMeta(peer int, op backend.Op, flags frMeta) frMeta {
	return frMeta(uint32(int32(peer))) | frMeta(op)<<32 | flags
}

func (m frMeta) peer() int         { return int(int32(uint32(m))) }
func (m frMeta) op() backend.Op    { return backend.Op(uint8(m >> 32)) }
func (m frMeta) state() frState    { return frState(uint8(m >> frStateShift)) }
func (m frMeta) has(f frMeta) bool { return m&f != 0 }

// withState is m in state s.
func (m frMeta) withState(s frState) frMeta {
	return m&^(0xff<<frStateShift) | frMeta(s)<<frStateShift
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
// of up to frInlineDims dimensions (most ops') inline, else the slot's
// side holds them, or, for the out side of an in-place op, the in side's.
// hdr is the count of tensors (frNone, frOne, frInSide, frSameAsIn), the
// lone tensor's ndim and its dtype, in one word.
type frShapes struct {
	hdr  uint32 // kind in bits 0-7, ndim in 8-15, dtype in 16-23
	dims [frInlineDims]int32
}

const frInlineDims = 4

// What an frShapes holds.
const (
	frNone     = iota // no tensors
	frOne             // one tensor, inline
	frInSide          // the side record's sizes and dtypes
	frSameAsIn        // the out side of an in-place op: the in side's
)

func (f *frShapes) kind() uint8         { return uint8(f.hdr) }
func (f *frShapes) ndim() int           { return int(uint8(f.hdr >> 8)) }
func (f *frShapes) dtype() tensor.DType { return tensor.DType(f.hdr >> 16) }

// name is the entry's profiling name's parts.
func (fe *frEntry) name() opName {
	return opName{op: fe.m.op(), backend: fe.backend, rank: fe.g.rank, peer: fe.m.peer()}
}

// sideOf returns fe's side record, made on first use.
func (fe *frEntry) sideOf() *frSide {
	if fe.side == nil {
		fe.side = &frSide{}
	}
	return fe.side
}

// fill notes a's tensors in f (fe.in, or fe.out when out), inline when
// they are a lone tensor that fits, else in the side's sizes and dtypes.
func (fe *frEntry) fill(f *frShapes, a *targ, out bool) {
	if a == nil || a.shape == 0 {
		f.hdr = frNone
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
		}
		if fits {
			f.hdr = frOne | uint32(len(sh))<<8 | uint32(t.DType())<<16
			return
		}
	}
	sd := fe.sideOf()
	f.hdr = frInSide
	if out {
		sd.outSizes, sd.outDtypes = fillSizes(sd.outSizes, sd.outDtypes, a)
	} else {
		sd.inSizes, sd.inDtypes = fillSizes(sd.inSizes, sd.inDtypes, a)
	}
}

// dump returns the shapes and dtypes as the dump writes them, in slices
// of their own; sizes and dtypes are the side's, for frInSide.
func (f *frShapes) dump(sizes [][]int, dtypes []tensor.DType) ([][]int, []string) {
	dtype := func(d tensor.DType) string {
		if d == noDType {
			return ""
		}
		return d.String()
	}
	switch f.kind() {
	case frNone:
		return [][]int{}, []string{}
	case frOne:
		dims := make([]int, f.ndim())
		for i := range dims {
			dims[i] = int(f.dims[i])
		}
		return [][]int{dims}, []string{dtype(f.dtype())}
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
	m := fe.m
	st := m.state()
	e := frtrace.Entry{RecordID: fe.id, OpID: fe.id, PGID: fe.g.name, ProcessGroup: [2]string{fe.g.name, fe.g.desc},
		CollectiveSeqID: fe.seq, P2PSeqID: fe.p2p, ProfilingName: fe.name().String(), TimeCreatedNs: fr.wallNs(fe.created),
		State: frStateNames[st], Retired: m.has(frRetired), TimeoutMs: fe.timeout.Milliseconds(), IsP2P: m.has(frP2P),
		ThreadName: "dispatcher", Captured: m.has(frCaptured)}
	if st >= frStarted {
		e.TimeStartedNs = fr.wallNs(fe.started)
	}
	if st == frCompleted {
		e.TimeCompletedNs = fr.wallNs(fe.completed)
	}
	var sd frSide
	if fe.side != nil {
		sd = *fe.side
	}
	if m.has(frHasErr) {
		e.Error = sd.err
	}
	e.InputSizes, e.InputDtypes = fe.in.dump(sd.inSizes, sd.inDtypes)
	out, outSizes, outDtypes := &fe.out, sd.outSizes, sd.outDtypes
	if out.kind() == frSameAsIn {
		out, outSizes, outDtypes = &fe.in, sd.inSizes, sd.inDtypes
	}
	e.OutputSizes, e.OutputDtypes = out.dump(outSizes, outDtypes)
	if m.has(frHasDur) {
		ms := float64(fe.dur) / float64(time.Millisecond)
		e.DurationMs = &ms
	}
	return e
}
