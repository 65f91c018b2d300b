// Package conformance is gocoll's backend conformance suite: Ginkgo specs
// that state, once for every backend, the semantics of the dispatcher's
// ops, gated by the backend's capabilities.
//
// A run is N rank processes that run the same specs in the same order:
// RunRank is the body of one rank (it joins the job through torchrun's
// variables, rank 0 hosting the TCPStore), Launch starts the N processes
// and merges their reports. cmd/conftest wraps both; `go test
// ./conformance/...` runs a small world through the same path.
//
// Writing specs. A spec file registers a definer in init:
//
//	func init() { Define(func(s *Suite) { Describe("...", Label("p2p"), func() { ... }) }) }
//
// The definer is called with the rank's Suite before the tree is built, so
// its closures use s (s.PG, s.Rank, s.Caps, helpers) and no package state.
// The package imports no backend. A backend's own specs live in its own
// conformance package (backends/nccl/ncclconform), which calls Define the
// same way, gates on s.Backend, s.Device or s.Caps with s.Require (which
// skips with the reason), and registers its setup and child-process
// scenarios with Register; a program links it with a blank import.
//
// Every spec runs on every rank; ranks are kept in step through the store
// before and after each spec (lockstep.go): a rank whose spec fails tells
// the others at once, so they stop waiting for it, and every rank then
// moves to a fresh process group, so one failure does not cascade.
package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive // Ginkgo's DSL is meant to be dot-imported
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// Labels of the themes (DESIGN.md, "Conformance").
const (
	LabelOps        = "ops"
	LabelDTypes     = "dtypes"
	LabelErrors     = "errors"
	LabelAsync      = "async"
	LabelLifetime   = "lifetime"
	LabelTimeout    = "timeout"
	LabelP2P        = "p2p"
	LabelStress     = "stress"
	LabelStream     = "stream"
	LabelCoalescing = "coalescing"
	LabelStore      = "store"
)

var (
	definersMu sync.Mutex
	definers   []func(*Suite)
)

// Define registers a function that declares specs. Spec files call it from
// init, as backends call backend.Register.
func Define(f func(*Suite)) {
	definersMu.Lock()
	defer definersMu.Unlock()
	definers = append(definers, f)
}

// Suite is what specs run against on one rank.
type Suite struct {
	// Backend is the backend string the groups are made with.
	Backend string
	// Device is where specs put tensors.
	Device tensor.Device
	// Rank and Size place this process in the world.
	Rank, Size int
	// Caps are the capabilities of the backend serving Device.
	Caps backend.Capabilities
	// Timeout is the op timeout of the spec groups.
	Timeout time.Duration
	// Seed is the suite's random seed, the same on every rank.
	Seed int64
	// World is the default group; specs use PG, a group of every rank made
	// from it, which is replaced after a failed spec.
	World *dispatcher.ProcessGroup
	// PG is the group specs issue ops on.
	PG *dispatcher.ProcessGroup
	// Upload copies a host tensor to Device, Download back; both are the
	// identity on the CPU.
	Upload, Download func(*tensor.Tensor) (*tensor.Tensor, error)

	skips map[string]string
	store store.Store // prefixed "conformance/" for the suite's own keys
	specN int
	spec  *specRun // the spec running now (lockstep.go); nil between specs
	onEnd []func() // run first thing in the spec's AfterEach; see OnSpecEnd
	opSeq uint64   // numbers ops that specs issue on a backend directly
}

// OnSpecEnd registers f to run when the current spec ends, before the
// suite's own AfterEach steps (the store barrier, and replacing the group
// after a failure). Ginkgo's DeferCleanup runs after AfterEach, too late for
// what must be undone before a new group is made: a group whose kernels
// wait on a peer that never comes, or a closed stream gate (GPU.md's trap:
// creating a communicator hangs behind it). Functions run in reverse order.
func (s *Suite) OnSpecEnd(f func()) { s.onEnd = append(s.onEnd, f) }

// Issued skips the spec when err says the backend does not implement the
// op (ErrUnsupported), with that reason, and returns its arguments, so that
// s.Done(s.Issued(s.PG.Op(...))) runs an op where the backend has it.
func (s *Suite) Issued(w backend.Work, err error) (backend.Work, error) {
	GinkgoHelper()
	s.SkipUnsupported(err)
	return w, err
}

// Store returns the suite's store (its keys live under "conformance/"),
// for specs that coordinate ranks beyond Sync. Keys a spec sets should
// carry SpecIndex, so that no two specs share one.
func (s *Suite) Store() store.Store { return s.store }

// SpecIndex numbers the specs as they run, from 1, the same on every rank.
func (s *Suite) SpecIndex() int { return s.specN }

