package main

// The pure parts of `conftest bench overlap`: its flags and their checks,
// the overlap figure, medians, and the Chrome-trace JSON of the streams.
// Nothing here touches a GPU, so CI tests all of it.

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// killers are the overlap killers, in the article's order, with what each
// does between the async allreduce's issue and the GEMM's.
var killers = []struct{ name, help string }{
	{"none", "nothing: the allreduce runs on the internal stream while the GEMM runs on the current one; both should be close to max(gemm, ar)"},
	{"item", "a device-to-pageable-host copy of 4 bytes on the current stream (PyTorch's .item(), .cpu(), print): the host blocks until the current stream drains, so the GEMM is queued late"},
	{"early_wait", "Wait right after the issue: the current stream waits for the allreduce's end event, so the GEMM runs after it; the host does not block, the GPU serialises"},
	{"sync", "a device synchronisation (cuCtxSynchronize, torch.cuda.synchronize()): the host waits for every stream, the allreduce included, before it queues the GEMM"},
	{"frag", "allocator pressure: 48 blocks of 1-13 MiB and one of 200 MiB are taken with cuMemAlloc and given back with cuMemFree, as PyTorch's caching allocator does when a request forces it to release cached blocks (release_cached_blocks, cudaFree); cuMemFree waits for the device, so the GEMM is queued after the allreduce"},
}

// killerNames lists the killer names.
func killerNames() []string {
	out := make([]string, len(killers))
	for i, k := range killers {
		out[i] = k.name
	}
	return out
}

// overlapFlags are the flags of `conftest bench overlap`.
type overlapFlags struct {
	nproc        int
	sizeMB       float64
	gemm         int
	iters        int
	warmup       int
	killers      []string // parsed from --killer
	highPriority bool
	minCTAs      int
	maxCTAs      int
	traceDir     string
	child        bool // a rank process started by the launcher
}

