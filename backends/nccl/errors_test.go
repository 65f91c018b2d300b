package nccl

// GPU specs of issue 6 (labels timeout and errors): the watchdog, the error
// policies, blocking wait, the remote-error key, the desync report and the
// flight-recorder dumps, a killed peer, the heartbeat monitor. Where a
// process must end, the spec runs this test binary again as a child
// (TestErrorChild, selected by GOCOLL_ERR_CHILD) and checks its exit, its
// output and its dump. GOCOLL_ERR_OUT, when set, keeps the children's logs
// and dumps there (the GPU run script returns them).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/internal/frtrace"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// specTimeout is the op timeout of the specs.
const specTimeout = time.Second

// child is a finished child process of a spec.
type child struct {
	rank    int
	code    int
	stdout  string
	stderr  string
	results map[string]string // RESULT key=value lines
	wall    time.Duration
}

func (c *child) String() string {
	return fmt.Sprintf("rank %d exit %d after %v\nstdout:\n%s\nstderr:\n%s", c.rank, c.code, c.wall.Round(time.Millisecond), c.stdout, c.stderr)
}

func (c *child) seconds(key string) float64 {
	f, _ := strconv.ParseFloat(c.results[key], 64)
	return f
}

// runChildren runs scenario in world children (rank r on GPU r, or on GPU
// 0 for world 1) around a TCPStore and returns them once all have ended.
func runChildren(t *testing.T, scenario string, world int, env ...string) (string, []*child) {
	t.Helper()
	if n := gpus(t); n < world {
		t.Skipf("needs %d GPUs, have %d", world, n)
	}
	srv, err := store.NewTCPServer(context.Background(), store.ServerOptions{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dir := t.TempDir()
	if out := os.Getenv("GOCOLL_ERR_OUT"); out != "" {
		dir = filepath.Join(out, scenario)
		os.RemoveAll(dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe, _ := os.Executable()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kids := make([]*child, world)
	cmds := make([]*exec.Cmd, world)
	outs := make([][2]*bytes.Buffer, world)
	start := time.Now()
	for r := range world {
		cmd := exec.CommandContext(ctx, exe, "-test.run", "^TestErrorChild$", "-test.v", "-test.count=1")
		dev := strconv.Itoa(r)
		cmd.Env = append(os.Environ(), "GOCOLL_ERR_CHILD="+scenario, "GOCOLL_ERR_RANK="+strconv.Itoa(r), "GOCOLL_ERR_WORLD="+strconv.Itoa(world),
			fmt.Sprintf("GOCOLL_ERR_STORE=127.0.0.1:%d", srv.Port()), "GOCOLL_ERR_DIR="+dir, "GOCOLL_ERR_DEV="+dev, "NCCL_DEBUG=WARN")
		cmd.Env = append(cmd.Env, env...)
		outs[r] = [2]*bytes.Buffer{{}, {}}
		cmd.Stdout, cmd.Stderr = outs[r][0], outs[r][1]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
	}
	for r, cmd := range cmds {
		err := cmd.Wait()
		c := &child{rank: r, wall: time.Since(start), stdout: outs[r][0].String(), stderr: outs[r][1].String(), results: map[string]string{}}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			c.code = ee.ExitCode()
			if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
				c.code = 128 + int(st.Signal())
			}
		} else if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		sc := bufio.NewScanner(strings.NewReader(c.stdout))
		for sc.Scan() {
			if k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "RESULT "), "="); ok && strings.HasPrefix(sc.Text(), "RESULT ") {
				c.results[k] = v
			}
		}
		kids[r] = c
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("child%d.log", r)), []byte(c.String()), 0o644)
		t.Logf("%s: rank %d exit %d after %v: %v", scenario, r, c.code, c.wall.Round(time.Millisecond), c.results)
	}
	return dir, kids
}

// fatalLines counts the lines of the backend's fatal log.
func fatalLines(s string) int { return strings.Count(s, "gocoll nccl: fatal") }

func within(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if got < want-tol || got > want+tol {
		t.Errorf("%s after %.3f s, want %.1f s ± %.1f s", what, got, want, tol)
	}
}

