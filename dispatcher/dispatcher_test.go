package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/testgroup"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// initRanks starts world ranks on the recording backends, which log to log.
func initRanks(t *testing.T, world int, backendStr string, log *callLog) []*ProcessGroup {
	t.Helper()
	return initGroups(t, world, Config{Backend: backendStr, Timeout: 5 * time.Second,
		BackendOptions: map[string]any{"reccpu": log, "reccuda": log}})
}

// initGroups starts world ranks as goroutines over one HashStore, each
// with cfg plus its rank, and returns their groups in rank order.
func initGroups(t *testing.T, world int, cfg Config) []*ProcessGroup {
	t.Helper()
	cfg.Store, cfg.WorldSize = store.NewHashStore(), world
	return testgroup.StartClosed(t, world, func(r int) (*ProcessGroup, error) {
		c := cfg
		c.Rank = r
		return Init(context.Background(), c)
	})
}

func host(t *testing.T, dt tensor.DType, n int) *tensor.Tensor {
	t.Helper()
	return tensor.New(dt, n)
}

func cudaTensor(t *testing.T, n int) *tensor.Tensor {
	t.Helper()
	ct, err := tensor.FromDevice(tensor.CUDADevice(0), tensor.Float32, fakeMem{n * 4}, n)
	if err != nil {
		t.Fatal(err)
	}
	return ct
}

