package conformance

import (
	"fmt"
	"slices"
	"sync"

	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/dispatcher"
)

// Extension is what a backend's own conformance package registers (as
// database/sql drivers register themselves): the run setup, child-process
// knobs and failure scenarios that only that backend knows. The suite
// itself imports no backend; backends/nccl/ncclconform is the nccl one,
// linked into cmd/conftest with a blank import. A backend's own specs are
// registered with Define, as the generic ones are, and gate themselves on
// the backend serving the suite's tensors.
type Extension struct {
	// Backend is the backend name the extension serves ("nccl").
	Backend string
	// Setup adjusts a rank's config once Setup has placed the rank's
	// tensors (cfg.Device) on a device that Backend serves: its options,
	// skips (RankConfig.Skip) and Info lines.
	Setup func(cfg *RankConfig) error
	// Child adjusts the dispatcher config of a failure spec's child
	// process (its options, test hooks) when the child's backend string
	// names Backend. It may set c.BlockingWait.
	Child func(c *Child, dcfg *dispatcher.Config) error
	// Scenarios are child scenarios of the backend's own failure specs,
	// by name; RunChildren runs them.
	Scenarios map[string]Scenario
	// Policies, when not nil, describes the backend's error policies to
	// the policy specs ("a collective that never starts ..."). A backend
	// without error policies (cpupool) leaves it nil: its children must
	// then survive the timeout, and the group must work on once the late
	// op can run.
	Policies *Policies
	// CheckKilled, when not nil, checks what the backend does after a peer
	// is killed, beyond the generic checks (an error within the timeout,
	// and a failing next op), on the surviving child rank 0. When nil, the
	// suite expects a host backend's answer: ErrRemote naming the dead
	// rank.
	CheckKilled func(r0 *ChildResult)
}

// Scenario is a child-process scenario of a backend's failure spec.
type Scenario struct {
	// Warm is the number of allreduces every child completes first.
	Warm int
	// Run runs the scenario in one child; it reports with Child.Result.
	Run func(c *Child) error
}

// Policies describes a backend's error policies: what follows a
// collective that timed out under each of TearDown, SkipCleanUp,
// CleanUpOnly, NoHandling and blocking wait (PolicyNames).
type Policies struct {
	// Env returns the environment that selects policy in a child.
	Env func(policy string) []string
	// After runs in the child once its collective timed out; gate is the
	// gate that holds its stream (nil on the CPU).
	After func(c *Child, policy string, gate *cuda.Gate) error
	// Check checks the child's outcome; dumps are the flight recorder
	// files it left.
	Check func(policy string, c *ChildResult, dumps []string)
}

// PolicyNames are the entries of the policy specs, in PyTorch's terms.
var PolicyNames = []string{"TearDown", "SkipCleanUp", "CleanUpOnly", "NoHandling", "BlockingWait"}

var (
	extMu      sync.Mutex
	extensions = map[string]Extension{}
)

// Register makes ext known to the suite. Extension packages call it from
// init; registering one backend twice panics, as backend.Register does.
func Register(ext Extension) {
	extMu.Lock()
	defer extMu.Unlock()
	if ext.Backend == "" {
		panic("conformance: Register of an extension without a backend name")
	}
	if _, dup := extensions[ext.Backend]; dup {
		panic(fmt.Sprintf("conformance: Register called twice for backend %q", ext.Backend))
	}
	extensions[ext.Backend] = ext
}

// extension returns the registered extension of backend name.
func extension(name string) (Extension, bool) {
	extMu.Lock()
	defer extMu.Unlock()
	ext, ok := extensions[name]
	return ext, ok
}

// Extensions returns the names of the backends with a registered
// extension, sorted.
func Extensions() []string {
	extMu.Lock()
	defer extMu.Unlock()
	var names []string
	for n := range extensions {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