// NextSeq numbers an op that a spec issues on a backend directly (not
// through the dispatcher, which numbers its own), in backend.Meta.Seq.
func (s *Suite) NextSeq() uint64 {
	s.opSeq++
	return s.opSeq
}

// Ctx returns a context for one step of a spec: the group timeout plus a
// margin, so that a spec never hangs on a broken peer. It ends at once when
// the spec fails on another rank (its cause says which), so that this rank
// stops waiting for what that rank will not do.
func (s *Suite) Ctx() (context.Context, context.CancelFunc) {
	parent := context.Background()
	if s.spec != nil {
		parent = s.spec.ctx
	}
	return context.WithTimeout(parent, s.Timeout+30*time.Second)
}

// Require skips the current spec, with reason, unless ok.
func (s *Suite) Require(ok bool, reason string) {
	if !ok {
		Skip(reason)
	}
}

// Sync is a store barrier across every rank within a spec: it returns
// once all ranks have called it the same number of times in this spec. It
// fails at once when the spec has failed on another rank.
func (s *Suite) Sync() error {
	sp := s.spec
	if sp == nil {
		return errors.New("conformance: Sync outside a spec")
	}
	sp.syncN++
	ctx, cancel := s.Ctx()
	defer cancel()
	return s.barrier(ctx, stepKey(sp.n, "sync/"+strconv.Itoa(sp.syncN)))
}

// NewGroup makes a fresh group of every rank with its own backend, for
// specs that break their group (timeouts, aborts, dead peers). Every rank
// must call it at the same point.
func (s *Suite) NewGroup(ctx context.Context, timeout time.Duration) (*dispatcher.ProcessGroup, error) {
	return s.World.NewGroup(ctx, nil, dispatcher.GroupOptions{Timeout: timeout})
}

// Rand returns a generator seeded from the suite seed and salt, the same on
// every rank.
func (s *Suite) Rand(salt uint64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(s.Seed), salt))
}

// RankConfig configures one rank of a run.
type RankConfig struct {
	// Backend is the backend string (default "cpupool").
	Backend string
	// Device is where tensors go (default the CPU).
	Device tensor.Device
	// Upload and Download move tensors to and from Device (default
	// identity, for the CPU).
	Upload, Download func(*tensor.Tensor) (*tensor.Tensor, error)
	// Timeout is the op timeout of the spec groups (default 30 s).
	Timeout time.Duration
	// Seed, when non-zero on rank 0, is the suite seed; else rank 0 draws
	// one. Other ranks take rank 0's through the store.
	Seed int64
	// LabelFilter and Focus narrow the specs (Ginkgo's --label-filter and
	// --focus).
	LabelFilter string
	Focus       []string
	// JSONReport is where this rank writes its Ginkgo JSON report.
	JSONReport string
	// Progress receives one line per spec from rank 0, each starting with
	// ProgressPrefix; nil for none.
	Progress io.Writer
	// BackendOptions are passed to the dispatcher.
	BackendOptions map[string]any
	// Skip maps spec ids (the first argument of Suite.Gate) to the reason
	// the backend does not meet them; those specs are skipped.
	Skip map[string]string
	// Info lines describe the run (devices, library versions). Rank 0
	// prints them, and every rank records them in its report, as entries of
	// the BeforeSuite node.
	Info []string
}

// ProgressPrefix starts the progress lines rank 0 writes, so a launcher can
// tell them from other output.
const ProgressPrefix = "@@ "

type failT struct{ failed bool }

func (f *failT) Fail() { f.failed = true }

