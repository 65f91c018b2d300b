package conformance_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive // Ginkgo's DSL
	. "github.com/onsi/gomega"    //nolint:revive // Gomega's DSL

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/tensor"
)

// envRank makes the test binary a rank process when Launch re-executes it.
const envRank = "GOCOLL_CONFTEST_TEST_RANK"

// envPlant makes the rank processes add the planted specs and run only
// them and a few others (TestFailedSpecResyncs).
const envPlant = "GOCOLL_CONFTEST_TEST_PLANT"

func TestMain(m *testing.M) {
	conformance.RunChild() // a failure spec's child process: runs and exits
	if os.Getenv(envRank) == "1" {
		cfg := conformance.RankConfig{
			Backend:        "cpupool",
			Timeout:        20 * time.Second,
			BackendOptions: map[string]any{"cpupool": &cpupool.Options{Threads: 8}},
		}
		if os.Getenv(envPlant) == "1" {
			conformance.Define(definePlanted)
			cfg.Focus = []string{"planted|reductions allreduce float32"}
		}
		conformance.Main(cfg)
	}
	os.Exit(m.Run())
}

// definePlanted declares specs that fail on rank 1 only, where its peers
// then wait for it: in a collective rank 1 never issues, and at a Sync it
// never reaches. A third spec checks that the group works afterwards.
func definePlanted(s *conformance.Suite) {
	Describe("planted", func() {
		It("planted: rank 1 fails while its peers wait for its collective", func() {
			if s.Rank == 1 {
				Fail("planted failure")
			}
			t := s.Tensor(tensor.Float32, []float64{1})
			s.Done(s.PG.Allreduce(context.Background(), []*tensor.Tensor{t}, backend.AllreduceOptions{}))
		})
		It("planted: rank 1 fails before a Sync its peers reach", func() {
			if s.Rank == 1 {
				Fail("planted failure")
			}
			Expect(s.Sync()).To(Succeed())
		})
		It("planted: after the failures, the ranks are in step and the group works", func() {
			t := s.Tensor(tensor.Float32, []float64{float64(s.Rank)})
			s.Done(s.PG.Allreduce(context.Background(), []*tensor.Tensor{t}, backend.AllreduceOptions{}))
			Expect(s.Values(t)).To(Equal([]float64{float64(s.Size * (s.Size - 1) / 2)}))
			Expect(s.Sync()).To(Succeed())
		})
	})
}

// TestFailedSpecResyncs: a spec that fails on one rank brings the ranks
// back in step within seconds (its peers stop waiting for that rank's
// collective, or its Sync, at once, instead of after the 20 s op timeout),
// the merged report keeps the failing rank's own message, and every spec
// is counted.
func TestFailedSpecResyncs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts rank processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := conformance.Launch(context.Background(), conformance.LaunchConfig{
		Command: []string{exe},
		Env:     append(os.Environ(), envRank+"=1", envPlant+"=1"),
		NProc:   3,
		Out:     testWriter{t},
		Timeout: 3 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	for r, c := range res.ExitCodes {
		if c != 0 && c != 1 { // 1: a spec failed on that rank, as planted
			t.Errorf("rank %d exited with status %d (a crash, or the race detector)", r, c)
		}
	}
	// 3 planted specs and allreduce float32 × SUM AVG PRODUCT MIN MAX PREMUL_SUM.
	if res.Passed != 7 || res.Failed != 2 || res.Skipped != 0 {
		t.Errorf("got %d passed, %d failed, %d skipped; want 7, 2, 0", res.Passed, res.Failed, res.Skipped)
	}
	for _, sp := range res.Report.SpecReports {
		if !sp.Failed() {
			continue
		}
		if !strings.Contains(sp.Failure.Message, "planted failure") {
			t.Errorf("%s: the merged failure is %q, not rank 1's own", sp.FullText(), sp.Failure.Message)
		}
		if sp.RunTime > 5*time.Second {
			t.Errorf("%s took %v on rank 0: its peers waited for the failed rank", sp.FullText(), sp.RunTime)
		}
	}
	if took > time.Minute {
		t.Errorf("the run took %v", took)
	}
}

// TestConformanceCPU runs the whole suite on three cpupool ranks (three:
// not a power of two, so the folding paths of the algorithms run too).
func TestConformanceCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("starts rank processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	res, err := conformance.Launch(context.Background(), conformance.LaunchConfig{
		Command: []string{exe},
		Env:     append(os.Environ(), envRank+"=1"),
		NProc:   3,
		Out:     testWriter{t},
		Timeout: 5 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK() {
		t.Fatalf("conformance failed: %d failed, exit codes %v", res.Failed, res.ExitCodes)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-min(len(p), 1)]))
	return len(p), nil
}