func TestRoutingByDevice(t *testing.T) {
	log := &callLog{}
	pg := initRanks(t, 1, "cpu:reccpu,cuda:reccuda", log)[0]
	ctx := context.Background()
	if _, err := pg.Allreduce(ctx, []*tensor.Tensor{host(t, tensor.Float32, 4)}, backend.AllreduceOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Allreduce(ctx, []*tensor.Tensor{cudaTensor(t, 4)}, backend.AllreduceOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Barrier(ctx, backend.BarrierOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Barrier(ctx, backend.BarrierOptions{DeviceIDs: []int{0}}); err != nil {
		t.Fatal(err)
	}
	got := []string{}
	for _, c := range log.all() {
		got = append(got, c.backend+":"+c.meta.Op.String())
	}
	want := "reccpu:allreduce reccuda:allreduce reccpu:barrier reccuda:barrier"
	if strings.Join(got, " ") != want {
		t.Fatalf("routed %v, want %s", got, want)
	}
}

func TestSingleBackendServesItsDevices(t *testing.T) {
	log := &callLog{}
	pg := initRanks(t, 1, "reccuda", log)[0]
	_, err := pg.Allreduce(context.Background(), []*tensor.Tensor{host(t, tensor.Float32, 1)}, backend.AllreduceOptions{})
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "no backend for device type cpu") {
		t.Fatalf("CPU tensor on a CUDA-only group: %v", err)
	}
	if _, err := pg.Allreduce(context.Background(), []*tensor.Tensor{cudaTensor(t, 1)}, backend.AllreduceOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestMissingLibraryFailsOnlyItsDevice(t *testing.T) {
	pg := initRanks(t, 1, "cpu:reccpu,cuda:missinglib", &callLog{})[0]
	ctx := context.Background()
	if _, err := pg.Allreduce(ctx, []*tensor.Tensor{host(t, tensor.Float32, 1)}, backend.AllreduceOptions{}); err != nil {
		t.Fatalf("CPU op: %v", err)
	}
	_, err := pg.Allreduce(ctx, []*tensor.Tensor{cudaTensor(t, 1)}, backend.AllreduceOptions{})
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "GOCOLL_MISSING_LIBRARY") {
		t.Fatalf("CUDA op without the library: %v", err)
	}
	dev := tensor.CUDADevice(0)
	_, err = Init(ctx, Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "cpu:reccpu,cuda:missinglib", Device: &dev})
	if !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("eager init on a device without its library: %v", err)
	}
}

func TestValidation(t *testing.T) {
	pgs := initRanks(t, 2, "cpu:reccpu,cuda:reccuda", &callLog{})
	pg0, pg1 := pgs[0], pgs[1]
	ctx := context.Background()
	f32 := func(n int) *tensor.Tensor { return host(t, tensor.Float32, n) }
	ts := func(xs ...*tensor.Tensor) []*tensor.Tensor { return xs }
	strided, err := f32(8).AsStrided([]int{4}, []int{2})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		run  func() (backend.Work, error)
		want string
	}{
		{"empty list", func() (backend.Work, error) { return pg0.Allreduce(ctx, nil, backend.AllreduceOptions{}) }, "requires non-empty tensor list"},
		{"non-contiguous", func() (backend.Work, error) { return pg0.Allreduce(ctx, ts(strided), backend.AllreduceOptions{}) }, "Tensors must be contiguous (tensors[0] has strides [2]"},
		{"dtype mismatch", func() (backend.Work, error) {
			return pg0.AllreduceCoalesced(ctx, ts(f32(2), host(t, tensor.Int32, 2)), backend.AllreduceCoalescedOptions{})
		}, "tensors with different dtypes (tensors[1] is int32, others are float32)"},
		{"root -1", func() (backend.Work, error) {
			return pg0.Broadcast(ctx, ts(f32(1)), backend.BroadcastOptions{RootRank: -1})
		}, "invalid root rank (root -1, world size 2)"},
		{"root = world", func() (backend.Work, error) {
			return pg0.Broadcast(ctx, ts(f32(1)), backend.BroadcastOptions{RootRank: 2})
		}, "invalid root rank (root 2, world size 2)"},
		{"root tensor", func() (backend.Work, error) {
			return pg0.Broadcast(ctx, ts(f32(1)), backend.BroadcastOptions{RootTensor: 1})
		}, "invalid root tensor"},
		{"allgather base size", func() (backend.Work, error) {
			return pg0.AllgatherIntoTensor(ctx, f32(3), f32(2), backend.AllgatherIntoTensorOptions{})
		}, "output tensor size must be equal to world_size times input tensor size (output has 3 elements, input has 2, world size 2)"},
		{"allgather base dtype", func() (backend.Work, error) {
			return pg0.AllgatherIntoTensor(ctx, host(t, tensor.Int64, 4), f32(2), backend.AllgatherIntoTensorOptions{})
		}, "output tensor must have the same type as input tensor"},
		{"reduce_scatter base size", func() (backend.Work, error) {
			return pg0.ReduceScatterTensor(ctx, f32(2), f32(5), backend.ReduceScatterTensorOptions{})
		}, "input tensor must be the same size as output size times world size"},
		{"bitwise on float", func() (backend.Work, error) {
			return pg0.Allreduce(ctx, ts(f32(1)), backend.AllreduceOptions{ReduceOp: backend.BAND})
		}, "Cannot use ReduceOp.BAND with dtype float32"},
		{"split sum", func() (backend.Work, error) {
			return pg0.AlltoallBase(ctx, f32(4), f32(4), backend.AlltoallBaseOptions{InputSplitSizes: []int{1, 2}})
		}, "invalid input split sizes (split sizes [1 2] sum to 3, input has 4 rows)"},
		{"split count", func() (backend.Work, error) {
			return pg0.AlltoallBase(ctx, f32(4), f32(4), backend.AlltoallBaseOptions{OutputSplitSizes: []int{4}})
		}, "invalid output split sizes (1 split sizes for world size 2)"},
		{"alltoall list", func() (backend.Work, error) {
			return pg0.Alltoall(ctx, ts(f32(1)), ts(f32(1), f32(1)), backend.AlltoallOptions{})
		}, "Incorrect output list size. Output list size should be the world size (len(outputs) = 1, want 2)"},
		{"send to self", func() (backend.Work, error) { return pg0.Send(ctx, ts(f32(1)), 0, backend.SendOptions{}) }, "send to or receive from self"},
		{"send out of range", func() (backend.Work, error) { return pg0.Send(ctx, ts(f32(1)), 7, backend.SendOptions{}) }, "invalid destination rank (rank 7 is outside [0, 2))"},
		{"negative tag", func() (backend.Work, error) {
			return pg0.Recv(ctx, ts(f32(1)), 1, backend.RecvOptions{Tag: -1})
		}, "tag must not be negative"},
		{"gather on non-root", func() (backend.Work, error) {
			return pg1.Gather(ctx, [][]*tensor.Tensor{ts(f32(1), f32(1))}, ts(f32(1)), backend.GatherOptions{})
		}, "requires a single-element output list of world_size tensors on the root and an empty output list elsewhere (rank 1 is not the root"},
		{"gather on root, wrong size", func() (backend.Work, error) {
			return pg0.Gather(ctx, [][]*tensor.Tensor{ts(f32(1), f32(2))}, ts(f32(1)), backend.GatherOptions{})
		}, "invalid tensor size: outputs[0][1] has 2 elements"},
		{"mixed devices", func() (backend.Work, error) {
			return pg0.AllgatherIntoTensor(ctx, cudaTensor(t, 4), f32(2), backend.AllgatherIntoTensorOptions{})
		}, "tensors must all be on the same device (output is on cuda:0, others on cpu)"},
		{"negative timeout", func() (backend.Work, error) {
			return pg0.Barrier(ctx, backend.BarrierOptions{Timeout: -time.Second})
		}, "timeout must not be negative"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, err := c.run()
			if w != nil || !errors.Is(err, backend.ErrInvalidArgument) {
				t.Fatalf("got work %v, err %v; want ErrInvalidArgument", w, err)
			}
			var oe *backend.OpError
			if !errors.As(err, &oe) || oe.Seq != 0 {
				t.Fatalf("error %v is not an unnumbered *OpError", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q\nlacks %q", err, c.want)
			}
		})
	}
	if pg0.SeqNum() != 0 || pg0.P2PSeqNum() != 0 {
		t.Fatalf("rejected ops were numbered: coll %d p2p %d", pg0.SeqNum(), pg0.P2PSeqNum())
	}
}

