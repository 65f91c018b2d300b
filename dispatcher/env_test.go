package dispatcher

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// badopts is a backend whose options are always invalid, as cpupool's are
// under GOCOLL_CPUPOOL_TRANSPORT=bogus: Init must fail with its error
// rather than record it for the first op.
func init() {
	backend.Register(backend.Driver{Name: "badopts", Devices: []tensor.DeviceType{tensor.CUDA}, New: func(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
		return nil, backend.Errorf(backend.ErrInvalidArgument, "init", `GOCOLL_BADOPTS_MODE="bogus": want auto`)
	}})
}

// resolved is what a zero Config's knobs resolve to in an empty
// environment, with the given changes.
func resolved(change func(c *Config)) Config {
	c := Config{Timeout: DefaultTimeout,
		FlightRecorder: FlightRecorderOptions{Entries: DefaultTraceEntries, DumpPrefix: DefaultDumpPrefix, Poll: 100 * time.Millisecond},
		Monitor:        MonitorOptions{HeartbeatTimeout: DefaultHeartbeatTimeout, CoordCheck: DefaultCoordCheck}}
	if change != nil {
		change(&c)
	}
	return c
}

// TestResolveConfig: set field > GOCOLL_ variable > TORCH_NCCL_ alias >
// default, for every knob of Config.
func TestResolveConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		in   Config
		env  map[string]string
		want Config
	}{
		{"zero value", Config{}, nil, resolved(nil)},
		{"timeout field", Config{Timeout: time.Second}, nil, resolved(func(c *Config) { c.Timeout = time.Second })},
		{"trace size from env", Config{}, map[string]string{"GOCOLL_TRACE_BUFFER_SIZE": "10"},
			resolved(func(c *Config) { c.FlightRecorder.Entries = 10 })},
		{"trace size 0 turns the recorder off", Config{}, map[string]string{"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"},
			resolved(func(c *Config) { c.FlightRecorder.Entries = -1 })},
		{"trace size field beats env", Config{FlightRecorder: FlightRecorderOptions{Entries: 5}}, map[string]string{"GOCOLL_TRACE_BUFFER_SIZE": "0"},
			resolved(func(c *Config) { c.FlightRecorder.Entries = 5 })},
		{"negative entries stay off", Config{FlightRecorder: FlightRecorderOptions{Entries: -1}}, map[string]string{"GOCOLL_TRACE_BUFFER_SIZE": "10"},
			resolved(func(c *Config) { c.FlightRecorder.Entries = -1 })},
		{"dump prefix and pipe from env", Config{}, map[string]string{"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/fr_", "GOCOLL_DEBUG_INFO_PIPE_FILE": "/x/p"},
			resolved(func(c *Config) { c.FlightRecorder.DumpPrefix, c.FlightRecorder.PipeFile = "/x/fr_", "/x/p" })},
		{"dump prefix field beats env", Config{FlightRecorder: FlightRecorderOptions{DumpPrefix: "/y/"}}, map[string]string{"GOCOLL_DEBUG_INFO_TEMP_FILE": "/x/fr_"},
			resolved(func(c *Config) { c.FlightRecorder.DumpPrefix = "/y/" })},
		{"dump on timeout off", Config{}, map[string]string{"GOCOLL_DUMP_ON_TIMEOUT": "false"},
			resolved(func(c *Config) { c.FlightRecorder.NoDumpOnError = true })},
		{"dump on timeout on", Config{}, map[string]string{"GOCOLL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, resolved(nil)},
		{"monitor off", Config{}, map[string]string{"TORCH_NCCL_ENABLE_MONITORING": "0"},
			resolved(func(c *Config) { c.Monitor.Disable = true })},
		{"monitor field beats env", Config{Monitor: MonitorOptions{Disable: true}}, map[string]string{"GOCOLL_ENABLE_MONITORING": "1"},
			resolved(func(c *Config) { c.Monitor.Disable = true })},
		{"monitor durations from env", Config{}, map[string]string{"GOCOLL_HEARTBEAT_TIMEOUT_SEC": "3", "GOCOLL_COORD_CHECK_MILSEC": "50"},
			resolved(func(c *Config) { c.Monitor.HeartbeatTimeout, c.Monitor.CoordCheck = 3*time.Second, 50*time.Millisecond })},
		// The conformance child sets CoordCheck and the failure spec sets
		// the variable: the field wins.
		{"monitor durations field beats env", Config{Monitor: MonitorOptions{CoordCheck: 200 * time.Millisecond}}, map[string]string{"GOCOLL_COORD_CHECK_MILSEC": "100"},
			resolved(func(c *Config) { c.Monitor.CoordCheck = 200 * time.Millisecond })},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := resolveConfig(c.in, knob.Map(c.env))
			if err != nil {
				t.Fatal(err)
			}
			if got.Monitor.Exit == nil || got.Monitor.Logger == nil || got.FlightRecorder.Logger == nil {
				t.Fatal("Exit and Logger not filled in")
			}
			got.Monitor.Exit, got.Monitor.Logger, got.FlightRecorder.Logger = nil, nil, nil
			if got.Timeout != c.want.Timeout || got.FlightRecorder != c.want.FlightRecorder ||
				got.Monitor.Disable != c.want.Monitor.Disable || got.Monitor.HeartbeatTimeout != c.want.Monitor.HeartbeatTimeout ||
				got.Monitor.CoordCheck != c.want.Monitor.CoordCheck {
				t.Fatalf("got %+v %+v %+v\nwant %+v %+v %+v", got.Timeout, got.FlightRecorder, got.Monitor,
					c.want.Timeout, c.want.FlightRecorder, c.want.Monitor)
			}
		})
	}
}

