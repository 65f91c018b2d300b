package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gocoll/gocoll/backend"
	_ "github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/internal/testgroup"
	"github.com/gocoll/gocoll/metrics"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// scrape reads the exposition h serves, as Prometheus would.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	return get(t, srv.URL)
}

func get(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value returns the sample of family name whose labels include want: a
// counter's or a gauge's value, a histogram's count.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// initRanks starts world cpupool ranks as goroutines over one HashStore,
// each with an Exporter of its own.
func initRanks(t *testing.T, world int, cfg dispatcher.Config, opts ...metrics.Options) ([]*dispatcher.ProcessGroup, []*metrics.Exporter) {
	t.Helper()
	cfg.Store, cfg.WorldSize, cfg.Backend = store.NewHashStore(), world, "cpupool"
	cfg.FlightRecorder.DumpPrefix = t.TempDir() + "/fr_"
	exps := make([]*metrics.Exporter, world)
	for r := range world {
		var o metrics.Options
		if len(opts) > 0 {
			o = opts[0]
		}
		exps[r] = metrics.New(o)
	}
	pgs := testgroup.StartClosed(t, world, func(r int) (*dispatcher.ProcessGroup, error) {
		c := cfg
		c.Rank, c.Metrics = r, exps[r]
		return dispatcher.Init(context.Background(), c)
	})
	return pgs, exps
}

// eventually scrapes until cond holds: completions are recorded off the
// issuing goroutine, a moment after the Work completes.
func eventually(t *testing.T, h http.Handler, what string, cond func(map[string]*dto.MetricFamily) bool) map[string]*dto.MetricFamily {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		fams := scrape(t, h)
		if cond(fams) {
			return fams
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen within 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Two real cpupool ranks: every op is counted issued and completed once,
// in its own (group, backend, op) series, with the rank label, and the
// latency histogram holds the timed ones: with TimeEvery 2, the ops of
// even sequence numbers.
func TestOpsCounted(t *testing.T) {
	pgs, exps := initRanks(t, 2, dispatcher.Config{}, metrics.Options{TimeEvery: 2})
	const n = 7
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r, pg := range pgs {
		wg.Go(func() {
			ctx := context.Background()
			x := []*tensor.Tensor{tensor.New(tensor.Float32, 1024)}
			for range n {
				w, err := pg.Allreduce(ctx, x, backend.AllreduceOptions{})
				if err == nil {
					err = w.Wait(ctx)
				}
				if err != nil {
					errs[r] = err
					return
				}
			}
			w, err := pg.Broadcast(ctx, x, backend.BroadcastOptions{})
			if err == nil {
				err = w.Wait(ctx)
			}
			errs[r] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r, e := range exps {
		rank := strconv.Itoa(r)
		ar := map[string]string{"rank": rank, "group": "0", "group_desc": "default_pg", "backend": "cpupool", "op": "allreduce"}
		bc := map[string]string{"rank": rank, "group": "0", "backend": "cpupool", "op": "broadcast"}
		fams := eventually(t, e.Handler(), "rank "+rank+" completions", func(f map[string]*dto.MetricFamily) bool {
			a, _ := value(f, "gocoll_ops_completed_total", ar)
			b, _ := value(f, "gocoll_ops_completed_total", bc)
			return a == n && b == 1
		})
		// allreduce is seq 1 … 7, broadcast seq 8.
		if v, _ := value(fams, "gocoll_op_duration_seconds", ar); v != 3 {
			t.Errorf("rank %d: %v allreduce latencies, want 3 (seq 2, 4, 6)", r, v)
		}
		if v, _ := value(fams, "gocoll_op_duration_seconds", bc); v != 1 {
			t.Errorf("rank %d: %v broadcast latencies, want 1 (seq 8)", r, v)
		}
		if v, _ := value(fams, "gocoll_ops_issued_total", ar); v != n {
			t.Errorf("rank %d: allreduce issued %v, want %d", r, v, n)
		}
		if v, _ := value(fams, "gocoll_ops_issued_total", bc); v != 1 {
			t.Errorf("rank %d: broadcast issued %v, want 1", r, v)
		}
		if _, ok := fams["gocoll_op_failures_total"]; ok {
			t.Errorf("rank %d: failures reported for ops that all succeeded", r)
		}
		h := fams["gocoll_op_duration_seconds"].GetMetric()
		for _, m := range h {
			if m.GetHistogram().GetSampleSum() <= 0 {
				t.Errorf("rank %d: latency sum %v of %v", r, m.GetHistogram().GetSampleSum(), m.GetLabel())
			}
		}
		// The barrier of Init is the store's, not an op: nothing else.
		if got := len(fams["gocoll_ops_issued_total"].GetMetric()); got != 2 {
			t.Errorf("rank %d: %d issued series, want 2 (allreduce, broadcast)", r, got)
		}
	}
}

// A collective that a peer never issues fails with ErrTimeout: it is
// counted as a failure of kind timeout and in the timeouts series, not as
// completed; the flight recorder's dump and a later Abort are counted too.
func TestTimeoutAbortDump(t *testing.T) {
	logs := captureLogs(t)
	pgs, exps := initRanks(t, 2, dispatcher.Config{}, metrics.Options{TimeEvery: 1})
	ctx := context.Background()
	w, err := pgs[0].Allreduce(ctx, []*tensor.Tensor{tensor.New(tensor.Float32, 4)}, backend.AllreduceOptions{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitHost(ctx); !errors.Is(err, backend.ErrTimeout) {
		t.Fatalf("rank 1 never joined: got %v, want ErrTimeout", err)
	}
	labels := map[string]string{"rank": "0", "op": "allreduce", "backend": "cpupool", "kind": "timeout"}
	fams := eventually(t, exps[0].Handler(), "timeout counted", func(f map[string]*dto.MetricFamily) bool {
		v, _ := value(f, "gocoll_op_failures_total", labels)
		d, _ := value(f, "gocoll_flight_recorder_dumps_total", map[string]string{"rank": "0"})
		return v == 1 && d >= 1
	})
	if v, _ := value(fams, "gocoll_timeouts_total", map[string]string{"rank": "0", "group": "0", "backend": "cpupool"}); v != 1 {
		t.Errorf("timeouts %v, want 1", v)
	}
	for _, name := range []string{"gocoll_ops_completed_total", "gocoll_op_duration_seconds"} {
		if v, _ := value(fams, name, map[string]string{"rank": "0", "op": "allreduce"}); v != 0 {
			t.Errorf("a failed op was counted in %s (%v)", name, v)
		}
	}
	pgs[0].Abort(ctx, errors.New("test: abort"))
	fams = scrape(t, exps[0].Handler())
	if v, _ := value(fams, "gocoll_aborts_total", map[string]string{"rank": "0", "group": "0", "group_desc": "default_pg"}); v != 1 {
		t.Errorf("aborts %v, want 1", v)
	}
	// An op after the abort is refused before it is numbered, as an
	// invalid argument is: it is not an issued op.
	_, err = pgs[0].Allreduce(ctx, []*tensor.Tensor{tensor.New(tensor.Float32, 4)}, backend.AllreduceOptions{})
	if !errors.Is(err, backend.ErrAborted) {
		t.Fatalf("op after Abort: %v", err)
	}
	fams = scrape(t, exps[0].Handler())
	if v, _ := value(fams, "gocoll_ops_issued_total", map[string]string{"rank": "0", "op": "allreduce"}); v != 1 {
		t.Errorf("issued %v after a refused op, want 1", v)
	}

	// The fault paths log through slog with the group, rank and seq.
	for _, want := range []map[string]string{
		{"msg": "gocoll cpupool: op failed", "group": "default_pg", "rank": "0", "seq": "1", "op": "allreduce"},
		{"msg": "gocoll: group aborted", "group": "default_pg", "rank": "0", "seq": "1"},
	} {
		if !logs.has(want) {
			t.Errorf("no log record %v in %v", want, logs.all())
		}
	}
}

// records keeps the slog records of a test.
type records struct {
	mu   sync.Mutex
	recs []map[string]string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	m := map[string]string{"msg": rec.Message, "level": rec.Level.String()}
	rec.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	r.mu.Lock()
	r.recs = append(r.recs, m)
	r.mu.Unlock()
	return nil
}

func (r *records) all() []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]string(nil), r.recs...)
}

func (r *records) has(want map[string]string) bool {
next:
	for _, m := range r.all() {
		for k, v := range want {
			if m[k] != v {
				continue next
			}
		}
		return true
	}
	return false
}

// captureLogs makes slog.Default keep its records until the test ends.
func captureLogs(t *testing.T) *records {
	r := &records{}
	old := slog.Default()
	slog.SetDefault(slog.New(r))
	t.Cleanup(func() { slog.SetDefault(old) })
	return r
}

// GOCOLL_METRICS_ADDR alone turns metrics on (the blank-imported package's
// implementation), served over HTTP at the port moved by LOCAL_RANK; and
// the TCPStore server that InitFromEnv starts on rank 0 is observed.
func TestEnvListenerAndStore(t *testing.T) {
	base := freePorts(t, 2)
	storePort := freePorts(t, 1)
	t.Setenv("GOCOLL_METRICS_ADDR", "127.0.0.1:"+strconv.Itoa(base))
	t.Setenv("LOCAL_RANK", "1")
	t.Setenv("LOCAL_WORLD_SIZE", "2")
	t.Setenv("RANK", "0")
	t.Setenv("WORLD_SIZE", "1")
	t.Setenv("MASTER_ADDR", "127.0.0.1")
	t.Setenv("MASTER_PORT", strconv.Itoa(storePort))
	t.Setenv("GOCOLL_DEBUG_INFO_TEMP_FILE", t.TempDir()+"/fr_")
	ctx := context.Background()
	pg, err := dispatcher.InitFromEnv(ctx, dispatcher.Config{Backend: "cpupool"})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(ctx)
	x := []*tensor.Tensor{tensor.New(tensor.Float32, 8)}
	w, err := pg.Allreduce(ctx, x, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", base+1)
	fams := get(t, url)
	if v, _ := value(fams, "gocoll_ops_issued_total", map[string]string{"rank": "0", "op": "allreduce", "backend": "cpupool"}); v != 1 {
		t.Errorf("issued %v, want 1", v)
	}
	// The rendezvous and Init went through the store this rank hosts.
	var reqs uint64
	for _, m := range fams["gocoll_store_server_request_duration_seconds"].GetMetric() {
		reqs += m.GetHistogram().GetSampleCount()
	}
	if reqs < 1 {
		t.Errorf("store requests %v, want at least 1 (the rendezvous)", reqs)
	}
	if v, ok := value(fams, "gocoll_store_server_connections", map[string]string{"rank": "0"}); !ok || v < 1 {
		t.Errorf("store connections %v (present %v), want at least 1", v, ok)
	}
	if _, ok := value(fams, "gocoll_store_server_sending_bytes", map[string]string{"rank": "0"}); !ok {
		t.Error("no gocoll_store_server_sending_bytes")
	}
	pg.Close(ctx)
	if _, err := http.Get(url); err == nil {
		t.Error("the listener still answers after Close")
	}
}

// freePorts returns n consecutive free TCP ports on 127.0.0.1.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		ok := true
		for i := 1; i < n && ok; i++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+i))
			if err != nil {
				ok = false
				continue
			}
			l.Close()
		}
		if ok && p+n <= 65535 {
			return p
		}
	}
	t.Fatal("no free ports")
	return 0
}

// Bad values of GOCOLL_METRICS_ADDR fail Init, naming the variable and
// the value, before anything starts.
func TestBadAddr(t *testing.T) {
	for _, v := range []string{"nonsense", "host:port", "127.0.0.1:70000", ":-1"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv("GOCOLL_METRICS_ADDR", v)
			_, err := dispatcher.Init(context.Background(), dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "cpupool"})
			if err == nil {
				t.Fatal("Init accepted it")
			}
			if !strings.Contains(err.Error(), "GOCOLL_METRICS_ADDR="+strconv.Quote(v)) || !errors.Is(err, backend.ErrInvalidArgument) {
				t.Errorf("error does not name GOCOLL_METRICS_ADDR=%q or wrap ErrInvalidArgument: %v", v, err)
			}
		})
	}
	// A port that is taken costs the listener, with a line that names
	// it, not the job.
	logs := captureLogs(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pg, err := dispatcher.Init(context.Background(), dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "cpupool",
		MetricsAddr: ln.Addr().String(), FlightRecorder: dispatcher.FlightRecorderOptions{Entries: -1}})
	if err != nil {
		t.Fatalf("a taken metrics port failed Init: %v", err)
	}
	defer pg.Close(context.Background())
	if !logs.has(map[string]string{"msg": "gocoll metrics: cannot serve /metrics; the series are still counted (Exporter.Handler serves them)",
		"addr": ln.Addr().String(), "rank": "0"}) {
		t.Errorf("no log line names the taken address %s: %v", ln.Addr(), logs.all())
	}
}

