package backend

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/tensor"
)

func init() {
	noop := func(ctx context.Context, cfg Config) (Backend, error) { return nil, errors.New("not for construction") }
	Register(Driver{Name: "testcpu", Devices: []tensor.DeviceType{tensor.CPU}, New: noop})
	Register(Driver{Name: "testgpu", Devices: []tensor.DeviceType{tensor.CUDA}, New: noop})
	Register(Driver{Name: "testboth", Devices: []tensor.DeviceType{tensor.CPU, tensor.CUDA}, New: noop})
}

func TestParseBackendString(t *testing.T) {
	good := map[string]string{
		"cuda:testgpu":              "cuda:testgpu",
		"cpu:testcpu,cuda:testgpu":  "cpu:testcpu,cuda:testgpu",
		"CUDA:testgpu, cpu:testcpu": "", // spaces inside pairs are not trimmed
		"testboth":                  "cpu:testboth,cuda:testboth",
		"testcpu":                   "cpu:testcpu",
		"cuda:testboth":             "cuda:testboth",
	}
	for in, want := range good {
		m, err := ParseBackendString(in)
		if want == "" {
			if err == nil {
				t.Errorf("%q: accepted as %v", in, m)
			}
			continue
		}
		if err != nil || m.String() != want {
			t.Errorf("%q: got %v, %v; want %s", in, m, err, want)
		}
	}
	bad := map[string]string{
		"nosuch":                   `Unknown backend "nosuch"`,
		"cpu:nosuch":               `Unknown backend "nosuch"`,
		"cpu:testcpu,":             `Invalid device:backend pairing: ""`,
		"cpu:testcpu,cuda":         `Invalid device:backend pairing: "cuda"`,
		"cpu:testcpu:x":            `Invalid device:backend pairing`,
		"tpu:testcpu":              `Invalid device:backend pairing: "tpu:testcpu": tensor: unknown device type "tpu"`,
		"cpu:testcpu,cpu:testboth": "Duplicate device type cpu",
		"cuda:testcpu":             `backend "testcpu" does not serve device type cuda`,
		"":                         "empty backend string",
	}
	for in, want := range bad {
		_, err := ParseBackendString(in)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

func TestRegisterPanics(t *testing.T) {
	for name, d := range map[string]Driver{
		"duplicate":  {Name: "testcpu", Devices: []tensor.DeviceType{tensor.CPU}, New: func(context.Context, Config) (Backend, error) { return nil, nil }},
		"no devices": {Name: "x", New: func(context.Context, Config) (Backend, error) { return nil, nil }},
		"no New":     {Name: "y", Devices: []tensor.DeviceType{tensor.CPU}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Register did not panic", name)
				}
			}()
			Register(d)
		}()
	}
}

func TestReduceOp(t *testing.T) {
	if PreMulSum != 8 || Sum != 0 {
		t.Fatalf("PREMUL_SUM = %d, SUM = %d; PyTorch has 8 and 0", PreMulSum, Sum)
	}
	if PremulSum(0.5) != PremulSum(0.5) || PremulSum(0.5) == PremulSum(2) || (ReduceOp{}) != SUM {
		t.Fatal("ReduceOp must compare by kind and factor, with SUM the zero value")
	}
	if PremulSum(0.5).String() != "PREMUL_SUM(0.5)" || AVG.String() != "AVG" {
		t.Fatalf("names %s %s", PremulSum(0.5), AVG)
	}
	for _, op := range []ReduceOp{BAND, BOR, BXOR} {
		if err := op.ValidFor(tensor.Float16); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%v on float16: %v", op, err)
		}
		for _, dt := range []tensor.DType{tensor.Int8, tensor.Uint8, tensor.Int32, tensor.Int64, tensor.Bool} {
			if err := op.ValidFor(dt); err != nil {
				t.Errorf("%v on %v: %v", op, dt, err)
			}
		}
	}
	if err := (ReduceOp{Type: 42}).ValidFor(tensor.Int32); err == nil {
		t.Error("unknown reduce op accepted")
	}
}

func TestOpError(t *testing.T) {
	cause := errors.New("socket closed")
	err := error(&OpError{Op: "allreduce", Seq: 42, Rank: 0, Backend: "nccl", Ranks: []int{1, 3}, Timeout: 10 * time.Second, Kind: ErrTimeout, Err: cause, Detail: "never joined"})
	want := "nccl allreduce seq 42 on rank 0: timeout after 10s: never joined: ranks [1 3]: socket closed"
	if err.Error() != want {
		t.Fatalf("got  %q\nwant %q", err, want)
	}
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, cause) || errors.Is(err, ErrAborted) {
		t.Fatal("errors.Is must match the kind and the cause only")
	}
	var oe *OpError
	if !errors.As(error(errors.Join(errors.New("x"), err)), &oe) || oe.Seq != 42 {
		t.Fatal("errors.As through a join")
	}
}