// parseOverlapFlags parses and checks the flags; errors name the flag.
func parseOverlapFlags(args []string, out io.Writer) (*overlapFlags, error) {
	fs := flag.NewFlagSet("conftest bench overlap", flag.ContinueOnError)
	fs.SetOutput(out)
	f := &overlapFlags{}
	killer := fs.String("killer", "all", "the overlap killers to run, comma-separated, or all: "+strings.Join(killerNames(), ", "))
	fs.IntVar(&f.nproc, "nproc", 1, "number of ranks, one GPU each (LOCAL_RANK); rank processes are started as torchrun starts them")
	fs.Float64Var(&f.sizeMB, "size-mb", 25, "allreduce message in MiB, float32 (25: a DDP bucket)")
	fs.IntVar(&f.gemm, "gemm", 8192, "GEMM side n: an n x n by n x n bf16 matrix product (cuBLAS, float32 accumulation)")
	fs.IntVar(&f.iters, "iters", 20, "timed iterations of each of gemm, ar and both; each figure is their median")
	fs.IntVar(&f.warmup, "warmup", 5, "untimed iterations before each series")
	fs.BoolVar(&f.highPriority, "high-priority", false, "run NCCL's internal stream at the device's greatest priority (TORCH_NCCL_HIGH_PRIORITY=1): freed SMs go to the allreduce's blocks first")
	fs.IntVar(&f.minCTAs, "min-ctas", 0, "NCCL minCTAs in the communicator's config (NCCL_MIN_CTAS); 0 is NCCL's choice")
	fs.IntVar(&f.maxCTAs, "max-ctas", 0, "NCCL maxCTAs in the communicator's config (NCCL_MAX_CTAS): fewer blocks for the allreduce leaves more SMs to the GEMM; 0 is NCCL's choice")
	fs.StringVar(&f.traceDir, "trace", "", "write DIR/overlap_<killer>_rank<r>.json, a Chrome trace (Perfetto, chrome://tracing) of four both-iterations: the current stream's GEMM, the internal stream's allreduce (intervals from events) and the host's calls")
	fs.BoolVar(&f.child, "rank-child", false, "internal: this process is one rank started by the launcher")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: conftest bench overlap [flags]

The article's overlap_bench (section 10.4) in Go, on the nccl backend: a bf16
GEMM on the current stream (cuBLAS, dlopen'd from the CUDA toolkit:
GOCOLL_CUBLAS_LIBRARY, else libcublas.so.13/.12 or /usr/local/cuda) and an
async allreduce (float32 SUM) on NCCL's internal stream. For each killer,
each rank prints gemm_ms (the GEMM alone), ar_ms (the allreduce alone, sync
mode), both_ms (allreduce issued async, the killer, the GEMM, Wait), each the
median of --iters event-timed iterations with no synchronisation inside a
series, and overlap = (gemm + ar - both) / min(gemm, ar): 1 is full overlap,
0 serial, below 0 worse than serial. Then four traced iterations give
order (whether the first GEMM and allreduce intersected on the GPU) and gap
(the median idle time of the current stream between one GEMM's end and the
next one's start: the host stall a killer causes shows up there). With one
rank NCCL's allreduce is a local copy (or nothing, in place), so ar_ms is
tiny and the overlap figure means little: read both_ms against gemm_ms, and
gap.

Killers (between the allreduce's issue and the GEMM's):
`)
		for _, k := range killers {
			fmt.Fprintf(fs.Output(), "  %-10s %s\n", k.name, k.help)
		}
		fmt.Fprint(fs.Output(), "\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("bench overlap: unexpected argument %q", fs.Arg(0))
	}
	ks, err := parseKillers(*killer)
	if err != nil {
		return nil, err
	}
	f.killers = ks
	switch {
	case f.nproc < 1:
		return nil, fmt.Errorf("bench overlap: --nproc %d must be at least 1", f.nproc)
	case !(f.sizeMB > 0) || math.IsInf(f.sizeMB, 0) || f.sizeMB*(1<<20) < 4:
		return nil, fmt.Errorf("bench overlap: --size-mb %g must be positive (at least one float32)", f.sizeMB)
	case f.gemm < 16 || f.gemm%16 != 0:
		return nil, fmt.Errorf("bench overlap: --gemm %d must be a positive multiple of 16", f.gemm)
	case f.gemm > 32768:
		return nil, fmt.Errorf("bench overlap: --gemm %d is above 32768 (three such bf16 matrices take %d GiB)", f.gemm, 3*f.gemm*f.gemm*2>>30)
	case f.iters < 1:
		return nil, fmt.Errorf("bench overlap: --iters %d must be at least 1", f.iters)
	case f.warmup < 0:
		return nil, fmt.Errorf("bench overlap: --warmup %d must not be negative", f.warmup)
	case f.minCTAs < 0 || f.maxCTAs < 0:
		return nil, fmt.Errorf("bench overlap: --min-ctas %d and --max-ctas %d must not be negative", f.minCTAs, f.maxCTAs)
	case f.minCTAs > 0 && f.maxCTAs > 0 && f.minCTAs > f.maxCTAs:
		return nil, fmt.Errorf("bench overlap: --min-ctas %d is above --max-ctas %d", f.minCTAs, f.maxCTAs)
	}
	return f, nil
}

// parseKillers reads "all" or a comma-separated list of killer names.
func parseKillers(s string) ([]string, error) {
	if strings.TrimSpace(s) == "all" {
		return killerNames(), nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(killerNames(), k) {
			return nil, fmt.Errorf("bench overlap: unknown killer %q (have %s, or all)", k, strings.Join(killerNames(), ", "))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

// overlapRatio is the article's overlap = (gemm + ar - both) / min(gemm, ar):
// 1 when both takes max(gemm, ar), 0 when it takes gemm + ar.
func overlapRatio(gemm, ar, both float64) (float64, error) {
	m := math.Min(gemm, ar)
	if !(m > 0) || !(both > 0) || math.IsInf(gemm+ar+both, 0) {
		return 0, fmt.Errorf("overlap of gemm %g ms, ar %g ms, both %g ms: every time must be positive and finite", gemm, ar, both)
	}
	return (gemm + ar - both) / m, nil
}

// medianOf returns the median of xs without changing it.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// span is one interval of a trace track, in microseconds from the trace's
// origin.
type span struct {
	track      int // index into traceFile.tracks
	name       string
	start, dur float64
	args       map[string]any
}

// traceFile is a Chrome trace of one rank: its tracks (rows) and spans.
type traceFile struct {
	rank   int
	tracks []string
	spans  []span
	meta   map[string]any
}

// chromeEvent is one entry of the Chrome trace event format's traceEvents.
type chromeEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  float64        `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// chromeTrace is the file's object form.
type chromeTrace struct {
	TraceEvents     []chromeEvent  `json:"traceEvents"`
	DisplayTimeUnit string         `json:"displayTimeUnit"`
	OtherData       map[string]any `json:"otherData,omitempty"`
}

// marshal writes the trace as Chrome-trace JSON: one process per rank, one
// thread per track (named by metadata events), each span a complete ("X")
// event. It refuses spans that name no track or have a negative or
// non-finite time, so that a broken measurement never makes a file that
// looks right.
func (t *traceFile) marshal() ([]byte, error) {
	ct := chromeTrace{DisplayTimeUnit: "ms", OtherData: t.meta}
	ct.TraceEvents = append(ct.TraceEvents, chromeEvent{Name: "process_name", Ph: "M", Pid: t.rank, Args: map[string]any{"name": fmt.Sprintf("rank %d", t.rank)}})
	for i, name := range t.tracks {
		ct.TraceEvents = append(ct.TraceEvents,
			chromeEvent{Name: "thread_name", Ph: "M", Pid: t.rank, Tid: i, Args: map[string]any{"name": name}},
			chromeEvent{Name: "thread_sort_index", Ph: "M", Pid: t.rank, Tid: i, Args: map[string]any{"sort_index": i}})
	}
	var errs []error
	for _, s := range t.spans {
		switch {
		case s.track < 0 || s.track >= len(t.tracks):
			errs = append(errs, fmt.Errorf("span %q names track %d of %d", s.name, s.track, len(t.tracks)))
			continue
		case math.IsNaN(s.start) || math.IsInf(s.start, 0) || math.IsNaN(s.dur) || math.IsInf(s.dur, 0) || s.dur < 0:
			errs = append(errs, fmt.Errorf("span %q has start %g us and duration %g us", s.name, s.start, s.dur))
			continue
		}
		ct.TraceEvents = append(ct.TraceEvents, chromeEvent{Name: s.name, Cat: t.tracks[s.track], Ph: "X", Ts: s.start, Dur: s.dur, Pid: t.rank, Tid: s.track, Args: s.args})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("trace of rank %d: %w", t.rank, err)
	}
	return json.MarshalIndent(ct, "", " ")
}

// traceIters is how many both-iterations a trace holds.
const traceIters = 4

// gemmGaps returns the idle time between each GEMM's end and the next
// one's start, from [start, end] intervals in issue order.
func gemmGaps(gemms [][2]float64) []float64 {
	var out []float64
	for i := 1; i < len(gemms); i++ {
		out = append(out, gemms[i][0]-gemms[i-1][1])
	}
	return out
}

// overlapOrder says how the GEMM and the allreduce of one traced iteration
// lie on the GPU: "overlapped" when their intervals intersect, else
// "serial" (and which ran first).
func overlapOrder(gemmStart, gemmEnd, arStart, arEnd float64) string {
	if gemmStart < arEnd && arStart < gemmEnd {
		return "overlapped"
	}
	if gemmStart >= arEnd {
		return "serial (gemm after ar)"
	}
	return "serial (ar after gemm)"
}