// A source's readings become gocoll_gpu_*; a source that hangs (NVML on a
// sick GPU) is cut off at Options.GPUTimeout.
func TestGPUSource(t *testing.T) {
	defer metrics.RegisterGPUSource(metrics.NVMLSource)
	pgs, exps := initRanks(t, 1, dispatcher.Config{})
	_ = pgs
	metrics.RegisterGPUSource(func(ctx context.Context) ([]metrics.GPUReading, error) {
		return []metrics.GPUReading{{Index: 0, UUID: "GPU-x", UtilGPU: 42, UtilMemory: -1, MemoryUsed: 1 << 30, MemoryTotal: 2 << 30,
			TempC: 30, PowerMW: 71500, ECCCorrected: 0, ECCUncorrected: -1, XIDs: 2, Throttle: []string{"idle"}}}, nil
	})
	fams := scrape(t, exps[0].Handler())
	gpu := map[string]string{"rank": "0", "gpu": "0", "uuid": "GPU-x"}
	for name, want := range map[string]float64{"gocoll_gpu_utilization_percent": 42, "gocoll_gpu_memory_used_bytes": 1 << 30,
		"gocoll_gpu_power_watts": 71.5, "gocoll_gpu_xid_events": 2, "gocoll_gpu_lost": 0} {
		if v, ok := value(fams, name, gpu); !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
	if _, ok := value(fams, "gocoll_gpu_memory_utilization_percent", gpu); ok {
		t.Error("an unknown reading (-1) was exported")
	}
	if v, ok := value(fams, "gocoll_gpu_throttle", map[string]string{"reason": "idle"}); !ok || v != 1 {
		t.Errorf("throttle idle %v %v", v, ok)
	}

	e := metrics.New(metrics.Options{GPUTimeout: 200 * time.Millisecond})
	metrics.RegisterGPUSource(func(ctx context.Context) ([]metrics.GPUReading, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	if err := e.Start(dispatcher.MetricsProcess{Rank: 3}); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// The source returns only when its ctx ends: the scrape returning at
	// all is the bound at work.
	fams = scrape(t, e.Handler())
	if _, ok := fams["gocoll_gpu_utilization_percent"]; ok {
		t.Error("GPU series from a source that failed")
	}
}

// Without NVML (CI, this machine: no libnvidia-ml), the default source
// exports no GPU series and says why in one line at info level; later
// scrapes say it at debug level only.
func TestNoNVML(t *testing.T) {
	if _, err := metrics.NVMLSource(context.Background()); err == nil {
		t.Skip("NVML is available here")
	}
	logs := captureLogs(t)
	e := metrics.New(metrics.Options{Logger: slog.New(logs)})
	if err := e.Start(dispatcher.MetricsProcess{Rank: 0}); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for range 3 {
		for name := range scrape(t, e.Handler()) {
			if strings.HasPrefix(name, "gocoll_gpu_") {
				t.Errorf("GPU series %s without NVML", name)
			}
		}
	}
	n := 0
	for _, r := range logs.all() {
		if r["msg"] == "gocoll metrics: no GPU gauges" && r["level"] == "INFO" && strings.Contains(r["err"], "NVML unavailable") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d info lines about the missing NVML, want 1: %v", n, logs.all())
	}
}

// A follower parks after a while without ops; the next op wakes it and
// is counted, with its latency (every op timed here).
func TestFollowerParksAndWakes(t *testing.T) {
	pgs, exps := initRanks(t, 2, dispatcher.Config{}, metrics.Options{TimeEvery: 1})
	allreduce := func() {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for r, pg := range pgs {
			wg.Go(func() {
				w, err := pg.Allreduce(context.Background(), []*tensor.Tensor{tensor.New(tensor.Float32, 256)}, backend.AllreduceOptions{})
				if err == nil {
					err = w.Wait(context.Background())
				}
				errs[r] = err
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	labels := map[string]string{"rank": "0", "op": "allreduce"}
	for want := 1.0; want <= 2; want++ {
		allreduce()
		eventually(t, exps[0].Handler(), "allreduce counted", func(f map[string]*dto.MetricFamily) bool {
			c, _ := value(f, "gocoll_ops_completed_total", labels)
			l, _ := value(f, "gocoll_op_duration_seconds", labels)
			return c == want && l == want
		})
		time.Sleep(300 * time.Millisecond) // past the follower's idle limit: it parks
	}
}

// Works complete at issue (the nop backend of the benchmark) are counted
// issued and completed in one add, and timed from their own stamp.
func TestInlineCompletion(t *testing.T) {
	e := metrics.New(metrics.Options{TimeEvery: 2})
	pg, err := dispatcher.Init(context.Background(), dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "nopbench",
		Metrics: e, FlightRecorder: dispatcher.FlightRecorderOptions{Entries: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(context.Background())
	for range 5 {
		if _, err := pg.Allreduce(context.Background(), []*tensor.Tensor{tensor.New(tensor.Float32, 4)}, backend.AllreduceOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	fams := scrape(t, e.Handler())
	l := map[string]string{"rank": "0", "op": "allreduce", "backend": "nopbench"}
	for name, want := range map[string]float64{"gocoll_ops_issued_total": 5, "gocoll_ops_completed_total": 5, "gocoll_op_duration_seconds": 2} {
		if v, _ := value(fams, name, l); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
}
