package stage_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/stage"
	"github.com/gocoll/gocoll/tensor"
)

// fakeMem is "device" memory of the fake: plain bytes only the fake's
// stream touches.
type fakeMem struct{ b []byte }

func (m *fakeMem) Ptr() uintptr {
	if len(m.b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&m.b[0]))
}
func (m *fakeMem) Len() int    { return len(m.b) }
func (m *fakeMem) Free() error { return nil }

// fakeStream is a stream of the fake device: a goroutine that runs the
// queued steps in order, as a CUDA stream runs its work.
type fakeStream struct {
	dev   int
	steps chan func()
}

func newFakeStream(dev int) *fakeStream {
	s := &fakeStream{dev: dev, steps: make(chan func(), 4096)}
	go func() {
		for f := range s.steps {
			f()
		}
	}()
	return s
}

func (s *fakeStream) Device() int     { return s.dev }
func (s *fakeStream) Handle() uintptr { return uintptr(unsafe.Pointer(s)) }

// event is a fake CUDA event: closed once the stream gets to it.
type event chan struct{}

// record queues the event on s and returns it.
func (s *fakeStream) record() event {
	e := make(event)
	s.steps <- func() { close(e) }
	return e
}

// wait queues a wait for e on s.
func (s *fakeStream) wait(e event) { s.steps <- func() { <-e } }

type streamKey struct{}

// fakeEngine is a stage.Engine on a fake device: the caller's current
// stream rides in the context (withStream), as cuda.WithStream's does.
type fakeEngine struct {
	dev      int
	internal *fakeStream
	def      *fakeStream // the default current stream

	mu      sync.Mutex
	stashed int // device tensors stashed by ops not yet freed
	freed   int
	ordered []*fakeStream // streams made to wait on an end event, in order
}

func newFakeEngine(dev int) *fakeEngine {
	return &fakeEngine{dev: dev, internal: newFakeStream(dev), def: newFakeStream(dev)}
}

func withStream(ctx context.Context, s *fakeStream) context.Context {
	return context.WithValue(ctx, streamKey{}, s)
}

func (e *fakeEngine) current(ctx context.Context) *fakeStream {
	if s, ok := ctx.Value(streamKey{}).(*fakeStream); ok {
		return s
	}
	return e.def
}

func (e *fakeEngine) Stream() backend.Stream { return e.internal }
func (e *fakeEngine) Close() error           { close(e.internal.steps); return nil }

func (e *fakeEngine) Stage(ctx context.Context, ts []*tensor.Tensor, back []bool) (stage.Staged, error) {
	st := &fakeStaged{e: e, release: make(chan struct{})}
	s := e.internal
	s.wait(e.current(ctx).record())
	for _, t := range ts {
		m := t.Memory().(*fakeMem)
		h := tensor.New(t.DType(), t.Shape()...)
		st.host = append(st.host, h)
		s.steps <- func() { copy(h.Bytes(), m.b) }
	}
	st.copied = s.record()
	rel := st.release
	s.steps <- func() { <-rel }
	for i, t := range ts {
		if back[i] {
			m, h := t.Memory().(*fakeMem), st.host[i]
			s.steps <- func() { copy(m.b, h.Bytes()) }
		}
	}
	st.end = s.record()
	e.mu.Lock()
	e.stashed += len(ts)
	e.mu.Unlock()
	st.n = len(ts)
	return st, nil
}

type fakeStaged struct {
	e           *fakeEngine
	host        []*tensor.Tensor
	copied, end event
	release     chan struct{}
	once        sync.Once
	n           int
}

func (st *fakeStaged) Host() []*tensor.Tensor { return st.host }

func (st *fakeStaged) WaitCopied(ctx context.Context) error {
	select {
	case <-st.copied:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (st *fakeStaged) Release() { st.once.Do(func() { close(st.release) }) }

func (st *fakeStaged) WaitDone(ctx context.Context) error {
	select {
	case <-st.end:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (st *fakeStaged) Done() bool {
	select {
	case <-st.end:
		return true
	default:
		return false
	}
}

func (st *fakeStaged) OrderCurrent(ctx context.Context) error {
	return st.OrderStream(st.e.current(ctx))
}

func (st *fakeStaged) OrderStream(s backend.Stream) error {
	fs, ok := s.(*fakeStream)
	if !ok || fs.dev != st.e.dev {
		return fmt.Errorf("%w: stream %T of device %d", backend.ErrInvalidArgument, s, s.Device())
	}
	fs.wait(st.end)
	st.e.mu.Lock()
	st.e.ordered = append(st.e.ordered, fs)
	st.e.mu.Unlock()
	return nil
}

func (st *fakeStaged) Free() {
	st.e.mu.Lock()
	st.e.stashed -= st.n
	st.e.freed += st.n
	st.e.mu.Unlock()
}

func (e *fakeEngine) counts() (stashed, freed int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stashed, e.freed
}

// gate holds a fake stream until opened.
type gate chan struct{}

func (s *fakeStream) hold() gate {
	g := make(gate)
	s.steps <- func() { <-g }
	return g
}

func (g gate) open() {
	select {
	case <-g:
	default:
		close(g)
	}
}

// fakeTensor is a CUDA tensor of the fake device holding vals.
func fakeTensor(dev int, vals ...float32) *tensor.Tensor {
	h, _ := tensor.FromSlice(vals)
	b := append([]byte(nil), h.Bytes()...)
	t, err := tensor.FromDevice(tensor.CUDADevice(dev), tensor.Float32, &fakeMem{b: b}, len(vals))
	if err != nil {
		panic(err)
	}
	return t
}

// values reads a fake CUDA tensor once the stream s has run what is queued
// on it so far.
func values(s *fakeStream, t *tensor.Tensor) []float32 {
	<-s.record()
	b := t.Memory().(*fakeMem).b
	h, _ := tensor.FromBytes(tensor.Float32, append([]byte(nil), b...), t.Numel())
	v, _ := tensor.ToSlice[float32](h)
	return v
}

var errFakeDevice = errors.New("fake: no such device")

func engines(es ...*fakeEngine) stage.Engines {
	return func(dev int) (stage.Engine, error) {
		for _, e := range es {
			if e.dev == dev {
				return e, nil
			}
		}
		return nil, errFakeDevice
	}
}