func TestValidArgumentsPass(t *testing.T) {
	pgs := initRanks(t, 2, "reccpu", &callLog{})
	ctx := context.Background()
	f32 := func(n int) *tensor.Tensor { return host(t, tensor.Float32, n) }
	if _, err := pgs[0].AllgatherIntoTensor(ctx, f32(4), f32(2), backend.AllgatherIntoTensorOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pgs[0].AlltoallBase(ctx, f32(4), f32(4), backend.AlltoallBaseOptions{InputSplitSizes: []int{1, 3}, OutputSplitSizes: []int{2, 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pgs[0].Gather(ctx, [][]*tensor.Tensor{{f32(1), f32(1)}}, []*tensor.Tensor{f32(1)}, backend.GatherOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pgs[1].Gather(ctx, nil, []*tensor.Tensor{f32(1)}, backend.GatherOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pgs[0].Allreduce(ctx, []*tensor.Tensor{host(t, tensor.Int32, 1)}, backend.AllreduceOptions{ReduceOp: backend.BXOR}); err != nil {
		t.Fatal(err)
	}
	// Three inputs on two ranks: the output list has one entry per input,
	// each of world-size tensors.
	outs := [][]*tensor.Tensor{{f32(1), f32(1)}, {f32(2), f32(2)}, {f32(3), f32(3)}}
	_, err := pgs[0].AllgatherCoalesced(ctx, outs, []*tensor.Tensor{f32(1), f32(2), f32(3)}, backend.AllgatherCoalescedOptions{})
	if !errors.Is(err, backend.ErrUnsupported) { // valid arguments; the recorder lacks the op
		t.Fatalf("allgather_coalesced with valid arguments: %v", err)
	}
	outs[1] = outs[1][:1]
	_, err = pgs[0].AllgatherCoalesced(ctx, outs, []*tensor.Tensor{f32(1), f32(2), f32(3)}, backend.AllgatherCoalescedOptions{})
	if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), "outputs[1] has 1 tensors, world size 2") {
		t.Fatalf("allgather_coalesced with a short output list: %v", err)
	}
}

func TestSequenceNumbers(t *testing.T) {
	log := &callLog{}
	pgs := initRanks(t, 2, "reccpu", log)
	pg := pgs[0]
	ctx := context.Background()
	x := []*tensor.Tensor{host(t, tensor.Float32, 1)}
	var works []backend.Work
	for range 3 {
		w, err := pg.Allreduce(ctx, x, backend.AllreduceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		works = append(works, w)
	}
	w, err := pg.Send(ctx, x, 1, backend.SendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	works = append(works, w)
	w, err = pg.Barrier(ctx, backend.BarrierOptions{})
	if err != nil {
		t.Fatal(err)
	}
	works = append(works, w)
	var seqs []uint64
	for _, w := range works {
		seqs = append(seqs, w.SeqNum())
	}
	if fmt.Sprint(seqs) != "[1 2 3 1 4]" {
		t.Fatalf("work seqs %v, want [1 2 3 1 4]: collectives and p2p count separately", seqs)
	}
	if pg.SeqNum() != 4 || pg.P2PSeqNum() != 1 {
		t.Fatalf("counters coll %d p2p %d", pg.SeqNum(), pg.P2PSeqNum())
	}
	// A rejected op does not bump the counter; a failed backend call does,
	// as in PyTorch, since the op was issued.
	if _, err := pg.Allreduce(ctx, nil, backend.AllreduceOptions{}); err == nil {
		t.Fatal("empty allreduce accepted")
	}
	if pg.SeqNum() != 4 {
		t.Fatalf("rejected op bumped the counter to %d", pg.SeqNum())
	}
	if pgs[1].SeqNum() != 0 {
		t.Fatalf("rank 1 counter moved to %d without ops", pgs[1].SeqNum())
	}
}

func TestSubgroupsCountIndependently(t *testing.T) {
	pgs := initRanks(t, 3, "reccpu", &callLog{})
	ctx := context.Background()
	subs := make([]*ProcessGroup, 3)
	for r, pg := range pgs {
		g, err := pg.NewGroup(ctx, []int{2, 0}, GroupOptions{})
		if err != nil {
			t.Fatal(err)
		}
		subs[r] = g
	}
	if got := subs[0].Ranks(); fmt.Sprint(got) != "[0 2]" {
		t.Fatalf("ranks %v not sorted", got)
	}
	if subs[2].Rank() != 1 || subs[0].Rank() != 0 || subs[1].Rank() != -1 || subs[1].IsMember() {
		t.Fatalf("group ranks %d %d %d", subs[0].Rank(), subs[1].Rank(), subs[2].Rank())
	}
	if subs[0].Name() != "1" || subs[0].Desc() != "default_pg:group:1" {
		t.Fatalf("name %q desc %q", subs[0].Name(), subs[0].Desc())
	}
	x := []*tensor.Tensor{host(t, tensor.Float32, 1)}
	if _, err := subs[0].Allreduce(ctx, x, backend.AllreduceOptions{}); err != nil {
		t.Fatal(err)
	}
	if subs[0].SeqNum() != 1 || pgs[0].SeqNum() != 0 {
		t.Fatalf("subgroup seq %d, default seq %d", subs[0].SeqNum(), pgs[0].SeqNum())
	}
	_, err := subs[1].Allreduce(ctx, x, backend.AllreduceOptions{})
	if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), "global rank 1 is not a member of group 1") {
		t.Fatalf("non-member op: %v", err)
	}
	if g, _ := subs[2].GlobalRank(1); g != 2 {
		t.Fatalf("GlobalRank(1) = %d", g)
	}
	if _, err := subs[0].GroupRank(1); err == nil || !strings.Contains(err.Error(), "not part of group") {
		t.Fatalf("GroupRank of a non-member: %v", err)
	}
	for _, bad := range [][]int{{0, 0}, {0, 3}, {-1}} {
		if _, err := pgs[0].NewGroup(ctx, bad, GroupOptions{}); !errors.Is(err, backend.ErrInvalidArgument) {
			t.Fatalf("NewGroup(%v): %v", bad, err)
		}
	}
	g, err := pgs[0].NewGroup(ctx, []int{2, 0}, GroupOptions{KeepOrder: true})
	if err != nil || fmt.Sprint(g.Ranks()) != "[2 0]" || g.Rank() != 1 {
		t.Fatalf("KeepOrder: ranks %v rank %d err %v", g.Ranks(), g.Rank(), err)
	}
}

func TestHooks(t *testing.T) {
	pgs := initRanks(t, 2, "reccpu", &callLog{})
	pg := pgs[0]
	ctx := context.Background()
	var mu sync.Mutex
	var pre, post []string
	pg.AddHooks(Hooks{
		Pre: func(ctx context.Context, i OpInfo) {
			mu.Lock()
			defer mu.Unlock()
			pre = append(pre, fmt.Sprintf("%s seq=%d coll=%d p2p=%d in=%d out=%d", i.ProfilingName(), i.Seq, i.CollSeq, i.P2PSeq, len(i.Inputs), len(i.Outputs)))
		},
		Post: func(ctx context.Context, i OpInfo, w backend.Work, err error) {
			mu.Lock()
			defer mu.Unlock()
			post = append(post, fmt.Sprintf("%s work=%v err=%v", i.Op, w != nil, err != nil))
		},
	})
	x := []*tensor.Tensor{host(t, tensor.Float32, 1)}
	pg.Allreduce(ctx, x, backend.AllreduceOptions{})
	pg.Send(ctx, x, 1, backend.SendOptions{})
	pg.Recv(ctx, x, 1, backend.RecvOptions{})
	pg.AllgatherIntoTensor(ctx, host(t, tensor.Float32, 2), x[0], backend.AllgatherIntoTensorOptions{})
	pg.ReduceScatterTensor(ctx, x[0], host(t, tensor.Float32, 2), backend.ReduceScatterTensorOptions{})
	wantPre := []string{
		"reccpu:all_reduce seq=1 coll=1 p2p=0 in=1 out=1",
		"reccpu:send 0->1 seq=1 coll=1 p2p=1 in=1 out=0",
		"reccpu:recv 0<-1 seq=2 coll=1 p2p=2 in=0 out=1",
		"reccpu:_allgather_base seq=2 coll=2 p2p=2 in=1 out=1",
		"reccpu:_reduce_scatter_base seq=3 coll=3 p2p=2 in=1 out=1",
	}
	if strings.Join(pre, "\n") != strings.Join(wantPre, "\n") {
		t.Fatalf("pre hooks saw\n%s\nwant\n%s", strings.Join(pre, "\n"), strings.Join(wantPre, "\n"))
	}
	if post[4] != "reduce_scatter_tensor work=false err=true" || post[0] != "allreduce work=true err=false" {
		t.Fatalf("post hooks saw %v", post)
	}
}

func TestBackendErrorsAreLabelled(t *testing.T) {
	pg := initRanks(t, 1, "reccpu", &callLog{})[0]
	ctx := context.Background()
	x := host(t, tensor.Float32, 1)
	_, err := pg.ReduceScatterTensor(ctx, x, x, backend.ReduceScatterTensorOptions{})
	var oe *backend.OpError
	if !errors.As(err, &oe) || oe.Seq != 1 || oe.Backend != "reccpu" || oe.Op != "reduce_scatter_tensor" {
		t.Fatalf("backend error not labelled: %#v", err)
	}
	_, err = pg.RecvAnysource(ctx, []*tensor.Tensor{x}, backend.RecvAnysourceOptions{})
	if !errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), "reccpu recv_anysource seq 1") {
		t.Fatalf("unimplemented op: %v", err)
	}
}

func TestClosedGroup(t *testing.T) {
	pg := initRanks(t, 1, "reccpu", &callLog{})[0]
	if err := pg.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err := pg.Barrier(context.Background(), backend.BarrierOptions{})
	if !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("op on a closed group: %v", err)
	}
	if err := pg.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestInitBarrierNamesMissingRanks(t *testing.T) {
	st := store.NewHashStore()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for _, r := range []int{0, 2} {
		wg.Go(func() {
			_, errs[r] = Init(context.Background(), Config{Store: st, Rank: r, WorldSize: 3, Backend: "reccpu", Timeout: 300 * time.Millisecond})
		})
	}
	wg.Wait()
	for _, r := range []int{0, 2} {
		err := errs[r]
		var oe *backend.OpError
		if !errors.Is(err, backend.ErrTimeout) || !errors.As(err, &oe) || fmt.Sprint(oe.Ranks) != "[1]" {
			t.Fatalf("rank %d: %v", r, err)
		}
		if !strings.Contains(err.Error(), "2 of 3 ranks joined; never joined: ranks [1]") {
			t.Fatalf("rank %d message: %v", r, err)
		}
	}
}

func TestInitRejectsBadConfig(t *testing.T) {
	st := store.NewHashStore()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{WorldSize: 1, Backend: "reccpu"}, "Store is nil"},
		{Config{Store: st, WorldSize: 0, Backend: "reccpu"}, "world size 0"},
		{Config{Store: st, Rank: 2, WorldSize: 2, Backend: "reccpu"}, "rank 2 outside [0, 2)"},
		{Config{Store: st, WorldSize: 1, Backend: "nosuch"}, `Unknown backend "nosuch"`},
		{Config{Store: st, WorldSize: 1, Backend: "cpu:reccpu,"}, "Invalid device:backend pairing"},
		{Config{Store: st, WorldSize: 1, Backend: "reccpu", Timeout: -1}, "dispatcher.Config.Timeout=-1ns: want a timeout that is not negative"},
		{Config{Store: st, WorldSize: 1, Backend: "reccpu", Monitor: MonitorOptions{CoordCheck: -time.Second}}, "dispatcher.MonitorOptions.CoordCheck=-1s"},
		{Config{Store: st, WorldSize: 1, Backend: "cpu:reccpu,cuda:badopts"}, `GOCOLL_BADOPTS_MODE="bogus"`},
	} {
		_, err := Init(context.Background(), c.cfg)
		if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Init(%+v): %v, want %q", c.cfg, err, c.want)
		}
	}
}

