package watch

import (
	"testing"
	"time"
)

// BenchmarkEnqueueRetire is the unit's share of an op's host cost: one
// Enqueue on the issuing goroutine, and its share of the driver's bulk
// Retire (every 256 ops here).
func BenchmarkEnqueueRetire(b *testing.B) {
	type work struct{ _ [64]byte }
	u := NewWatchdog[*work](Config{})
	ws := make([]*work, 256)
	for i := range ws {
		ws[i] = &work{}
	}
	done := func(*work) bool { return true }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		u.Enqueue(ws[i%256], "c0", t0, time.Second)
		if i%256 == 255 {
			u.Retire(done)
			u.Tick(t0)
		}
	}
}
