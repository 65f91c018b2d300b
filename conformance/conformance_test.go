package conformance_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/conformance"
)

// envRank makes the test binary a rank process when Launch re-executes it.
const envRank = "GOCOLL_CONFTEST_TEST_RANK"

func TestMain(m *testing.M) {
	conformance.RunChild() // a failure spec's child process: runs and exits
	if os.Getenv(envRank) == "1" {
		conformance.Main(conformance.RankConfig{
			Backend:        "cpupool",
			Timeout:        20 * time.Second,
			BackendOptions: map[string]any{"cpupool": &cpupool.Options{Threads: 8}},
		})
	}
	os.Exit(m.Run())
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
