package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/store"
)

// TestServeRefusesSecretOnArgv: a secret on the command line is refused
// with a message that names the ways that keep it out of ps.
func TestServeRefusesSecretOnArgv(t *testing.T) {
	err := serve([]string{"--addr", "127.0.0.1:0", "--secret", "s3cret"})
	if err == nil || !strings.Contains(err.Error(), "--secret-file") || !strings.Contains(err.Error(), store.SecretEnv) {
		t.Fatalf("serve --secret: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := serve([]string{"--addr", "127.0.0.1:0", "--secret-file", empty}); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("serve --secret-file of an empty file: %v", err)
	}
	if err := serve([]string{"--addr", "127.0.0.1:0", "--memory-budget", "lots"}); err == nil || !strings.Contains(err.Error(), "--memory-budget") {
		t.Fatalf("serve --memory-budget lots: %v", err)
	}
}

func TestLoopbackOnly(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:1": true, "[::1]:1": true, "0.0.0.0:1": false, "[::]:1": false, "10.1.2.3:1": false} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := loopbackOnly(a); got != want {
			t.Errorf("loopbackOnly(%s) = %v, want %v", addr, got, want)
		}
	}
}

// TestRendezvousRanks runs the bench's client sequence for 64 ranks in
// this process against both engines: every rank completes, with no error.
func TestRendezvousRanks(t *testing.T) {
	for _, e := range []store.Engine{store.EngineRing, store.EngineGoroutines} {
		srv, err := store.NewTCPServer(context.Background(), store.ServerOptions{Addr: "127.0.0.1:0", Engine: e, NoEnvSecret: true})
		if err != nil {
			if e == store.EngineRing {
				t.Logf("no ring engine here: %v", err)
				continue
			}
			t.Fatal(err)
		}
		const n = 64
		var wg sync.WaitGroup
		errs := make(chan error, n)
		deadline := time.Now().Add(time.Minute)
		for r := range n {
			wg.Go(func() {
				if _, err := rendezvousRank(srv.Addr().String(), r, n, deadline); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("%s: %v", e, err)
		}
		_ = srv.Close()
	}
}
