package ucc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/ucc"
	"github.com/gocoll/gocoll/tensor"
)

// BenchmarkAllreduce is the backend's own cost per op, beside its peer in
// the same run: an allreduce (float32 SUM, in place) issued and waited
// through the backend ("backend"; "backend-wait" as the dispatcher's
// blocking forms issue it: Meta.Waited, Wait, Release), and the same UCC calls made by a C loop
// on the same team with nothing of the backend in between ("raw"), as
// cmd/conftest/benchc/ucc-bench-raw.c makes them, and that loop called
// from Go once per op ("raw-each": the cgo crossing's own cost). One rank
// (UCC's self transport): what is left is the issue path, the Work and the
// wait, not the wire; BenchmarkTwoRanks8B and `conftest bench` measure two
// ranks. Run it in the sid root:
//
//	GOCOLL_UCC_TEST_RACE=0 scripts/ucc-test.sh ./backends/ucc -test.run '^$' -test.bench Allreduce -test.benchmem
func BenchmarkAllreduce(b *testing.B) {
	be := group(b, 1)[0] // its Config.Timeout (a minute) is every op's, as the dispatcher passes the group's
	ctx := context.Background()
	for _, size := range []int{8, 64 << 10} {
		t := tensor.New(tensor.Float32, size/4)
		t.Fill(1)
		ts := []*tensor.Tensor{t}
		b.Run(fmt.Sprintf("%dB/backend", size), func(b *testing.B) {
			b.ReportAllocs()
			seq := uint64(0)
			for b.Loop() {
				seq++
				w, err := be.Allreduce(ctx, backend.Meta{Op: backend.OpAllreduce, Seq: seq, Timeout: time.Minute}, ts, backend.AllreduceOptions{})
				if err != nil {
					b.Fatal(err)
				}
				if err := w.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("%dB/backend-wait", size), func(b *testing.B) {
			b.ReportAllocs()
			seq := uint64(0)
			for b.Loop() {
				seq++
				w, err := be.Allreduce(ctx, backend.Meta{Op: backend.OpAllreduce, Seq: seq, Timeout: time.Minute, Waited: true}, ts, backend.AllreduceOptions{})
				if err != nil {
					b.Fatal(err)
				}
				if err := w.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				w.(backend.Releaser).Release()
			}
		})
		b.Run(fmt.Sprintf("%dB/raw", size), func(b *testing.B) {
			b.ReportAllocs()
			if err := ucc.RawAllreduce(be, t.Bytes(), b.N, false); err != nil {
				b.Fatal(err)
			}
		})
		b.Run(fmt.Sprintf("%dB/raw-each", size), func(b *testing.B) {
			b.ReportAllocs()
			if err := ucc.RawAllreduce(be, t.Bytes(), b.N, true); err != nil {
				b.Fatal(err)
			}
		})
	}
}
