package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/onsi/ginkgo/v2/reporters"
	"github.com/onsi/ginkgo/v2/types"
)

// EnvReport names the variable through which Launch tells a rank where to
// write its JSON report.
const EnvReport = "GOCOLL_CONFTEST_REPORT"

// LaunchConfig starts a run of N rank processes.
type LaunchConfig struct {
	// Command is the rank program and its arguments; each rank runs it with
	// torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
	// MASTER_ADDR, MASTER_PORT) and EnvReport added to Env.
	Command []string
	// Env is the environment of the ranks (default os.Environ()).
	Env []string
	// NProc is the number of ranks.
	NProc int
	// Out receives the progress lines and the summary (default os.Stdout).
	Out io.Writer
	// Report, when set, is the path prefix of the merged reports:
	// Report+".xml" (JUnit), Report+".json" (Ginkgo JSON) and every
	// rank's output, Report+".rankN.log".
	Report string
	// Timeout bounds the whole run (default 30 minutes).
	Timeout time.Duration
}

// Result is a run's outcome.
type Result struct {
	Passed, Failed, Skipped int
	// ExitCodes of the rank processes.
	ExitCodes []int
	// StoppedBy is the rank whose setup error or crash made the launcher
	// stop the others (their exit codes are then the launcher's doing), or
	// -1.
	StoppedBy int
	// TimedOut says that the run outlived LaunchConfig.Timeout, and the
	// ranks still running were sent SIGQUIT for their stacks.
	TimedOut bool
	// Report merges the ranks' reports: a spec fails when it failed on any
	// rank.
	Report types.Report
}

// OK reports whether every rank exited cleanly and no spec failed.
func (r Result) OK() bool {
	for _, c := range r.ExitCodes {
		if c != 0 {
			return false
		}
	}
	return r.Failed == 0 && r.Passed+r.Skipped > 0
}

