package dispatcher

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// fakeMetrics records what the dispatcher reports, so that these tests
// check the dispatcher's side of the interface; package metrics tests the
// Prometheus side over real cpupool ranks.
type fakeMetrics struct {
	every   uint64 // TimeEvery; 0 means 1
	mu      sync.Mutex
	started []MetricsProcess
	groups  []MetricsGroup
	ops     []fakeOp
	aborts  int
	closed  int
	gclosed int
}

type fakeOp struct {
	group  string
	op     backend.Op
	dt     tensor.DeviceType
	issued time.Duration
	work   bool
	err    error
}

func (f *fakeMetrics) Start(p MetricsProcess) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started = append(f.started, p)
	return nil
}

func (f *fakeMetrics) Group(g MetricsGroup) GroupMetrics {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.groups = append(f.groups, g)
	return fakeGroup{f, g.Name, max(f.every, 1)}
}

func (f *fakeMetrics) StoreServer(func() store.ServerStats) store.ServerObserver { return nil }

func (f *fakeMetrics) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed++
	return nil
}

type fakeGroup struct {
	f     *fakeMetrics
	name  string
	every uint64
}

func (g fakeGroup) Op(op backend.Op, dt tensor.DeviceType, issued time.Duration, w backend.Work, err error) {
	g.f.mu.Lock()
	defer g.f.mu.Unlock()
	g.f.ops = append(g.f.ops, fakeOp{g.name, op, dt, issued, w != nil, err})
}

func (g fakeGroup) Aborted(error) {
	g.f.mu.Lock()
	defer g.f.mu.Unlock()
	g.f.aborts++
}

func (g fakeGroup) TimeEvery() uint64 { return g.every }

func (g fakeGroup) Close() {
	g.f.mu.Lock()
	defer g.f.mu.Unlock()
	g.f.gclosed++
}

