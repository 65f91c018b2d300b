package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
	"github.com/onsi/ginkgo/v2/types"
)

// clientTimeout is the timeout of TestTwoHosts's store clients.
const clientTimeout = 3 * time.Second

// envRole makes the test binary one of the processes of the two-host test
// (netnsRole) instead of running the tests.
const envRole = "GOCOLL_NETNS_ROLE"

func TestMain(m *testing.M) {
	conformance.RunChild() // a failure spec's child process: runs and exits
	if role := os.Getenv(envRole); role != "" {
		os.Exit(netnsRole(role, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// netnsRole runs one process of TestTwoHosts:
//   - rank: a conformance rank, as `conftest rank ARGS`;
//   - loop: a rank that allreduces until an op fails, printing "ok N" after
//     each and, at the end, "FAILED ranks=[...] after=D: error";
//   - store-server: a TCPStore server on ARGS[0], until stdin closes;
//   - store-client: a client of the server at ARGS[0]: it sets and gets a
//     key, prints "ok", and on each line of stdin tries again, printing
//     "ok" or "FAILED after=D: error".
func netnsRole(role string, args []string) int {
	ctx := context.Background()
	switch role {
	case "rank":
		if err := rank(args); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		return 2
	case "loop":
		timeout, _ := time.ParseDuration(os.Getenv("GOCOLL_NETNS_OP_TIMEOUT"))
		pg, err := dispatcher.InitFromEnv(ctx, dispatcher.Config{Backend: "cpupool", Timeout: timeout})
		if err != nil {
			fmt.Println("FAILED init:", err)
			return 1
		}
		x := tensor.New(tensor.Float32, 1024)
		for i := 1; ; i++ {
			start := time.Now()
			w, err := pg.Allreduce(ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{})
			if err == nil {
				err = w.Wait(ctx)
			}
			if err != nil {
				var oe *backend.OpError
				var ranks []int
				if errors.As(err, &oe) {
					ranks = oe.Ranks
				}
				fmt.Printf("FAILED ranks=%v after=%v: %v\n", ranks, time.Since(start).Round(time.Millisecond), err)
				// Stay until the test has every rank's verdict: a rank that
				// exits closes its connections, and a peer still waiting
				// would hear of that rather than of the cut.
				_, _ = io.Copy(io.Discard, os.Stdin)
				return 1
			}
			fmt.Println("ok", i)
			time.Sleep(20 * time.Millisecond)
		}
	case "store-server":
		srv, err := store.NewTCPServer(ctx, store.ServerOptions{Addr: args[0]})
		if err != nil {
			fmt.Println("FAILED", err)
			return 1
		}
		fmt.Println("listening")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return exitCode(srv.Close())
	case "store-client":
		// One client, kept across the lines of stdin: "op" sets and gets a
		// key on it, "dial" replaces it with a new one first.
		var c *store.TCPStore
		defer func() {
			if c != nil {
				c.Close()
			}
		}()
		sc := bufio.NewScanner(os.Stdin)
		for n := 0; sc.Scan(); n++ {
			start := time.Now()
			cctx, cancel := context.WithTimeout(ctx, clientTimeout)
			var err error
			if sc.Text() == "dial" || c == nil {
				if c != nil {
					c.Close()
				}
				c, err = store.DialTCPStore(cctx, args[0], store.ClientOptions{Timeout: clientTimeout, NoEnvSecret: true})
			}
			if err == nil {
				k := "key" + strconv.Itoa(n)
				if err = c.Set(cctx, k, []byte("v")); err == nil {
					_, err = c.Get(cctx, k)
				}
			}
			cancel()
			if err != nil {
				fmt.Printf("FAILED after=%v: %v\n", time.Since(start).Round(time.Millisecond), err)
				if c != nil {
					c.Close()
				}
				c = nil
				continue
			}
			fmt.Println("ok")
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

func exitCode(err error) int {
	if err != nil {
		fmt.Println("FAILED", err)
		return 1
	}
	return 0
}

// host is one network namespace of TestTwoHosts: a "host" with one veth
// end and its address.
type host struct {
	ns, veth, addr, name string
}

// twoHosts is a pair of network namespaces joined by a veth pair, made
// and removed by the test.
type twoHosts struct {
	t     *testing.T
	hosts [2]host
	self  string
	mu    sync.Mutex
	procs []*proc
}

// newTwoHosts makes the namespaces, or skips where that is not possible.
// Their only interfaces are lo and the veth end; the addresses are the
// test's own (10.231.N.1 and .2), reachable from nowhere else.
func newTwoHosts(t *testing.T) *twoHosts {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make network namespaces (ip netns); CI runs as root")
	}
	for _, tool := range []string{"ip", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (.ci/run installs iproute2 and util-linux): %v", tool, err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	id := os.Getpid()
	sub := 1 + id%250
	th := &twoHosts{t: t, self: self}
	for i := range th.hosts {
		th.hosts[i] = host{ns: fmt.Sprintf("gocoll-h%d-%d", i, id), veth: fmt.Sprintf("gcv%d", i),
			addr: fmt.Sprintf("10.231.%d.%d", sub, i+1), name: fmt.Sprintf("gocoll-host%d", i)}
	}
	if out, err := exec.Command("ip", "netns", "add", th.hosts[0].ns).CombinedOutput(); err != nil {
		t.Skipf("cannot make a network namespace here (%v: %s)", err, strings.TrimSpace(string(out)))
	}
	// Cleanup runs last-in first-out: the processes go before the
	// namespaces (deleting a namespace deletes its veth end, and the pair).
	t.Cleanup(func() {
		for _, h := range th.hosts {
			_ = exec.Command("ip", "netns", "del", h.ns).Run()
		}
	})
	t.Cleanup(th.stopAll)
	th.ip("netns", "add", th.hosts[1].ns)
	th.ip("link", "add", th.hosts[0].veth, "netns", th.hosts[0].ns, "type", "veth", "peer", "name", th.hosts[1].veth, "netns", th.hosts[1].ns)
	for _, h := range th.hosts {
		th.ip("-n", h.ns, "addr", "add", h.addr+"/24", "dev", h.veth)
		th.ip("-n", h.ns, "link", "set", "lo", "up")
		th.ip("-n", h.ns, "link", "set", h.veth, "up")
	}
	return th
}

func (th *twoHosts) ip(args ...string) {
	th.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		th.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// cut takes host 0's veth end down, which cuts the link: packets between
// the hosts are dropped, as by a failed switch; restore brings it back.
func (th *twoHosts) cut()     { th.ip("-n", th.hosts[0].ns, "link", "set", th.hosts[0].veth, "down") }
func (th *twoHosts) restore() { th.ip("-n", th.hosts[0].ns, "link", "set", th.hosts[0].veth, "up") }

// proc is a role process in one namespace.
type proc struct {
	name   string // role@namespace
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *strings.Builder
	done   chan struct{}
	exit   error
}

// start runs the test binary as role in host h's namespace, with a UTS
// namespace of its own named after the host, so that ranks of one host
// (and only those) take each other for neighbours (shared memory).
func (th *twoHosts) start(h host, role string, env []string, args ...string) *proc {
	th.t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", h.ns, "unshare", "--uts", "--", "sh", "-c",
		`hostname "$GOCOLL_NETNS_HOSTNAME" && exec "$0" "$@"`, th.self}, args...)...)
	cmd.Env = append(append(os.Environ(), envRole+"="+role, "GOCOLL_NETNS_HOSTNAME="+h.name, "GOCOLL_SOCKET_IFNAME="+h.veth), env...)
	p := &proc{name: role + "@" + h.ns, cmd: cmd, lines: make(chan string, 1024), stderr: &strings.Builder{}, done: make(chan struct{})}
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		th.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		th.t.Fatal(err)
	}
	cmd.Stderr = &lockedWriter{b: p.stderr}
	if err := cmd.Start(); err != nil {
		th.t.Fatal(err)
	}
	th.mu.Lock()
	th.procs = append(th.procs, p)
	th.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // nobody reads this many: drop
			}
		}
		p.exit = cmd.Wait()
		close(p.lines)
		close(p.done)
	}()
	return p
}

type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// next returns the next output line that has prefix, or fails the test
// after d.
func (p *proc) next(t *testing.T, prefix string, d time.Duration) string {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("%v ended (%v) before printing %q; stderr:\n%s", p.name, p.exit, prefix, p.cmd.Stderr)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timer.C:
			t.Fatalf("%v printed no %q within %v; stderr:\n%s", p.name, prefix, d, p.cmd.Stderr)
		}
	}
}

