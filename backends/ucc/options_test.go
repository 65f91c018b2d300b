package ucc

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
)

func TestResolveYield(t *testing.T) {
	for _, c := range []struct {
		field string
		env   map[string]string
		want  string
	}{
		{"", nil, YieldAuto},
		{"", map[string]string{EnvYield: "always"}, YieldAlways},
		{YieldNever, map[string]string{EnvYield: "always"}, YieldNever}, // a set field wins
	} {
		o, err := resolveOptions(Options{Yield: c.field}, time.Minute, knob.Map(c.env))
		if err != nil || o.Yield != c.want {
			t.Errorf("field %q, env %v: Yield %q, %v; want %q", c.field, c.env, o.Yield, err, c.want)
		}
	}
	for _, bad := range []struct {
		o    Options
		env  map[string]string
		name string
	}{
		{Options{Yield: "sometimes"}, nil, "ucc.Options.Yield"},
		{Options{}, map[string]string{EnvYield: "yes"}, EnvYield},
	} {
		_, err := resolveOptions(bad.o, time.Minute, knob.Map(bad.env))
		if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), bad.name) || !strings.Contains(err.Error(), "auto, always or never") {
			t.Errorf("%+v, env %v: %v; want ErrInvalidArgument naming %s and the values", bad.o, bad.env, err, bad.name)
		}
	}
}

func TestYields(t *testing.T) {
	for _, c := range []struct {
		yield     string
		world     int
		cpus      int
		local     string
		want      bool
		situation string
	}{
		{YieldAuto, 4, 2, "", true, "4 ranks, 2 cores, no LOCAL_WORLD_SIZE: the group is taken to be here"},
		{YieldAuto, 2, 2, "", false, "as many ranks as cores"},
		{YieldAuto, 8, 4, "2", false, "8 ranks over hosts of 2"},
		{YieldAuto, 2, 16, "32", true, "LOCAL_WORLD_SIZE counts the host's ranks"},
		{YieldAuto, 4, 2, "x", true, "a bad LOCAL_WORLD_SIZE is ignored"},
		{YieldAlways, 1, 64, "", true, "always"},
		{YieldNever, 64, 1, "64", false, "never"},
	} {
		env := map[string]string{}
		if c.local != "" {
			env[EnvLocalWorldSize] = c.local
		}
		if got := yields(c.yield, c.world, c.cpus, knob.Map(env)); got != c.want {
			t.Errorf("%s: yields(%q, world %d, %d cpus, LOCAL_WORLD_SIZE %q) = %v", c.situation, c.yield, c.world, c.cpus, c.local, got)
		}
	}
}

// TestREADMEListsVariables: every variable that resolution reads, and the
// one Yield's auto reads, is in the README.
func TestREADMEListsVariables(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var read []string
	record := func(n string) (string, bool) { read = append(read, n); return "", false }
	if _, err := resolveOptions(Options{}, 0, record); err != nil {
		t.Fatal(err)
	}
	yields(YieldAuto, 2, 2, record)
	if len(read) != 6 {
		t.Fatalf("%d variables read, want 6: %v", len(read), read)
	}
	for _, n := range read {
		if !strings.Contains(string(readme), "`"+n+"`") {
			t.Errorf("README.md does not list `%s`", n)
		}
	}
}

// TestFingerprintsAheadOption: on is the default, off is taken, and any
// other value fails naming the variable and its values.
func TestFingerprintsAheadOption(t *testing.T) {
	o, err := resolveOptions(Options{}, time.Minute, knob.Map(nil))
	if err != nil || o.FingerprintsAhead != AheadOn {
		t.Fatalf("default: %q, %v; want %q", o.FingerprintsAhead, err, AheadOn)
	}
	o, err = resolveOptions(Options{}, time.Minute, knob.Map(map[string]string{EnvFingerprintsAhead: "off"}))
	if err != nil || o.FingerprintsAhead != AheadOff {
		t.Fatalf("%s=off: %q, %v", EnvFingerprintsAhead, o.FingerprintsAhead, err)
	}
	_, err = resolveOptions(Options{}, time.Minute, knob.Map(map[string]string{EnvFingerprintsAhead: "maybe"}))
	if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), EnvFingerprintsAhead) || !strings.Contains(err.Error(), "on or off") {
		t.Fatalf("%s=maybe: %v; want ErrInvalidArgument naming it and the values", EnvFingerprintsAhead, err)
	}
}
