package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/store"
)

// TestServeMetrics: with --metrics-addr the server's requests and
// connections are served at /metrics, and a malformed address is an error
// naming the flag before anything listens.
func TestServeMetrics(t *testing.T) {
	if _, _, err := serveMetrics("no-port-here", slog.New(slog.DiscardHandler), &store.ServerOptions{}); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Fatalf("bad address: %v, want an error naming --metrics-addr", err)
	}
	t.Setenv("GOCOLL_METRICS_ADDR", "")
	if exp, set, err := serveMetrics("", slog.New(slog.DiscardHandler), &store.ServerOptions{}); exp != nil || err != nil {
		t.Fatalf("no address: exporter %v, err %v; want neither", exp, err)
	} else {
		set(nil)
	}

	o := store.ServerOptions{Addr: "127.0.0.1:0"}
	exp, setServer, err := serveMetrics("127.0.0.1:0", slog.New(slog.DiscardHandler), &o)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv, err := store.NewTCPServer(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	setServer(srv)
	c, err := store.DialTCPStore(ctx, srv.Addr().String(), store.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}

	resp, err := http.Get("http://" + exp.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)
	for _, want := range []string{
		`gocoll_store_server_request_duration_seconds_count{op="SET",rank="0"} 1`,
		`gocoll_store_server_request_duration_seconds_count{op="GET",rank="0"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The client holds a connection (two: it waits on a second one).
	if conns := `gocoll_store_server_connections{rank="0"} `; !strings.Contains(text, conns) || strings.Contains(text, conns+"0\n") {
		t.Errorf("/metrics has no open connection in %q", conns)
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", text)
	}
}
