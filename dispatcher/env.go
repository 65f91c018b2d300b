package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/store"
)

// Env is what InitFromEnv reads: the variables torchrun's agent gives each
// worker (torch.distributed.elastic's LocalElasticAgent), which c10d and
// torch programs read.
type Env struct {
	// Rank and WorldSize are RANK and WORLD_SIZE: the global rank, in
	// [0, WorldSize).
	Rank, WorldSize int
	// LocalRank and LocalWorldSize are LOCAL_RANK (default Rank) and
	// LOCAL_WORLD_SIZE (default WorldSize): the rank among the workers of
	// this node, which picks its GPU, and their number.
	LocalRank, LocalWorldSize int
	// GroupRank and GroupWorldSize are GROUP_RANK (default 0) and
	// GROUP_WORLD_SIZE (default 1): this node's rank among the nodes.
	GroupRank, GroupWorldSize int
	// RoleName, RoleRank and RoleWorldSize are ROLE_NAME, ROLE_RANK
	// (default Rank) and ROLE_WORLD_SIZE (default WorldSize).
	RoleName                string
	RoleRank, RoleWorldSize int
	// MasterAddr and MasterPort are MASTER_ADDR and MASTER_PORT: where the
	// TCPStore is, hosted by rank 0 or, with UseAgentStore, by the agent.
	MasterAddr string
	MasterPort int
	// RunID is TORCHELASTIC_RUN_ID, the rendezvous id ("none" for
	// torchrun's static rendezvous without --rdzv-id).
	RunID string
	// RestartCount and MaxRestarts are TORCHELASTIC_RESTART_COUNT and
	// TORCHELASTIC_MAX_RESTARTS (default 0).
	RestartCount, MaxRestarts int
	// UseAgentStore is TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent
	// already hosts the TCPStore on MASTER_ADDR:MASTER_PORT, so every rank,
	// rank 0 included, connects to it as a client, under the key prefix
	// AgentStorePrefix(RestartCount), as torch does.
	UseAgentStore bool
	// StoreDialect is GOCOLL_STORE_DIALECT: the protocol numbering of the
	// store's clients, 2 (store.DialectV2, PyTorch ≥ 2.2; the default) or
	// 1 (store.DialectV1), for an agent store of a torch 1.x/2.0 torchrun,
	// whose server a version 2 handshake would leave waiting.
	StoreDialect store.Dialect
}

// AgentStorePrefix is the key prefix of the workers' store inside
// torchrun's agent store for restart attempt n: "/worker/attempt_<n>",
// torch.distributed.rendezvous's, so that the keys of gocoll and torch
// workers of one job never mix with the agent's own or an earlier
// attempt's.
func AgentStorePrefix(n int) string { return "/worker/attempt_" + strconv.Itoa(n) }

// ReadEnv reads torchrun's variables (see Env) from the process
// environment and checks them: a missing or malformed variable, or a rank
// outside its range, is an error naming the variable and its value, so a
// bad launch fails before it connects anywhere.
func ReadEnv() (Env, error) { return readEnv(knob.OS) }

