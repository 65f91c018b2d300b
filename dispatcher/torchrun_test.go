package dispatcher

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/store"
)

// torchrunEnv is what torchrun's agent gives worker 1 of 2 on one node,
// with the given changes.
func torchrunEnv(change map[string]string) map[string]string {
	m := map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
		"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2", "ROLE_NAME": "default",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none",
		"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"}
	for k, v := range change {
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return m
}

func TestReadTorchrunEnv(t *testing.T) {
	e, err := readEnv(knob.Map(torchrunEnv(map[string]string{"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3"})))
	if err != nil {
		t.Fatal(err)
	}
	want := Env{Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, GroupRank: 0, GroupWorldSize: 1, RoleName: "default",
		RoleRank: 1, RoleWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 29500, RunID: "none", RestartCount: 2, MaxRestarts: 3, UseAgentStore: true, StoreDialect: store.DialectV2}
	if e != want {
		t.Fatalf("got %+v\nwant %+v", e, want)
	}
	// A plain launcher sets only the five variables: the rest default.
	e, err = readEnv(knob.Map(map[string]string{"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}))
	want = Env{Rank: 3, WorldSize: 4, LocalRank: 3, LocalWorldSize: 4, GroupWorldSize: 1, RoleRank: 3, RoleWorldSize: 4, MasterAddr: "h", MasterPort: 1, StoreDialect: store.DialectV2}
	if err != nil || e != want {
		t.Fatalf("got %+v, %v\nwant %+v", e, err, want)
	}
	if envRunID(want) != "" || envRunID(Env{RunID: "none"}) != "" || envRunID(Env{RunID: "j"}) != "j" || envRunID(Env{RunID: "j", RestartCount: 2}) != "j/attempt_2" {
		t.Fatal("envRunID")
	}
}

func TestReadEnvRejects(t *testing.T) {
	for _, c := range []struct {
		change map[string]string
		want   string
	}{
		{map[string]string{"RANK": "5"}, "RANK=5 is outside [0, WORLD_SIZE=2)"},
		{map[string]string{"RANK": "-1"}, "RANK=-1 is outside [0, WORLD_SIZE=2)"},
		{map[string]string{"RANK": ""}, "environment variable RANK expected, but not set"},
		{map[string]string{"WORLD_SIZE": "two"}, `WORLD_SIZE="two" is not an integer`},
		{map[string]string{"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE=0 must be at least 1"},
		{map[string]string{"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"},
		{map[string]string{"MASTER_ADDR": ""}, "MASTER_ADDR expected"},
		{map[string]string{"LOCAL_RANK": "2"}, "LOCAL_RANK=2 is outside [0, LOCAL_WORLD_SIZE=2)"},
		{map[string]string{"LOCAL_WORLD_SIZE": "1"}, "LOCAL_RANK=1 is outside [0, LOCAL_WORLD_SIZE=1)"},
		{map[string]string{"GROUP_RANK": "1"}, "GROUP_RANK=1 is outside [0, GROUP_WORLD_SIZE=1)"},
		{map[string]string{"ROLE_RANK": "x"}, `ROLE_RANK="x" is not an integer`},
		{map[string]string{"TORCHELASTIC_RESTART_COUNT": "-1"}, "TORCHELASTIC_RESTART_COUNT=-1 is negative"},
		{map[string]string{"TORCHELASTIC_USE_AGENT_STORE": "yes"}, `TORCHELASTIC_USE_AGENT_STORE="yes": want "True" or "False"`},
		{map[string]string{"GOCOLL_STORE_DIALECT": "3"}, `GOCOLL_STORE_DIALECT="3": want 1`},
	} {
		_, err := readEnv(knob.Map(torchrunEnv(c.change)))
		if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want ErrInvalidArgument naming %q", c.change, err, c.want)
		}
	}
}

func setEnv(t *testing.T, m map[string]string) {
	for _, k := range []string{"LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
		"ROLE_NAME", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "GOCOLL_STORE_DIALECT"} {
		t.Setenv(k, "")
	}
	for k, v := range m {
		t.Setenv(k, v)
	}
}

// TestInitFromEnvAgentStore plays torchrun's agent with a gocoll server:
// the agent hosts the store on MASTER_PORT, so rank 0 must not try to
// listen there, and the ranks' keys go under /worker/attempt_<restart>.
func TestInitFromEnvAgentStore(t *testing.T) {
	ctx := context.Background()
	srv, err := store.NewTCPServer(ctx, store.ServerOptions{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	setEnv(t, torchrunEnv(map[string]string{"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
		"ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1", "MASTER_PORT": strconv.Itoa(srv.Port()), "TORCHELASTIC_RESTART_COUNT": "3",
		"TORCHELASTIC_RUN_ID": "job9"}))
	pg, err := InitFromEnv(ctx, Config{Backend: "reccpu", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d := pg.FlightRecorder().Snapshot("test"); d.RunID != "job9/attempt_3" {
		t.Fatalf("run id %q", d.RunID)
	}
	agent, err := store.DialTCPStore(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.Port())), store.ClientOptions{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	for key, want := range map[string]bool{"/worker/attempt_3/default_pg/barrier/init/0": true, "default_pg/barrier/init/0": false} {
		if ok, err := agent.Check(ctx, key); err != nil || ok != want {
			t.Errorf("agent store key %q: present %v (%v), want %v", key, ok, err, want)
		}
	}
	if err := pg.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The agent's server outlives the ranks' clients.
	if ok, err := agent.Check(ctx, "/worker/attempt_3/default_pg/barrier/init/0"); err != nil || !ok {
		t.Fatalf("agent store after the rank closed: %v %v", ok, err)
	}
	// Without TORCHELASTIC_USE_AGENT_STORE rank 0 hosts the store, and the
	// agent's port is taken: the error says what to set.
	t.Setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
	_, err = InitFromEnv(ctx, Config{Backend: "reccpu", Timeout: 10 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "TORCHELASTIC_USE_AGENT_STORE=True") {
		t.Fatalf("rank 0 on a taken port: %v", err)
	}
}

// TestInitFromEnvBadInput: a bad launch fails before it connects, naming
// the value.
func TestInitFromEnvBadInput(t *testing.T) {
	ctx := context.Background()
	setEnv(t, map[string]string{"RANK": "5", "WORLD_SIZE": "2", "MASTER_ADDR": "192.0.2.1", "MASTER_PORT": "29500"})
	_, err := InitFromEnv(ctx, Config{Backend: "reccpu"})
	if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), "RANK=5 is outside [0, WORLD_SIZE=2)") {
		t.Fatalf("RANK=5: %v", err)
	}
	setEnv(t, map[string]string{"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "nosuchhost.invalid", "MASTER_PORT": "29500"})
	_, err = InitFromEnv(ctx, Config{Backend: "reccpu", Timeout: 3 * time.Second})
	// "Does not resolve" where a resolver answers; "did not resolve within"
	// where none does.
	if err == nil || !strings.Contains(err.Error(), `MASTER_ADDR="nosuchhost.invalid" d`) {
		t.Fatalf("MASTER_ADDR=nosuchhost.invalid: %v", err)
	}
}
