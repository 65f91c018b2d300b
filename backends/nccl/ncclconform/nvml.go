package ncclconform

import (
	"encoding/json"
	"os"

	. "github.com/onsi/ginkgo/v2" //nolint:revive // Ginkgo's DSL
	. "github.com/onsi/gomega"    //nolint:revive // Gomega's DSL

	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/internal/frtrace"
	"github.com/gocoll/gocoll/internal/gpuinfo"
)

// checkNVML checks that a gated collective's timeout error carries the
// NVML snapshot of the child's GPU (or the one line saying NVML is
// unavailable), and that its flight-recorder dumps hold the "nvml"
// section: the snapshots of the process's GPUs with their XID events.
func checkNVML(c *conformance.ChildResult, dumps []string) {
	GinkgoHelper()
	Expect(c.Results["err"]).To(Or(ContainSubstring("NVML: GPU"), ContainSubstring("NVML unavailable: "), ContainSubstring("NVML was still starting")),
		"the timeout error carries the NVML snapshot: %v", c)
	for _, path := range dumps {
		b, err := os.ReadFile(path)
		Expect(err).NotTo(HaveOccurred())
		var d frtrace.Dump
		Expect(json.Unmarshal(b, &d)).To(Succeed(), "dump %s", path)
		Expect(d.Sections).To(HaveKey("nvml"), "dump %s has no nvml section", path)
		var snaps []gpuinfo.Snapshot
		if json.Unmarshal(d.Sections["nvml"], &snaps) == nil {
			Expect(snaps).NotTo(BeEmpty(), "dump %s: the nvml section names no GPU", path)
			Expect(snaps[0].UUID).To(HavePrefix("GPU-"), "dump %s: %s", path, d.Sections["nvml"])
			Expect(snaps[0].XIDs).NotTo(BeNil(), "dump %s: the XIDs since the group started are missing", path)
			continue
		}
		var why map[string]string
		Expect(json.Unmarshal(d.Sections["nvml"], &why)).To(Succeed(), "dump %s: %s", path, d.Sections["nvml"])
		Expect(why["unavailable"]).To(HavePrefix("NVML unavailable: "), "dump %s: %s", path, d.Sections["nvml"])
	}
}
