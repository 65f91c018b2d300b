package ucc

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// twoRanksEnv marks a rank process of BenchmarkTwoRanks8B.
const twoRanksEnv = "GOCOLL_UCC_BENCH_TWO_RANKS"

// twoRanksSeries are the loops of BenchmarkTwoRanks8B, in the order each
// round runs them.
var twoRanksSeries = []string{"raw", "raw-each", "backend", "backend-async", "backend-async4", "backend-rel"}

// twoRanksSelected is twoRanksSeries, or the comma-separated series of
// GOCOLL_UCC_BENCH_SERIES (a profile of one loop, say).
func twoRanksSelected() []string {
	if v := os.Getenv("GOCOLL_UCC_BENCH_SERIES"); v != "" {
		return strings.Split(v, ",")
	}
	return twoRanksSeries
}

// BenchmarkTwoRanks8B splits the 8 B allreduce's time at two ranks, where
// the backend's distance from raw libucc is measured (issue 12): each rank
// a process (inRankProcesses says why), one team, the loops taking
// turns in rounds of GOCOLL_UCC_BENCH_OPS ops (default 200 000; the loops
// of GOCOLL_UCC_BENCH_SERIES, default all):
//   - raw: the C loop of the raw libucc peer, all ops in one cgo call;
//   - raw-each: that loop called once per op from Go, nothing else between
//     the calls: the floor of an op per crossing;
//   - backend: Allreduce with Meta.Waited, Wait and Release, as the
//     dispatcher's AllreduceWait calls them, fingerprint check on (on the
//     shared-memory board; GOCOLL_UCC_FINGERPRINTS=off turns it off);
//   - backend-async: Allreduce and Wait, the Work then dropped, as the
//     async form's caller does: its handle is garbage;
//   - backend-async4: the same with four ops in flight over four tensors
//     (conftest bench's default depth);
//   - backend-rel: Allreduce, Wait and Release: the async path with the
//     handle given back, which tells the garbage's share from the rest.
//
// Each rank also writes per loop, to stderr, its GC count and pause,
// bytes allocated per op, minor faults and involuntary context switches;
// the benchmark logs them: on two cores, a spinning
// rank that collects takes a core from its peer.
//
// At two ranks most ops complete inside their post (its progress round
// finds the peer's data there), so a rank's Go from that completion to its
// next post is on every op's path, and a CPU nanosecond there cost 1.5–3
// ns of the op's time in the session-11 runs (docs/perf.md, ucc
// "Fifteenth round"). Rank 0's median per-op time of each loop over the rounds is
// reported as ns/op-SERIES; b.N is ignored (one pair of processes). Run it
// in the sid root:
//
//	GOCOLL_UCC_TEST_RACE=0 scripts/ucc-test.sh ./backends/ucc -test.run '^$' -test.bench TwoRanks8B
func BenchmarkTwoRanks8B(b *testing.B) {
	if r, path, ok := rankOf(b, twoRanksEnv); ok {
		twoRanksRank(b, r, path)
		return
	}
	outs, errs := spawnRanks(b, twoRanksEnv, "-test.run", "^$", "-test.bench", "^BenchmarkTwoRanks8B$", "-test.benchtime", "1x")
	for r := range 2 {
		if errs[r] != nil || !strings.Contains(string(outs[r]), "PASS") {
			b.Fatalf("rank %d: %v\n%s", r, errs[r], outs[r])
		}
	}
	times := map[string][]float64{}
	for _, line := range strings.Split(string(outs[0]), "\n") {
		// "tworanks SERIES NS" lines of twoRanksRank.
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "tworanks" {
			if ns, err := strconv.ParseFloat(f[2], 64); err == nil {
				times[f[1]] = append(times[f[1]], ns)
			}
		}
	}
	for _, s := range twoRanksSelected() {
		if len(times[s]) == 0 {
			b.Fatalf("rank 0 reported no %s times:\n%s", s, outs[0])
		}
		slices.Sort(times[s])
		b.ReportMetric(times[s][len(times[s])/2], "ns/op-"+s)
	}
	for _, line := range strings.Split(string(outs[0])+string(outs[1]), "\n") {
		if strings.HasPrefix(line, "rank ") {
			b.Log(line)
		}
	}
}

