package dispatcher

import (
	"context"
	"errors"
	"sync"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// recorder is a test backend: it records the ops it is asked to run and
// completes them at once. It implements a few ops and leaves the rest to
// Unimplemented, so that the unsupported path is tested too.
type recorder struct {
	backend.Unimplemented
	name string
	cfg  backend.Config
	log  *callLog
}

// call is one recorded backend call.
type call struct {
	backend string
	meta    backend.Meta
	group   string
	tensors int
}

type callLog struct {
	mu    sync.Mutex
	calls []call
}

func (l *callLog) add(c call) {
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

func (l *callLog) all() []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]call(nil), l.calls...)
}

func (r *recorder) rec(m backend.Meta, n int) (backend.Work, error) {
	r.log.add(call{backend: r.name, meta: m, group: r.cfg.GroupName, tensors: n})
	return backend.CompletedWork(m.Seq, nil, nil), nil
}

func (r *recorder) Name() string { return r.name }
func (r *recorder) Capabilities() backend.Capabilities {
	return backend.Capabilities{Devices: []tensor.DeviceType{tensor.CPU, tensor.CUDA}}
}
func (r *recorder) Rank() int                                  { return r.cfg.Rank }
func (r *recorder) Size() int                                  { return r.cfg.WorldSize }
func (r *recorder) Close(context.Context) error                { return nil }
func (r *recorder) Abort(ctx context.Context, err error) error { return nil }

func (r *recorder) Allreduce(ctx context.Context, m backend.Meta, ts []*tensor.Tensor, _ backend.AllreduceOptions) (backend.Work, error) {
	return r.rec(m, len(ts))
}
func (r *recorder) Broadcast(ctx context.Context, m backend.Meta, ts []*tensor.Tensor, _ backend.BroadcastOptions) (backend.Work, error) {
	return r.rec(m, len(ts))
}
func (r *recorder) AllgatherIntoTensor(ctx context.Context, m backend.Meta, out, in *tensor.Tensor, _ backend.AllgatherIntoTensorOptions) (backend.Work, error) {
	return r.rec(m, 2)
}
func (r *recorder) AlltoallBase(ctx context.Context, m backend.Meta, out, in *tensor.Tensor, _ backend.AlltoallBaseOptions) (backend.Work, error) {
	return r.rec(m, 2)
}
func (r *recorder) Gather(ctx context.Context, m backend.Meta, outs [][]*tensor.Tensor, ins []*tensor.Tensor, _ backend.GatherOptions) (backend.Work, error) {
	return r.rec(m, len(ins))
}
func (r *recorder) Send(ctx context.Context, m backend.Meta, ts []*tensor.Tensor, dst int, _ backend.SendOptions) (backend.Work, error) {
	return r.rec(m, len(ts))
}
func (r *recorder) Recv(ctx context.Context, m backend.Meta, ts []*tensor.Tensor, src int, _ backend.RecvOptions) (backend.Work, error) {
	return r.rec(m, len(ts))
}
func (r *recorder) Barrier(ctx context.Context, m backend.Meta, _ backend.BarrierOptions) (backend.Work, error) {
	return r.rec(m, 0)
}
func (r *recorder) ReduceScatterTensor(ctx context.Context, m backend.Meta, out, in *tensor.Tensor, _ backend.ReduceScatterTensorOptions) (backend.Work, error) {
	return nil, errors.New("plain error without a sentinel")
}

// logs holds the call log of each test, by the Options the test passes.
// Drivers are registered once per process, so the log travels in
// Config.Options.
func init() {
	for _, name := range []string{"reccpu", "reccuda"} {
		dt := tensor.CPU
		if name == "reccuda" {
			dt = tensor.CUDA
		}
		backend.Register(backend.Driver{Name: name, Devices: []tensor.DeviceType{dt}, New: func(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
			log, _ := cfg.Options.(*callLog)
			if log == nil {
				log = &callLog{}
			}
			return &recorder{name: name, cfg: cfg, log: log}, nil
		}})
	}
	backend.Register(backend.Driver{Name: "missinglib", Devices: []tensor.DeviceType{tensor.CUDA}, New: func(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
		return nil, backend.Errorf(backend.ErrUnavailable, "init", "libmissing.so.1 not found (set GOCOLL_MISSING_LIBRARY)")
	}})
}

// fakeMem is device memory that is only an address, for routing tests:
// nothing reads it.
type fakeMem struct{ n int }

func (m fakeMem) Ptr() uintptr { return 0x1000 }
func (m fakeMem) Len() int     { return m.n }
func (m fakeMem) Free() error  { return nil }

// typedNil registers a driver that fails the way a careless factory does:
// a nil *recorder in a non-nil interface, with an error.
func init() {
	backend.Register(backend.Driver{Name: "typednil", Devices: []tensor.DeviceType{tensor.CUDA}, New: func(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
		var r *recorder
		return r, backend.Errorf(backend.ErrUnavailable, "init", "no device")
	}})
}

// swapBackend makes b the backend of pg's device type dt, for the ops
// (the slot's serve) as for the rest (its b): a test's stand-in for the
// backend Init made.
func swapBackend(pg *ProcessGroup, dt tensor.DeviceType, b backend.Backend) {
	s := &pg.backends[dt]
	s.b, s.serve = b, b
}
