package dispatcher

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/frtrace"
)

// capturedWork is the Work of an op captured into a CUDA graph: any query
// of it fails the test, as a query of its event fails on the device.
type capturedWork struct {
	backend.Work // nil: every method but Captured panics
	t            *testing.T
}

func (w capturedWork) Captured() bool { return true }
func (w capturedWork) IsCompleted() bool {
	w.t.Error("the recorder polled a captured work")
	return true
}
func (w capturedWork) IsStarted() (bool, error) {
	w.t.Error("the recorder asked a captured work whether it started")
	return true, nil
}

// The flight recorder leaves a captured op alone: its entry stays
// scheduled, retired and marked captured, it is never polled, and nothing
// is dumped, however long the recorder runs (graph replays do not touch
// the Work).
func TestFlightRecorderLeavesCapturedWorksAlone(t *testing.T) {
	fr, err := newFlightRecorder(FlightRecorderOptions{DumpPrefix: filepath.Join(t.TempDir(), "fr_"), Poll: time.Millisecond}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.close()
	info := OpInfo{Group: "0", GroupDesc: "default_pg", Op: backend.OpAllgatherIntoTensor, Backend: "nccl", Seq: 7, Issued: time.Now(), Timeout: time.Second}
	fr.record(context.Background(), info, capturedWork{t: t}, nil)
	fr.mu.Lock()
	pending := fr.pending
	fr.mu.Unlock()
	if pending != 0 {
		t.Fatalf("%d pending entries: the captured work is watched", pending)
	}
	time.Sleep(20 * time.Millisecond) // many poll periods
	d := fr.Snapshot("test")
	if len(d.Entries) != 1 {
		t.Fatalf("%d entries", len(d.Entries))
	}
	e := d.Entries[0]
	if e.State != frtrace.StateScheduled || !e.Retired || !e.Captured || e.Error != "" || e.CollectiveSeqID != 7 {
		t.Fatalf("captured entry %+v", e)
	}
	if n := fr.Dumps(); n != 0 {
		t.Fatalf("%d dumps", n)
	}
	// A failed op still dumps, once.
	fail := backend.CompletedWork(8, nil, &backend.OpError{Op: "allreduce", Seq: 8, Kind: backend.ErrTimeout})
	fr.record(context.Background(), OpInfo{Group: "0", Op: backend.OpAllreduce, Seq: 8, Issued: time.Now()}, fail, nil)
	fr.record(context.Background(), OpInfo{Group: "0", Op: backend.OpAllreduce, Seq: 9, Issued: time.Now()}, fail, nil)
	deadline := time.Now().Add(10 * time.Second)
	for fr.Dumps() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	fr.refresh()
	if n := fr.Dumps(); n != 1 {
		t.Fatalf("%d dumps after two failed ops, want 1", n)
	}
}
