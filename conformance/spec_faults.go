package conformance

// Fault specs of issue 15 (labels timeout and errors), in child processes
// (child_faults.go): the root cause of a failure is named by every
// survivor, a rank that never joins is named within the Init timeout, and
// ranks that pass one collective different dtypes fail on every rank.

import (
	"fmt"
	"strconv"

	. "github.com/onsi/ginkgo/v2" //nolint:revive // Ginkgo's DSL
	. "github.com/onsi/gomega"    //nolint:revive // Gomega's DSL
	"github.com/onsi/gomega/types"
)

func defineFaultSpecs(s *Suite) {
	Describe("faults name the right rank", Label(LabelTimeout, LabelErrors), func() {
		It("every survivor of a rank of 4 killed during an allreduce loop names the killed rank, also after its peers abort", func() {
			const world = 4
			s.RequireChildren(world)
			ext, _ := s.servingExtension()
			// Backends that see a dead peer at once (cpupool's mesh) do so
			// within a second; the others (UCC, whose transports never see
			// it) at the op's deadline.
			bound := 1.0
			if ext.CheckKilled != nil {
				bound = childKillTimeout.Seconds() + 1
			}
			for _, victim := range []int{2, 0, 3} {
				_, kids := s.RunChildren(fmt.Sprintf("killone-%d", victim), world)
				for _, k := range kids {
					if k.Rank == victim {
						Expect(k.Code).To(Equal(137), "rank %d should have been killed: %v", victim, k)
						continue
					}
					Expect(k.Code).To(Equal(0), "%v", k)
					Expect(k.Results["err_ranks"]).To(Equal(fmt.Sprintf("[%d]", victim)),
						"survivor %d must name the killed rank %d, not a rank that only followed: %v", k.Rank, victim, k)
					Expect(k.Seconds("detect")).To(BeNumerically("<", bound), "survivor %d: %v", k.Rank, k)
				}
			}
		})

		It("a rank that never calls Init is named by every other rank within the Init timeout + 10 %", func() {
			const world = 3
			s.RequireChildren(world)
			_, kids := s.RunChildren("nojoin", world)
			for _, k := range kids[:world-1] {
				Expect(k.Code).To(Equal(0), "%v", k)
				Expect(k.Results["err_ranks"]).To(Equal("["+strconv.Itoa(world-1)+"]"), "rank %d: %v", k.Rank, k)
				Expect(k.Results["err"]).To(ContainSubstring("never joined"), "rank %d: %v", k.Rank, k)
				Expect(k.Seconds("elapsed")).To(BeNumerically("<=", 1.1*childNoJoinTimeout.Seconds()), "rank %d: %v", k.Rank, k)
			}
		})

		DescribeTable("ranks that pass one allreduce float32 and int32 of the same size fail on every rank naming both, and the group works on",
			func(debug bool) {
				const world = 2
				s.RequireChildren(world)
				var env []string
				if debug {
					env = append(env, "GOCOLL_DEBUG=detail")
				} else {
					s.Require(s.Caps.MismatchChecks, "the backend does not check the ops' fingerprints itself (only GOCOLL_DEBUG=detail does)")
				}
				_, kids := s.RunChildren("mismatch-dtype", world, env...)
				expectNamedMismatch(kids, "rank 0 allreduce float32 x 1024 (SUM), rank 1 allreduce int32 x 1024 (SUM)")
			},
			Entry("found by the backend itself (in-band fingerprints)", false),
			Entry("found by the dispatcher's check, GOCOLL_DEBUG=detail (every backend)", true),
		)

		DescribeTable("ranks that pass one allreduce of different float32 sizes fail on every rank naming both sizes, in the same words in every run, and the group works on",
			func(scenario, want, wantBytes string) {
				const world = 2
				s.RequireChildren(world)
				s.Require(s.Caps.MismatchChecks, "the backend does not check the ops' fingerprints itself (only GOCOLL_DEBUG=detail does)")
				var first string
				for run := range 3 {
					_, kids := s.RunChildren(scenario, world)
					expectNamedMismatch(kids, want, wantBytes)
					if run == 0 {
						first = kids[0].Results["detail"]
					}
					for _, k := range kids {
						Expect(k.Results["detail"]).To(Equal(first), "run %d, rank %d: the words differ from run 0's", run, k.Rank)
					}
				}
			},
			Entry("1024 and 1000 elements", "mismatch-size",
				"rank 0 allreduce float32 x 1024 (SUM), rank 1 allreduce float32 x 1000 (SUM)", "rank 0 4096 bytes, rank 1 4000 bytes"),
			Entry("4 MiB and 1024 elements less", "mismatch-size4m",
				"rank 0 allreduce float32 x 1048576 (SUM), rank 1 allreduce float32 x 1047552 (SUM)", "rank 0 4194304 bytes, rank 1 4190208 bytes"),
		)

		DescribeTable("ranks that pass one allreduce that differs after three matching ones (where a rank may post it ahead of the check) fail on every rank naming both, and the group works on",
			func(scenario, want, wantBytes string) {
				const world = 2
				s.RequireChildren(world)
				s.Require(s.Caps.MismatchChecks, "the backend does not check the ops' fingerprints itself (only GOCOLL_DEBUG=detail does)")
				_, kids := s.RunChildren(scenario, world)
				expectNamedMismatch(kids, want, wantBytes)
			},
			Entry("float32 and int32 of one size", "mismatch-dtype-ahead",
				"rank 0 allreduce float32 x 1024 (SUM), rank 1 allreduce int32 x 1024 (SUM)", "rank 0 allreduce float32 x 1024 (SUM), rank 1 allreduce int32 x 1024 (SUM)"),
			Entry("1024 and 1000 elements", "mismatch-size-ahead",
				"rank 0 allreduce float32 x 1024 (SUM), rank 1 allreduce float32 x 1000 (SUM)", "rank 0 4096 bytes, rank 1 4000 bytes"),
			Entry("4 MiB and 1024 elements less", "mismatch-size4m-ahead",
				"rank 0 allreduce float32 x 1048576 (SUM), rank 1 allreduce float32 x 1047552 (SUM)", "rank 0 4194304 bytes, rank 1 4190208 bytes"),
		)
	})
}

// expectNamedMismatch checks the ranks of a 2-rank mismatch scenario:
// each exits cleanly with ErrInvalidArgument naming ranks 0 and 1, its
// detail holds one of wants (the ops' words, or their sizes in bytes) in
// the same words on every rank, and its next, matching op succeeds (the
// group works on).
func expectNamedMismatch(kids []*ChildResult, wants ...string) {
	GinkgoHelper()
	matchers := make([]types.GomegaMatcher, len(wants))
	for i, w := range wants {
		matchers[i] = ContainSubstring(w)
	}
	for _, k := range kids {
		Expect(k.Code).To(Equal(0), "%v", k)
		Expect(k.Results["invalid"]).To(Equal("true"), "rank %d: want ErrInvalidArgument: %v", k.Rank, k)
		Expect(k.Results["err_ranks"]).To(Equal("[0 1]"), "rank %d: %v", k.Rank, k)
		Expect(k.Results["detail"]).To(Or(matchers...), "rank %d: %v", k.Rank, k)
		Expect(k.Results["detail"]).To(Equal(kids[0].Results["detail"]), "the ranks' words differ")
		Expect(k.Results["next"]).To(Equal("<nil>"), "rank %d: the next, matching op: %v", k.Rank, k)
	}
}

func init() { Define(defineFaultSpecs) }
