package conformance

// Failure specs that need processes of their own (labels timeout and
// errors): a process that the error policy ends, a rank that skips a
// collective or is killed. Rank 0 of the suite runs each scenario in fresh
// child processes (child.go) around a TCPStore of its own and checks their
// exits, outputs and dumps; the other ranks skip. The children use the
// suite's backend string and, when the suite runs on GPUs, GPU r for child
// rank r. A backend's own failure specs (the nccl watchdog hang, say) use
// RequireChildren and RunChildren with scenarios of its Extension.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive // Ginkgo's DSL
	. "github.com/onsi/gomega"    //nolint:revive // Gomega's DSL

	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/internal/frtrace"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// EnvChildDir, when set, keeps each scenario's child logs and dumps in a
// directory of that name (the GPU scripts return them); otherwise they go
// to a temporary directory removed after the spec.
const EnvChildDir = "GOCOLL_CONFTEST_CHILD_DIR"

// ChildResult is a finished child process.
type ChildResult struct {
	Rank   int
	Code   int // exit status; 128+signal when killed
	Out    string
	Stderr string
	// Results are its RESULT key=value lines.
	Results map[string]string
}

func (c *ChildResult) String() string {
	return fmt.Sprintf("child rank %d exit %d\nstdout:\n%s\nstderr:\n%s", c.Rank, c.Code, c.Out, c.Stderr)
}

// Seconds reads the result key as seconds, failing the spec when the child
// printed none.
func (c *ChildResult) Seconds(key string) float64 {
	GinkgoHelper()
	f, err := strconv.ParseFloat(c.Results[key], 64)
	Expect(err).NotTo(HaveOccurred(), "rank %d printed no %s: %v", c.Rank, key, c)
	return f
}

// fatalLine is a backend's one fatal log line before an error policy ends
// the process ("gocoll nccl: fatal ...").
var fatalLine = regexp.MustCompile(`gocoll [a-z0-9]+: fatal`)

// FatalLines counts the backends' fatal log lines in s.
func FatalLines(s string) int { return len(fatalLine.FindAllString(s, -1)) }

// onStreams reports whether the suite's tensors are CUDA tensors of a
// backend with stream semantics, whose kernels can be held by a gate.
func (s *Suite) onStreams() bool {
	return s.Device.Type == tensor.CUDA && s.Caps.StreamSemantics
}

// RequireChildren skips unless this rank runs the children (rank 0) and
// the machine has what world children need (a GPU each when the suite
// runs on GPUs).
func (s *Suite) RequireChildren(world int) {
	GinkgoHelper()
	s.Require(s.Rank == 0, "rank 0 runs this spec's child processes")
	if s.Device.Type == tensor.CUDA {
		n, err := cuda.DeviceCount()
		Expect(err).NotTo(HaveOccurred())
		s.Require(n >= world, fmt.Sprintf("needs %d GPUs, one per child rank; this machine has %d", world, n))
	}
}

// RunChildren runs scenario in world child processes and returns them
// once all have ended, with the directory that holds their dumps.
func (s *Suite) RunChildren(scenario string, world int, env ...string) (string, []*ChildResult) {
	GinkgoHelper()
	return s.runChildren(childConfig{Scenario: scenario, World: world}, env...)
}