func TestResolveConfigRejects(t *testing.T) {
	for _, c := range []struct {
		name string
		in   Config
		env  map[string]string
		want string
	}{
		{"negative timeout", Config{Timeout: -time.Second}, nil, "dispatcher.Config.Timeout=-1s"},
		{"trace size", Config{}, map[string]string{"TORCH_NCCL_TRACE_BUFFER_SIZE": "abc"}, `TORCH_NCCL_TRACE_BUFFER_SIZE="abc": want a non-negative integer`},
		{"trace size negative", Config{}, map[string]string{"GOCOLL_TRACE_BUFFER_SIZE": "-2"}, `GOCOLL_TRACE_BUFFER_SIZE="-2"`},
		{"dump on timeout", Config{}, map[string]string{"GOCOLL_DUMP_ON_TIMEOUT": "sometimes"}, `GOCOLL_DUMP_ON_TIMEOUT="sometimes": want a boolean`},
		{"poll", Config{FlightRecorder: FlightRecorderOptions{Poll: -time.Millisecond}}, nil, "dispatcher.FlightRecorderOptions.Poll=-1ms"},
		{"monitoring", Config{}, map[string]string{"TORCH_NCCL_ENABLE_MONITORING": "2"}, `TORCH_NCCL_ENABLE_MONITORING="2"`},
		{"heartbeat 0", Config{}, map[string]string{"GOCOLL_HEARTBEAT_TIMEOUT_SEC": "0"}, `GOCOLL_HEARTBEAT_TIMEOUT_SEC="0": want a positive value`},
		{"heartbeat field", Config{Monitor: MonitorOptions{HeartbeatTimeout: -1}}, nil, "dispatcher.MonitorOptions.HeartbeatTimeout=-1ns"},
		{"coord check", Config{}, map[string]string{"TORCH_NCCL_COORD_CHECK_MILSEC": "1s"}, `TORCH_NCCL_COORD_CHECK_MILSEC="1s": want an integer number of milliseconds`},
		{"metrics addr", Config{}, map[string]string{"GOCOLL_METRICS_ADDR": "9400"}, `GOCOLL_METRICS_ADDR="9400": want host:port`},
		{"metrics port", Config{}, map[string]string{"GOCOLL_METRICS_ADDR": ":http"}, `GOCOLL_METRICS_ADDR=":http": want a port number`},
		{"metrics addr field", Config{MetricsAddr: "localhost"}, nil, `dispatcher.Config.MetricsAddr="localhost": want host:port`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := resolveConfig(c.in, knob.Map(c.env))
			if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want ErrInvalidArgument naming %s", err, c.want)
			}
		})
	}
}

// TestInvalidKnobFailsInit: a bad variable fails Init (and InitFromEnv,
// before the rendezvous) rather than the first op.
func TestInvalidKnobFailsInit(t *testing.T) {
	t.Setenv("GOCOLL_HEARTBEAT_TIMEOUT_SEC", "soon")
	_, err := Init(context.Background(), Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "reccpu"})
	if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), `GOCOLL_HEARTBEAT_TIMEOUT_SEC="soon"`) {
		t.Fatalf("Init: %v", err)
	}
	t.Setenv("RANK", "0")
	t.Setenv("WORLD_SIZE", "1")
	t.Setenv("MASTER_ADDR", "192.0.2.1") // TEST-NET-1: a rendezvous there would hang
	t.Setenv("MASTER_PORT", "29500")
	_, err = InitFromEnv(context.Background(), Config{Backend: "reccpu"})
	if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), `GOCOLL_HEARTBEAT_TIMEOUT_SEC="soon"`) {
		t.Fatalf("InitFromEnv: %v", err)
	}
}

func TestNewGroupRejectsNegativeTimeout(t *testing.T) {
	pg := initRanks(t, 1, "reccpu", &callLog{})[0]
	_, err := pg.NewGroup(context.Background(), nil, GroupOptions{Timeout: -time.Second})
	if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), "dispatcher.GroupOptions.Timeout=-1s") {
		t.Fatalf("NewGroup: %v", err)
	}
	g, err := pg.NewGroup(context.Background(), nil, GroupOptions{})
	if err != nil || g.Timeout() != pg.Timeout() {
		t.Fatalf("NewGroup without a timeout: %v, timeout %v want %v", err, g.Timeout(), pg.Timeout())
	}
}

// TestREADMEListsVariables: every variable that resolution reads is in the
// README's configuration table.
func TestREADMEListsVariables(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var read []string
	if _, err := resolveConfig(Config{}, func(n string) (string, bool) { read = append(read, n); return "", false }); err != nil {
		t.Fatal(err)
	}
	if len(read) != 17 {
		t.Fatalf("%d variables read, want 17: %v", len(read), read)
	}
	var torchrun []string
	if _, err := readEnv(func(n string) (string, bool) {
		torchrun = append(torchrun, n)
		if strings.HasSuffix(n, "SIZE") || n == "MASTER_PORT" || n == "GOCOLL_STORE_DIALECT" {
			return "1", true
		}
		return "0", true
	}); err != nil {
		t.Fatal(err)
	}
	if len(torchrun) != 16 {
		t.Fatalf("%d torchrun variables read, want 16: %v", len(torchrun), torchrun)
	}
	for _, n := range append(read, torchrun...) {
		if !strings.Contains(string(readme), "`"+n+"`") {
			t.Errorf("README.md does not list `%s`", n)
		}
	}
}
