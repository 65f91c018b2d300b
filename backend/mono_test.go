package backend

import (
	"errors"
	"testing"
)

// CompletedAt is 0 until Complete, then a Mono time between the calls
// around Complete; a later Complete (an Abort after the end) keeps it.
func TestHostWorkCompletedAt(t *testing.T) {
	w := NewHostWork(1, false, nil)
	if w.CompletedAt() != 0 {
		t.Fatal("CompletedAt before Complete")
	}
	before := Mono()
	w.Complete(nil, nil)
	after := Mono()
	at := w.CompletedAt()
	if at < before || at > after {
		t.Fatalf("CompletedAt %v outside [%v, %v]", at, before, after)
	}
	w.Complete(nil, errors.New("late"))
	w.Abort(errors.New("late"))
	if w.CompletedAt() != at || w.Exception() != nil {
		t.Fatalf("a later Complete changed the work: %v, %v", w.CompletedAt(), w.Exception())
	}
}

// Outcome answers as CompletedAt, Duration and Exception do, in one call:
// zeros before Complete; after it the completion time, the duration only
// with timing, and the error.
func TestHostWorkOutcome(t *testing.T) {
	for _, timing := range []bool{false, true} {
		w := NewHostWork(1, timing, nil)
		if at, dur, timed, err := w.Outcome(); at != 0 || dur != 0 || timed || err != nil {
			t.Fatalf("timing %v: before Complete: %v %v %v %v", timing, at, dur, timed, err)
		}
		w.MarkStarted()
		boom := errors.New("boom")
		w.Complete(nil, boom)
		at, dur, timed, err := w.Outcome()
		wantDur, durErr := w.Duration()
		if at != w.CompletedAt() || at == 0 || err != boom || timed != (durErr == nil) || dur != wantDur {
			t.Fatalf("timing %v: Outcome %v %v %v %v; CompletedAt %v, Duration %v %v", timing, at, dur, timed, err, w.CompletedAt(), wantDur, durErr)
		}
	}
}
