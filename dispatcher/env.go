package dispatcher

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/store"
)

// Env is what InitFromEnv reads: torchrun's variables.
type Env struct {
	Rank, WorldSize, LocalRank int
	MasterAddr                 string
	MasterPort                 int
}

// ReadEnv reads RANK, WORLD_SIZE, LOCAL_RANK (default: RANK), MASTER_ADDR
// and MASTER_PORT, as torchrun sets them. Missing or malformed variables
// are named in the error.
func ReadEnv() (Env, error) {
	var e Env
	var err error
	geti := func(name string, dst *int) {
		if err != nil {
			return
		}
		v, ok := os.LookupEnv(name)
		if !ok {
			err = fmt.Errorf("dispatcher: %w: environment variable %s expected, but not set", backend.ErrInvalidArgument, name)
			return
		}
		n, perr := strconv.Atoi(v)
		if perr != nil {
			err = fmt.Errorf("dispatcher: %w: %s=%q is not an integer", backend.ErrInvalidArgument, name, v)
			return
		}
		*dst = n
	}
	geti("RANK", &e.Rank)
	geti("WORLD_SIZE", &e.WorldSize)
	geti("MASTER_PORT", &e.MasterPort)
	if err != nil {
		return e, err
	}
	e.LocalRank = e.Rank
	if _, ok := os.LookupEnv("LOCAL_RANK"); ok {
		geti("LOCAL_RANK", &e.LocalRank)
	}
	e.MasterAddr = os.Getenv("MASTER_ADDR")
	if e.MasterAddr == "" {
		return e, fmt.Errorf("dispatcher: %w: environment variable MASTER_ADDR expected, but not set", backend.ErrInvalidArgument)
	}
	return e, err
}

// InitFromEnv starts a rank the way torchrun starts a torch rank: it reads
// the environment (ReadEnv), makes rank 0 host a TCPStore server on
// MASTER_ADDR:MASTER_PORT, connects every rank to it as a client, and calls
// Init with cfg's other fields. cfg.Store, Rank and WorldSize are set here.
// Closing the group closes that store (and, on rank 0, its server).
func InitFromEnv(ctx context.Context, cfg Config) (*ProcessGroup, error) {
	env, err := ReadEnv()
	if err != nil {
		return nil, err
	}
	// Reject bad knobs before the rendezvous; Init resolves them again,
	// which changes nothing.
	if cfg, err = resolveConfig(cfg, knob.OS); err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(env.MasterAddr, strconv.Itoa(env.MasterPort))
	st, err := store.NewTCPStore(ctx, addr, store.TCPStoreOptions{
		IsMaster:      env.Rank == 0,
		ClientOptions: store.ClientOptions{Timeout: cfg.Timeout, WorldSize: env.WorldSize},
	})
	if err != nil {
		return nil, fmt.Errorf("dispatcher: rendezvous at %s: %w", addr, err)
	}
	cfg.Store, cfg.Rank, cfg.WorldSize = st, env.Rank, env.WorldSize
	pg, err := Init(ctx, cfg)
	if err != nil {
		st.Close()
		return nil, err
	}
	pg.ownedStore = st
	return pg, nil
}

// vars are the names of one dispatcher variable: GOCOLL_<name>, then its
// TORCH_NCCL_<name> alias (the flight recorder and the heartbeat monitor
// are ProcessGroupNCCL's in PyTorch, whatever the backend here).
func vars(name string) []string { return []string{"GOCOLL_" + name, "TORCH_NCCL_" + name} }

// parseTraceEntries reads GOCOLL_TRACE_BUFFER_SIZE, where 0 turns the
// recorder off; FlightRecorderOptions.Entries says that with -1.
func parseTraceEntries(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, knob.Want("a non-negative integer (0 turns the recorder off)")
	}
	if n == 0 {
		n = -1
	}
	return n, nil
}

