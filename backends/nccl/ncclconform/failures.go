package ncclconform

// The nccl side of the child-process failure specs: the children's nccl
// options and test hooks, what each error policy does after a timeout,
// and the specs only nccl has (a rank's error through the store, the
// heartbeat monitor, the NaN check), with their scenarios.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive // Ginkgo's DSL
	. "github.com/onsi/gomega"    //nolint:revive // Gomega's DSL

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/backends/nccl/internal/ncclhook"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/tensor"
)

// childSetup gives a child the run's nccl options from its environment
// (the policy specs set GOCOLL_NCCL_ASYNC_ERROR_HANDLING), a bounded abort,
// CleanUpOnly where a scenario's process must survive a peer's failure,
// and the watchdog hang hook for the heartbeat scenario.
func childSetup(c *conformance.Child, dcfg *dispatcher.Config) error {
	o, err := nccl.OptionsFromEnv()
	if err != nil {
		return err
	}
	o.AbortTimeout = 2 * time.Second
	if c.Scenario == "skip" || c.Scenario == "kill" {
		o.ErrorPolicy = nccl.CleanUpOnly
	}
	ncclhook.Set(&o, ncclhook.Knobs{HangWatchdog: c.Scenario == "heartbeat"})
	c.BlockingWait = c.BlockingWait || o.BlockingWait
	if dcfg.BackendOptions == nil {
		dcfg.BackendOptions = map[string]any{}
	}
	dcfg.BackendOptions[nccl.Name] = &o
	return nil
}

var scenarios = map[string]conformance.Scenario{
	"remote":    {Warm: 2, Run: remote},
	"heartbeat": {Warm: 0, Run: heartbeat},
	"nan":       {Warm: 0, Run: nan},
}

var policies = conformance.Policies{Env: policyEnv, After: policyAfter, Check: policyCheck}

