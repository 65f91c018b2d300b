package backend_test

import (
	"context"
	"testing"

	"github.com/gocoll/gocoll/backend"
)

// BenchmarkHostWork is the life of a host op's Work as a host backend's
// caller sees it when the op is done by the time it waits: made, started,
// completed, waited for, asked whether it completed and when; timed (the
// start's clock read too) and not.
func BenchmarkHostWork(b *testing.B) {
	for _, timed := range []bool{false, true} {
		name := "untimed"
		if timed {
			name = "timed"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for i := range b.N {
				w := backend.NewHostWork(uint64(i), timed, func(error) {})
				w.MarkStarted()
				w.Complete(nil, nil)
				if err := w.WaitHost(ctx); err != nil || !w.IsCompleted() || w.CompletedAt() == 0 {
					b.Fatal("work did not complete")
				}
			}
		})
	}
}