// The knobs of Config; see the fields for their meaning.
var (
	knobTimeout = knob.Knob[time.Duration]{Field: "dispatcher.Config.Timeout", Default: DefaultTimeout,
		Check: func(d time.Duration) error {
			if d < 0 {
				return knob.Want("a timeout that is not negative (0 means DefaultTimeout)")
			}
			return nil
		}}
	knobTraceEntries = knob.Knob[int]{Field: "dispatcher.FlightRecorderOptions.Entries", Env: vars("TRACE_BUFFER_SIZE"),
		Default: DefaultTraceEntries, Parse: parseTraceEntries}
	knobDumpPrefix = knob.Knob[string]{Field: "dispatcher.FlightRecorderOptions.DumpPrefix", Env: vars("DEBUG_INFO_TEMP_FILE"),
		Default: DefaultDumpPrefix}
	knobPipeFile      = knob.Knob[string]{Field: "dispatcher.FlightRecorderOptions.PipeFile", Env: vars("DEBUG_INFO_PIPE_FILE")}
	knobNoDumpOnError = knob.Knob[bool]{Field: "dispatcher.FlightRecorderOptions.NoDumpOnError", Env: vars("DUMP_ON_TIMEOUT"),
		Parse: knob.Not}
	knobPoll = knob.Knob[time.Duration]{Field: "dispatcher.FlightRecorderOptions.Poll", Default: 100 * time.Millisecond,
		Check: knob.Positive[time.Duration]}
	knobNoMonitor = knob.Knob[bool]{Field: "dispatcher.MonitorOptions.Disable", Env: vars("ENABLE_MONITORING"), Parse: knob.Not}
	knobHeartbeat = knob.Knob[time.Duration]{Field: "dispatcher.MonitorOptions.HeartbeatTimeout", Env: vars("HEARTBEAT_TIMEOUT_SEC"),
		Default: DefaultHeartbeatTimeout, Parse: knob.Units(time.Second), Check: knob.Positive[time.Duration]}
	knobCoordCheck = knob.Knob[time.Duration]{Field: "dispatcher.MonitorOptions.CoordCheck", Env: vars("COORD_CHECK_MILSEC"),
		Default: DefaultCoordCheck, Parse: knob.Units(time.Millisecond), Check: knob.Positive[time.Duration]}
)

// resolveConfig fills cfg's zero knobs (Timeout, FlightRecorder, Monitor)
// from env, else their defaults, and checks every value, so that Init
// rejects a bad one before it starts anything. It reads nothing but env:
// tests call it with a knob.Map.
func resolveConfig(cfg Config, env knob.Env) (Config, error) {
	var err error
	dur := func(dst *time.Duration, k knob.Knob[time.Duration]) {
		if err == nil {
			*dst, err = k.Resolve(env, *dst)
		}
	}
	str := func(dst *string, k knob.Knob[string]) {
		if err == nil {
			*dst, err = k.Resolve(env, *dst)
		}
	}
	flag := func(dst *bool, k knob.Knob[bool]) {
		if err == nil {
			*dst, err = k.Resolve(env, *dst)
		}
	}
	dur(&cfg.Timeout, knobTimeout)
	fr := &cfg.FlightRecorder
	if err == nil {
		fr.Entries, err = knobTraceEntries.Resolve(env, fr.Entries)
	}
	str(&fr.DumpPrefix, knobDumpPrefix)
	str(&fr.PipeFile, knobPipeFile)
	flag(&fr.NoDumpOnError, knobNoDumpOnError)
	dur(&fr.Poll, knobPoll)
	mo := &cfg.Monitor
	flag(&mo.Disable, knobNoMonitor)
	dur(&mo.HeartbeatTimeout, knobHeartbeat)
	dur(&mo.CoordCheck, knobCoordCheck)
	if err != nil {
		return cfg, fmt.Errorf("dispatcher: %w: %w", backend.ErrInvalidArgument, err)
	}
	if fr.Logger == nil {
		fr.Logger = slog.Default()
	}
	if mo.Logger == nil {
		mo.Logger = slog.Default()
	}
	if mo.Exit == nil {
		mo.Exit = os.Exit
	}
	return cfg, nil
}
