package dl

import (
	"errors"
	"strings"
	"testing"
)

// libm is on every glibc system that can build this package.
var libm = Spec{What: "the math library libm.so.6", Env: "GOCOLL_DL_TEST_LIBRARY", Candidates: []string{"libm.so.6"}}

func TestOpenResolvesSymbols(t *testing.T) {
	t.Setenv(libm.Env, "")
	s := libm
	s.Symbols = []Symbol{{Name: "cos"}, {Name: "gocoll_no_such_symbol", Optional: true}, {Name: "sqrt"}}
	l, err := Open(s)
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addrs()
	if len(a) != 3 || a[0] == 0 || a[1] != 0 || a[2] == 0 || a[0] == a[2] {
		t.Fatalf("addresses %#x: want cos and sqrt resolved, the optional symbol 0", a)
	}
	if l.Path() != "libm.so.6" {
		t.Fatalf("path %q", l.Path())
	}
	if p, err := l.Lookup("cos"); err != nil || p != a[0] {
		t.Fatalf("Lookup(cos) = %#x, %v; want %#x", p, err, a[0])
	}
	if !l.Has("sin") || l.Has("gocoll_no_such_symbol") {
		t.Fatal("Has: wrong answer for sin or a missing symbol")
	}
	_, err = l.Lookup("gocoll_no_such_symbol")
	var e *Error
	if !errors.As(err, &e) || e.Symbol != "gocoll_no_such_symbol" {
		t.Fatalf("Lookup of a missing symbol: %v", err)
	}
	for _, want := range []string{"gocoll_no_such_symbol", "libm.so.6", libm.Env} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

// A candidate that lacks a required symbol is skipped for the next, and
// the error of the last names every reason.
func TestOpenSkipsCandidateWithoutRequiredSymbol(t *testing.T) {
	t.Setenv(libm.Env, "")
	s := Spec{What: "the test library", Env: libm.Env, Candidates: []string{"libc.so.6", "libm.so.6"},
		Symbols: []Symbol{{Name: "malloc"}, {Name: "cos"}}}
	l, err := Open(s)
	if err != nil {
		t.Fatal(err)
	}
	if l.Path() != "libm.so.6" {
		t.Fatalf("opened %s, want libm.so.6 (libc has no cos)", l.Path())
	}
	s.Symbols = append(s.Symbols, Symbol{Name: "gocoll_no_such_symbol"})
	_, err = Open(s)
	var e *Error
	if !errors.As(err, &e) || len(e.Tried) != 2 {
		t.Fatalf("want an *Error with two reasons, got %v", err)
	}
	for _, want := range []string{"the test library", libm.Env, "libc.so.6: symbol cos not found", "libm.so.6: symbol gocoll_no_such_symbol not found"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// The variable, when set, is the only path tried.
func TestOpenEnvOverridesCandidates(t *testing.T) {
	t.Setenv(libm.Env, "/nonexistent/libgocoll.so")
	_, err := Open(libm)
	var e *Error
	if !errors.As(err, &e) || len(e.Tried) != 1 || !strings.Contains(e.Tried[0], "/nonexistent/libgocoll.so") {
		t.Fatalf("want one failure naming the variable's path, got %v", err)
	}
	if !strings.Contains(err.Error(), "cannot load the math library libm.so.6 (set "+libm.Env+" to its path)") {
		t.Fatalf("error %q", err)
	}
}
