package nccl

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// withPolicy is DefaultOptions with another policy.
func withPolicy(p ErrorPolicy) Options {
	o := DefaultOptions()
	o.ErrorPolicy = p
	return o
}

// TestResolveOptions: a zero field takes its variable, else its default; a
// set field wins over the variable; PyTorch's 0-3 numbering is read from
// the variables only.
func TestResolveOptions(t *testing.T) {
	for _, c := range []struct {
		name string
		in   Options
		env  map[string]string
		want Options
	}{
		{"zero value is the defaults", Options{}, nil, DefaultOptions()},
		// A new user's first try: one field set, the rest the defaults.
		{"CleanUpOnly alone", Options{ErrorPolicy: CleanUpOnly}, nil, withPolicy(CleanUpOnly)},
		{"policy from GOCOLL_", Options{}, map[string]string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING": "0"}, withPolicy(NoHandling)},
		{"policy from TORCH_", Options{}, map[string]string{"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, withPolicy(TearDown)},
		{"policy from the legacy name", Options{}, map[string]string{"NCCL_ASYNC_ERROR_HANDLING": "2"}, withPolicy(CleanUpOnly)},
		{"GOCOLL_ before TORCH_", Options{}, map[string]string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, withPolicy(SkipCleanUp)},
		{"field beats variable", Options{ErrorPolicy: CleanUpOnly}, map[string]string{"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, withPolicy(CleanUpOnly)},
		{"booleans from variables", Options{}, map[string]string{
			"TORCH_NCCL_BLOCKING_WAIT": "1", "GOCOLL_NCCL_NAN_CHECK": "yes", "TORCH_NCCL_ENABLE_TIMING": "On",
			"GOCOLL_NCCL_USE_COMM_NONBLOCKING": "true", "TORCH_NCCL_HIGH_PRIORITY": "y"},
			func() Options {
				o := DefaultOptions()
				o.BlockingWait, o.NaNCheck, o.EnableTiming, o.NonBlocking, o.HighPriorityStream = true, true, true, true, true
				return o
			}()},
		{"async on the current stream from its variable", Options{}, map[string]string{"GOCOLL_NCCL_ASYNC_ON_CURRENT_STREAM": "1"}, func() Options {
			o := DefaultOptions()
			o.AsyncOnCurrentStream = true
			return o
		}()},
		{"no TORCH_ name for async on the current stream", Options{}, map[string]string{"TORCH_NCCL_ASYNC_ON_CURRENT_STREAM": "1"}, DefaultOptions()},
		{"legacy blocking wait", Options{}, map[string]string{"NCCL_BLOCKING_WAIT": "1"}, func() Options {
			o := DefaultOptions()
			o.BlockingWait = true
			return o
		}()},
		{"variable turns a boolean off", Options{}, map[string]string{"GOCOLL_NCCL_BLOCKING_WAIT": "0", "NCCL_BLOCKING_WAIT": "1"}, DefaultOptions()},
		{"numbers from variables", Options{}, map[string]string{"GOCOLL_NCCL_RANKS_PER_ROOT": "4", "TORCH_NCCL_NONBLOCKING_TIMEOUT": "7"}, func() Options {
			o := DefaultOptions()
			o.RanksPerRoot, o.NonBlockingTimeout = 4, 7*time.Second
			return o
		}()},
		{"numbers from fields", Options{RanksPerRoot: 2, NonBlockingTimeout: time.Second, AbortTimeout: time.Second, WatchdogInterval: time.Millisecond, MinCTAs: 2, MaxCTAs: 8},
			map[string]string{"GOCOLL_NCCL_RANKS_PER_ROOT": "4"}, func() Options {
				o := DefaultOptions()
				o.RanksPerRoot, o.NonBlockingTimeout, o.AbortTimeout, o.WatchdogInterval, o.MinCTAs, o.MaxCTAs = 2, time.Second, time.Second, time.Millisecond, 2, 8
				return o
			}()},
		{"empty variable is unset", Options{}, map[string]string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING": "", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}, withPolicy(CleanUpOnly)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := resolveOptions(c.in, knob.Map(c.env))
			if err != nil || got != c.want {
				t.Fatalf("resolveOptions(%+v, %v) =\n %+v, %v\nwant\n %+v", c.in, c.env, got, err, c.want)
			}
			again, err := resolveOptions(got, knob.Map(c.env))
			if err != nil || again != got {
				t.Fatalf("resolving resolved options changed them: %+v, %v", again, err)
			}
		})
	}
}

// TestResolveOptionsRejects: every invalid value is an error wrapping
// ErrInvalidArgument that names the variable or field and the value
// (PyTorch's test_invalid_nccl_blocking_wait_env, and more).
func TestResolveOptionsRejects(t *testing.T) {
	for _, c := range []struct {
		name string
		in   Options
		env  map[string]string
		want string
	}{
		{"bool not a word", Options{}, map[string]string{"GOCOLL_NCCL_BLOCKING_WAIT": "abc"}, `GOCOLL_NCCL_BLOCKING_WAIT="abc"`},
		{"bool -1", Options{}, map[string]string{"GOCOLL_NCCL_BLOCKING_WAIT": "-1"}, `GOCOLL_NCCL_BLOCKING_WAIT="-1"`},
		{"bool big", Options{}, map[string]string{"TORCH_NCCL_BLOCKING_WAIT": "2147483647"}, `TORCH_NCCL_BLOCKING_WAIT="2147483647"`},
		{"bool bigger", Options{}, map[string]string{"TORCH_NCCL_BLOCKING_WAIT": "4294967295"}, `TORCH_NCCL_BLOCKING_WAIT="4294967295"`},
		{"legacy bool", Options{}, map[string]string{"NCCL_BLOCKING_WAIT": "2"}, `NCCL_BLOCKING_WAIT="2"`},
		{"async on the current stream", Options{}, map[string]string{"GOCOLL_NCCL_ASYNC_ON_CURRENT_STREAM": "sometimes"}, `GOCOLL_NCCL_ASYNC_ON_CURRENT_STREAM="sometimes"`},
		{"nan check", Options{}, map[string]string{"GOCOLL_NCCL_NAN_CHECK": "maybe"}, `GOCOLL_NCCL_NAN_CHECK="maybe"`},
		{"policy 4", Options{}, map[string]string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING": "4"}, `GOCOLL_NCCL_ASYNC_ERROR_HANDLING="4": want 0 (NoHandling)`},
		{"policy -1", Options{}, map[string]string{"TORCH_NCCL_ASYNC_ERROR_HANDLING": "-1"}, `TORCH_NCCL_ASYNC_ERROR_HANDLING="-1"`},
		{"policy by name", Options{}, map[string]string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING": "teardown"}, `GOCOLL_NCCL_ASYNC_ERROR_HANDLING="teardown"`},
		{"policy field", Options{ErrorPolicy: 9}, nil, `nccl.Options.ErrorPolicy=ErrorPolicy(9)`},
		{"ranks per root 0", Options{}, map[string]string{"GOCOLL_NCCL_RANKS_PER_ROOT": "0"}, `GOCOLL_NCCL_RANKS_PER_ROOT="0": want a positive value`},
		{"ranks per root field", Options{RanksPerRoot: -1}, nil, `nccl.Options.RanksPerRoot=-1`},
		{"nonblocking timeout", Options{}, map[string]string{"TORCH_NCCL_NONBLOCKING_TIMEOUT": "1.5"}, `TORCH_NCCL_NONBLOCKING_TIMEOUT="1.5": want an integer number of seconds`},
		{"abort timeout", Options{AbortTimeout: -time.Second}, nil, `nccl.Options.AbortTimeout=-1s`},
		{"watchdog interval", Options{WatchdogInterval: -1}, nil, `nccl.Options.WatchdogInterval=-1ns`},
		{"min CTAs", Options{MinCTAs: -2}, nil, `nccl.Options.MinCTAs=-2`},
		{"CTA bounds", Options{MinCTAs: 8, MaxCTAs: 2}, nil, `nccl.Options.MinCTAs=8 is above nccl.Options.MaxCTAs=2`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := resolveOptions(c.in, knob.Map(c.env))
			if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want ErrInvalidArgument naming %s", err, c.want)
			}
		})
	}
}

// TestCGAClusterSize: zero leaves NCCL's default, negative asks for 0.
func TestCGAClusterSize(t *testing.T) {
	for in, want := range map[int]int{0: -1, -1: 0, -7: 0, 1: 1, 4: 4} {
		o := Options{CGAClusterSize: in}
		if got := o.cgaClusterSize(); got != want {
			t.Errorf("CGAClusterSize %d gives %d, want %d", in, got, want)
		}
	}
}

// TestNewRejectsOptionsFirst: invalid options fail New before the library
// is loaded, so dispatcher.Init fails with them on a machine without a GPU
// too, instead of the first CUDA op.
func TestNewRejectsOptionsFirst(t *testing.T) {
	t.Setenv("GOCOLL_NCCL_ASYNC_ERROR_HANDLING", "7")
	_, err := New(context.Background(), backend.Config{Store: store.NewHashStore(), WorldSize: 1})
	if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), `GOCOLL_NCCL_ASYNC_ERROR_HANDLING="7"`) {
		t.Fatalf("New: %v", err)
	}
	_, err = dispatcher.Init(context.Background(), dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1, Backend: Name})
	if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), `GOCOLL_NCCL_ASYNC_ERROR_HANDLING="7"`) {
		t.Fatalf("dispatcher.Init: %v", err)
	}
	t.Setenv("GOCOLL_NCCL_ASYNC_ERROR_HANDLING", "")
	_, err = New(context.Background(), backend.Config{Store: store.NewHashStore(), WorldSize: 1, Options: (*Options)(nil)})
	if err != nil && !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("New with a nil *Options: %v", err)
	}
}

