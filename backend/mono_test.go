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
