// Command conftest runs gocoll's conformance suite and benchmarks over N
// rank processes on this machine, started as torchrun starts torch ranks
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; rank 0 hosts the TCPStore).
//
//	conftest [--backend cpupool] [--nproc 4] [--report out/conformance] [--label-filter 'ops && !stress'] [--focus allreduce]
//	conftest --backend nccl --nproc 2  one GPU per rank (LOCAL_RANK), CUDA tensors; also "cpu:cpupool,cuda:nccl";
//	                                   without --nproc, one rank per visible GPU (NVML, CUDA_VISIBLE_DEVICES)
//	conftest ops                       the op × backend table
//	conftest gpus [--json]             the GPUs, their topology and health (NVML)
//	conftest bench --backend cpupool --op all -b 8 -e 64M -f 4 --nproc 2 -c 1   nccl-tests' tables beside the peers
//	conftest bench plot -o out.svg FILE...   busbw against size from bench --json files
//	conftest bench overlap [--killer all]    GEMM / async allreduce overlap and its killers (one GPU per rank)
//	conftest bench hostcost [--backend nccl] host cost per op call beside NCCL's own and torch's
//	conftest fr analyze [--job ID] DIR      the first collective on which the ranks' flight-recorder dumps disagree
//	conftest help                           the commands
//
// The exit status is non-zero when a spec fails on any rank.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	_ "github.com/gocoll/gocoll/backends/nccl/ncclconform" // registers "nccl" and its specs, setup and child scenarios
	_ "github.com/gocoll/gocoll/backends/ucc/uccconform"   // registers "ucc" and its setup
	"github.com/gocoll/gocoll/conformance"
	_ "github.com/gocoll/gocoll/internal/stage/stageconform" // the staged CUDA specs of cpupool and ucc
	"github.com/onsi/ginkgo/v2/types"
)

func main() {
	conformance.RunChild() // a failure spec's child process: runs and exits
	args := os.Args[1:]
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var err error
	code := 0
	switch cmd {
	case "run":
		code, err = run(args)
	case "rank":
		err = rank(args) // a rank process of run; exits itself
	case "ops":
		err = ops(args)
	case "bench":
		if mode := benchMode(args); mode != nil { // overlap.go: bench overlap, bench hostcost
			err = mode(args[1:])
		} else {
			err = bench(args)
		}
	case "bench-rank":
		err = benchRank(args)
	case "fr":
		code, err = fr(args) // fr.go: conftest fr analyze DIR
	case "gpus":
		err = gpus(args) // gpus.go: the GPUs, their topology and health, through NVML
	case "help":
		usage(os.Stdout)
	default:
		err = fmt.Errorf("unknown command %q (conftest help lists them)", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "conftest:", err)
		if code == 0 {
			code = 2
		}
	}
	os.Exit(code)
}

// usage lists every command (TestUsageListsEveryCommand checks it against
// main's switch).
func usage(w io.Writer) {
	fmt.Fprint(w, `usage:
  conftest [run] [flags]    run the conformance suite over --nproc rank processes
  conftest ops              print the op × backend table
  conftest gpus [--json]    the GPUs (NVML): topology, driver, NCCL, health, XID events
  conftest bench [flags]    nccl-tests' tables for a backend and op, peers beside (gloo, Open MPI; raw NCCL, torch)
  conftest bench plot -o out.svg FILE...   busbw against size from bench --json files
  conftest bench overlap    GEMM + async allreduce overlap, with its killers (nccl, GPUs)
  conftest bench hostcost   host cost per allreduce call, beside NCCL's own call and torch
  conftest fr analyze DIR   read the flight-recorder dumps in DIR (one job's: --job ID) and print the first collective on which the ranks disagree
  conftest help             this list
run "conftest run -h", "conftest bench -h" or "conftest fr analyze -h" for the flags
`)
}

// suiteFlags are the flags that the launcher passes on to every rank.
type suiteFlags struct {
	backend, labels, focus string
	seed                   int64
	timeout                time.Duration
	threads                int
}

func (f *suiteFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.backend, "backend", "cpupool", "backend string (a name, or device:backend pairs)")
	fs.StringVar(&f.labels, "label-filter", "", "Ginkgo label filter, e.g. 'ops && !stress' (labels: ops dtypes errors async lifetime timeout p2p stress stream coalescing)")
	fs.StringVar(&f.focus, "focus", "", "run only specs whose text matches this regular expression")
	fs.Int64Var(&f.seed, "seed", 0, "suite random seed (default: rank 0 draws one)")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "op timeout of the spec groups")
	fs.IntVar(&f.threads, "threads", 8, "cpupool worker threads (the stress specs want 8)")
}

func (f *suiteFlags) args() []string {
	return []string{"--backend", f.backend, "--label-filter", f.labels, "--focus", f.focus,
		"--seed", fmt.Sprint(f.seed), "--timeout", f.timeout.String(), "--threads", fmt.Sprint(f.threads)}
}

