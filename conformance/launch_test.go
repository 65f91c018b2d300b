package conformance

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rankScript is a rank that says which signal ended it: with FAIL set,
// rank 0 fails with that status (a setup error is 2) once the others have
// set their traps; the others wait.
const rankScript = `trap 'echo got SIGQUIT; kill $!; exit 3' QUIT; trap 'echo got SIGTERM; kill $!; exit 4' TERM
if [ "$RANK" = 0 ] && [ -n "$FAIL" ]; then
	for i in $(seq 200); do [ -e "$READY/1" ] && [ -e "$READY/2" ] && break; sleep 0.05; done
	echo "rank 0: setup failed"; exit "$FAIL"
fi
echo ready; touch "$READY/$RANK"; sleep 30 & wait`

func launchScript(t *testing.T, fail string, timeout time.Duration) (Result, string, []string) {
	t.Helper()
	dir := t.TempDir()
	var out strings.Builder
	res, err := Launch(context.Background(), LaunchConfig{
		Command: []string{"/bin/sh", "-c", rankScript}, NProc: 3, Out: &out, Timeout: timeout,
		Env: append(os.Environ(), "FAIL="+fail, "READY="+dir), Report: filepath.Join(dir, "r"),
	})
	if err != nil {
		t.Fatal(err)
	}
	logs := make([]string, 3)
	for r := range logs {
		b, _ := os.ReadFile(filepath.Join(dir, "r.rank"+string(rune('0'+r))+".log"))
		logs[r] = string(b)
	}
	return res, out.String(), logs
}

// TestLaunchStopsWithoutStacks: a rank's setup error stops the others with
// SIGTERM, not SIGQUIT, whose goroutine dumps would bury the error; the
// summary shows the failed rank's output and says what it did to the
// others.
func TestLaunchStopsWithoutStacks(t *testing.T) {
	res, out, logs := launchScript(t, "2", time.Minute)
	t.Log(out)
	if res.StoppedBy != 0 || res.TimedOut || res.ExitCodes[0] != 2 {
		t.Fatalf("stopped by %d, timed out %v, exit codes %v", res.StoppedBy, res.TimedOut, res.ExitCodes)
	}
	for r := 1; r < 3; r++ {
		if !strings.Contains(logs[r], "got SIGTERM") {
			t.Errorf("rank %d was not ended by SIGTERM: %q", r, logs[r])
		}
	}
	for _, want := range []string{"rank 0 exited with status 2; its output:\nrank 0: setup failed", "the launcher stopped ranks 1 and 2 (SIGTERM) after rank 0 failed",
		"0 passed, 0 failed, 0 skipped on 3 ranks in"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if strings.Contains(out, "Summary by spec") || strings.Contains(out, "rank 1 exited") {
		t.Error("summary of a run without reports lists specs or the stopped ranks' output")
	}
}

// TestLaunchTimeoutSendsSIGQUIT: a run that outlives its timeout is hung,
// and SIGQUIT asks its ranks for their stacks.
func TestLaunchTimeoutSendsSIGQUIT(t *testing.T) {
	res, out, logs := launchScript(t, "", 2*time.Second)
	t.Log(out)
	if !res.TimedOut || res.StoppedBy != -1 {
		t.Fatalf("timed out %v, stopped by %d", res.TimedOut, res.StoppedBy)
	}
	for r := range 3 {
		if !strings.Contains(logs[r], "got SIGQUIT") {
			t.Errorf("rank %d did not get SIGQUIT: %q", r, logs[r])
		}
	}
	if !strings.Contains(out, "the run outlived its timeout") {
		t.Error("the summary does not say the run timed out")
	}
}