// Every numbered op reaches the group's metrics once, with its device
// type and issue time, accepted or refused; aborts and closes reach them;
// an op refused before numbering does not.
func TestMetricsReported(t *testing.T) {
	f := &fakeMetrics{}
	t.Setenv("LOCAL_RANK", "2")
	before := backend.Mono()
	pg, err := Init(context.Background(), Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "cpu:reccpu,cuda:reccuda",
		BackendOptions: map[string]any{"reccpu": &callLog{}, "reccuda": &callLog{}}, Metrics: f, MetricsAddr: "127.0.0.1:9400"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := pg.Allreduce(ctx, []*tensor.Tensor{host(t, tensor.Float32, 4)}, backend.AllreduceOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Allreduce(ctx, []*tensor.Tensor{cudaTensor(t, 4)}, backend.AllreduceOptions{}); err != nil {
		t.Fatal(err)
	}
	// reccpu fails reduce_scatter_tensor with a plain error.
	x, y := host(t, tensor.Float32, 4), host(t, tensor.Float32, 4)
	if _, err := pg.ReduceScatterTensor(ctx, y, x, backend.ReduceScatterTensorOptions{}); !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("reduce_scatter_tensor: %v", err)
	}
	// Refused by validation, before numbering: not an op.
	if _, err := pg.Allreduce(ctx, nil, backend.AllreduceOptions{}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Fatalf("empty allreduce: %v", err)
	}
	sub, err := pg.NewGroup(ctx, nil, GroupOptions{Desc: "sub"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Broadcast(ctx, []*tensor.Tensor{host(t, tensor.Float32, 4)}, backend.BroadcastOptions{}); err != nil {
		t.Fatal(err)
	}
	pg.Abort(ctx, errors.New("test"))
	pg.Close(ctx)
	pg.Close(ctx)

	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.started) != 1 || f.started[0].Addr != "127.0.0.1:9402" || f.started[0].Rank != 0 || f.started[0].Dumps == nil {
		t.Errorf("Start: %+v, want one call with the port moved by LOCAL_RANK 2 and the recorder's dumps", f.started)
	}
	if len(f.groups) != 2 || f.groups[0].Desc != "default_pg" || f.groups[1].Desc != "sub" ||
		f.groups[0].Backends[tensor.CPU] != "reccpu" || f.groups[0].Backends[tensor.CUDA] != "reccuda" {
		t.Errorf("groups: %+v", f.groups)
	}
	want := []struct {
		group string
		op    backend.Op
		dt    tensor.DeviceType
		ok    bool
	}{{"0", backend.OpAllreduce, tensor.CPU, true}, {"0", backend.OpAllreduce, tensor.CUDA, true},
		{"0", backend.OpReduceScatterTensor, tensor.CPU, false}, {"1", backend.OpBroadcast, tensor.CPU, true}}
	if len(f.ops) != len(want) {
		t.Fatalf("%d ops reported, want %d: %+v", len(f.ops), len(want), f.ops)
	}
	for i, w := range want {
		o := f.ops[i]
		if o.group != w.group || o.op != w.op || o.dt != w.dt || o.work != w.ok || (o.err == nil) != w.ok || o.issued < before || o.issued > backend.Mono() {
			t.Errorf("op %d: %+v, want %+v", i, o, w)
		}
		var oe *backend.OpError
		if !w.ok && (!errors.As(o.err, &oe) || oe.Seq == 0 || oe.Backend != "reccpu") {
			t.Errorf("op %d: the refusal reached the metrics unlabelled: %v", i, o.err)
		}
	}
	if f.aborts != 2 || f.gclosed != 2 || f.closed != 1 {
		t.Errorf("aborts %d, group closes %d, closes %d; want 2 (both groups), 2, 1", f.aborts, f.gclosed, f.closed)
	}
}

// With metrics off (the default), nothing is made, and an address without
// a linked implementation fails Init, naming the variable, the value and
// the package to import.
func TestMetricsOff(t *testing.T) {
	pg := initRanks(t, 1, "reccpu", &callLog{})[0]
	if pg.metricsRoot != nil || pg.metrics != nil {
		t.Fatal("metrics made without being asked for")
	}
	t.Setenv("GOCOLL_METRICS_ADDR", ":9400")
	_, err := Init(context.Background(), Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "reccpu"})
	if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), `":9400"`) ||
		!strings.Contains(err.Error(), "GOCOLL_METRICS_ADDR") || !strings.Contains(err.Error(), "gocoll/metrics") {
		t.Fatalf("Init: %v", err)
	}
}

// A Metrics whose Start fails fails Init, and is closed.
func TestMetricsStartFails(t *testing.T) {
	f := &failingMetrics{}
	_, err := Init(context.Background(), Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "reccpu", Metrics: f})
	if err == nil || !strings.Contains(err.Error(), "port taken") || f.closed != 1 {
		t.Fatalf("Init: %v; closed %d times", err, f.closed)
	}
}

type failingMetrics struct {
	fakeMetrics
}

func (f *failingMetrics) Start(MetricsProcess) error { return errors.New("port taken") }

// The dispatcher stamps the ops whose sequence number is a multiple of
// TimeEvery, rounded up to a power of two (3 is 4), and only those.
func TestMetricsTimeEvery(t *testing.T) {
	f := &fakeMetrics{every: 3}
	pg, err := Init(context.Background(), Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "reccpu",
		BackendOptions: map[string]any{"reccpu": &callLog{}}, Metrics: f})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(context.Background())
	for range 9 {
		if _, err := pg.Allreduce(context.Background(), []*tensor.Tensor{host(t, tensor.Float32, 4)}, backend.AllreduceOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, o := range f.ops {
		seq := i + 1
		if timed := o.issued != 0; timed != (seq%4 == 0) {
			t.Errorf("seq %d: stamped %v (issued %v), want stamped only at multiples of 4", seq, timed, o.issued)
		}
	}
}
