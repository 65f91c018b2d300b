package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/frtrace"
)

// TestRecorderRetiresHostWorksOnIssue: with no poll in sight (an hour),
// a host work that has completed leaves the ring's hold at the next op,
// completed with its duration and error, and one not yet complete stays
// pending until it completes; a failed one dumps, once.
func TestRecorderRetiresHostWorksOnIssue(t *testing.T) {
	fr, err := newFlightRecorder(FlightRecorderOptions{Entries: 4, DumpPrefix: t.TempDir() + "/r", Poll: time.Hour}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.close()
	fr.mu.Lock()
	fr.status["0"] = &frtrace.PGStatus{LastStarted: -1}
	fr.mu.Unlock()
	ctx := context.Background()
	info := func(seq uint64) OpInfo {
		return OpInfo{Group: "0", Op: backend.OpAllreduce, Backend: "host", Seq: seq, Peer: -1, Issued: time.Now()}
	}
	pending := func() int {
		fr.mu.Lock()
		defer fr.mu.Unlock()
		return fr.pending
	}
	slow := backend.NewHostWork(1, true, nil)
	fr.record(ctx, info(1), slow, nil)
	fr.record(ctx, info(2), backend.CompletedWork(2, nil, nil), nil)
	if n := pending(); n != 2 {
		t.Fatalf("%d pending, want 2: the first op is not complete, and the second waits behind it", n)
	}
	slow.MarkStarted()
	slow.Complete(nil, nil)
	fr.record(ctx, info(3), backend.CompletedWork(3, nil, nil), nil)
	if n := pending(); n != 1 {
		t.Fatalf("%d pending after the first op completed, want 1 (the newest, behind the scan bound)", n)
	}
	fail := backend.CompletedWork(4, nil, &backend.OpError{Op: "allreduce", Seq: 4, Kind: backend.ErrTimeout})
	fr.record(ctx, info(4), fail, nil)
	fr.record(ctx, info(5), backend.CompletedWork(5, nil, nil), nil)
	if n := pending(); n != 0 {
		t.Fatalf("%d pending, want 0", n)
	}
	d := fr.Snapshot("test")
	if len(d.Entries) != 4 {
		t.Fatalf("%d entries, want 4 (the ring's size)", len(d.Entries))
	}
	first := d.Entries[0] // seq 2; seq 1 was overwritten
	if first.CollectiveSeqID != 2 || first.State != frtrace.StateCompleted || !first.Retired || first.TimeCompletedNs < first.TimeCreatedNs {
		t.Errorf("entry of seq 2: %+v", first)
	}
	if e := d.Entries[2]; e.CollectiveSeqID != 4 || e.Error == "" || e.State != frtrace.StateCompleted {
		t.Errorf("entry of seq 4: %+v, want its timeout", e)
	}
	if st := d.PGStatus["0"]; st.LastCompleted != 5 || st.LastStarted != 5 {
		t.Errorf("status %+v, want last started and completed 5", st)
	}
	deadline := time.Now().Add(10 * time.Second)
	for fr.Dumps() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := fr.Dumps(); n != 1 {
		t.Errorf("%d dumps after a failed op, want 1", n)
	}
}

// TestRecorderLeavesDeviceWorksToThePoll: a work that is not a host work
// (no Outcome) is never queried on the issuing goroutine.
func TestRecorderLeavesDeviceWorksToThePoll(t *testing.T) {
	fr, err := newFlightRecorder(FlightRecorderOptions{Entries: 8, DumpPrefix: t.TempDir() + "/r", Poll: time.Hour}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.close()
	dev := &queryCounter{Work: backend.CompletedWork(1, nil, nil)}
	for seq := uint64(1); seq <= 4; seq++ {
		fr.record(context.Background(), OpInfo{Group: "0", Op: backend.OpAllreduce, Seq: seq, Peer: -1, Issued: time.Now()}, dev, nil)
	}
	if dev.queries != 0 {
		t.Fatalf("%d queries on the issuing goroutine", dev.queries)
	}
	fr.refresh()
	if dev.queries == 0 {
		t.Fatal("the poll did not query the works")
	}
}

// queryCounter is a Work without Outcome (not a host work) that counts
// its queries.
type queryCounter struct {
	backend.Work
	queries int
}

func (w *queryCounter) IsCompleted() bool { w.queries++; return true }

// TestRecorderRetireScanWraps: in a ring whose size is not a power of
// two, a backlog of host works that complete late (more of them than the
// ring holds, so the scan's next entry is overwritten meanwhile) is
// retired over the next ops, and the ring's slot indices (head, scanAt)
// stay nextID and scan modulo its size throughout.
func TestRecorderRetireScanWraps(t *testing.T) {
	const size = 3
	fr, err := newFlightRecorder(FlightRecorderOptions{Entries: size, DumpPrefix: t.TempDir() + "/r", Poll: time.Hour}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.close()
	ctx := context.Background()
	check := func(when string) {
		t.Helper()
		fr.mu.Lock()
		defer fr.mu.Unlock()
		if int(fr.head) != int(fr.nextID%size) || int(fr.scanAt) != int(fr.scan%size) {
			t.Fatalf("%s: head %d, scanAt %d for nextID %d, scan %d (size %d)", when, fr.head, fr.scanAt, fr.nextID, fr.scan, size)
		}
	}
	seq := uint64(0)
	record := func(w backend.Work) {
		seq++
		fr.record(ctx, OpInfo{Group: "0", Op: backend.OpAllreduce, Backend: "host", Seq: seq, Peer: -1, Issued: time.Now()}, w, nil)
	}
	var slow []*backend.HostWork
	for range 2*size + 1 {
		w := backend.NewHostWork(seq+1, false, nil)
		slow = append(slow, w)
		record(w)
		check("backlog")
	}
	fr.mu.Lock()
	if fr.pending != size {
		t.Fatalf("%d pending, want %d (the ring's size: the rest were overwritten)", fr.pending, size)
	}
	fr.mu.Unlock()
	for _, w := range slow {
		w.Complete(nil, nil)
	}
	for range size {
		record(backend.CompletedWork(seq+1, nil, nil))
		check("draining")
	}
	fr.mu.Lock()
	pending := fr.pending
	fr.mu.Unlock()
	if pending != 0 {
		t.Fatalf("%d pending after %d ops behind the completed backlog, want 0", pending, size)
	}
	d := fr.Snapshot("test")
	for i, e := range d.Entries {
		if want := seq - size + 1 + uint64(i); e.CollectiveSeqID != want || e.State != frtrace.StateCompleted || !e.Retired {
			t.Errorf("entry %d: seq %d, state %s, retired %v; want seq %d, completed and retired", i, e.CollectiveSeqID, e.State, e.Retired, want)
		}
	}
}

// queriedWork is a host work whose IsCompleted, as a refresh calls it
// outside the recorder's lock, reports the call on queried and then
// blocks until release is closed.
type queriedWork struct {
	*backend.HostWork
	queried, release chan struct{}
}

func (w *queriedWork) IsCompleted() bool {
	w.queried <- struct{}{}
	<-w.release
	return w.HostWork.IsCompleted()
}

// TestRetireLeavesWorksARefreshQueries: while a refresh queries the works
// outside the recorder's lock, a blocking op's retire declines (the
// dispatcher then keeps its Work rather than hand it back for reuse under
// the query); once the refresh is done, the entry is retired.
func TestRetireLeavesWorksARefreshQueries(t *testing.T) {
	fr, err := newFlightRecorder(FlightRecorderOptions{Entries: 4, DumpPrefix: t.TempDir() + "/r", Poll: time.Hour}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.close()
	w := &queriedWork{HostWork: backend.NewHostWork(1, true, nil), queried: make(chan struct{}), release: make(chan struct{})}
	s := fr.record(context.Background(), OpInfo{Group: "0", Op: backend.OpAllreduce, Backend: "host", Seq: 1, Peer: -1, Issued: time.Now()}, w, nil)
	done := make(chan error)
	go func() { done <- fr.refresh() }()
	<-w.queried // the refresh holds the work, outside fr.mu
	w.MarkStarted()
	w.Complete(nil, nil)
	if fr.retire(s) {
		t.Fatal("retire let go of a work while a refresh was querying it")
	}
	close(w.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !fr.retire(s) {
		t.Fatal("retire kept the work after the refresh had retired its entry")
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fe := &fr.ring[s.at]; fe.ho != nil || fe.work != nil || fe.m.state() != frCompleted || fr.pending != 0 {
		t.Fatalf("entry after the refresh: state %v, ho %v, work %v, %d pending; want completed, no work held, 0 pending", fe.m.state(), fe.ho, fe.work, fr.pending)
	}
}