// wait waits for the process to end, up to d.
func (p *proc) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.exit
	case <-time.After(d):
		t.Fatalf("%v still running after %v; stderr:\n%s", p.name, d, p.cmd.Stderr)
		return nil
	}
}

func (th *twoHosts) stopAll() {
	th.mu.Lock()
	defer th.mu.Unlock()
	for _, p := range th.procs {
		_ = p.stdin.Close()
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	th.procs = nil
}

// rankEnv is torchrun's variables for rank r of 4: ranks 0 and 1 on host 0
// (which hosts the store, on rank 0), 2 and 3 on host 1.
func (th *twoHosts) rankEnv(r, port int) []string {
	return []string{"RANK=" + strconv.Itoa(r), "WORLD_SIZE=4", "LOCAL_RANK=" + strconv.Itoa(r%2), "LOCAL_WORLD_SIZE=2",
		"GROUP_RANK=" + strconv.Itoa(r/2), "GROUP_WORLD_SIZE=2", "MASTER_ADDR=" + th.hosts[0].addr, "MASTER_PORT=" + strconv.Itoa(port),
		"GOCOLL_TRACE_BUFFER_SIZE=0"}
}

// TestTwoHosts puts 2 hosts × 2 cpupool ranks on network namespaces joined
// by veth: a conformance subset over real TCP between the hosts (and
// shared memory inside each), then a cut of the link, which the ranks on
// each side must report within the op timeout naming ranks of the other
// side; then the store: a client across the cut fails with a clear error,
// while the server goes on serving.
func TestTwoHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 4 rank processes in network namespaces")
	}
	th := newTwoHosts(t)
	t.Run("conformance", func(t *testing.T) {
		dir := t.TempDir()
		ranks := make([]*proc, 4)
		for r := range ranks {
			env := append(th.rankEnv(r, 29500), conformance.EnvReport+"="+filepath.Join(dir, fmt.Sprintf("rank%d.json", r)))
			ranks[r] = th.start(th.hosts[r/2], "rank", env, "--backend", "cpupool", "--label-filter", "ops && !stress",
				"--timeout", "20s", "--threads", "2")
		}
		for r, p := range ranks {
			if err := p.wait(t, 3*time.Minute); err != nil {
				t.Fatalf("rank %d: %v; stderr:\n%s", r, err, p.cmd.Stderr)
			}
		}
		passed, failed := countReport(t, filepath.Join(dir, "rank0.json"))
		t.Logf("conformance subset over two hosts: %d passed, %d failed", passed, failed)
		if passed < 100 || failed != 0 {
			t.Fatalf("%d passed, %d failed", passed, failed)
		}
	})
	t.Run("cut", func(t *testing.T) {
		const opTimeout = 5 * time.Second
		// slack is what the test allows beyond the op timeout: the op
		// that fails starts up to one loop pause (20 ms) after the cut,
		// its diagnosis takes at most cpupool.DiagnosisBudget (500 ms:
		// the peers' probe and the store's desync report, at the same
		// time) and the dump signal at most 100 ms more (DumpAll); the
		// rest is for a busy machine.
		const slack = time.Second
		ranks := make([]*proc, 4)
		for r := range ranks {
			ranks[r] = th.start(th.hosts[r/2], "loop", append(th.rankEnv(r, 29501), "GOCOLL_NETNS_OP_TIMEOUT="+opTimeout.String()))
		}
		for _, p := range ranks {
			p.next(t, "ok 20", time.Minute)
		}
		th.cut()
		cutAt := time.Now()
		defer th.restore()
		for r, p := range ranks {
			l := p.next(t, "FAILED", 3*opTimeout) // fails later than the goal: measured below
			since := time.Since(cutAt)
			t.Logf("rank %d, %v after the cut: %s", r, since.Round(time.Millisecond), l)
			var named []int
			if i, j := strings.Index(l, "ranks=["), strings.Index(l, "] after="); i >= 0 && j > i {
				for _, f := range strings.Fields(l[i+len("ranks=[") : j]) {
					n, _ := strconv.Atoi(f)
					named = append(named, n)
				}
			}
			other := []int{2, 3}
			if r >= 2 {
				other = []int{0, 1}
			}
			if len(named) == 0 || slices.ContainsFunc(named, func(n int) bool { return !slices.Contains(other, n) }) {
				t.Errorf("rank %d names ranks %v, want ranks of the other host %v", r, named, other)
			}
			// The goal is the op timeout (issue 15, item 1), on both
			// sides of the cut: the ranks on the store's far side may not
			// wait for the store.
			if since > opTimeout+slack {
				t.Errorf("rank %d failed %v after the cut, beyond the op timeout (%v) + %v", r, since.Round(time.Millisecond), opTimeout, slack)
			}
		}
		th.stopAll()
	})
	t.Run("store", func(t *testing.T) {
		addr := th.hosts[0].addr + ":29600"
		srv := th.start(th.hosts[0], "store-server", nil, addr)
		srv.next(t, "listening", 30*time.Second)
		far := th.start(th.hosts[1], "store-client", nil, addr)
		near := th.start(th.hosts[0], "store-client", nil, addr)
		ask := func(p *proc, what string) string {
			fmt.Fprintln(p.stdin, what)
			return p.next(t, "", 15*time.Second)
		}
		if l := ask(far, "dial"); l != "ok" {
			t.Fatalf("a client on the other host, before the cut: %s", l)
		}
		th.cut()
		l := ask(far, "op")
		t.Logf("the client across the cut: %s", l)
		if !strings.HasPrefix(l, "FAILED") || !strings.Contains(l, addr) || !strings.Contains(l, "timeout") {
			t.Errorf("the client across the cut: %q, want an error naming %s and the timeout", l, addr)
		}
		// Within its 3 s timeout and 1 s of slack (a busy machine): the
		// wait's CANCEL_WAIT exchange, which the server's host cannot
		// answer, must not delay the error.
		after, _, _ := strings.Cut(strings.TrimPrefix(l, "FAILED after="), ":")
		if d, err := time.ParseDuration(after); err != nil || d > clientTimeout+time.Second {
			t.Errorf("the client across the cut failed after %q, beyond its timeout %v + 1 s", after, clientTimeout)
		}
		if l := ask(near, "dial"); l != "ok" {
			t.Errorf("a client on the server's host, during the cut: %s", l)
		}
		th.restore()
		if l := ask(far, "dial"); l != "ok" {
			t.Errorf("a new client on the other host, after the cut: %s", l)
		}
		select {
		case <-srv.done:
			t.Fatalf("the server ended: %v", srv.exit)
		default:
		}
	})
}

// countReport counts the passed and failed specs of a rank's JSON report.
func countReport(t *testing.T, path string) (passed, failed int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var reps []types.Report
	if err := json.Unmarshal(b, &reps); err != nil || len(reps) == 0 {
		t.Fatalf("%s: %v", path, err)
	}
	for _, sp := range reps[0].SpecReports {
		switch {
		case sp.LeafNodeType != types.NodeTypeIt:
		case sp.State == types.SpecStatePassed:
			passed++
		case sp.Failed():
			failed++
		}
	}
	return passed, failed
}