func readEnv(env knob.Env) (Env, error) {
	var e Env
	var err error
	bad := func(format string, args ...any) {
		if err == nil {
			err = fmt.Errorf("dispatcher: %w: "+format, append([]any{backend.ErrInvalidArgument}, args...)...)
		}
	}
	geti := func(name string, dst *int, def int, required bool) {
		if err != nil {
			return
		}
		v, ok := env(name)
		if !ok || v == "" {
			if required {
				bad("environment variable %s expected, but not set", name)
			}
			*dst = def
			return
		}
		n, perr := strconv.Atoi(v)
		if perr != nil {
			bad("%s=%q is not an integer", name, v)
			return
		}
		*dst = n
	}
	within := func(name string, v int, lo int, hiName string, hi int) {
		if err == nil && (v < lo || v >= hi) {
			bad("%s=%d is outside [%d, %s=%d)", name, v, lo, hiName, hi)
		}
	}
	geti("RANK", &e.Rank, 0, true)
	geti("WORLD_SIZE", &e.WorldSize, 0, true)
	geti("MASTER_PORT", &e.MasterPort, 0, true)
	if err == nil && e.WorldSize < 1 {
		bad("WORLD_SIZE=%d must be at least 1", e.WorldSize)
	}
	within("RANK", e.Rank, 0, "WORLD_SIZE", e.WorldSize)
	if err == nil && (e.MasterPort < 1 || e.MasterPort > 65535) {
		bad("MASTER_PORT=%d is not a TCP port (1 to 65535)", e.MasterPort)
	}
	geti("LOCAL_WORLD_SIZE", &e.LocalWorldSize, e.WorldSize, false)
	geti("LOCAL_RANK", &e.LocalRank, e.Rank, false)
	within("LOCAL_RANK", e.LocalRank, 0, "LOCAL_WORLD_SIZE", e.LocalWorldSize)
	geti("GROUP_WORLD_SIZE", &e.GroupWorldSize, 1, false)
	geti("GROUP_RANK", &e.GroupRank, 0, false)
	within("GROUP_RANK", e.GroupRank, 0, "GROUP_WORLD_SIZE", e.GroupWorldSize)
	geti("ROLE_WORLD_SIZE", &e.RoleWorldSize, e.WorldSize, false)
	geti("ROLE_RANK", &e.RoleRank, e.Rank, false)
	within("ROLE_RANK", e.RoleRank, 0, "ROLE_WORLD_SIZE", e.RoleWorldSize)
	geti("TORCHELASTIC_RESTART_COUNT", &e.RestartCount, 0, false)
	geti("TORCHELASTIC_MAX_RESTARTS", &e.MaxRestarts, 0, false)
	if err == nil && e.RestartCount < 0 {
		bad("TORCHELASTIC_RESTART_COUNT=%d is negative", e.RestartCount)
	}
	if err == nil && e.MaxRestarts < 0 {
		bad("TORCHELASTIC_MAX_RESTARTS=%d is negative", e.MaxRestarts)
	}
	switch v, _ := env("GOCOLL_STORE_DIALECT"); v {
	case "", "2":
		e.StoreDialect = store.DialectV2
	case "1":
		e.StoreDialect = store.DialectV1
	default:
		bad(`GOCOLL_STORE_DIALECT=%q: want 1 (PyTorch 1.x/2.0 stores) or 2 (PyTorch >= 2.2)`, v)
	}
	e.RoleName, _ = env("ROLE_NAME")
	e.RunID, _ = env("TORCHELASTIC_RUN_ID")
	if v, ok := env("TORCHELASTIC_USE_AGENT_STORE"); ok && v != "" {
		// torch compares with str(True); the agent writes "True" or "False".
		switch v {
		case "True", "true", "1":
			e.UseAgentStore = true
		case "False", "false", "0":
		default:
			bad(`TORCHELASTIC_USE_AGENT_STORE=%q: want "True" or "False"`, v)
		}
	}
	if err != nil {
		return e, err
	}
	e.MasterAddr, _ = env("MASTER_ADDR")
	if e.MasterAddr == "" {
		bad("environment variable MASTER_ADDR expected, but not set")
	}
	return e, err
}

