package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
)

// slowWork is a Work whose completion query blocks until gate closes, as a
// cgo event query stalls under a busy driver.
type slowWork struct {
	backend.Work
	entered chan struct{}
	gate    chan struct{}
}

func (w *slowWork) IsCompleted() bool {
	select {
	case w.entered <- struct{}{}:
	default:
	}
	<-w.gate
	return true
}
func (w *slowWork) IsStarted() (bool, error)         { return false, backend.ErrNoTiming }
func (w *slowWork) Duration() (time.Duration, error) { return 0, backend.ErrNoTiming }
func (w *slowWork) Exception() error                 { return nil }

// TestRecordDoesNotWaitForRefresh: the recorder queries works outside its
// lock, so an op is recorded while a sweep is stuck in a query; and the
// entries keep their profiling names, built only at the snapshot.
func TestRecordDoesNotWaitForRefresh(t *testing.T) {
	fr, err := newFlightRecorder(FlightRecorderOptions{Entries: 8, DumpPrefix: t.TempDir() + "/r", Poll: time.Hour}, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.close()
	ctx := context.Background()
	info := func(seq uint64, op backend.Op, peer int) OpInfo {
		return OpInfo{Group: "0", GroupDesc: "default_pg", GroupSize: 2, Op: op, Backend: "slow", Seq: seq, CollSeq: seq, Peer: peer, Timeout: time.Second, Issued: time.Now()}
	}
	slow := &slowWork{Work: backend.CompletedWork(1, nil, nil), entered: make(chan struct{}, 1), gate: make(chan struct{})}
	fr.record(ctx, info(1, backend.OpAllreduce, -1), slow, nil)
	swept := make(chan error)
	go func() { swept <- fr.refresh() }()
	<-slow.entered
	recorded := make(chan struct{})
	go func() {
		fr.record(ctx, info(1, backend.OpSend, 1), backend.CompletedWork(1, nil, nil), nil)
		close(recorded)
	}()
	select {
	case <-recorded:
	case <-time.After(10 * time.Second):
		close(slow.gate)
		t.Fatal("record waited for a refresh stuck in a work's query")
	}
	close(slow.gate)
	if err := <-swept; err != nil {
		t.Fatal(err)
	}
	d := fr.Snapshot("test")
	if len(d.Entries) != 2 {
		t.Fatalf("%d entries, want 2", len(d.Entries))
	}
	if e := d.Entries[0]; e.ProfilingName != "slow:all_reduce" || !e.Retired || e.State != "completed" {
		t.Errorf("first entry %q retired %v state %q; want slow:all_reduce, retired, completed", e.ProfilingName, e.Retired, e.State)
	}
	if e := d.Entries[1]; e.ProfilingName != "slow:send 0->1" {
		t.Errorf("second entry %q, want slow:send 0->1", e.ProfilingName)
	}
}
