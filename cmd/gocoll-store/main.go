// Command gocoll-store runs gocoll's TCPStore server on its own, so that a Go
// process can host the rendezvous of PyTorch (or gocoll) ranks, and
// benchmarks it against PyTorch's server.
//
//	gocoll-store serve --addr 0.0.0.0:29500 [--secret-file F] [--max-value-bytes N] [--engine auto|ring|goroutines]
//	                   [--memory-budget 256MiB] [--max-conns N] [--frame-timeout 30s]
//	gocoll-store bench rendezvous [--n 1024,4096,8192] [--procs 8] [--torch /usr/bin/python3] [--repeat N]
//	gocoll-store bench [--duration 3s] [--conns 1,8,64,256] [--rates 5000,10000] [--torch /usr/bin/python3]
//	                   [--engines auto,ring,goroutines] [--client ring|epoll] [--repeat N]
//	                   [--baseline OLD-gocoll-store] [--client-cpu 0] [--server-cpu 1] [--server-procs 1]
//
// serve runs until SIGINT or SIGTERM. With torch ranks, set MASTER_ADDR and
// MASTER_PORT to the server and TORCHELASTIC_USE_AGENT_STORE=1 so that every
// rank is a client (torch 1.13 also needs TORCHELASTIC_RESTART_COUNT=0).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/metrics"
	"github.com/gocoll/gocoll/store"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "bench":
		if len(os.Args) > 2 && os.Args[2] == "rendezvous" {
			err = benchRendezvous(os.Args[3:])
		} else {
			err = bench(os.Args[2:])
		}
	case "rendezvous-client": // the client processes of bench rendezvous
		err = rendezvousClient(os.Args[2:])
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "gocoll-store: unknown command %q\n", os.Args[1])
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gocoll-store:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  gocoll-store serve --addr HOST:PORT [--secret-file F] [--max-value-bytes N] [--engine auto|ring|goroutines]
                     [--memory-budget BYTES] [--max-conns N] [--frame-timeout D]
  gocoll-store bench rendezvous [--n 1024,4096,8192] [--procs N] [--torch PYTHON] [--repeat N]
  gocoll-store bench [--duration D] [--conns 1,8,64,256] [--rates 5000,10000] [--torch PYTHON]
                     [--engines auto,ring,goroutines] [--client ring|epoll] [--repeat N]
                     [--baseline EXE] [--client-cpu N] [--server-cpu N] [--server-procs N]
