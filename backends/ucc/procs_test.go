package ucc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/store"
)

// inRankProcesses runs test as two processes of the test binary, one per
// rank, sharing a file store: UCC's contexts of two ranks in one process
// did not wire up reliably (the out-of-band allgather of one timed out),
// so each rank is a process, as in conformance. In a rank's process (env
// set to "RANK:STOREFILE") it calls rank and returns true; in the parent
// it skips where libucc cannot be loaded, waits for both ranks and fails
// the test with the output of any rank that did not pass, and returns
// false.
func inRankProcesses(t *testing.T, test, env string, rank func(t *testing.T, rank int, path string)) bool {
	t.Helper()
	if r, path, ok := rankOf(t, env); ok {
		rank(t, r, path)
		return true
	}
	outs, errs := spawnRanks(t, env, "-test.run", "^"+test+"$", "-test.v")
	for r := range 2 {
		if errs[r] != nil || !strings.Contains(string(outs[r]), "--- PASS: "+test) {
			t.Errorf("rank %d: %v\n%s", r, errs[r], outs[r])
		}
	}
	return false
}

// rankOf reports this process's rank and store file when it is a rank
// process of spawnRanks (env set).
func rankOf(tb testing.TB, env string) (rank int, path string, ok bool) {
	v := os.Getenv(env)
	if v == "" {
		return 0, "", false
	}
	r, path, _ := strings.Cut(v, ":")
	n, err := strconv.Atoi(r)
	if err != nil {
		tb.Fatalf("%s=%q", env, v)
	}
	return n, path, true
}

// spawnRanks runs the test binary twice with args, as ranks 0 and 1 (env
// set to "RANK:STOREFILE", a file store in a fresh directory), and returns
// their combined output and exit errors. It skips where libucc cannot be
// loaded.
func spawnRanks(tb testing.TB, env string, args ...string) (outs [][]byte, errs []error) {
	tb.Helper()
	if err := Load(); err != nil {
		tb.Skipf("libucc cannot be loaded here (%v); the ucc conformance run in the sid root covers the backend", err)
	}
	path := filepath.Join(tb.TempDir(), "store")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	outs, errs = make([][]byte, 2), make([]error, 2)
	for r := range 2 {
		cmd := exec.CommandContext(ctx, os.Args[0], args...)
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%s", env, r, path))
		wg.Go(func() { outs[r], errs[r] = cmd.CombinedOutput() })
	}
	wg.Wait()
	return outs, errs
}

// rankBackend opens the file store at path and a 2-rank shm-fingerprint
// ucc backend on it for one rank of an inRankProcesses test; both close
// when the test ends.
func rankBackend(t testing.TB, rank int, path, desc string, timeout time.Duration) (*store.FileStore, *Backend) {
	t.Helper()
	return rankBackendWith(t, rank, path, desc, timeout, &Options{Fingerprints: FingerprintsShm})
}

// rankBackendWith is rankBackend with the backend's options.
func rankBackendWith(t testing.TB, rank int, path, desc string, timeout time.Duration, opts *Options) (*store.FileStore, *Backend) {
	t.Helper()
	st, err := store.NewFileStore(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	be, err := New(ctx, backend.Config{Store: st, Rank: rank, WorldSize: 2, GroupName: "0", GroupDesc: desc,
		Timeout: timeout, Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	b := be.(*Backend)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		_ = b.Close(cctx)
	})
	return st, b
}
