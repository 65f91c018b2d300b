package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain makes the test binary the example itself when the test starts
// it as a rank.
func TestMain(m *testing.M) {
	if os.Getenv("GOCOLL_EXAMPLE_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// torchPython is Debian's python3-torch (torch 1.13); .ci/store-deps.sh
// installs it.
const torchPython = "/usr/bin/python3"

// agentScript is torchrun's agent, as far as its workers see it: it hosts
// a TCPStore master (torch's own, wait_for_workers off, as the agent's),
// prints its port, waits until the test says the workers are done, and
// then reads from its store what the workers wrote under the attempt's
// prefix.
const agentScript = `
import datetime, sys, torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, 3, True, datetime.timedelta(seconds=60), wait_for_workers=False)
print("port", s.port, flush=True)
sys.stdin.readline()
p = "/worker/attempt_1/default_pg/"
s.wait([p + "barrier/init/0", p + "barrier/init/1"], datetime.timedelta(seconds=10))
print("uid", s.get(p + "pg_uid").decode(), flush=True)
print("keys", s.num_keys(), flush=True)
`

// TestTorchrunAgentStore plays torchrun: a torch 1.13 TCPStore master is
// the agent's store, and two ranks of the example start with the
// variables the agent sets (TORCHELASTIC_USE_AGENT_STORE=True, a restart
// count, LOCAL_WORLD_SIZE, GROUP_RANK, ...). Both must connect as clients
// (rank 0 hosting a store would fail: the port is the agent's), meet under
// torch's /worker/attempt_1 prefix, and reduce correctly. Debian's torch
// 1.13 torchrun itself fails on Python 3.11 before it starts workers; the
// GPU machine's torch 2.11 torchrun runs the example for real (runs/).
func TestTorchrunAgentStore(t *testing.T) {
	if out, err := exec.Command(torchPython, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import torch (%v: %s); run .ci/store-deps.sh to install python3-torch", torchPython, err, strings.TrimSpace(string(out)))
	}
	agent := exec.Command(torchPython, "-c", agentScript)
	agent.Stderr = os.Stderr
	stdin, err := agent.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := agent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	defer agent.Process.Kill()
	lines := bufio.NewScanner(stdout)
	var port string
	if lines.Scan() {
		port = strings.TrimPrefix(lines.Text(), "port ")
	}
	if port == "" {
		t.Fatalf("the agent printed no port: %v", lines.Err())
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const world = 2
	outs := make([]string, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			c := exec.Command(self, "-n", "1000")
			c.Env = append(os.Environ(), "GOCOLL_EXAMPLE_MAIN=1", "GOCOLL_STORE_DIALECT=1", // torch 1.13's numbering
				fmt.Sprintf("RANK=%d", r), fmt.Sprintf("LOCAL_RANK=%d", r), fmt.Sprintf("ROLE_RANK=%d", r),
				fmt.Sprintf("WORLD_SIZE=%d", world), fmt.Sprintf("LOCAL_WORLD_SIZE=%d", world), fmt.Sprintf("ROLE_WORLD_SIZE=%d", world),
				"GROUP_RANK=0", "GROUP_WORLD_SIZE=1", "ROLE_NAME=default",
				"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port,
				"TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_RESTART_COUNT=1", "TORCHELASTIC_MAX_RESTARTS=3",
				"TORCHELASTIC_RUN_ID=agent-test", "GOCOLL_TRACE_BUFFER_SIZE=0")
			timer := time.AfterFunc(60*time.Second, func() { c.Process.Kill() })
			defer timer.Stop()
			out, err := c.CombinedOutput()
			outs[r], errs[r] = string(out), err
		})
	}
	wg.Wait()
	for r := range world {
		want := fmt.Sprintf("rank %d/%d: allreduce of 1000 float32 = 3 everywhere", r, world)
		if errs[r] != nil || !strings.Contains(outs[r], want) {
			t.Errorf("rank %d: %v\n%s", r, errs[r], outs[r])
		}
	}
	fmt.Fprintln(stdin)
	var report []string
	for lines.Scan() {
		report = append(report, lines.Text())
	}
	if err := agent.Wait(); err != nil {
		t.Fatalf("the agent: %v (%q)", err, report)
	}
	t.Logf("agent: %q", report)
	if len(report) != 2 || !strings.HasPrefix(report[0], "uid ") || len(report[0]) != len("uid ")+16 {
		t.Fatalf("the agent read %q from its store, want the group uid under /worker/attempt_1", report)
	}
}

// TestFlagsRejected: -nproc 0 and -n -5 fail before anything starts,
// naming the flag.
func TestFlagsRejected(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-nproc", "0"}, "-nproc 0: want at least 1 rank"},
		{[]string{"-n", "-5"}, "-n -5: want at least 1 element"},
		{[]string{"-n", "0"}, "-n 0: want at least 1 element"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
	} {
		cmd := exec.Command(self, c.args...)
		cmd.Env = append(os.Environ(), "GOCOLL_EXAMPLE_MAIN=1")
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("%v: %v, output %q; want exit status 2 naming %q", c.args, err, out, c.want)
		}
	}
}
