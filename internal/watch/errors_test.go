package watch

import (
	"errors"
	"testing"
)

// TestErrorsBuildsOnce checks that every action naming one failure gets the
// same error, built once, and that two failures get two errors.
func TestErrorsBuildsOnce(t *testing.T) {
	builds := 0
	m := Errors[string, error]{Build: func(f *Failure[string]) error { builds++; return errors.New(f.Work) }}
	f1, f2 := &Failure[string]{Work: "w1"}, &Failure[string]{Work: "w2"}
	a, b, c := m.Of(f1), m.Of(f1), m.Of(f2)
	if a != b || a == c || builds != 2 || a.Error() != "w1" || c.Error() != "w2" {
		t.Fatalf("errors %v %v %v after %d builds; want one error per failure, built once", a, b, c, builds)
	}
}
