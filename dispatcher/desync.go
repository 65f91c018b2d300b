package dispatcher

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/frtrace"
)

// ProgressInterval is how often a rank publishes its progress (the last
// collective it enqueued and completed, per group) to the store, for the
// desync report. A rank publishes only when the numbers moved.
const ProgressInterval = time.Second

func progressKey(rank int) string { return "progress/" + strconv.Itoa(rank) }

// progress is what one rank publishes for one group.
type progress struct{ enqueued, completed int64 }

func (p progress) encode() []byte { return fmt.Appendf(nil, "%d,%d", p.enqueued, p.completed) }

func decodeProgress(b []byte) (progress, error) {
	e, c, ok := strings.Cut(string(b), ",")
	var p progress
	var err1, err2 error
	p.enqueued, err1 = strconv.ParseInt(e, 10, 64)
	p.completed, err2 = strconv.ParseInt(c, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return p, fmt.Errorf("malformed progress %q", b)
	}
	return p, nil
}

// current returns this rank's progress in the group: enqueued from the
// dispatcher's counter, completed from the flight recorder (-1 without it).
func (pg *ProcessGroup) current() progress {
	p := progress{enqueued: int64(pg.collSeq.Load()), completed: -1}
	if fr := pg.recorder; fr != nil {
		fr.mu.Lock()
		if st := fr.status[pg.name]; st != nil {
			p.completed = st.LastCompleted
		}
		fr.mu.Unlock()
	}
	return p
}

// publishProgress writes pg's progress to its store when it moved since
// last time.
func (pg *ProcessGroup) publishProgress(ctx context.Context) {
	pg.pubMu.Lock()
	defer pg.pubMu.Unlock()
	p := pg.current()
	if p == pg.published {
		return
	}
	if err := pg.store.Set(ctx, progressKey(pg.rank), p.encode()); err == nil {
		pg.published = p
	}
}

// publisher publishes the progress of every group of the process until stop
// is closed.
func (root *ProcessGroup) publisher(stop <-chan struct{}) {
	t := time.NewTicker(ProgressInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		root.mu.Lock()
		groups := append([]*ProcessGroup(nil), root.groups...)
		root.mu.Unlock()
		for _, g := range groups {
			ctx, cancel := context.WithTimeout(context.Background(), ProgressInterval)
			g.publishProgress(ctx)
			cancel()
		}
	}
}

// Desync explains a timed-out collective op seq of this group: it
// publishes this rank's progress, reads every rank's from the store and
// returns the ranks that never enqueued it (or, when all did, those that
// never completed it), with a sentence such as
//
//	rank 1 never enqueued allreduce seq 42 (its last was 41); ranks 0,2,3 did
//
// A rank that published nothing is reported as never having started.
// Backends get this function in backend.Config.Desync.
//
// It returns when ctx ends even if the store has not answered (a store
// across a cut link, a store call of the publisher or the heartbeat
// monitor ahead of it on the connection), saying that the report is
// unavailable: the backend is failing an op, and its caller should get the
// error within the time the backend gave the diagnosis.
func (pg *ProcessGroup) Desync(ctx context.Context, op backend.Op, seq uint64) ([]int, string) {
	type report struct {
		late   []int
		detail string
	}
	done := make(chan report, 1)
	go func() {
		late, detail := pg.desync(ctx, op, seq)
		done <- report{late, detail}
	}()
	select {
	case r := <-done:
		return r.late, r.detail
	case <-ctx.Done():
		return nil, fmt.Sprintf("desync report unavailable: the store did not answer in time: %v", ctx.Err())
	}
}

// desync is Desync's work: every store call in it ends with ctx, but it may
// first wait for a call of another goroutine on the same connection.
func (pg *ProcessGroup) desync(ctx context.Context, op backend.Op, seq uint64) ([]int, string) {
	pg.publishProgress(ctx)
	var never, notDone, did []int
	last := map[int]int64{}
	for r := range pg.size {
		var p progress
		if r == pg.rank {
			p = pg.current()
		} else {
			ok, err := pg.store.Check(ctx, progressKey(r))
			if err != nil {
				return nil, fmt.Sprintf("desync report unavailable: %v", err)
			}
			p = progress{enqueued: 0, completed: -1}
			if ok {
				b, err := pg.store.Get(ctx, progressKey(r))
				if err != nil {
					return nil, fmt.Sprintf("desync report unavailable: %v", err)
				}
				if p, err = decodeProgress(b); err != nil {
					return nil, fmt.Sprintf("desync report unavailable: rank %d: %v", r, err)
				}
			}
		}
		last[r] = p.enqueued
		switch {
		case p.enqueued < int64(seq):
			never = append(never, r)
		case p.completed >= 0 && p.completed < int64(seq):
			notDone = append(notDone, r)
			did = append(did, r)
		default:
			did = append(did, r)
		}
	}
	if len(never) > 0 {
		var lasts []string
		for _, r := range never {
			lasts = append(lasts, strconv.FormatInt(last[r], 10))
		}
		return never, fmt.Sprintf("%s never enqueued %s seq %d (last enqueued: %s); %s did",
			frtrace.RankList(never), op, seq, strings.Join(lasts, ","), frtrace.RankList(did))
	}
	if len(notDone) > 0 && len(notDone) < pg.size {
		return notDone, fmt.Sprintf("every rank enqueued %s seq %d; %s had not completed it", op, seq, frtrace.RankList(notDone))
	}
	return nil, fmt.Sprintf("every rank enqueued %s seq %d", op, seq)
}