`)
	os.Exit(2)
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", ":29500", "address to listen on, HOST:PORT")
	secretFile := fs.String("secret-file", "", "file holding the shared secret clients must prove (default $"+store.SecretEnv+"; PyTorch clients cannot)")
	secretArg := fs.String("secret", "", "removed: a secret on the command line is visible in ps; use --secret-file or $"+store.SecretEnv)
	maxVal := fs.Int("max-value-bytes", store.DefaultMaxValueLen, "largest value accepted")
	budget := fs.String("memory-budget", "", "bytes of queued replies and request buffers, server-wide, e.g. 256MiB (default $"+store.MemoryBudgetEnv+", else 256MiB)")
	maxConns := fs.Int("max-conns", 0, "most open client connections (default: the raised RLIMIT_NOFILE less a sixteenth)")
	frameTimeout := fs.Duration("frame-timeout", 0, "time a begun request has to arrive whole (default 30s; idle connections are never timed out)")
	engine := fs.String("engine", "auto", "how connections are driven: auto, ring (io_uring) or goroutines (default $"+store.EngineEnv+", else auto)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (diagnostics)")
	metricsAddr := fs.String("metrics-addr", "", "serve the server's Prometheus metrics at http://HOST:PORT/metrics (default $"+dispatcher.MetricsAddrEnv+"; off when empty)")
	_ = fs.Parse(args)
	if *secretArg != "" {
		return fmt.Errorf("--secret is no longer accepted: a secret on the command line is visible to every user in ps; put it in a file for --secret-file, or in $%s", store.SecretEnv)
	}
	eng, err := store.ParseEngine(*engine)
	if err != nil {
		return err
	}
	o := store.ServerOptions{Addr: *addr, MaxValueLen: *maxVal, Engine: eng, MaxConns: *maxConns, FrameTimeout: *frameTimeout}
	if *secretFile != "" {
		b, err := os.ReadFile(*secretFile)
		if err != nil {
			return fmt.Errorf("--secret-file: %w", err)
		}
		if b = bytes.TrimRight(b, "\r\n"); len(b) == 0 {
			return fmt.Errorf("--secret-file %s is empty", *secretFile)
		}
		o.Secret = b
	}
	if *budget != "" {
		if o.MemoryBudget, err = store.ParseBytes(*budget); err != nil {
			return fmt.Errorf("--memory-budget: %w", err)
		}
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	o.Logger = log
	// Every client holds a descriptor: take all the process may have.
	nofile, err := store.RaiseNofile()
	if err != nil {
		log.Warn("gocoll-store: could not raise RLIMIT_NOFILE", "err", err)
	}
	exp, setServer, err := serveMetrics(*metricsAddr, log, &o)
	if err != nil {
		return err
	}
	if exp != nil {
		defer exp.Close()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := store.NewTCPServer(ctx, o)
	if err != nil {
		return err
	}
	setServer(srv)
	auth := "off"
	if len(o.Secret) > 0 || os.Getenv(store.SecretEnv) != "" {
		auth = "on"
	}
	log.Info("gocoll-store serving", "addr", srv.Addr().String(), "auth", auth, "engine", srv.Engine().String(), "nofile", nofile)
	if auth == "off" && !loopbackOnly(srv.Addr()) {
		log.Warn("gocoll-store: listening beyond loopback with authentication off: anyone who can reach " + srv.Addr().String() +
			" can read, change and delete every key. Set a secret (--secret-file or " + store.SecretEnv + ") if every client is gocoll's, or bind 127.0.0.1 or a private interface.")
	}
	// Scripts read the port from this line.
	fmt.Printf("LISTENING %s\n", srv.Addr().String())
	<-ctx.Done()
	log.Info("gocoll-store shutting down")
	return srv.Close()
}

// serveMetrics turns on the store server's metrics (the gocoll_store_server_*
// series of package metrics) when addr, or else GOCOLL_METRICS_ADDR, names
// an address: it sets o.Observer and serves /metrics there. setServer hands
// it the server, whose connection and queued-bytes gauges are read at each
// scrape; until then they read zero. With no address it returns a nil
// Exporter and a setServer that does nothing.
func serveMetrics(addr string, log *slog.Logger, o *store.ServerOptions) (exp *metrics.Exporter, setServer func(*store.TCPServer), err error) {
	name := "--metrics-addr"
	if addr == "" {
		addr, name = os.Getenv(dispatcher.MetricsAddrEnv), dispatcher.MetricsAddrEnv
	}
	if addr == "" {
		return nil, func(*store.TCPServer) {}, nil
	}
	// A standalone server has no job to keep going: a bad address is an
	// error here, where a rank only logs it (metrics.Exporter.Start).
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, nil, fmt.Errorf("%s=%q: %w", name, addr, err)
	}
	var srv atomic.Pointer[store.TCPServer]
	exp = metrics.New(metrics.Options{Logger: log})
	o.Observer = exp.StoreServer(func() store.ServerStats {
		if s := srv.Load(); s != nil {
			return s.Stats()
		}
		return store.ServerStats{}
	})
	if err := exp.Start(dispatcher.MetricsProcess{Rank: 0, WorldSize: 1, Addr: addr}); err != nil {
		return nil, nil, err
	}
	if exp.Addr() == nil {
		exp.Close()
		return nil, nil, fmt.Errorf("%s=%q: cannot listen there (see the log line above)", name, addr)
	}
	return exp, func(s *store.TCPServer) { srv.Store(s) }, nil
}

// loopbackOnly reports whether a listens on a loopback address only.
func loopbackOnly(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

const torchServerPy = `
import sys, datetime, resource, torch, torch.distributed as dist
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # thousands of clients in bench rendezvous
s = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=300), wait_for_workers=False)
print("PORT", s.port, torch.__version__, flush=True)
sys.stdin.read()
`

// pinned returns the command line argv, run under taskset on cpu when cpu
// is not empty.
func pinned(cpu string, argv ...string) *exec.Cmd {
	if cpu != "" {
		argv = append([]string{"taskset", "-c", cpu}, argv...)
	}
	return exec.Command(argv[0], argv[1:]...)
}

// startTorchServer runs PyTorch's TCPStore server in python, on cpu.
func startTorchServer(py, cpu string) (addr, version string, pid int, stop func(), err error) {
	cmd := pinned(cpu, py, "-c", torchServerPy)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", "", 0, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", "", 0, nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", "", 0, nil, err
	}
	stop = func() { stdin.Close(); _ = cmd.Wait() }
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		stop()
		return "", "", 0, nil, errors.New("torch server printed nothing")
	}
	f := strings.Fields(sc.Text())
	if len(f) != 3 || f[0] != "PORT" {
		stop()
		return "", "", 0, nil, fmt.Errorf("torch server said %q", sc.Text())
	}
	return "127.0.0.1:" + f[1], f[2], cmd.Process.Pid, stop, nil
}

// startOurServer runs "EXE serve" on a free loopback port, on cpu, with
// GOMAXPROCS=procs when procs > 0. exe empty means this program.
func startOurServer(exe, cpu string, procs int, engine string) (addr string, pid int, stop func(), err error) {
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return "", 0, nil, err
		}
	}
	cmd := pinned(cpu, exe, "serve", "--addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), store.SecretEnv+"=", store.EngineEnv+"="+engine)
	if procs > 0 {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(procs))
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	stop = func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "LISTENING "); ok {
			return a, cmd.Process.Pid, stop, nil
		}
	}
	stop()
	return "", 0, nil, errors.New("gocoll-store serve printed no LISTENING line")
}