// twoRanksRank is one rank of BenchmarkTwoRanks8B: it prints a line
// "tworanks SERIES NS" per loop and round.
func twoRanksRank(b *testing.B, rank int, path string) {
	// The check on the shared-memory board unless GOCOLL_UCC_FINGERPRINTS
	// says otherwise (off: the backend without it).
	fp := FingerprintsShm
	if v := os.Getenv(EnvFingerprints); v != "" {
		fp = v
	}
	_, be := rankBackendWith(b, rank, path, "two-ranks", time.Minute, &Options{Fingerprints: fp})
	ops := 200000
	if v, err := strconv.Atoi(os.Getenv("GOCOLL_UCC_BENCH_OPS")); err == nil && v > 0 {
		ops = v
	}
	ctx := context.Background()
	x := tensor.New(tensor.Float32, 2)
	xs := []*tensor.Tensor{x}
	x4 := [4][]*tensor.Tensor{xs, {tensor.New(tensor.Float32, 2)}, {tensor.New(tensor.Float32, 2)}, {tensor.New(tensor.Float32, 2)}}
	seq := uint64(0)
	// issue posts the next op on xs; waited says the caller waits at once
	// (Meta.Waited, as the blocking forms).
	issue := func(xs []*tensor.Tensor, waited bool) (backend.Work, error) {
		seq++
		return be.Allreduce(ctx, backend.Meta{Op: backend.OpAllreduce, Seq: seq, Timeout: be.cfg.Timeout, Waited: waited}, xs, backend.AllreduceOptions{})
	}
	// oneByOne is a loop of issue and Wait, with Release when release.
	oneByOne := func(waited, release bool) func(n int) error {
		return func(n int) error {
			for range n {
				w, err := issue(xs, waited)
				if err != nil {
					return err
				}
				if err := w.Wait(ctx); err != nil {
					return err
				}
				if release {
					w.(backend.Releaser).Release()
				}
			}
			return nil
		}
	}
	loops := map[string]func(n int) error{
		"raw":           func(n int) error { return be.rawAllreduce(x.Bytes(), n, false) },
		"raw-each":      func(n int) error { return be.rawAllreduce(x.Bytes(), n, true) },
		"backend":       oneByOne(true, true),
		"backend-async": oneByOne(false, false),
		"backend-rel":   oneByOne(false, true),
		"backend-async4": func(n int) error {
			var ws [4]backend.Work
			for i := range n + len(ws) {
				k := i % len(ws)
				if ws[k] != nil {
					if err := ws[k].Wait(ctx); err != nil {
						return err
					}
					ws[k] = nil
				}
				if i < n {
					w, err := issue(x4[k], false)
					if err != nil {
						return err
					}
					ws[k] = w
				}
			}
			return nil
		},
	}
	series := twoRanksSelected()
	for _, s := range series { // warm every loop up
		if err := loops[s](ops / 10); err != nil {
			b.Fatal(err)
		}
	}
	for range 3 {
		for _, s := range series {
			var m0, m1 runtime.MemStats
			var u0, u1 syscall.Rusage
			runtime.ReadMemStats(&m0)
			syscall.Getrusage(syscall.RUSAGE_SELF, &u0)
			start := time.Now()
			if err := loops[s](ops); err != nil {
				b.Fatal(err)
			}
			el := time.Since(start)
			syscall.Getrusage(syscall.RUSAGE_SELF, &u1)
			runtime.ReadMemStats(&m1)
			fmt.Printf("tworanks %s %.1f\n", s, float64(el.Nanoseconds())/float64(ops))
			fmt.Fprintf(os.Stderr, "rank %d %s: %d GCs, pause %v, %d B/op, heap %d KiB, %d minflt, %d nivcsw, released %d KiB\n", rank, s, m1.NumGC-m0.NumGC, time.Duration(m1.PauseTotalNs-m0.PauseTotalNs), (m1.TotalAlloc-m0.TotalAlloc)/uint64(ops), m1.HeapAlloc>>10, u1.Minflt-u0.Minflt, u1.Nivcsw-u0.Nivcsw, (m1.HeapReleased)>>10)
		}
	}
}
