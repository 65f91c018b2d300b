package dispatcher

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/gocoll/gocoll/backend"
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
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	addr := net.JoinHostPort(env.MasterAddr, strconv.Itoa(env.MasterPort))
	st, err := store.NewTCPStore(ctx, addr, store.TCPStoreOptions{
		IsMaster:      env.Rank == 0,
		ClientOptions: store.ClientOptions{Timeout: timeout, WorldSize: env.WorldSize},
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