// TestTimeoutPolicies gates the current stream so that an allreduce never
// starts, and checks each ErrorPolicy's outcome and blocking wait.
func TestTimeoutPolicies(t *testing.T) {
	for _, tc := range []struct{ name, policy, env string }{
		{"TearDown", "1", ""}, {"SkipCleanUp", "3", ""}, {"CleanUpOnly", "2", ""}, {"NoHandling", "0", ""},
		{"BlockingWait", "3", "GOCOLL_NCCL_BLOCKING_WAIT=1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := []string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING=" + tc.policy}
			if tc.env != "" {
				env = append(env, tc.env)
			}
			dir, kids := runChildren(t, "policy-"+tc.name, 1, env...)
			c := kids[0]
			errText := c.results["err"]
			if !strings.Contains(errText, "timeout after 1s") {
				t.Fatalf("want a timeout error:\n%v", c)
			}
			within(t, "ErrTimeout", c.seconds("elapsed"), specTimeout.Seconds()+0.05, 0.2)
			dumps, _ := filepath.Glob(filepath.Join(dir, "fr_*"))
			switch tc.name {
			case "TearDown", "SkipCleanUp":
				if c.code != 1 || fatalLines(c.stderr) != 1 || c.results["survived"] != "" {
					t.Fatalf("want exit 1 with one fatal line:\n%v", c)
				}
				if len(dumps) == 0 {
					t.Fatalf("no flight recorder dump in %s", dir)
				}
				if !strings.Contains(c.stderr, "policy="+tc.name) {
					t.Errorf("the fatal line does not state the policy:\n%s", c.stderr)
				}
			case "CleanUpOnly", "BlockingWait":
				if c.code != 0 || fatalLines(c.stderr) != 0 {
					t.Fatalf("want the process to survive:\n%v", c)
				}
				if next := c.results["next"]; !strings.Contains(next, "aborted") || !strings.Contains(next, "timeout after 1s") {
					t.Fatalf("the next op should fail with ErrAborted keeping the reason, got %q", next)
				}
				if len(dumps) == 0 {
					t.Errorf("no flight recorder dump in %s", dir)
				}
			case "NoHandling":
				if c.code != 0 || fatalLines(c.stderr) != 0 || c.results["next"] != "ok" {
					t.Fatalf("want nothing to happen (the next op works):\n%v", c)
				}
			}
		})
	}
}

// TestSkippedCollective: rank 1 skips allreduce seq 3; rank 0 times out
// naming it, both ranks dump, and the analyzer points at seq 3.
func TestSkippedCollective(t *testing.T) {
	dir, kids := runChildren(t, "skip", 2, "GOCOLL_NCCL_ASYNC_ERROR_HANDLING=2")
	r0, r1 := kids[0], kids[1]
	if r0.code != 0 || r1.code != 0 {
		t.Fatalf("children failed:\n%v\n%v", r0, r1)
	}
	if e := r0.results["err"]; !strings.Contains(e, "timeout") || !strings.Contains(e, "rank 1 never enqueued allreduce seq 3") || r0.results["ranks"] != "[1]" {
		t.Fatalf("rank 0's error should name rank 1 and seq 3: %q ranks %s", e, r0.results["ranks"])
	}
	within(t, "rank 0's ErrTimeout", r0.seconds("elapsed"), 2.05, 0.2)
	dumps, err := frtrace.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ranks []int
	for _, d := range dumps {
		ranks = append(ranks, d.Rank)
	}
	slices.Sort(ranks)
	if !slices.Equal(ranks, []int{0, 1}) {
		t.Fatalf("dumps of ranks %v, want both", ranks)
	}
	rep := frtrace.Analyze(dumps)
	t.Log(rep.String())
	if m := rep.Mismatch; m == nil || m.Kind != frtrace.MissingRank || m.Seq != 3 || !slices.Equal(m.Ranks, []int{1}) {
		t.Fatalf("analyzer: %v", rep)
	}
}

// TestKilledPeer: rank 1 is killed while rank 0 is in an allreduce; rank 0
// detects it within the timeout (an NCCL async error or the timeout) and
// cleans up (CleanUpOnly): later ops fail with ErrAborted.
func TestKilledPeer(t *testing.T) {
	_, kids := runChildren(t, "kill", 2, "GOCOLL_NCCL_ASYNC_ERROR_HANDLING=2")
	r0, r1 := kids[0], kids[1]
	if r1.code != 128+int(syscall.SIGKILL) {
		t.Errorf("rank 1 should have been killed:\n%v", r1)
	}
	if r0.code != 0 || r0.results["err"] == "" {
		t.Fatalf("rank 0:\n%v", r0)
	}
	if el := r0.seconds("elapsed"); el > 3+0.2 {
		t.Errorf("rank 0 detected the death after %.3f s (timeout 3 s)", el)
	}
	if !strings.Contains(r0.results["next"], "aborted") {
		t.Errorf("rank 0's next op: %q", r0.results["next"])
	}
}