// InitFromEnv starts a rank the way torchrun starts a torch rank: it reads
// and checks the environment (ReadEnv) and cfg's knobs, resolves
// MASTER_ADDR, then connects to the TCPStore on MASTER_ADDR:MASTER_PORT
// and calls Init with cfg's other fields. The store is torchrun's agent's
// when TORCHELASTIC_USE_AGENT_STORE=True (every rank is a client, its keys
// under AgentStorePrefix); otherwise rank 0 hosts it. cfg.Store, Rank and
// WorldSize are set here, and cfg.RunID, when empty, from
// TORCHELASTIC_RUN_ID. Closing the group closes that store (and, on a rank
// 0 that hosts it, its server).
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
	// One deadline from here: the store's rendezvous counts against the
	// Init timeout too, so every rank names a missing one by then.
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	if err := resolveMaster(ctx, env.MasterAddr, cfg.Timeout); err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(env.MasterAddr, strconv.Itoa(env.MasterPort))
	copts := store.ClientOptions{Timeout: cfg.Timeout, WorldSize: env.WorldSize, Dialect: env.StoreDialect}
	// Metrics come first, so that they see the store server's requests.
	m, err := newMetrics(cfg)
	if err != nil {
		return nil, err
	}
	sopts := store.TCPStoreOptions{IsMaster: env.Rank == 0, ClientOptions: copts}
	if sopts.IsMaster {
		// The server logs as the dispatcher does, naming the rank.
		sopts.Server.Logger = slog.Default().With("rank", env.Rank)
	}
	var srv atomic.Pointer[store.TCPServer]
	if m != nil && sopts.IsMaster && !env.UseAgentStore {
		sopts.Server.Observer = m.StoreServer(func() store.ServerStats {
			if s := srv.Load(); s != nil {
				return s.Stats()
			}
			return store.ServerStats{}
		})
	}
	var st *store.TCPStore
	if env.UseAgentStore {
		st, err = store.DialTCPStore(ctx, addr, copts)
	} else {
		// Rank 0 does not wait for the clients here: Init's one deadline
		// covers the rendezvous, and its error names a rank that never came.
		copts.NoWaitForWorkers = env.Rank == 0
		sopts.ClientOptions = copts
		st, err = store.NewTCPStore(ctx, addr, sopts)
	}
	if err != nil {
		if m != nil {
			_ = m.Close()
		}
		if env.Rank == 0 && !env.UseAgentStore && errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("dispatcher: rank 0 hosts the store on MASTER_PORT=%d, but the port is taken (under torchrun, whose agent hosts a store there, TORCHELASTIC_USE_AGENT_STORE=True says to use it): %w", env.MasterPort, err)
		}
		return nil, fmt.Errorf("dispatcher: rendezvous at %s (RANK=%d): %w", addr, env.Rank, err)
	}
	srv.Store(st.Server())
	cfg.Store, cfg.Rank, cfg.WorldSize = st, env.Rank, env.WorldSize
	if env.UseAgentStore {
		if cfg.Store, err = store.NewPrefixStore(AgentStorePrefix(env.RestartCount), st); err != nil {
			st.Close()
			if m != nil {
				_ = m.Close()
			}
			return nil, fmt.Errorf("dispatcher: %w", err)
		}
	}
	if cfg.RunID == "" {
		cfg.RunID = envRunID(env)
	}
	pg, err := initGroup(ctx, cfg, m)
	if err != nil {
		if env.Rank == 0 && !env.UseAgentStore {
			// This rank hosts the store: keep it up a moment, so that the
			// other ranks, which time out a little later, can still ask it
			// which rank never joined.
			time.Sleep(min(time.Second, cfg.Timeout/20))
		}
		st.Close()
		return nil, err
	}
	pg.ownedStore = st
	return pg, nil
}

// envRunID is the run id of torchrun's variables: TORCHELASTIC_RUN_ID, with
// the restart attempt when there was one (each attempt is a job of its
// own to the flight recorder's analyzer). torchrun's static default,
// "none", names no run.
func envRunID(env Env) string {
	if env.RunID == "" || env.RunID == "none" {
		return ""
	}
	if env.RestartCount > 0 {
		return env.RunID + "/attempt_" + strconv.Itoa(env.RestartCount)
	}
	return env.RunID
}

// resolveMaster checks that MASTER_ADDR resolves, before any rank waits on
// it: a name the resolver says does not exist fails at once, and one whose
// look-ups fail otherwise (a resolver that is not up yet) is retried until
// timeout, then fails naming it.
func resolveMaster(ctx context.Context, host string, timeout time.Duration) error {
	if net.ParseIP(host) != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 100 * time.Millisecond
	for {
		_, err := net.DefaultResolver.LookupHost(ctx, host)
		if err == nil {
			return nil
		}
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			return fmt.Errorf("dispatcher: %w: MASTER_ADDR=%q does not resolve: %w", backend.ErrInvalidArgument, host, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("dispatcher: %w: MASTER_ADDR=%q did not resolve within %v: %w", backend.ErrUnavailable, host, timeout, err)
		case <-t.C:
		}
		delay = min(2*delay, 5*time.Second)
	}
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
	str(&cfg.MetricsAddr, knobMetricsAddr)
	mo := &cfg.Monitor
	flag(&mo.Disable, knobNoMonitor)
	dur(&mo.HeartbeatTimeout, knobHeartbeat)
	dur(&mo.CoordCheck, knobCoordCheck)
	if err == nil {
		err = resolveDebug(&cfg, env) // debug.go
	}
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
