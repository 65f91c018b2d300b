package knob

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseBool(t *testing.T) {
	for _, c := range []struct {
		in   string
		want bool
		ok   bool
	}{
		{"1", true, true}, {"true", true, true}, {"TRUE", true, true}, {"True", true, true},
		{"t", true, true}, {"yes", true, true}, {"Y", true, true}, {"on", true, true}, {"ON", true, true},
		{"0", false, true}, {"false", false, true}, {"F", false, true}, {"no", false, true},
		{"n", false, true}, {"off", false, true}, {"Off", false, true},
		{"", false, false}, {"2", false, false}, {"-1", false, false}, {"maybe", false, false},
		{" 1", false, false}, {"enable", false, false}, {"0x1", false, false},
	} {
		got, err := ParseBool(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseBool(%q) = %v, %v; want %v, ok=%v", c.in, got, err, c.want, c.ok)
		}
	}
}

// TestResolve: field > environment (in the order of Env) > default, for
// every kind of knob, and errors that name where the bad value came from.
func TestResolve(t *testing.T) {
	threads := Knob[int]{Field: "pkg.Options.Threads", Env: []string{"GOCOLL_THREADS", "TORCH_THREADS"},
		Default: 2, Parse: ParseInt, Check: Positive[int]}
	flag := Knob[bool]{Field: "pkg.Options.Flag", Env: []string{"GOCOLL_FLAG", "TORCH_FLAG", "LEGACY_FLAG"}, Parse: ParseBool}
	disable := Knob[bool]{Field: "pkg.Options.Disable", Env: []string{"GOCOLL_ENABLE"}, Parse: Not}
	mode := Knob[string]{Field: "pkg.Options.Mode", Env: []string{"GOCOLL_MODE"}, Default: "auto", Check: OneOf("auto", "tcp", "shm")}
	wait := Knob[time.Duration]{Field: "pkg.Options.Wait", Env: []string{"GOCOLL_WAIT_SEC"}, Default: time.Minute,
		Parse: Units(time.Second), Check: Positive[time.Duration]}
	type result struct {
		v   any
		err error
	}
	r := func(v any, err error) result { return result{v, err} }
	for _, c := range []struct {
		name    string
		env     map[string]string
		run     func(Env) result
		want    any
		wantErr string // substring of the error; "" for none
	}{
		{"int default", nil, func(e Env) result { return r(threads.Resolve(e, 0)) }, 2, ""},
		{"int env", map[string]string{"GOCOLL_THREADS": "8"}, func(e Env) result { return r(threads.Resolve(e, 0)) }, 8, ""},
		{"int alias", map[string]string{"TORCH_THREADS": "3"}, func(e Env) result { return r(threads.Resolve(e, 0)) }, 3, ""},
		{"int GOCOLL before alias", map[string]string{"GOCOLL_THREADS": "5", "TORCH_THREADS": "bad"}, func(e Env) result { return r(threads.Resolve(e, 0)) }, 5, ""},
		{"int empty is unset", map[string]string{"GOCOLL_THREADS": "", "TORCH_THREADS": "4"}, func(e Env) result { return r(threads.Resolve(e, 0)) }, 4, ""},
		{"int field wins", map[string]string{"GOCOLL_THREADS": "8"}, func(e Env) result { return r(threads.Resolve(e, 6)) }, 6, ""},
		{"int field beats a bad env", map[string]string{"GOCOLL_THREADS": "x"}, func(e Env) result { return r(threads.Resolve(e, 6)) }, 6, ""},
		{"int env not a number", map[string]string{"TORCH_THREADS": "four"}, func(e Env) result { return r(threads.Resolve(e, 0)) }, nil, `TORCH_THREADS="four": want an integer`},
		{"int env checked", map[string]string{"GOCOLL_THREADS": "0"}, func(e Env) result { return r(threads.Resolve(e, 0)) }, nil, `GOCOLL_THREADS="0": want a positive value`},
		{"int field checked", nil, func(e Env) result { return r(threads.Resolve(e, -1)) }, nil, `pkg.Options.Threads=-1: want a positive value`},
		{"bool default", nil, func(e Env) result { return r(flag.Resolve(e, false)) }, false, ""},
		{"bool env on", map[string]string{"GOCOLL_FLAG": "yes"}, func(e Env) result { return r(flag.Resolve(e, false)) }, true, ""},
		{"bool legacy", map[string]string{"LEGACY_FLAG": "1"}, func(e Env) result { return r(flag.Resolve(e, false)) }, true, ""},
		{"bool env off", map[string]string{"GOCOLL_FLAG": "off", "LEGACY_FLAG": "1"}, func(e Env) result { return r(flag.Resolve(e, false)) }, false, ""},
		{"bool field true wins", map[string]string{"GOCOLL_FLAG": "0"}, func(e Env) result { return r(flag.Resolve(e, true)) }, true, ""},
		{"bool bad", map[string]string{"TORCH_FLAG": "maybe"}, func(e Env) result { return r(flag.Resolve(e, false)) }, nil, `TORCH_FLAG="maybe": want a boolean`},
		{"negated bool", map[string]string{"GOCOLL_ENABLE": "0"}, func(e Env) result { return r(disable.Resolve(e, false)) }, true, ""},
		{"negated bool on", map[string]string{"GOCOLL_ENABLE": "true"}, func(e Env) result { return r(disable.Resolve(e, false)) }, false, ""},
		{"string default", nil, func(e Env) result { return r(mode.Resolve(e, "")) }, "auto", ""},
		{"string env", map[string]string{"GOCOLL_MODE": "shm"}, func(e Env) result { return r(mode.Resolve(e, "")) }, "shm", ""},
		{"string field", map[string]string{"GOCOLL_MODE": "shm"}, func(e Env) result { return r(mode.Resolve(e, "tcp")) }, "tcp", ""},
		{"string env bad", map[string]string{"GOCOLL_MODE": "bogus"}, func(e Env) result { return r(mode.Resolve(e, "")) }, nil, `GOCOLL_MODE="bogus": want auto, tcp or shm`},
		{"string field bad", nil, func(e Env) result { return r(mode.Resolve(e, "udp")) }, nil, `pkg.Options.Mode="udp": want auto, tcp or shm`},
		{"duration default", nil, func(e Env) result { return r(wait.Resolve(e, 0)) }, time.Minute, ""},
		{"duration env in units", map[string]string{"GOCOLL_WAIT_SEC": "3"}, func(e Env) result { return r(wait.Resolve(e, 0)) }, 3 * time.Second, ""},
		{"duration field", map[string]string{"GOCOLL_WAIT_SEC": "3"}, func(e Env) result { return r(wait.Resolve(e, time.Millisecond)) }, time.Millisecond, ""},
		{"duration env bad", map[string]string{"GOCOLL_WAIT_SEC": "1.5"}, func(e Env) result { return r(wait.Resolve(e, 0)) }, nil, `GOCOLL_WAIT_SEC="1.5": want an integer number of seconds`},
		{"duration env zero", map[string]string{"GOCOLL_WAIT_SEC": "0"}, func(e Env) result { return r(wait.Resolve(e, 0)) }, nil, `GOCOLL_WAIT_SEC="0": want a positive value`},
		{"duration field negative", nil, func(e Env) result { return r(wait.Resolve(e, -time.Second)) }, nil, `pkg.Options.Wait=-1s: want a positive value`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := c.run(Map(c.env))
			if c.wantErr != "" {
				if got.err == nil || !strings.Contains(got.err.Error(), c.wantErr) || !errors.Is(got.err, ErrInvalid) {
					t.Fatalf("got %v, %v; want an ErrInvalid error containing %q", got.v, got.err, c.wantErr)
				}
				return
			}
			if got.err != nil || got.v != c.want {
				t.Fatalf("got %v, %v; want %v", got.v, got.err, c.want)
			}
		})
	}
}