// TestHeartbeatMonitor: a watchdog that hangs makes the dispatcher's
// heartbeat monitor dump and end the process.
func TestHeartbeatMonitor(t *testing.T) {
	dir, kids := runChildren(t, "heartbeat", 1, "GOCOLL_HEARTBEAT_TIMEOUT_SEC=1", "GOCOLL_COORD_CHECK_MILSEC=100")
	c := kids[0]
	if c.code != 134 || !strings.Contains(c.stderr, "heartbeat") || c.results["survived"] != "" {
		t.Fatalf("want exit 134 from the heartbeat monitor:\n%v", c)
	}
	for _, p := range []string{"fr_0", "fr_0.stacks"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("missing %s: %v", p, err)
		}
	}
}

// TestRemoteErrorPropagation: rank 0's allreduce never starts (gated) and
// times out after 1 s; rank 1, whose op has a 30 s timeout, fails soon
// after with ErrRemote naming rank 0, through the store's remote-error key
// (policy NoHandling: nothing else happens). Separate processes: with both
// ranks in one process, NCCL's launch on GPU 1 waited on GPU 0's gated
// stream.
func TestRemoteErrorPropagation(t *testing.T) {
	_, kids := runChildren(t, "remote", 2, "GOCOLL_NCCL_ASYNC_ERROR_HANDLING=0")
	r0, r1 := kids[0], kids[1]
	if r0.code != 0 || r1.code != 0 {
		t.Fatalf("children failed:\n%v\n%v", r0, r1)
	}
	if !strings.Contains(r0.results["err"], "timeout after 1s") {
		t.Fatalf("rank 0: %q", r0.results["err"])
	}
	if e := r1.results["err"]; !strings.Contains(e, "remote rank failed") || r1.results["ranks"] != "[0]" || !strings.Contains(e, "rank 0 failed") {
		t.Fatalf("rank 1 should fail with ErrRemote naming rank 0: %q ranks %s", e, r1.results["ranks"])
	}
	if el := r1.seconds("elapsed"); el > specTimeout.Seconds()+0.5 {
		t.Errorf("rank 1 learnt of it after %.3f s", el)
	}
}