// RunRank runs the suite as one rank of a job started with torchrun's
// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). It reports
// whether every spec passed on this rank.
func RunRank(ctx context.Context, cfg RankConfig) (bool, error) {
	if cfg.Backend == "" {
		cfg.Backend = "cpupool"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	ident := func(t *tensor.Tensor) (*tensor.Tensor, error) { return t, nil }
	if cfg.Upload == nil {
		cfg.Upload = ident
	}
	if cfg.Download == nil {
		cfg.Download = ident
	}
	dcfg := dispatcher.Config{Backend: cfg.Backend, Timeout: cfg.Timeout, BackendOptions: cfg.BackendOptions}
	if cfg.Device.Type == tensor.CUDA {
		// Eager init on the rank's GPU, as PyTorch's device_id: the
		// communicators exist before any spec closes a stream gate.
		dev := cfg.Device
		dcfg.Device = &dev
	}
	world, err := dispatcher.InitFromEnv(ctx, dcfg)
	if err != nil {
		return false, fmt.Errorf("conformance: init: %w", err)
	}
	defer world.Close(context.Background())
	st, err := store.NewPrefixStore("conformance", world.Store())
	if err != nil {
		return false, err
	}
	s := &Suite{Backend: cfg.Backend, Device: cfg.Device, Rank: world.Rank(), Size: world.Size(), Timeout: cfg.Timeout,
		World: world, Upload: cfg.Upload, Download: cfg.Download, store: st, skips: cfg.Skip}
	if b, err := world.Backend(cfg.Device.Type); err == nil {
		s.Caps = b.Capabilities()
	} else {
		return false, fmt.Errorf("conformance: no backend for %s: %w", cfg.Device, err)
	}
	if s.Seed, err = agreeSeed(ctx, st, s.Rank, cfg.Seed); err != nil {
		return false, err
	}
	if s.PG, err = s.NewGroup(ctx, cfg.Timeout); err != nil {
		return false, fmt.Errorf("conformance: spec group: %w", err)
	}
	defer func() { s.PG.Close(context.Background()) }()

	s.declare(cfg.Progress, cfg.Info)
	definersMu.Lock()
	defs := append([]func(*Suite){}, definers...)
	definersMu.Unlock()
	for _, d := range defs {
		d(s)
	}

	gomega.RegisterFailHandler(Fail)
	sc, rc := GinkgoConfiguration()
	sc.RandomSeed = s.Seed
	sc.LabelFilter = cfg.LabelFilter
	sc.FocusStrings = cfg.Focus
	sc.Timeout = 2 * time.Hour
	rc.Succinct = true
	rc.NoColor = true
	rc.SilenceSkips = true
	rc.JSONReport = cfg.JSONReport
	t := &failT{}
	passed := RunSpecs(t, fmt.Sprintf("gocoll conformance: %s on %s, rank %d of %d", cfg.Backend, cfg.Device, s.Rank, s.Size), sc, rc)
	return passed && !t.failed, nil
}

// agreeSeed makes every rank use rank 0's seed: different seeds would order
// the specs differently and deadlock the ranks.
func agreeSeed(ctx context.Context, st store.Store, rank int, seed int64) (int64, error) {
	if rank == 0 {
		if seed == 0 {
			seed = time.Now().UnixNano()%1_000_000 + 1
		}
		if err := st.Set(ctx, "seed", []byte(strconv.FormatInt(seed, 10))); err != nil {
			return 0, fmt.Errorf("conformance: publishing the seed: %w", err)
		}
		return seed, nil
	}
	v, err := st.Get(ctx, "seed")
	if err != nil {
		return 0, fmt.Errorf("conformance: waiting for rank 0's seed: %w", err)
	}
	return strconv.ParseInt(string(v), 10, 64)
}

// declare adds the nodes that keep ranks in step around every spec and
// report progress.
func (s *Suite) declare(progress io.Writer, info []string) {
	var total, done int
	ReportBeforeSuite(func(r Report) { total = r.PreRunStats.SpecsThatWillRun })
	if len(info) > 0 {
		BeforeSuite(func() {
			for _, line := range info {
				AddReportEntry("run", line)
				if progress != nil && s.Rank == 0 {
					fmt.Fprintf(progress, "%s%s\n", ProgressPrefix, line)
				}
			}
		})
	}
	BeforeEach(func() {
		if err := s.beginSpec(); err != nil {
			Fail(err.Error())
		}
	})
	AfterEach(func() {
		if errs := s.endSpec(CurrentSpecReport().Failed()); len(errs) > 0 {
			Fail(strings.Join(errs, "; "))
		}
	})
	if progress != nil && s.Rank == 0 {
		ReportAfterEach(func(r SpecReport) {
			if r.State == types.SpecStateSkipped && r.Failure.Message == "" {
				return // filtered out by label or focus: not part of the run
			}
			done++
			state := "ok"
			switch {
			case r.State == types.SpecStateSkipped:
				state = "skip"
			case r.Failed():
				state = "FAIL"
			}
			fmt.Fprintf(progress, "%s[%d/%d] %-4s %8s  %s\n", ProgressPrefix, done, total, state, r.RunTime.Round(time.Millisecond), r.FullText())
		})
	}
}

// Main is the body of a rank process: it runs RunRank from the
// environment and exits 0 when every spec passed, 1 when one failed, 2 on
// a setup error. conftest and the test binary call it.
func Main(cfg RankConfig) {
	if cfg.Progress == nil {
		cfg.Progress = os.Stdout
	}
	if cfg.JSONReport == "" {
		cfg.JSONReport = os.Getenv(EnvReport)
	}
	ok, err := RunRank(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
	os.Exit(0)
}
