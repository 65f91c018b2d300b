package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// torchPython is the interpreter the interop tests run; CI installs
// Debian's python3-torch (torch 1.13) for it with .ci/store-deps.sh.
const torchPython = "/usr/bin/python3"

// needTorch skips the test when torchPython cannot import torch.
func needTorch(t *testing.T) {
	t.Helper()
	out, err := exec.Command(torchPython, "-c", "import torch").CombinedOutput()
	if err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		t.Skipf("%s cannot import torch (%v: %s); run .ci/store-deps.sh to install python3-torch", torchPython, err, lines[len(lines)-1])
	}
}

// startPython runs a Python script with args; its stdout lines come on the
// returned channel, and stderr is kept for failure messages.
type pyProc struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *logBuf
	stdin  io.WriteCloser
}

func startPython(t *testing.T, script string, env []string, args ...string) *pyProc {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.py")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(torchPython, append([]string{path}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	p := &pyProc{cmd: cmd, lines: make(chan string, 100), stderr: &logBuf{}}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = p.stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return p
}

// expect waits for a stdout line with the given prefix and returns it.
func (p *pyProc) expect(t *testing.T, prefix string, d time.Duration) string {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				err := p.cmd.Wait()
				t.Fatalf("python exited (%v) before printing %q; stderr:\n%s", err, prefix, p.stderr.String())
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
			if strings.HasPrefix(l, "FAIL") {
				t.Fatalf("python: %s; stderr:\n%s", l, p.stderr.String())
			}
		case <-timer.C:
			t.Fatalf("no %q from python within %v; stderr:\n%s", prefix, d, p.stderr.String())
		}
	}
}

const torchClientScript = `
import sys, datetime, traceback
import torch.distributed as dist
host, port = sys.argv[1], int(sys.argv[2])
def check(cond, what):
    if not cond:
        print("FAIL", what, flush=True); sys.exit(1)
try:
    s = dist.TCPStore(host, port, 2, False, datetime.timedelta(seconds=20))
    s.set("k1", b"v1"); check(s.get("k1") == b"v1", "get k1")
    s.set("s", "str-value"); check(s.get("s") == b"str-value", "get s")
    check(s.add("ctr", 5) == 5, "add 5"); check(s.add("ctr", -2) == 3, "add -2")
    check(s.get("ctr") == b"3", "add stores decimal text")
    check(s.compare_set("k1", "v1", "v2") == b"v2", "cas match")
    check(s.compare_set("k1", "nope", "zz") == b"v2", "cas mismatch")
    check(s.compare_set("absent", "", "new") == b"new", "cas absent+empty")
    check(s.compare_set("absent2", "x", "y") == b"x", "cas absent+nonempty")
    n = s.num_keys()
    check(s.delete_key("k1") is True, "delete"); check(s.delete_key("k1") is False, "delete again")
    s.wait(["ctr"])
    try:
        s.wait(["missing"], datetime.timedelta(milliseconds=300)); check(False, "wait timeout")
    except RuntimeError as e:
        check("timeout" in str(e).lower(), "timeout message: " + str(e))
    p = dist.PrefixStore("pfx", s); p.set("a", "b"); check(s.get("pfx/a") == b"b", "prefix")
    p2 = dist.PrefixStore("p2", dist.PrefixStore("p1", s)); check(p2.add("x", 1) == 1, "nested prefix")
    s2 = dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=20), wait_for_workers=False)
    s2.set("from-torch", "T")
    check(s.get("from-go") == b"G", "value set by the Go client")
    print("OK", n, flush=True)
except SystemExit:
    raise
except Exception as e:
    traceback.print_exc(); print("FAIL", repr(e), flush=True); sys.exit(1)
`