func (s *Suite) runChildren(base childConfig, env ...string) (string, []*ChildResult) {
	GinkgoHelper()
	scenario, world := base.Scenario, base.World
	srv, err := store.NewTCPServer(context.Background(), store.ServerOptions{Addr: "127.0.0.1:0"})
	Expect(err).NotTo(HaveOccurred())
	defer srv.Close()
	dir := GinkgoT().TempDir()
	if keep := os.Getenv(EnvChildDir); keep != "" {
		dir = filepath.Join(keep, scenario)
		Expect(os.RemoveAll(dir)).To(Succeed())
		Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	}
	exe, err := os.Executable()
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type running struct {
		cmd      *exec.Cmd
		out, err bytes.Buffer
	}
	procs := make([]*running, world)
	for r := range world {
		cfg := base
		cfg.Rank, cfg.Store, cfg.Dir, cfg.Backend, cfg.GPU = r, fmt.Sprintf("127.0.0.1:%d", srv.Port()), dir, s.Backend, -1
		if s.Device.Type == tensor.CUDA {
			cfg.GPU = r
		}
		js, _ := json.Marshal(cfg)
		p := &running{cmd: exec.CommandContext(ctx, exe)}
		p.cmd.Env = append(append(os.Environ(), EnvChild+"="+string(js), "NCCL_DEBUG=WARN"), env...)
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.err
		Expect(p.cmd.Start()).To(Succeed())
		procs[r] = p
	}
	kids := make([]*ChildResult, world)
	for r, p := range procs {
		err := p.cmd.Wait()
		c := &ChildResult{Rank: r, Out: p.out.String(), Stderr: p.err.String(), Results: map[string]string{}}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			c.Code = ee.ExitCode()
			if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
				c.Code = 128 + int(st.Signal())
			}
		} else {
			Expect(err).NotTo(HaveOccurred())
		}
		sc := bufio.NewScanner(strings.NewReader(c.Out))
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
				if k, v, ok := strings.Cut(line, "="); ok {
					c.Results[k] = v
				}
			}
		}
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("child%d.log", r)), []byte(c.String()), 0o644)
		fmt.Fprintf(GinkgoWriter, "%s: %v\n", scenario, c)
		AddReportEntry(fmt.Sprintf("%s rank %d", scenario, r), fmt.Sprintf("exit %d, %v", c.Code, c.Results))
		kids[r] = c
	}
	Expect(ctx.Err()).To(Succeed(), "the children of %s ran past 60 s", scenario)
	return dir, kids
}

// ExpectAround expects a duration (seconds) within tol of want.
func ExpectAround(what string, got, want, tol float64) {
	GinkgoHelper()
	Expect(got).To(BeNumerically("~", want, tol), "%s after %.3f s, want %.2f s ± %.1f s", what, got, want, tol)
}

// servingExtension returns the extension of the backend that serves the
// suite's tensors, if one is registered.
func (s *Suite) servingExtension() (Extension, bool) {
	b, err := s.PG.Backend(s.Device.Type)
	if err != nil {
		return Extension{}, false
	}
	return extension(b.Name())
}