// policyEnv selects the policy as a user would, through PyTorch's
// variables under their GOCOLL_ names.
func policyEnv(policy string) []string {
	switch policy {
	case "TearDown":
		return []string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING=1"}
	case "CleanUpOnly":
		return []string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING=2"}
	case "NoHandling":
		return []string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING=0"}
	case "BlockingWait":
		return []string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING=3", "GOCOLL_NCCL_BLOCKING_WAIT=1"}
	}
	return []string{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING=3"} // SkipCleanUp
}

// policyAfter runs in the child after its gated collective timed out.
func policyAfter(c *conformance.Child, policy string, g *cuda.Gate) error {
	switch policy {
	case "TearDown", "SkipCleanUp":
		time.Sleep(15 * time.Second) // the watchdog ends the process first
		c.Result("survived", true)
	case "NoHandling":
		// Nothing was done to the communicator: once the gate opens, the
		// late op runs and the next one works.
		if g != nil {
			g.Open()
			if err := c.Cur.SynchronizeContext(context.Background()); err != nil {
				return err
			}
		}
		_, err := c.Allreduce(conformance.ChildOKTimeout)
		c.ResultErr("next", err)
	default:
		// CleanUpOnly and blocking wait: the communicators were aborted;
		// the next op must fail, keeping the reason.
		_, err := c.Allreduce(conformance.ChildOKTimeout)
		c.ResultErr("next", err)
	}
	return nil
}

// policyCheck checks what each policy did.
func policyCheck(policy string, c *conformance.ChildResult, dumps []string) {
	GinkgoHelper()
	checkNVML(c, dumps)
	switch policy {
	case "TearDown", "SkipCleanUp":
		Expect(c.Code).To(Equal(1), "the process should end: %v", c)
		Expect(conformance.FatalLines(c.Stderr)).To(Equal(1), "one fatal line: %v", c)
		Expect(c.Stderr).To(ContainSubstring("policy=" + policy))
		Expect(c.Results).NotTo(HaveKey("survived"))
		Expect(dumps).NotTo(BeEmpty(), "no flight recorder dump")
	case "CleanUpOnly", "BlockingWait":
		Expect(c.Code).To(Equal(0), "the process should survive: %v", c)
		Expect(conformance.FatalLines(c.Stderr)).To(Equal(0))
		Expect(c.Results["next"]).To(And(ContainSubstring("aborted"), ContainSubstring("timeout after 1s")),
			"the next op fails with ErrAborted, keeping the reason")
		Expect(dumps).NotTo(BeEmpty(), "no flight recorder dump")
	case "NoHandling":
		Expect(c.Code).To(Equal(0), "%v", c)
		Expect(conformance.FatalLines(c.Stderr)).To(Equal(0))
		Expect(c.Results["next"]).To(Equal("<nil>"), "nothing happens: the next op works")
	}
}

// checkKilled: under CleanUpOnly the communicators are aborted after the
// peer's death.
func checkKilled(r0 *conformance.ChildResult) {
	GinkgoHelper()
	Expect(r0.Results["next"]).To(ContainSubstring("aborted"))
}

// remote: rank 0's allreduce never starts and times out after 1 s; rank
// 1's, with a 30 s timeout, must learn of it from the store.
func remote(c *conformance.Child) error {
	timeout := 30 * time.Second
	if c.Rank == 0 {
		if _, err := c.Hold(); err != nil {
			return err
		}
		timeout = conformance.ChildOpTimeout
	}
	el, err := c.Allreduce(timeout)
	c.Result("elapsed", el.Seconds())
	c.ResultErr("err", err)
	c.Result("remote", errors.Is(err, backend.ErrRemote))
	time.Sleep(500 * time.Millisecond)
	return nil
}

// heartbeat: the watchdog hangs (ncclhook.Knobs.HangWatchdog); the
// heartbeat monitor must end the process.
func heartbeat(c *conformance.Child) error {
	time.Sleep(15 * time.Second) // the monitor ends the process first
	c.Result("survived", true)
	return nil
}

// nan: with the NaN check on, an input holding a NaN fails the op on every
// rank before it is issued; a NaN in a receive buffer does not count.
func nan(c *conformance.Child) error {
	bad, err := c.Tensor(1<<20, 1<<20-3) // past the kernel's first grid pass
	if err != nil {
		return err
	}
	_, err = c.PG.Allreduce(c.Ctx, []*tensor.Tensor{bad}, backend.AllreduceOptions{})
	c.ResultErr("input", err)
	c.Result("input_invalid", errors.Is(err, backend.ErrInvalidArgument))
	// Every rank receives into a buffer with a NaN; rank 0's input is clean.
	recv, err := c.Tensor(1024, 5)
	if err != nil {
		return err
	}
	in, err := c.Tensor(1024, -1)
	if err != nil {
		return err
	}
	out := make([]*tensor.Tensor, c.World)
	out[c.Rank] = recv
	for r := range out {
		if out[r] == nil {
			if out[r], err = c.Tensor(1024, -1); err != nil {
				return err
			}
		}
	}
	w, err := c.PG.Allgather(c.Ctx, [][]*tensor.Tensor{out}, []*tensor.Tensor{in}, backend.AllgatherOptions{})
	if err == nil {
		ctx, cancel := context.WithTimeout(c.Ctx, conformance.ChildOKTimeout)
		err = w.WaitHost(ctx)
		cancel()
	}
	c.ResultErr("recv", err)
	if err == nil {
		h, err := cuda.ToHost(context.Background(), recv)
		if err != nil {
			return err
		}
		c.Result("recv_value", h.At(5))
	}
	return nil
}

// onNCCL reports whether the suite's tensors are CUDA tensors served by
// nccl, which these specs need.
func onNCCL(s *conformance.Suite) bool {
	if s.Device.Type != tensor.CUDA {
		return false
	}
	b, err := s.PG.Backend(tensor.CUDA)
	return err == nil && b.Name() == nccl.Name
}

func defineFailures(s *conformance.Suite) {
	Describe("failures in child processes", Label(conformance.LabelTimeout, conformance.LabelErrors), func() {
		It("a rank's failure reaches its peers through the store: ErrRemote naming it, long before their own timeout", func() {
			s.Require(onNCCL(s), "a collective that never starts needs a gated CUDA stream (nccl on GPUs)")
			s.RequireChildren(2)
			_, kids := s.RunChildren("remote", 2, "GOCOLL_NCCL_ASYNC_ERROR_HANDLING=0")
			r0, r1 := kids[0], kids[1]
			Expect(r0.Code).To(Equal(0), "%v", r0)
			Expect(r1.Code).To(Equal(0), "%v", r1)
			Expect(r0.Results["err"]).To(ContainSubstring("timeout after 1s"))
			Expect(r1.Results["remote"]).To(Equal("true"), "%v", r1)
			Expect(r1.Results["err"]).To(ContainSubstring("rank 0 failed"))
			Expect(r1.Results["err_ranks"]).To(Equal("[0]"))
			Expect(r1.Seconds("elapsed")).To(BeNumerically("<", conformance.ChildOpTimeout.Seconds()+0.5))
		})

		It("the heartbeat monitor ends a process whose watchdog hangs, after dumping the recorder and the stacks", func() {
			s.Require(onNCCL(s), "the watchdog hang hook is the nccl backend's (cpupool has no watchdog)")
			s.RequireChildren(1)
			dir, kids := s.RunChildren("heartbeat", 1, "GOCOLL_HEARTBEAT_TIMEOUT_SEC=1", "GOCOLL_COORD_CHECK_MILSEC=100")
			c := kids[0]
			Expect(c.Code).To(Equal(134), "want exit 134 from the heartbeat monitor: %v", c)
			Expect(c.Stderr).To(ContainSubstring("heartbeat"))
			Expect(c.Results).NotTo(HaveKey("survived"))
			for _, p := range []string{"fr_0", "fr_0.stacks"} {
				Expect(filepath.Join(dir, p)).To(BeAnExistingFile())
			}
		})

		It("the NaN check fails an op whose input holds a NaN, not one whose receive buffer does", func() {
			s.Require(onNCCL(s), "the NaN check is a CUDA kernel of the nccl backend")
			s.RequireChildren(1)
			world := 1
			if n, _ := cuda.DeviceCount(); n >= 2 {
				world = 2
			}
			_, kids := s.RunChildren("nan", world, "GOCOLL_NCCL_NAN_CHECK=1")
			for _, c := range kids {
				Expect(c.Code).To(Equal(0), "%v", c)
				Expect(c.Results["input_invalid"]).To(Equal("true"), "%v", c)
				Expect(c.Results["input"]).To(And(ContainSubstring("NaN"), ContainSubstring("allreduce"), ContainSubstring(fmt.Sprintf("rank %d", c.Rank))))
				Expect(c.Results["recv"]).To(Equal("<nil>"), "a NaN in a receive buffer must not count: %v", c)
				Expect(c.Results["recv_value"]).To(Equal("1"))
			}
		})
	})
}

func init() { conformance.Define(defineFailures) }