func TestReadEnv(t *testing.T) {
	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "4")
	t.Setenv("MASTER_ADDR", "10.0.0.1")
	t.Setenv("MASTER_PORT", "29500")
	t.Setenv("LOCAL_RANK", "0")
	e, err := ReadEnv()
	if err != nil || e != (Env{Rank: 1, WorldSize: 4, LocalRank: 0, LocalWorldSize: 4, GroupWorldSize: 1, RoleRank: 1, RoleWorldSize: 4, MasterAddr: "10.0.0.1", MasterPort: 29500, StoreDialect: store.DialectV2}) {
		t.Fatalf("ReadEnv = %+v, %v", e, err)
	}
	t.Setenv("WORLD_SIZE", "four")
	if _, err := ReadEnv(); err == nil || !strings.Contains(err.Error(), `WORLD_SIZE="four" is not an integer`) {
		t.Fatalf("bad WORLD_SIZE: %v", err)
	}
	t.Setenv("WORLD_SIZE", "4")
	t.Setenv("MASTER_ADDR", "")
	if _, err := ReadEnv(); err == nil || !strings.Contains(err.Error(), "MASTER_ADDR expected") {
		t.Fatalf("missing MASTER_ADDR: %v", err)
	}
}

// TestInitFromEnvHostsTheStore starts two ranks the torchrun way, in one
// process: rank 0 hosts the TCPStore and both connect to it. The environment
// is process-wide, so the ranks go one after the other through ReadEnv and
// meet in the init barrier.
func TestInitFromEnvHostsTheStore(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	t.Setenv("MASTER_ADDR", "127.0.0.1")
	t.Setenv("MASTER_PORT", strconv.Itoa(port))
	t.Setenv("WORLD_SIZE", "1")
	t.Setenv("RANK", "0")
	pg, err := InitFromEnv(context.Background(), Config{Backend: "reccpu", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(context.Background())
	if pg.Rank() != 0 || pg.Size() != 1 {
		t.Fatalf("rank %d size %d", pg.Rank(), pg.Size())
	}
	// The store is a real TCP store, reachable by another client.
	c, err := store.NewTCPStore(context.Background(), net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), store.TCPStoreOptions{ClientOptions: store.ClientOptions{Timeout: 5 * time.Second, NoWaitForWorkers: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ok, err := c.Check(context.Background(), "default_pg/barrier/init/0")
	if err != nil || !ok {
		t.Fatalf("init barrier key not in the TCP store: %v %v", ok, err)
	}
}

func TestAbortKeepsTheReason(t *testing.T) {
	pgs := initRanks(t, 2, "reccpu", &callLog{})
	ctx := context.Background()
	sub, err := pgs[0].NewGroup(ctx, []int{0, 1}, GroupOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reason := errors.New("rank 1 timed out in allreduce seq 9")
	if err := pgs[0].Abort(ctx, reason); err != nil {
		t.Fatal(err)
	}
	x := []*tensor.Tensor{host(t, tensor.Float32, 1)}
	for _, g := range []*ProcessGroup{pgs[0], sub} {
		_, err := g.Allreduce(ctx, x, backend.AllreduceOptions{})
		if !errors.Is(err, backend.ErrAborted) || !errors.Is(err, reason) || !strings.Contains(err.Error(), "allreduce seq 9") {
			t.Fatalf("group %s after abort: %v", g.Name(), err)
		}
	}
	// Close after Abort still releases the group, and Close stays idempotent.
	if err := pgs[0].Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !pgs[0].released || !sub.released {
		t.Fatal("Close after Abort did not release the groups")
	}
	if _, err := pgs[1].Allreduce(ctx, x, backend.AllreduceOptions{}); err != nil {
		t.Fatalf("the other rank's group was touched: %v", err)
	}
}

func TestFailedBackendIsNeverClosed(t *testing.T) {
	pg := initRanks(t, 1, "cpu:reccpu,cuda:typednil", &callLog{})[0]
	ctx := context.Background()
	if err := pg.Abort(ctx, errors.New("stop")); err != nil {
		t.Fatal(err)
	}
	if err := pg.Close(ctx); err != nil { // would panic on the nil *recorder
		t.Fatal(err)
	}
}

// TestHooksSeeOneOpInfo: an op's pre and post hooks see the same OpInfo
// (the dispatcher builds it for each from the op's record): its numbers,
// tensors, peer, backend, device and issue time.
func TestHooksSeeOneOpInfo(t *testing.T) {
	pg := initRanks(t, 2, "reccpu", &callLog{})[0]
	ctx := context.Background()
	var mu sync.Mutex
	var pre, post []OpInfo
	pg.AddHooks(Hooks{
		Pre: func(_ context.Context, i OpInfo) { mu.Lock(); pre = append(pre, i); mu.Unlock() },
		Post: func(_ context.Context, i OpInfo, _ backend.Work, _ error) {
			mu.Lock()
			post = append(post, i)
			mu.Unlock()
		},
	})
	x := []*tensor.Tensor{host(t, tensor.Float32, 3)}
	big := host(t, tensor.Float32, 6)
	pg.Allreduce(ctx, x, backend.AllreduceOptions{Timeout: time.Second})
	pg.Send(ctx, x, 1, backend.SendOptions{})
	pg.AllgatherIntoTensor(ctx, big, x[0], backend.AllgatherIntoTensorOptions{})
	if len(pre) != 3 || len(post) != 3 {
		t.Fatalf("%d pre and %d post hook calls, want 3 each", len(pre), len(post))
	}
	for k := range pre {
		if !reflect.DeepEqual(pre[k], post[k]) {
			t.Errorf("op %d: pre saw %+v, post %+v", k, pre[k], post[k])
		}
		if pre[k].Issued.IsZero() || pre[k].Backend != "reccpu" || pre[k].Device != tensor.Host || pre[k].Group != "0" || pre[k].GroupSize != 2 {
			t.Errorf("op %d: %+v", k, pre[k])
		}
	}
	if p := pre[1]; p.Peer != 1 || p.P2PSeq != 1 || p.CollSeq != 1 || len(p.Inputs) != 1 || p.Outputs != nil {
		t.Errorf("send: %+v", p)
	}
	if a := pre[2]; a.Peer != -1 || a.Seq != 2 || a.Inputs[0] != x[0] || a.Outputs[0] != big || a.Timeout != pg.timeout {
		t.Errorf("allgather_into_tensor: %+v", a)
	}
	if pre[0].Timeout != time.Second {
		t.Errorf("allreduce timeout %v, want the op's 1s", pre[0].Timeout)
	}
}
