package cpupool

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/watch"
)

// DiagnosisBudget bounds the diagnosis of a collective that ran out of
// time: the peers' answers to a probe and the store's desync report, asked
// for at the same time. The op's error waits for them, so it comes at most
// this long (plus the local flight-recorder dump and the dispatcher's
// bounded wait for the dump signal) after the op's timeout. A peer or a
// store that has not answered by then, as across a cut link, counts as
// silent: the peer is named late, the desync report is unavailable. Live
// peers and a live store answer within a round trip, even on a busy host.
const DiagnosisBudget = 500 * time.Millisecond

// explainTimeout fills in the ranks and the detail of a collective that
// ran out of time, from the peers' answers to a probe (the ranks that had
// not issued it, or did not answer) and the dispatcher's desync report
// (the store knows what each rank enqueued and completed; its ranks count
// when the peers named none), both within DiagnosisBudget; then performs
// what the watch unit decides for the timeout: a dump of every rank's
// flight recorder, once per backend, as for the nccl watchdog.
func (b *Backend) explainTimeout(e *backend.OpError, j *job) {
	ctx, cancel := context.WithTimeout(context.Background(), DiagnosisBudget)
	defer cancel()
	type report struct {
		late     []int
		sentence string
	}
	var desync chan report
	if b.cfg.Desync != nil && e.Seq > 0 && j.op.Info().Kind != backend.P2P {
		desync = make(chan report, 1)
		go func() {
			late, sentence := b.cfg.Desync(ctx, j.op, e.Seq)
			desync <- report{late, sentence}
		}()
	}
	e.Ranks = b.lateRanks(ctx, j)
	if len(e.Ranks) > 0 {
		e.Detail = "ranks that never joined (found by asking each peer how many collectives it issued)"
	}
	if desync != nil {
		var r report
		select {
		case r = <-desync:
		default:
			select {
			case r = <-desync:
			case <-ctx.Done():
				r.sentence = "desync report unavailable: the store did not answer within " + DiagnosisBudget.String()
			}
		}
		if len(e.Ranks) == 0 {
			e.Ranks = r.late
		}
		if r.sentence != "" {
			e.Detail = strings.TrimSuffix(r.sentence+"; "+e.Detail, "; ")
		}
	}
	b.wdMu.Lock()
	acts := b.wd.Report(watch.Failure[*job]{Kind: watch.Timeout, Work: j, Elapsed: j.timeout})
	b.wdMu.Unlock()
	for _, a := range acts {
		switch a.Kind {
		case watch.Dump:
			if path := b.cfg.DumpAll(e.Error()); path != "" {
				e.Detail += "; flight recorder dump: " + path
			}
		case watch.Fail:
			// e is the job's error: runJob completes the work with it.
			slog.Error("gocoll cpupool: op failed", "group", b.cfg.GroupDesc, "rank", b.cfg.Rank, "seq", j.seq, "op", j.op.String(), "err", e)
		}
	}
}

// lateRanks asks every peer how many collectives it has issued and blames
// those whose answers (or silence, when ctx ends) make them late for j
// (see blame). P2P ops name their peer instead (peer holds it). It returns
// when ctx ends even if a probe is still stuck (behind a write to its
// peer, say).
func (b *Backend) lateRanks(ctx context.Context, j *job) []int {
	if j.tag == 0 || j.tag >= p2pBit {
		if j.tag >= p2pBit && j.peer >= 0 {
			return []int{j.peer}
		}
		return nil
	}
	type answer struct {
		peer int
		st   peerState
	}
	answers := make(chan answer, b.cfg.WorldSize)
	states := make([]peerState, b.cfg.WorldSize)
	states[b.cfg.Rank] = peerState{answered: true, issued: j.tag}
	asked := 0
	for p := range b.cfg.WorldSize {
		if p == b.cfg.Rank {
			continue
		}
		asked++
		go func() {
			v, err := b.mesh.Probe(ctx, p)
			answers <- answer{p, peerState{answered: err == nil, issued: v &^ probeBusy, busy: v&probeBusy != 0}}
		}()
	}
wait:
	for range asked {
		select {
		case a := <-answers:
			states[a.peer] = a.st
		case <-ctx.Done():
			// Time is up: take the answers already in; the rest stay
			// unanswered.
			for {
				select {
				case a := <-answers:
					states[a.peer] = a.st
				default:
					break wait
				}
			}
		}
	}
	return blame(j.tag, states)
}

// probeBusy is the bit of a probe's answer that says the peer has a
// collective of its own in flight; the other bits count the collectives it
// issued (probeValue).
const probeBusy = 1 << 63

// probeValue is this rank's answer to a peer's probe.
func (b *Backend) probeValue() uint64 {
	// issued first: a collective issued after the load and ended before
	// the next one cannot make an idle rank look busy.
	v := b.issued.Load()
	if b.ended.Load() < v {
		v |= probeBusy
	}
	return v
}

// peerState is what a probe found out about one rank.
type peerState struct {
	answered bool   // it answered in time
	issued   uint64 // the collectives it issued
	busy     bool   // one of them has not ended
}

// blame names the ranks late for the collective tag, from every rank's
// state: those that did not answer, and those that have not issued it while
// nothing of their own is in flight (they are elsewhere: computing, hung,
// or past their last collective). A rank short of tag that waits in an
// earlier collective is named only when no other rank is: it waits for
// someone, and that someone is the one to blame. Across a cut link, a rank
// that ran ahead of a neighbour still stuck in the op before (the cut
// caught it mid-exchange) must name the far side, not the neighbour.
func blame(tag uint64, states []peerState) []int {
	var idle, blocked []int
	for p, s := range states {
		switch {
		case !s.answered || (s.issued < tag && !s.busy):
			idle = append(idle, p)
		case s.issued < tag:
			blocked = append(blocked, p)
		}
	}
	if len(idle) > 0 {
		return idle
	}
	return blocked
}