func defineChildFailures(s *Suite) {
	Describe("failures in child processes", Label(LabelTimeout, LabelErrors), func() {
		// On a stream backend the collective is held by a gate on the only
		// child's current stream; elsewhere a second child withholds it
		// until the first has timed out, then issues it late.
		DescribeTable("a collective that never starts fails with ErrTimeout after its timeout, then the error policy acts",
			func(policy string) {
				gated := s.onStreams()
				world := 2
				if gated {
					world = 1
				}
				s.RequireChildren(world)
				ext, _ := s.servingExtension()
				var env []string
				if ext.Policies != nil && ext.Policies.Env != nil {
					env = ext.Policies.Env(policy)
				}
				dir, kids := s.runChildren(childConfig{Scenario: "policy-" + policy, World: world, Gate: gated}, env...)
				c := kids[0]
				Expect(c.Results["timeout"]).To(Equal("true"), "want ErrTimeout: %v", c)
				Expect(c.Results["err"]).To(ContainSubstring("timeout after 1s"))
				// The host clock counts from enqueue; a watchdog looks every
				// 100 ms, so the error comes within 200 ms of it.
				ExpectAround("ErrTimeout", c.Seconds("elapsed"), ChildOpTimeout.Seconds()+0.05, 0.2)
				dumps, _ := filepath.Glob(filepath.Join(dir, "fr_*"))
				if ext.Policies != nil {
					ext.Policies.Check(policy, c, dumps)
					return
				}
				// No error policies: nothing ends the process or breaks the
				// group. The late op completes where it was late, and the
				// next op works on every child.
				for _, k := range kids {
					Expect(k.Code).To(Equal(0), "the process should survive: %v", k)
					Expect(FatalLines(k.Stderr)).To(Equal(0), "%v", k)
					Expect(k.Results["next"]).To(Equal("<nil>"), "the next op works: %v", k)
				}
				if world == 2 {
					Expect(c.Results["err_ranks"]).To(Equal("[1]"), "the timeout names the rank that never issued the op: %v", c)
					Expect(kids[1].Results["late"]).To(Equal("<nil>"), "the late op completes on the late rank: %v", kids[1])
				}
				Expect(dumps).NotTo(BeEmpty(), "no flight recorder dump in %s", dir)
			},
			Entry("TearDown", "TearDown"),
			Entry("SkipCleanUp", "SkipCleanUp"),
			Entry("CleanUpOnly", "CleanUpOnly"),
			Entry("NoHandling", "NoHandling"),
			Entry("BlockingWait", "BlockingWait"),
		)

		It("a rank that skips a collective is named by its peer's timeout; both ranks dump, and the analyzer points at it", func() {
			s.RequireChildren(2)
			dir, kids := s.RunChildren("skip", 2)
			r0, r1 := kids[0], kids[1]
			Expect(r0.Code).To(Equal(0), "%v", r0)
			Expect(r1.Code).To(Equal(0), "%v", r1)
			Expect(r0.Results["timeout"]).To(Equal("true"), "%v", r0)
			Expect(r0.Results["err"]).To(ContainSubstring("rank 1 never enqueued allreduce seq 3"))
			Expect(r0.Results["err_ranks"]).To(Equal("[1]"))
			ExpectAround("rank 0's ErrTimeout", r0.Seconds("elapsed"), childSkipTimeout.Seconds()+0.05, 0.2)
			Expect(r1.Results["dumped"]).To(Equal("true"), "rank 1 dumps when rank 0 signals through the store")
			dumps, err := frtrace.Load(dir)
			Expect(err).NotTo(HaveOccurred())
			var ranks []int
			for _, d := range dumps {
				ranks = append(ranks, d.Rank)
			}
			slices.Sort(ranks)
			Expect(ranks).To(Equal([]int{0, 1}))
			rep := frtrace.Analyze(dumps)
			fmt.Fprintln(GinkgoWriter, rep.String())
			Expect(rep.Mismatch).NotTo(BeNil(), "the analyzer found nothing: %v", rep)
			Expect(rep.Mismatch.Kind).To(Equal(frtrace.MissingRank))
			Expect(rep.Mismatch.Seq).To(BeEquivalentTo(3))
			Expect(rep.Mismatch.Ranks).To(Equal([]int{1}))
		})

		It("a killed peer is detected within the op's timeout, and later ops fail", func() {
			s.RequireChildren(2)
			_, kids := s.RunChildren("kill", 2)
			r0, r1 := kids[0], kids[1]
			Expect(r1.Code).To(Equal(128+int(syscall.SIGKILL)), "rank 1 should have been killed: %v", r1)
			Expect(r0.Code).To(Equal(0), "%v", r0)
			Expect(r0.Results["err"]).NotTo(Equal("<nil>"), "%v", r0)
			Expect(r0.Seconds("elapsed")).To(BeNumerically("<", childKillTimeout.Seconds()+0.2))
			Expect(r0.Results["next"]).NotTo(Equal("<nil>"), "the op after the peer died should fail: %v", r0)
			if ext, _ := s.servingExtension(); ext.CheckKilled != nil {
				ext.CheckKilled(r0)
			} else {
				// The dead peer's connections are gone, and the error says whose.
				Expect(r0.Results["err"]).To(ContainSubstring("remote rank failed"))
				Expect(r0.Results["err_ranks"]).To(Equal("[1]"))
			}
		})

		It("Abort fails the pending work and later ops with ErrAborted keeping the reason, without waiting for the peer", func() {
			s.RequireChildren(2)
			_, kids := s.RunChildren("abort", 2)
			r0 := kids[0]
			Expect(r0.Code).To(Equal(0), "%v", r0)
			Expect(kids[1].Code).To(Equal(0), "%v", kids[1])
			Expect(r0.Results["abort"]).To(Equal("<nil>"), "%v", r0)
			// Bounded (the nccl children's AbortTimeout is 2 s).
			Expect(r0.Seconds("abort_elapsed")).To(BeNumerically("<", 2.5))
			Expect(r0.Results["pending_aborted"]).To(Equal("true"), "%v", r0)
			Expect(r0.Results["next_aborted"]).To(Equal("true"), "%v", r0)
			Expect(r0.Results["next"]).To(ContainSubstring("conformance: user abort"), "the next op's error keeps the reason")
		})
	})
}

func init() { Define(defineChildFailures) }