func run(args []string) (int, error) {
	fs := flag.NewFlagSet("conftest", flag.ExitOnError)
	var sf suiteFlags
	sf.register(fs)
	nproc := fs.Int("nproc", 2, "number of rank processes (with --backend nccl: one per visible GPU when left out)")
	report := fs.String("report", "", "write the merged reports to PATH.xml (JUnit) and PATH.json")
	total := fs.Duration("run-timeout", 30*time.Minute, "bound on the whole run")
	fs.Usage = func() {
		usage(fs.Output())
		fmt.Fprintln(fs.Output(), "\nflags of conftest run:")
		fs.PrintDefaults()
	}
	if wantsHelp(args) {
		fs.SetOutput(os.Stdout) // asked for: not an error
	}
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	if err := sf.check(*nproc, fs.Args()); err != nil {
		return 2, err
	}
	nprocSet := false
	fs.Visit(func(f *flag.Flag) { nprocSet = nprocSet || f.Name == "nproc" })
	n, err := gpuRanks(os.Stdout, sf.backend, *nproc, nprocSet) // gpus.go
	if err != nil {
		return 2, err
	}
	*nproc = n
	exe, err := os.Executable()
	if err != nil {
		return 2, err
	}
	fmt.Printf("conftest: %s, %d ranks\n", sf.backend, *nproc)
	res, err := conformance.Launch(context.Background(), conformance.LaunchConfig{
		Command: append([]string{exe, "rank"}, sf.args()...),
		NProc:   *nproc,
		Report:  *report,
		Timeout: *total,
	})
	if err != nil {
		return 2, err
	}
	if !res.OK() {
		return 1, nil
	}
	return 0, nil
}

// check rejects, before any rank starts, what every rank would fail on: an
// unknown backend, a label filter that does not parse, a rank count below
// 1, stray arguments.
func (f *suiteFlags) check(nproc int, rest []string) error {
	if len(rest) > 0 {
		return fmt.Errorf("unexpected arguments %q (conftest help lists the commands)", rest)
	}
	if nproc < 1 {
		return fmt.Errorf("--nproc %d: want at least 1 rank", nproc)
	}
	if _, err := backend.ParseBackendString(f.backend); err != nil {
		return fmt.Errorf("--backend %q: %w", f.backend, err)
	}
	if f.labels != "" {
		if _, err := types.ParseLabelFilter(f.labels); err != nil {
			// Ginkgo's errors are coloured, and this goes to a log as often
			// as to a terminal: the text alone, "Heading: what".
			msg := ansi.ReplaceAllString(err.Error(), "")
			var ge types.GinkgoError
			if errors.As(err, &ge) {
				lines := strings.Split(strings.TrimSpace(ginkgoMarkup.ReplaceAllString(ge.Message, "")), "\n")
				msg = ge.Heading + ": " + strings.TrimSpace(lines[len(lines)-1])
			}
			return fmt.Errorf("--label-filter %q: %s", f.labels, msg)
		}
	}
	if f.focus != "" {
		if _, err := regexp.Compile(f.focus); err != nil {
			return fmt.Errorf("--focus %q: %w", f.focus, err)
		}
	}
	return nil
}

// ansi matches colour escape sequences; ginkgoMarkup, the colour markup
// of Ginkgo's messages ({{red}}, {{/}}).
var (
	ansi         = regexp.MustCompile("\x1b\\[[0-9;]*m")
	ginkgoMarkup = regexp.MustCompile(`\{\{[a-z/-]*\}\}`)
)

// wantsHelp reports whether args ask for the flags' help.
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "-h", "-help", "--help", "--h":
			return true
		case "--":
			return false
		}
	}
	return false
}

func rank(args []string) error {
	fs := flag.NewFlagSet("conftest rank", flag.ExitOnError)
	var sf suiteFlags
	sf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := conformance.RankConfig{
		Backend:        sf.backend,
		Seed:           sf.seed,
		LabelFilter:    sf.labels,
		Timeout:        sf.timeout,
		BackendOptions: map[string]any{cpupool.Name: &cpupool.Options{Threads: sf.threads}},
	}
	if sf.focus != "" {
		cfg.Focus = []string{sf.focus}
	}
	// One GPU per rank: LOCAL_RANK picks the device when the backend
	// string routes CUDA tensors ("nccl", "cpu:cpupool,cuda:nccl"); the
	// backend's extension (ncclconform) sets its options.
	local, err := strconv.Atoi(cmp.Or(os.Getenv("LOCAL_RANK"), "0"))
	if err != nil {
		return fmt.Errorf("LOCAL_RANK: %w", err)
	}
	if err := conformance.Setup(&cfg, local); err != nil {
		fmt.Fprintln(os.Stderr, "conftest:", err)
		os.Exit(2) // a setup error: Launch stops the other ranks
	}
	conformance.Main(cfg)
	return errors.New("unreachable")
}