// TestErrorChild is the child process of the specs above.
func TestErrorChild(t *testing.T) {
	scenario := os.Getenv("GOCOLL_ERR_CHILD")
	if scenario == "" {
		t.Skip("run by the error specs")
	}
	gpus(t)
	rank, _ := strconv.Atoi(os.Getenv("GOCOLL_ERR_RANK"))
	world, _ := strconv.Atoi(os.Getenv("GOCOLL_ERR_WORLD"))
	devIdx, _ := strconv.Atoi(os.Getenv("GOCOLL_ERR_DEV"))
	dir := os.Getenv("GOCOLL_ERR_DIR")
	result := func(k string, v any) { fmt.Printf("RESULT %s=%v\n", k, v) }
	bg := context.Background()
	tcp, err := store.DialTCPStore(bg, os.Getenv("GOCOLL_ERR_STORE"), store.ClientOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	st := pollStore{tcp}
	opts, err := OptionsFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	opts.AbortTimeout = 2 * time.Second
	if scenario == "heartbeat" {
		opts.HangWatchdogForTest = true
	}
	dev := tensor.CUDADevice(devIdx)
	pg, err := dispatcher.Init(bg, dispatcher.Config{Store: st, Rank: rank, WorldSize: world, Backend: "nccl", Device: &dev,
		Timeout: 30 * time.Second, BackendOptions: map[string]any{Name: opts},
		FlightRecorder: dispatcher.FlightRecorderOptions{DumpPrefix: filepath.Join(dir, "fr_")},
		Monitor:        dispatcher.MonitorOptions{CoordCheck: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := cuda.GetDevice(devIdx)
	s, err := d.NewStream(cuda.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := cuda.WithStream(bg, s)
	h, _ := tensor.FromFloat64s(tensor.Float32, make([]float64, 1024))
	x, err := cuda.FromHost(ctx, devIdx, h)
	if err != nil {
		t.Fatal(err)
	}
	allreduce := func(timeout time.Duration) (time.Duration, error) {
		t0 := time.Now()
		w, err := pg.Allreduce(ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Timeout: timeout})
		if err != nil {
			return time.Since(t0), err
		}
		wctx, cancel := context.WithTimeout(bg, 20*time.Second)
		defer cancel()
		if opts.BlockingWait {
			err = w.Wait(wctx)
		} else {
			err = w.WaitHost(wctx)
		}
		return time.Since(t0), err
	}
	oneLine := func(err error) string { return strings.ReplaceAll(fmt.Sprint(err), "\n", " ") }
	for i := range 2 { // seq 1 and 2 complete everywhere
		if scenario == "heartbeat" || (scenario == "kill" && i == 1) {
			break
		}
		if _, err := allreduce(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	switch {
	case strings.HasPrefix(scenario, "policy-"):
		gate, err := gateHold(d, s)
		if err != nil {
			t.Fatal(err)
		}
		el, err := allreduce(specTimeout)
		result("elapsed", el.Seconds())
		result("err", oneLine(err))
		if errors.Is(err, backend.ErrTimeout) {
			result("kind", "timeout")
		}
		if scenario == "policy-TearDown" || scenario == "policy-SkipCleanUp" {
			time.Sleep(15 * time.Second) // the watchdog ends the process
			result("survived", true)
			os.Exit(0)
		}
		if scenario == "policy-NoHandling" {
			gate.Open()
			if err := s.SynchronizeContext(bg); err != nil {
				t.Fatal(err)
			}
			if _, err := allreduce(10 * time.Second); err != nil {
				result("next", oneLine(err))
			} else {
				result("next", "ok")
			}
			os.Exit(0)
		}
		// CleanUpOnly and blocking wait: the communicators are aborted;
		// the gate stays closed, as its op belongs to an aborted
		// communicator, and the process exits.
		_, err = allreduce(10 * time.Second)
		result("next", oneLine(err))
		os.Exit(0)
	case scenario == "skip":
		if rank == 1 {
			time.Sleep(5 * time.Second) // never enqueues seq 3; dumps when rank 0 asks
			_, err := os.Stat(filepath.Join(dir, "fr_1"))
			result("dumped", err == nil)
			os.Exit(0)
		}
		el, err := allreduce(2 * time.Second)
		result("elapsed", el.Seconds())
		result("err", oneLine(err))
		var oe *backend.OpError
		if errors.As(err, &oe) {
			result("ranks", fmt.Sprint(oe.Ranks))
		}
		time.Sleep(time.Second)
		os.Exit(0)
	case scenario == "kill":
		if rank == 1 {
			gate, err := gateHold(d, s)
			if err != nil {
				t.Fatal(err)
			}
			_ = gate
			if _, err := pg.Allreduce(ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Timeout: 30 * time.Second}); err != nil {
				t.Fatal(err)
			}
			if err := st.Wait(bg, "test/r0issued"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
			fmt.Println("rank 1: killing myself mid-collective")
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		done := make(chan struct{})
		go func() {
			time.Sleep(50 * time.Millisecond)
			st.Set(bg, "test/r0issued", []byte("1"))
			close(done)
		}()
		el, err := allreduce(3 * time.Second)
		<-done
		result("elapsed", el.Seconds())
		result("err", oneLine(err))
		_, err = allreduce(10 * time.Second)
		result("next", oneLine(err))
		os.Exit(0)
	case scenario == "remote":
		timeout := 30 * time.Second
		if rank == 0 {
			if _, err := gateHold(d, s); err != nil {
				t.Fatal(err)
			}
			timeout = specTimeout
		}
		el, err := allreduce(timeout)
		result("elapsed", el.Seconds())
		result("err", oneLine(err))
		var oe *backend.OpError
		if errors.As(err, &oe) {
			result("ranks", fmt.Sprint(oe.Ranks))
		}
		time.Sleep(500 * time.Millisecond)
		os.Exit(0)
	case scenario == "heartbeat":
		time.Sleep(15 * time.Second)
		result("survived", true)
		os.Exit(0)
	}
	t.Fatalf("unknown scenario %q", scenario)
}