func TestOpTable(t *testing.T) {
	if len(Ops()) != 20 {
		t.Fatalf("%d ops, want c10d's 20", len(Ops()))
	}
	op, ok := LookupOp("allgather_into_tensor")
	if !ok || op != OpAllgatherIntoTensor || op.ProfilingName("nccl") != "nccl:_allgather_base" {
		t.Fatalf("lookup: %v %v %s", op, ok, op.ProfilingName("nccl"))
	}
	if OpSend.Info().Kind != P2P || OpBarrier.Info().Kind != Barrier || OpAllreduce.Info().Kind != Collective {
		t.Fatal("kinds")
	}
	for _, op := range Ops() {
		if op.Kind() != op.Info().Kind {
			t.Fatalf("%s: Kind %v, Info().Kind %v", op, op.Kind(), op.Info().Kind)
		}
	}
	if !OpReduce.Info().Rooted || !OpReduce.Info().Reduces || OpAllgather.Info().Reduces {
		t.Fatal("flags")
	}
	var u Unimplemented
	_, err := u.AlltoallBase(context.Background(), Meta{}, nil, nil, AlltoallBaseOptions{})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "AlltoallBase") {
		t.Fatalf("Unimplemented: %v", err)
	}
}

func TestFuture(t *testing.T) {
	f := NewFuture()
	if _, err := f.Value(); err == nil {
		t.Fatal("Value before completion")
	}
	x := tensor.New(tensor.Float32, 1)
	doubled := f.Then(func(v []*tensor.Tensor, err error) ([]*tensor.Tensor, error) {
		return append(v, v...), err
	})
	if !f.Complete([]*tensor.Tensor{x}, nil) || f.Complete(nil, errors.New("late")) {
		t.Fatal("Complete must report only the first call")
	}
	v, err := doubled.Wait(context.Background())
	if err != nil || len(v) != 2 {
		t.Fatalf("Then: %v %v", v, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := NewFuture().Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past deadline: %v", err)
	}
}

func TestHostWork(t *testing.T) {
	w := NewHostWork(7, true, nil)
	if w.IsCompleted() || w.Exception() != nil {
		t.Fatal("new work completed")
	}
	if started, _ := w.IsStarted(); started {
		t.Fatal("new work started")
	}
	if _, err := w.Duration(); err == nil {
		t.Fatal("duration before completion")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := w.WaitHost(ctx); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.HasPrefix(err.Error(), "wait for op seq 7: caller's context deadline exceeded after ") {
		t.Fatalf("WaitHost past deadline: %v", err)
	}
	w.MarkStarted()
	time.Sleep(time.Millisecond)
	w.Complete(nil, nil)
	if err := w.Wait(context.Background()); err != nil || !w.IsCompleted() || w.SeqNum() != 7 {
		t.Fatalf("wait %v", err)
	}
	if d, err := w.Duration(); err != nil || d <= 0 {
		t.Fatalf("duration %v %v", d, err)
	}
	if _, err := NewHostWork(1, false, nil).Duration(); !errors.Is(err, ErrNoTiming) {
		t.Fatalf("untimed duration: %v", err)
	}

	aborted := make(chan error, 1)
	a := NewHostWork(2, false, func(err error) { aborted <- err })
	a.Abort(errors.New("operator said stop"))
	if err := a.Wait(context.Background()); !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "operator said stop") {
		t.Fatalf("aborted work: %v", err)
	}
	if err := <-aborted; !errors.Is(err, ErrAborted) {
		t.Fatalf("onAbort got %v", err)
	}
	a.Abort(errors.New("again")) // no-op once completed
}

// A wait that the caller's context ended says so, and whether the op's own
// timeout had passed; it wraps ErrTimeout and the context's error.
func TestWaitError(t *testing.T) {
	cases := []struct {
		e    WaitError
		want string
	}{
		{WaitError{Op: "allreduce", Seq: 4, Rank: 0, Backend: "nccl", Waited: 300*time.Millisecond + 12*time.Microsecond, Timeout: 30 * time.Second,
			Elapsed: 310 * time.Millisecond, Err: context.DeadlineExceeded},
			"wait for nccl allreduce seq 4 on rank 0: caller's context deadline exceeded after 300ms (op timeout 30s not reached)"},
		{WaitError{Op: "send", Seq: 2, Rank: 1, Backend: "cpupool", Waited: 2 * time.Second, Timeout: time.Second,
			Elapsed: 2 * time.Second, Err: context.Canceled},
			"wait for cpupool send seq 2 on rank 1: caller's context canceled after 2s (op timeout 1s passed too, not yet reported)"},
		{WaitError{Seq: 9, Rank: -1, Waited: 1500 * time.Nanosecond, Err: context.DeadlineExceeded},
			"wait for op seq 9: caller's context deadline exceeded after 2µs"},
	}
	for _, c := range cases {
		err := error(&c.e)
		if err.Error() != c.want {
			t.Errorf("got  %q\nwant %q", err, c.want)
		}
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, c.e.Err) {
			t.Errorf("%v does not wrap ErrTimeout and %v", err, c.e.Err)
		}
	}
}
