package conformance

// Failure specs that need processes of their own (labels timeout and
// errors): a process that the error policy ends, a rank that skips a
// collective or is killed, a watchdog that hangs. Rank 0 of the suite
// runs each scenario in fresh child processes (child.go) around a TCPStore
// of its own and checks their exits, outputs and dumps; the other ranks
// skip. The children use the suite's backend string and, when the suite
// runs on GPUs, GPU r for child rank r.

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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive // Ginkgo's DSL
	. "github.com/onsi/gomega"    //nolint:revive // Gomega's DSL

	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/internal/frtrace"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// EnvChildDir, when set, keeps each scenario's child logs and dumps in a
// directory of that name (the GPU scripts return them); otherwise they go
// to a temporary directory removed after the spec.
const EnvChildDir = "GOCOLL_CONFTEST_CHILD_DIR"

// child is a finished child process.
type child struct {
	rank    int
	code    int // exit status; 128+signal when killed
	out     string
	stderr  string
	results map[string]string // its RESULT key=value lines
}

func (c *child) String() string {
	return fmt.Sprintf("child rank %d exit %d\nstdout:\n%s\nstderr:\n%s", c.rank, c.code, c.out, c.stderr)
}

func (c *child) seconds(key string) float64 {
	f, err := strconv.ParseFloat(c.results[key], 64)
	Expect(err).NotTo(HaveOccurred(), "rank %d printed no %s: %v", c.rank, key, c)
	return f
}

// fatalLines counts the nccl backend's fatal log lines.
func fatalLines(s string) int { return strings.Count(s, "gocoll nccl: fatal") }

// onGPU reports whether the suite's tensors are CUDA tensors served by
// nccl, which the GPU-only scenarios need.
func (s *Suite) onGPU() bool {
	if s.Device.Type != tensor.CUDA {
		return false
	}
	b, err := s.PG.Backend(tensor.CUDA)
	return err == nil && b.Name() == nccl.Name
}

// requireChildren skips unless this rank runs the children and the machine
// has what world children need.
func (s *Suite) requireChildren(world int, gpuOnly string) {
	GinkgoHelper()
	if gpuOnly != "" {
		s.Require(s.onGPU(), gpuOnly)
	}
	s.Require(s.Rank == 0, "rank 0 runs this spec's child processes")
	if s.Device.Type == tensor.CUDA {
		n, err := cuda.DeviceCount()
		Expect(err).NotTo(HaveOccurred())
		s.Require(n >= world, fmt.Sprintf("needs %d GPUs, one per child rank; this machine has %d", world, n))
	}
}

// runChildren runs scenario in world child processes and returns them
// once all have ended, with the directory that holds their dumps.
func (s *Suite) runChildren(scenario string, world int, env ...string) (string, []*child) {
	GinkgoHelper()
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
		cfg := childConfig{Scenario: scenario, Rank: r, World: world, Store: fmt.Sprintf("127.0.0.1:%d", srv.Port()),
			Dir: dir, Backend: s.Backend, GPU: -1}
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
	kids := make([]*child, world)
	for r, p := range procs {
		err := p.cmd.Wait()
		c := &child{rank: r, out: p.out.String(), stderr: p.err.String(), results: map[string]string{}}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			c.code = ee.ExitCode()
			if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
				c.code = 128 + int(st.Signal())
			}
		} else {
			Expect(err).NotTo(HaveOccurred())
		}
		sc := bufio.NewScanner(strings.NewReader(c.out))
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
				if k, v, ok := strings.Cut(line, "="); ok {
					c.results[k] = v
				}
			}
		}
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("child%d.log", r)), []byte(c.String()), 0o644)
		fmt.Fprintf(GinkgoWriter, "%s: %v\n", scenario, c)
		AddReportEntry(fmt.Sprintf("%s rank %d", scenario, r), fmt.Sprintf("exit %d, %v", c.code, c.results))
		kids[r] = c
	}
	Expect(ctx.Err()).To(Succeed(), "the children of %s ran past 60 s", scenario)
	return dir, kids
}

// Expect a duration (seconds) within tol of want.
func expectAround(what string, got, want, tol float64) {
	GinkgoHelper()
	Expect(got).To(BeNumerically("~", want, tol), "%s after %.3f s, want %.2f s ± %.1f s", what, got, want, tol)
}