func TestLookupAndHelpers(t *testing.T) {
	e := Map(map[string]string{"A": "", "B": "b", "C": "c"})
	if n, v, ok := e.Lookup("A", "B", "C"); !ok || n != "B" || v != "b" {
		t.Fatalf("Lookup = %q %q %v", n, v, ok)
	}
	if _, _, ok := e.Lookup("A", "Z"); ok {
		t.Fatal("an empty or missing variable was found")
	}
	if err := NonNegative(0); err != nil {
		t.Fatal(err)
	}
	if err := NonNegative(-time.Nanosecond); err == nil {
		t.Fatal("NonNegative accepted a negative value")
	}
	if err := OneOf("a")("b"); err == nil || err.Error() != "a" {
		t.Fatalf("OneOf: %v", err)
	}
	if d, err := Units(time.Millisecond)("250"); err != nil || d != 250*time.Millisecond {
		t.Fatalf("Units(ms)(250) = %v, %v", d, err)
	}
	t.Setenv("GOCOLL_KNOB_TEST", "on")
	if n, v, ok := OS.Lookup("GOCOLL_KNOB_TEST"); !ok || n != "GOCOLL_KNOB_TEST" || v != "on" {
		t.Fatalf("OS.Lookup = %q %q %v", n, v, ok)
	}
}