// Launch runs the suite on cfg.NProc rank processes and merges their
// reports. It prints rank 0's progress lines as they come, then a summary.
func Launch(ctx context.Context, cfg LaunchConfig) (Result, error) {
	if cfg.NProc < 1 || len(cfg.Command) == 0 {
		return Result{}, errors.New("conformance: launch needs a command and at least one rank")
	}
	if cfg.Out == nil {
		cfg.Out = os.Stdout
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Minute
	}
	ctx, cancelTimeout := context.WithTimeoutCause(ctx, cfg.Timeout, errRunTimeout)
	defer cancelTimeout()
	ctx, cancelCause := context.WithCancelCause(ctx)
	defer cancelCause(nil)
	dir, err := os.MkdirTemp("", "conftest-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	port, err := freePort()
	if err != nil {
		return Result{}, err
	}
	res := Result{ExitCodes: make([]int, cfg.NProc), StoppedBy: -1}
	var stopOnce sync.Once
	// stop ends the run after rank r's setup error or crash: the others
	// would only wait for it. They get SIGTERM, which ends a Go rank without
	// the goroutine dump that only a hung run needs.
	stop := func(r int) {
		stopOnce.Do(func() {
			res.StoppedBy = r
			cancelCause(fmt.Errorf("rank %d failed", r))
		})
	}
	logs := make([]*strings.Builder, cfg.NProc)
	var outMu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for r := range cfg.NProc {
		logs[r] = &strings.Builder{}
		if ctx.Err() != nil {
			// A rank already failed (or the time is up): start no more.
			res.ExitCodes[r] = -1
			continue
		}
		cmd := exec.CommandContext(ctx, cfg.Command[0], cfg.Command[1:]...)
		cmd.Env = append(append([]string{}, cfg.Env...),
			"RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(cfg.NProc), "LOCAL_WORLD_SIZE="+strconv.Itoa(cfg.NProc),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
			EnvReport+"="+filepath.Join(dir, fmt.Sprintf("rank%d.json", r)))
		// When the run's time is up, SIGQUIT makes a Go rank print every
		// goroutine's stack before it dies, so a hung run says where it
		// hung (the logs go to Report+".rankN.log"). When another rank
		// failed, the stacks would only bury its error: SIGTERM.
		cmd.Cancel = func() error {
			if errors.Is(context.Cause(ctx), errRunTimeout) {
				return cmd.Process.Signal(syscall.SIGQUIT)
			}
			return cmd.Process.Signal(syscall.SIGTERM)
		}
		cmd.WaitDelay = 5 * time.Second
		pr, pw := io.Pipe()
		cmd.Stdout, cmd.Stderr = pw, pw
		if err := cmd.Start(); err != nil {
			err = fmt.Errorf("conformance: starting rank %d: %w", r, err)
			cancelCause(err)
			pw.Close()
			wg.Wait() // the ranks already started end with SIGTERM
			return res, err
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(pr)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				line := sc.Text()
				// Ginkgo's succinct dots share the line with the progress.
				if i := strings.Index(line, ProgressPrefix); r == 0 && i >= 0 {
					outMu.Lock()
					fmt.Fprintln(cfg.Out, line[i+len(ProgressPrefix):])
					outMu.Unlock()
					continue
				}
				logs[r].WriteString(line)
				logs[r].WriteByte('\n')
			}
			_, _ = io.Copy(io.Discard, pr)
		}()
		go func() {
			defer wg.Done()
			err := cmd.Wait()
			pw.Close()
			if err != nil {
				res.ExitCodes[r] = 1
				var ee *exec.ExitError
				if errors.As(err, &ee) && ee.ExitCode() > 0 {
					res.ExitCodes[r] = ee.ExitCode()
				}
				if ctx.Err() == nil && (res.ExitCodes[r] == 2 || ee == nil || ee.ExitCode() < 0) {
					stop(r) // a setup error or a crash: the others would only wait
				}
			}
		}()
	}
	wg.Wait()
	res.TimedOut = errors.Is(context.Cause(ctx), errRunTimeout)
	reports := make([]*types.Report, cfg.NProc)
	for r := range reports {
		reports[r] = readReport(filepath.Join(dir, fmt.Sprintf("rank%d.json", r)))
	}
	res.Report = merge(reports)
	for _, sp := range res.Report.SpecReports {
		if sp.LeafNodeType != types.NodeTypeIt {
			continue
		}
		switch {
		case sp.State == types.SpecStateSkipped && sp.Failure.Message == "":
			// filtered out: not part of the run
		case sp.State == types.SpecStateSkipped:
			res.Skipped++
		case sp.Failed():
			res.Failed++
		case sp.State == types.SpecStatePassed:
			res.Passed++
		}
	}
	summarize(cfg.Out, &res, reports, logs, time.Since(start))
	if cfg.Report != "" {
		for r, l := range logs {
			_ = os.WriteFile(fmt.Sprintf("%s.rank%d.log", cfg.Report, r), []byte(l.String()), 0o644)
		}
		if err := reporters.GenerateJUnitReport(res.Report, cfg.Report+".xml"); err != nil {
			return res, err
		}
		if err := reporters.GenerateJSONReport(res.Report, cfg.Report+".json"); err != nil {
			return res, err
		}
		fmt.Fprintf(cfg.Out, "reports: %s.xml (JUnit), %s.json\n", cfg.Report, cfg.Report)
	}
	return res, nil
}

// errRunTimeout is the cause of a run's end when it outlived its Timeout.
var errRunTimeout = errors.New("the run outlived its timeout")

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("conformance: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func readReport(path string) *types.Report {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var rs []types.Report
	if json.Unmarshal(b, &rs) != nil || len(rs) == 0 {
		return nil
	}
	return &rs[0]
}

// merge takes the first rank's report and marks a spec failed when another
// rank failed it, prefixing the failure with that rank.
func merge(reports []*types.Report) types.Report {
	var base types.Report
	baseRank := -1
	for r, rep := range reports {
		if rep != nil {
			base, baseRank = *rep, r
			break
		}
	}
	if baseRank < 0 {
		return base
	}
	base.SpecReports = append(types.SpecReports{}, base.SpecReports...)
	index := map[string]int{}
	for i, sp := range base.SpecReports {
		index[specKey(sp)] = i
	}
	for r, rep := range reports {
		if rep == nil || r == baseRank {
			continue
		}
		if !rep.SuiteSucceeded {
			base.SuiteSucceeded = false
		}
		for _, sp := range rep.SpecReports {
			i, ok := index[specKey(sp)]
			if !ok || !sp.Failed() {
				continue
			}
			// Keep the first rank's own failure; one that only says
			// another rank failed first gives way to that rank's.
			if prev := base.SpecReports[i]; prev.Failed() && (!secondary(prev) || secondary(sp)) {
				continue
			}
			f := sp.Failure
			f.Message = fmt.Sprintf("[rank %d] %s", r, f.Message)
			base.SpecReports[i].State = sp.State
			base.SpecReports[i].Failure = f
			base.SuiteSucceeded = false
		}
	}
	return base
}