func defineChildFailures(s *Suite) {
	const gpuOnly = "a collective that never starts needs a gated CUDA stream (nccl on GPUs)"
	Describe("failures in child processes", Label(LabelTimeout, LabelErrors), func() {
		DescribeTable("a collective that never starts fails with ErrTimeout after its timeout, then the error policy acts",
			func(policy, env string) {
				s.requireChildren(1, gpuOnly)
				envs := []string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING=" + policy}
				if env != "" {
					envs = append(envs, env)
				}
				name := CurrentSpecReport().LeafNodeText
				dir, kids := s.runChildren("policy-"+name, 1, envs...)
				c := kids[0]
				Expect(c.results["timeout"]).To(Equal("true"), "want ErrTimeout: %v", c)
				Expect(c.results["err"]).To(ContainSubstring("timeout after 1s"))
				// The host clock counts from enqueue; the watchdog looks
				// every 100 ms, so the error comes within 200 ms of it.
				expectAround("ErrTimeout", c.seconds("elapsed"), childOpTimeout.Seconds()+0.05, 0.2)
				dumps, _ := filepath.Glob(filepath.Join(dir, "fr_*"))
				switch name {
				case "TearDown", "SkipCleanUp":
					Expect(c.code).To(Equal(1), "the process should end: %v", c)
					Expect(fatalLines(c.stderr)).To(Equal(1), "one fatal line: %v", c)
					Expect(c.stderr).To(ContainSubstring("policy=" + name))
					Expect(c.results).NotTo(HaveKey("survived"))
					Expect(dumps).NotTo(BeEmpty(), "no flight recorder dump in %s", dir)
				case "CleanUpOnly", "BlockingWait":
					Expect(c.code).To(Equal(0), "the process should survive: %v", c)
					Expect(fatalLines(c.stderr)).To(Equal(0))
					Expect(c.results["next"]).To(And(ContainSubstring("aborted"), ContainSubstring("timeout after 1s")),
						"the next op fails with ErrAborted, keeping the reason")
					Expect(dumps).NotTo(BeEmpty(), "no flight recorder dump in %s", dir)
				case "NoHandling":
					Expect(c.code).To(Equal(0), "%v", c)
					Expect(fatalLines(c.stderr)).To(Equal(0))
					Expect(c.results["next"]).To(Equal("<nil>"), "nothing happens: the next op works")
				}
			},
			Entry("TearDown", "1", ""),
			Entry("SkipCleanUp", "3", ""),
			Entry("CleanUpOnly", "2", ""),
			Entry("NoHandling", "0", ""),
			Entry("BlockingWait", "3", "GOCOLL_NCCL_BLOCKING_WAIT=1"),
		)

		It("a rank that skips a collective is named by its peer's timeout; both ranks dump, and the analyzer points at it", func() {
			s.requireChildren(2, "")
			dir, kids := s.runChildren("skip", 2, "GOCOLL_NCCL_ASYNC_ERROR_HANDLING=2")
			r0, r1 := kids[0], kids[1]
			Expect(r0.code).To(Equal(0), "%v", r0)
			Expect(r1.code).To(Equal(0), "%v", r1)
			Expect(r0.results["timeout"]).To(Equal("true"), "%v", r0)
			Expect(r0.results["err"]).To(ContainSubstring("rank 1 never enqueued allreduce seq 3"))
			Expect(r0.results["err_ranks"]).To(Equal("[1]"))
			expectAround("rank 0's ErrTimeout", r0.seconds("elapsed"), childSkipTimeout.Seconds()+0.05, 0.2)
			Expect(r1.results["dumped"]).To(Equal("true"), "rank 1 dumps when rank 0 signals through the store")
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
			s.requireChildren(2, "")
			_, kids := s.runChildren("kill", 2, "GOCOLL_NCCL_ASYNC_ERROR_HANDLING=2")
			r0, r1 := kids[0], kids[1]
			Expect(r1.code).To(Equal(128+int(syscall.SIGKILL)), "rank 1 should have been killed: %v", r1)
			Expect(r0.code).To(Equal(0), "%v", r0)
			Expect(r0.results["err"]).NotTo(Equal("<nil>"), "%v", r0)
			Expect(r0.seconds("elapsed")).To(BeNumerically("<", childKillTimeout.Seconds()+0.2))
			Expect(r0.results["next"]).NotTo(Equal("<nil>"), "the op after the peer died should fail: %v", r0)
			if s.onGPU() {
				// CleanUpOnly: the communicators are aborted.
				Expect(r0.results["next"]).To(ContainSubstring("aborted"))
			} else {
				// The dead peer's connections are gone, and the error says whose.
				Expect(r0.results["err"]).To(ContainSubstring("remote rank failed"))
				Expect(r0.results["err_ranks"]).To(Equal("[1]"))
			}
		})

		It("Abort fails the pending work and later ops with ErrAborted keeping the reason, without waiting for the peer", func() {
			s.requireChildren(2, "")
			_, kids := s.runChildren("abort", 2)
			r0 := kids[0]
			Expect(r0.code).To(Equal(0), "%v", r0)
			Expect(kids[1].code).To(Equal(0), "%v", kids[1])
			Expect(r0.results["abort"]).To(Equal("<nil>"), "%v", r0)
			// Bounded: the children's AbortTimeout is 2 s.
			Expect(r0.seconds("abort_elapsed")).To(BeNumerically("<", 2.5))
			Expect(r0.results["pending_aborted"]).To(Equal("true"), "%v", r0)
			Expect(r0.results["next_aborted"]).To(Equal("true"), "%v", r0)
			Expect(r0.results["next"]).To(ContainSubstring("conformance: user abort"), "the next op's error keeps the reason")
		})

		It("a rank's failure reaches its peers through the store: ErrRemote naming it, long before their own timeout", func() {
			s.requireChildren(2, gpuOnly)
			_, kids := s.runChildren("remote", 2, "GOCOLL_NCCL_ASYNC_ERROR_HANDLING=0")
			r0, r1 := kids[0], kids[1]
			Expect(r0.code).To(Equal(0), "%v", r0)
			Expect(r1.code).To(Equal(0), "%v", r1)
			Expect(r0.results["err"]).To(ContainSubstring("timeout after 1s"))
			Expect(r1.results["remote"]).To(Equal("true"), "%v", r1)
			Expect(r1.results["err"]).To(ContainSubstring("rank 0 failed"))
			Expect(r1.results["err_ranks"]).To(Equal("[0]"))
			Expect(r1.seconds("elapsed")).To(BeNumerically("<", childOpTimeout.Seconds()+0.5))
		})

		It("the heartbeat monitor ends a process whose watchdog hangs, after dumping the recorder and the stacks", func() {
			s.requireChildren(1, "the watchdog hang hook is the nccl backend's (cpupool has no watchdog)")
			dir, kids := s.runChildren("heartbeat", 1, "GOCOLL_HEARTBEAT_TIMEOUT_SEC=1", "GOCOLL_COORD_CHECK_MILSEC=100")
			c := kids[0]
			Expect(c.code).To(Equal(134), "want exit 134 from the heartbeat monitor: %v", c)
			Expect(c.stderr).To(ContainSubstring("heartbeat"))
			Expect(c.results).NotTo(HaveKey("survived"))
			for _, p := range []string{"fr_0", "fr_0.stacks"} {
				Expect(filepath.Join(dir, p)).To(BeAnExistingFile())
			}
		})

		It("the NaN check fails an op whose input holds a NaN, not one whose receive buffer does", func() {
			s.requireChildren(1, "the NaN check is a CUDA kernel of the nccl backend")
			world := 1
			if n, _ := cuda.DeviceCount(); n >= 2 {
				world = 2
			}
			_, kids := s.runChildren("nan", world, "GOCOLL_NCCL_NAN_CHECK=1")
			for _, c := range kids {
				Expect(c.code).To(Equal(0), "%v", c)
				Expect(c.results["input_invalid"]).To(Equal("true"), "%v", c)
				Expect(c.results["input"]).To(And(ContainSubstring("NaN"), ContainSubstring("allreduce"), ContainSubstring(fmt.Sprintf("rank %d", c.rank))))
				Expect(c.results["recv"]).To(Equal("<nil>"), "a NaN in a receive buffer must not count: %v", c)
				Expect(c.results["recv_value"]).To(Equal("1"))
			}
		})
	})
}

func init() { Define(defineChildFailures) }