// TestTorchClientAgainstOurServer: torch 1.13's TCPStore client (1.x
// dialect, two connections per store, wait_for_workers) runs every store op
// it has against our server, and shares data with a Go DialectV2 client.
func TestTorchClientAgainstOurServer(t *testing.T) {
	needTorch(t)
	ctx := context.Background()
	srv, lb := newTestServer(t, ServerOptions{})
	port := strconv.Itoa(srv.Port())
	py := startPython(t, torchClientScript, nil, "127.0.0.1", port)
	g := dial(t, srv.Addr().String(), ClientOptions{Timeout: 30 * time.Second})
	if v, err := g.Get(ctx, "from-torch"); err != nil || string(v) != "T" {
		t.Fatalf("Go get of torch's key: %q, %v; python stderr:\n%s", v, err, py.stderr.String())
	}
	// Keys the torch client wrote are visible, with PyTorch's "/" layout.
	keys := must(g.ListKeys(ctx))(t)
	for _, k := range []string{"ctr", "s", "absent", "pfx/a", "p1/p2/x"} {
		if !strings.Contains(strings.Join(keys, " "), k) {
			t.Errorf("list_keys %q lacks %q", keys, k)
		}
	}
	if v := must(g.Get(ctx, "ctr"))(t); string(v) != "3" {
		t.Errorf("ctr = %q", v)
	}
	if err := g.Set(ctx, "from-go", []byte("G")); err != nil {
		t.Fatal(err)
	}
	line := py.expect(t, "OK", 60*time.Second)
	// num_keys counted init/ (world_size=2 → ADD init/ 1), s, ctr and absent.
	if line != "OK 5" {
		t.Errorf("torch num_keys line %q, want OK 5", line)
	}
	if s := lb.String(); strings.Contains(s, "closing connection") {
		t.Errorf("server closed a torch connection:\n%s", s)
	}
}

const torchGlooScript = `
import sys, datetime, os
import torch, torch.distributed as dist
host, port, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = dist.TCPStore(host, port, 2, False, datetime.timedelta(seconds=30))
dist.init_process_group("gloo", store=s, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
dist.all_reduce(t)
sub = dist.new_group([0, 1])
u = torch.ones(3) * (rank + 1)
dist.all_reduce(u, group=sub)
print("SUM", t.tolist(), u.tolist(), flush=True)
dist.destroy_process_group()
`

// TestTorchGlooOverOurServer: two torch 1.13 ranks rendezvous through our
// server (init_process_group("gloo", store=...), a new_group, store-based
// barriers) and all_reduce.
func TestTorchGlooOverOurServer(t *testing.T) {
	needTorch(t)
	srv, lb := newTestServer(t, ServerOptions{})
	port := strconv.Itoa(srv.Port())
	var ps []*pyProc
	for r := range 2 {
		ps = append(ps, startPython(t, torchGlooScript, []string{"GLOO_SOCKET_IFNAME=lo"}, "127.0.0.1", port, strconv.Itoa(r)))
	}
	for _, p := range ps {
		if l := p.expect(t, "SUM", 90*time.Second); l != "SUM [3.0, 30.0] [3.0, 3.0, 3.0]" {
			t.Errorf("all_reduce: %q", l)
		}
	}
	if s := lb.String(); strings.Contains(s, "closing connection") {
		t.Errorf("server closed a torch connection:\n%s", s)
	}
}