func specKey(sp types.SpecReport) string {
	return fmt.Sprintf("%s|%s|%d", sp.LeafNodeType, sp.FullText(), sp.LeafNodeLocation.LineNumber)
}

// summarize prints the per-spec table of failures and the totals; on a
// failed rank it prints the tail of that rank's output.
func summarize(out io.Writer, res *Result, reports []*types.Report, logs []*strings.Builder, took time.Duration) {
	type row struct {
		text  string
		state []string
	}
	var rows []row
	byText := map[string]int{}
	for r, rep := range reports {
		if rep == nil {
			continue
		}
		for _, sp := range rep.SpecReports {
			if sp.LeafNodeType != types.NodeTypeIt || (sp.State == types.SpecStateSkipped && sp.Failure.Message == "") {
				continue
			}
			k := specKey(sp)
			i, ok := byText[k]
			if !ok {
				i = len(rows)
				byText[k] = i
				rows = append(rows, row{text: sp.FullText(), state: make([]string, len(reports))})
			}
			rows[i].state[r] = sp.State.String()
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].text < rows[j].text })
	if len(rows) > 0 {
		fmt.Fprintln(out, "\nSummary by spec (a spec fails when it fails on any rank):")
	}
	shown := 0
	for _, rw := range rows {
		// Passed when a rank passed it and none failed it: some specs run
		// on one rank only (the child-process specs) and skip elsewhere.
		verdict := "skipped"
		for _, st := range rw.state {
			switch st {
			case "skipped", "":
			case "passed":
				if verdict == "skipped" {
					verdict = "passed"
				}
			default:
				verdict = "FAILED"
			}
		}
		if verdict == "FAILED" || len(rows) <= 40 {
			fmt.Fprintf(out, "  %-7s %s   (ranks: %s)\n", verdict, rw.text, strings.Join(rw.state, " "))
			shown++
		}
	}
	switch {
	case shown == 0 && len(rows) > 0:
		fmt.Fprintf(out, "  all %d specs passed or were skipped on every rank\n", len(rows))
	case shown < len(rows):
		fmt.Fprintf(out, "  and %d more that passed or were skipped on every rank\n", len(rows)-shown)
	}
	for _, sp := range res.Report.SpecReports {
		if sp.Failed() {
			fmt.Fprintf(out, "\nFAILED %s\n  %s\n  at %s\n", sp.FullText(), sp.Failure.Message, sp.Failure.Location)
		}
	}
	color := isTerminal(out)
	var stopped []int
	for r, c := range res.ExitCodes {
		switch {
		case c == 0:
		case res.StoppedBy >= 0 && r != res.StoppedBy:
			stopped = append(stopped, r) // the launcher's doing: its output says nothing new
		case reports[r] == nil || res.Failed == 0 || r == res.StoppedBy:
			tail := logs[r].String()
			if !color {
				tail = ansi.ReplaceAllString(tail, "")
			}
			if len(tail) > 4000 {
				tail = "..." + tail[len(tail)-4000:]
			}
			fmt.Fprintf(out, "\nrank %d exited with status %d; its output:\n%s\n", r, c, strings.TrimRight(tail, "\n"))
		}
	}
	if len(stopped) > 0 {
		fmt.Fprintf(out, "\nthe launcher stopped %s (SIGTERM) after rank %d failed\n", rankList(stopped), res.StoppedBy)
	}
	if res.TimedOut {
		fmt.Fprintf(out, "\nthe run outlived its timeout; the ranks still running were sent SIGQUIT (their stacks are in their output)\n")
	}
	// Scripts read the first three counts (N passed, N failed, N skipped).
	total := fmt.Sprintf("%d passed, %d failed, %d skipped on %d ranks in %v", res.Passed, res.Failed, res.Skipped, len(res.ExitCodes), took.Round(time.Millisecond))
	if res.Passed+res.Failed+res.Skipped == 0 {
		total += ": no spec ran"
	}
	fmt.Fprintf(out, "\n%s\n", total)
}

// ansi matches the SGR escape sequences of coloured output (Ginkgo's).
var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

// isTerminal reports whether w is a terminal, where colour codes belong.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// rankList names ranks: "rank 1", "ranks 1, 2 and 3".
func rankList(rs []int) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = strconv.Itoa(r)
	}
	if len(rs) == 1 {
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}
