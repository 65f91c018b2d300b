// Package uccconform is the ucc backend's part of the conformance suite:
// it registers the run setup (an Info line naming the loaded libucc) and
// the check of what a killed peer leads to. Link it into cmd/conftest
// with a blank import; it imports backends/ucc, which registers "ucc".
package uccconform

import (
	"fmt"

	. "github.com/onsi/gomega" //nolint:revive // Gomega's DSL

	"github.com/gocoll/gocoll/backends/ucc"
	"github.com/gocoll/gocoll/conformance"
)

func init() {
	conformance.Register(conformance.Extension{
		Backend:     ucc.Name,
		Setup:       setup,
		CheckKilled: checkKilled,
	})
}

// setup names the UCC library in the run's Info lines.
func setup(cfg *conformance.RankConfig) error {
	v, err := ucc.Version()
	if err != nil {
		return err
	}
	cfg.Info = append(cfg.Info, fmt.Sprintf("ucc: %s (%s)", v, ucc.LibraryPath()))
	return nil
}

// checkKilled checks the surviving rank's error after its peer was killed
// mid-collective. UCC has no failure detection between ranks of one host
// (its shared-memory transports never see the peer go), so an op UCC has
// ends at its own deadline, through the backend's watchdog, with ErrTimeout
// naming the dead rank as the one that never completed it; an op still
// waiting for the dead rank's fingerprint (backends/ucc/fingerprint.go)
// fails at the watchdog's next tick with ErrRemote naming it. The generic
// checks (within the timeout, and the next op fails) still apply.
func checkKilled(r0 *conformance.ChildResult) {
	Expect(r0.Results["err"]).To(Or(ContainSubstring("timeout after 3s"), ContainSubstring("remote rank failed")), "%v", r0)
	Expect(r0.Results["err_ranks"]).To(Equal("[1]"), "%v", r0)
}