const torchServerScript = `
import sys, datetime
import torch.distributed as dist
port = int(sys.argv[1])
m = dist.TCPStore("127.0.0.1", port, 2, True, datetime.timedelta(seconds=30), wait_for_workers=True)
print("READY", flush=True)
m.set("from-torch", "T")
ok = m.get("from-go") == b"G" and m.get("g-ctr") == b"7" and m.get("g-cas") == b"new" and m.get("g-app") == b"xyz"
ok = ok and m.get("g-m2") == b"bb"
print("CHECKED", ok, m.num_keys(), flush=True)
sys.stdin.read()
`

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// TestOurClientAgainstTorchServer: our DialectV1 client against torch
// 1.13's TCPStore server: connect retries until the server is up, the
// "init/" announcement that unblocks torch's wait_for_workers, every op the
// 1.x protocol has, the emulated ones, and a wait timeout that leaves the
// client usable.
func TestOurClientAgainstTorchServer(t *testing.T) {
	needTorch(t)
	ctx := context.Background()
	port := freePort(t)
	addr := "127.0.0.1:" + port
	py := startPython(t, torchServerScript, nil, port)
	c := dial(t, addr, ClientOptions{Dialect: DialectV1, WorldSize: 2, Timeout: 60 * time.Second,
		Backoff: Backoff{Initial: 50 * time.Millisecond}})
	py.expect(t, "READY", 60*time.Second)

	if v := must(c.Get(ctx, "from-torch"))(t); string(v) != "T" {
		t.Fatalf("get from-torch = %q", v)
	}
	must(c.Add(ctx, "g-ctr", 10))(t)
	if n := must(c.Add(ctx, "g-ctr", -3))(t); n != 7 {
		t.Fatalf("add = %d", n)
	}
	if v := must(c.CompareSet(ctx, "g-cas", []byte("x"), []byte("y")))(t); string(v) != "x" {
		t.Fatalf("cas absent+nonempty = %q", v)
	}
	if v := must(c.CompareSet(ctx, "g-cas", nil, []byte("old")))(t); string(v) != "old" {
		t.Fatalf("cas absent+empty = %q", v)
	}
	if v := must(c.CompareSet(ctx, "g-cas", []byte("zz"), []byte("no")))(t); string(v) != "old" {
		t.Fatalf("cas mismatch = %q", v)
	}
	if v := must(c.CompareSet(ctx, "g-cas", []byte("old"), []byte("new")))(t); string(v) != "new" {
		t.Fatalf("cas match = %q", v)
	}
	if ok := must(c.Check(ctx, "g-ctr", "from-torch"))(t); !ok {
		t.Fatal("check = false")
	}
	if ok := must(c.Check(ctx, "g-ctr", "nope"))(t); ok {
		t.Fatal("check with missing = true")
	}
	_ = c.Set(ctx, "g-del", []byte("1"))
	if ok := must(c.DeleteKey(ctx, "g-del"))(t); !ok {
		t.Fatal("delete = false")
	}
	if ok := must(c.DeleteKey(ctx, "g-del"))(t); ok {
		t.Fatal("delete again = true")
	}
	if err := c.Append(ctx, "g-app", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := c.Append(ctx, "g-app", []byte("yz")); err != nil {
		t.Fatal(err)
	}
	if err := c.MultiSet(ctx, []string{"g-m1", "g-m2"}, [][]byte{[]byte("a"), []byte("bb")}); err != nil {
		t.Fatal(err)
	}
	if vs := must(c.MultiGet(ctx, []string{"g-m1", "g-m2"}))(t); string(vs[0]) != "a" || string(vs[1]) != "bb" {
		t.Fatalf("multi_get = %q", vs)
	}
	if err := c.QueuePush(ctx, "q", nil); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("queue push on v1: %v", err)
	}
	// A wait timeout: the 1.x protocol cannot cancel, so the client drops
	// the connection and reconnects on the next call.
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := c.Wait(wctx, "never")
	cancel()
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "/never") {
		t.Fatalf("wait timeout error %v: want ErrTimeout naming %s and the key", err, addr)
	}
	n0 := must(c.NumKeys(ctx))(t)
	if err := c.Set(ctx, "from-go", []byte("G")); err != nil {
		t.Fatal(err)
	}
	l := py.expect(t, "CHECKED", 30*time.Second)
	if want := fmt.Sprintf("CHECKED True %d", n0+1); l != want {
		t.Fatalf("torch saw %q, want %q", l, want)
	}

	// Our DialectV2 client cannot talk to a 1.x server; it says so.
	_, err = DialTCPStore(ctx, addr, ClientOptions{Timeout: 700 * time.Millisecond, NoEnvSecret: true, Backoff: Backoff{Initial: 100 * time.Millisecond}})
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "PING") {
		t.Fatalf("v2 client vs torch 1.13 server: %v", err)
	}
}