// TestInitWithOnePolicyField is the new user's try of the issue: the
// options with only ErrorPolicy set work, and the backend runs with
// CleanUpOnly and every other default. Without a GPU, Init succeeds and
// the backend is unavailable (not "RanksPerRoot must be positive").
func TestInitWithOnePolicyField(t *testing.T) {
	for _, n := range []string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "GOCOLL_NCCL_RANKS_PER_ROOT", "TORCH_NCCL_RANKS_PER_ROOT"} {
		t.Setenv(n, "")
	}
	ctx := context.Background()
	pg, err := dispatcher.Init(ctx, dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1, Backend: Name,
		BackendOptions: map[string]any{Name: &Options{ErrorPolicy: CleanUpOnly}}})
	if err != nil {
		t.Fatalf("Init: %v", err)
	}
	defer pg.Close(ctx)
	b, err := pg.Backend(tensor.CUDA)
	if err != nil {
		if !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("backend: %v, want it made or ErrUnavailable", err)
		}
		t.Skipf("no NCCL here (%v): the options were accepted", err)
	}
	got := b.(*Backend).Options()
	if want := withPolicy(CleanUpOnly); got != want {
		t.Fatalf("options in effect %+v, want %+v", got, want)
	}
}

// TestFactoryFailureGivesNilBackend: a failed New must reach the dispatcher
// as a nil backend.Backend, not a typed nil it would later Close.
func TestFactoryFailureGivesNilBackend(t *testing.T) {
	b, err := factory(context.Background(), backend.Config{Options: 42})
	if err == nil {
		t.Fatal("factory with bad options succeeded")
	}
	if b != nil {
		t.Fatalf("factory failed (%v) but returned a non-nil backend.Backend (%T)", err, b)
	}
}

// TestREADMEListsVariables: every variable that resolution reads is in the
// README's configuration table.
func TestREADMEListsVariables(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var read []string
	if _, err := resolveOptions(Options{}, func(n string) (string, bool) { read = append(read, n); return "", false }); err != nil {
		t.Fatal(err)
	}
	if len(read) < 16 {
		t.Fatalf("only %d variables read: %v", len(read), read)
	}
	for _, n := range read {
		if !strings.Contains(string(readme), "`"+n+"`") {
			t.Errorf("README.md does not list `%s`", n)
		}
	}
}
