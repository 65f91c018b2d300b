package ucc_test

import (
	"context"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/ucc"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// BenchmarkFingerprints is the fingerprint check's cost on the issue
// path: an 8 B allreduce issued and waited on one rank with the check on
// (publish, compare, start: fingerprint.go) and off, side by side in one
// run, taking turns. One rank has no peer to wait for:
// what is left is the board's own work per op; `scripts/ucc-fp-bench.sh`
// measures 2 ranks. Run it in the sid root:
//
//	GOCOLL_UCC_TEST_RACE=0 scripts/ucc-test.sh ./backends/ucc -test.run '^$' -test.bench Fingerprints -test.benchmem -test.count 2
func BenchmarkFingerprints(b *testing.B) {
	if err := ucc.Load(); err != nil {
		b.Skipf("libucc cannot be loaded here (%v)", err)
	}
	ctx := context.Background()
	modes := []string{ucc.FingerprintsAuto, ucc.FingerprintsOff}
	bes := make([]backend.Backend, len(modes))
	for i, mode := range modes {
		var err error
		bes[i], err = ucc.New(ctx, backend.Config{Store: store.NewHashStore(), Rank: 0, WorldSize: 1, GroupName: "0", GroupDesc: "bench",
			Timeout: time.Minute, Options: &ucc.Options{Fingerprints: mode}})
		if err != nil {
			b.Fatal(err)
		}
		defer bes[i].Close(ctx)
	}
	ts := []*tensor.Tensor{tensor.New(tensor.Float32, 2)}
	// Three rounds, the settings taking turns.
	for range 3 {
		for i, mode := range modes {
			b.Run("8B/"+mode, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					w, err := bes[i].Allreduce(ctx, backend.Meta{Op: backend.OpAllreduce}, ts, backend.AllreduceOptions{})
					if err != nil {
						b.Fatal(err)
					}
					if err := w.Wait(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
