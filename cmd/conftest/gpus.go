package main

// conftest gpus, GPU discovery for `conftest --backend nccl`, and the
// machine section of reports, all through NVML (internal/gpuinfo).

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/internal/gpuinfo"
	"github.com/gocoll/gocoll/tensor"
)

// ncclVersion is the loadable NCCL's version, or "" when there is none.
func ncclVersion() string {
	v, err := nccl.Version()
	if err != nil {
		return ""
	}
	return nccl.VersionString(v)
}

// printMachine writes the machine section of the GPUs of n local ranks
// (every visible GPU when n <= 0), or the one line saying NVML is
// unavailable. The bench reports call it; so may any report.
func printMachine(w io.Writer, n int) {
	for _, l := range gpuinfo.SectionLines(n, ncclVersion()) {
		fmt.Fprintln(w, l)
	}
}

// gpuRanks decides the number of ranks of a run whose backend string
// routes CUDA tensors to nccl: with --nproc left out, one per visible GPU
// (CUDA_VISIBLE_DEVICES, found through NVML); with --nproc given, it
// refuses more ranks than visible GPUs before any rank starts. Other
// backend strings keep nproc.
func gpuRanks(w io.Writer, backendString string, nproc int, set bool) (int, error) {
	env, envSet := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	return discovery{list: nvmlGPUs, cudaCount: cuda.DeviceCount, env: env, envSet: envSet}.ranks(w, backendString, nproc, set)
}

// discovery is what gpuRanks looks at, so that its tests can fake it.
type discovery struct {
	list      func() ([]gpuinfo.GPU, error) // the machine's GPUs, NVML order
	cudaCount func() (int, error)           // CUDA's device count, when NVML is unavailable
	env       string                        // CUDA_VISIBLE_DEVICES
	envSet    bool
}

func (d discovery) ranks(w io.Writer, backendString string, nproc int, set bool) (int, error) {
	devmap, err := backend.ParseBackendString(backendString)
	if err != nil || devmap[tensor.CUDA] != nccl.Name {
		return nproc, nil // the launcher's ranks report a bad string themselves
	}
	_, servesCPU := devmap[tensor.CPU]
	env, envSet := d.env, d.envSet
	var vis []gpuinfo.GPU
	var note string
	all, err := d.list()
	if err == nil {
		vis, note, err = gpuinfo.Visible(all, env, envSet)
	}
	if note != "" {
		fmt.Fprintln(w, "conftest:", note)
	}
	if errors.Is(err, gpuinfo.ErrUnavailable) {
		// NVML is missing: count through CUDA, which applies
		// CUDA_VISIBLE_DEVICES itself.
		n, cerr := d.cudaCount()
		if cerr != nil {
			why := cerr.Error()
			if errors.Is(cerr, cuda.ErrUnavailable) {
				why = "no CUDA driver either (libcuda.so.1 does not load; GOCOLL_CUDA_LIBRARY names its path)"
			}
			if set || servesCPU {
				fmt.Fprintf(w, "conftest: %v; %s: %d ranks\n", err, why, nproc)
				return nproc, nil
			}
			return 0, fmt.Errorf("no GPU found for --backend %s: %v; %s", backendString, err, why)
		}
		fmt.Fprintf(w, "conftest: %v; CUDA sees %d GPUs\n", err, n)
		vis = make([]gpuinfo.GPU, n)
		for i := range vis {
			vis[i] = gpuinfo.GPU{Index: i, UUID: "(index " + fmt.Sprint(i) + ")"}
		}
	} else if err != nil {
		return 0, err
	}
	if !set {
		if len(vis) == 0 && servesCPU {
			fmt.Fprintf(w, "conftest: no visible GPU; %d ranks on CPU tensors\n", nproc)
			return nproc, nil
		}
		if len(vis) == 0 {
			return 0, gpuinfo.CheckRanks(1, nil, env, envSet)
		}
		names := make([]string, len(vis))
		for i, g := range vis {
			names[i] = fmt.Sprintf("GPU%d %s", g.Index, g.UUID)
		}
		fmt.Fprintf(w, "conftest: one rank per visible GPU: %d (%s)\n", len(vis), strings.Join(names, ", "))
		return len(vis), nil
	}
	return nproc, gpuinfo.CheckRanks(nproc, vis, env, envSet)
}

// nvmlGPUs lists the machine's GPUs through NVML.
func nvmlGPUs() ([]gpuinfo.GPU, error) {
	lib, err := gpuinfo.Open(gpuinfo.Options{})
	if err != nil {
		return nil, err
	}
	defer lib.Close()
	return lib.GPUs()
}

// gpusReport is `conftest gpus --json`.
type gpusReport struct {
	Machine gpuinfo.Machine  `json:"machine"`
	Health  []gpuinfo.Health `json:"health"`
	XIDs    []gpuinfo.XID    `json:"xids"`
	// Listened is how long the XID event set was listened to.
	Listened string   `json:"xids_listened"`
	Notes    []string `json:"notes,omitempty"`
}

// gpus is `conftest gpus`: the machine section of the visible GPUs, each
// one's health (ECC counts, retired or remapped pages pending, throttle
// reasons), and the XID events NVML delivers while it listens.
func gpus(args []string) error {
	fs := flag.NewFlagSet("conftest gpus", flag.ExitOnError)
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	listen := fs.Duration("listen", time.Second, "how long to listen for XID events (NVML delivers only those raised after registration)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lib, err := gpuinfo.Open(gpuinfo.Options{})
	if err != nil {
		return err // "NVML unavailable: ..."
	}
	defer lib.Close()
	mon, err := lib.NewMonitor(gpuinfo.MonitorOptions{})
	if err != nil {
		return err
	}
	start := time.Now()
	m, note, err := gpuinfo.VisibleMachine(0)
	if err != nil {
		return err
	}
	m.NCCL = ncclVersion()
	rep := gpusReport{Machine: m, Notes: mon.Notes()}
	if note != "" {
		rep.Notes = append(rep.Notes, note)
	}
	if m.NCCL == "" {
		_, nerr := nccl.Version()
		rep.Notes = append(rep.Notes, "NCCL: "+nerr.Error())
	}
	for _, g := range m.GPUs {
		h, err := lib.Health(g.Index)
		if err != nil {
			rep.Notes = append(rep.Notes, err.Error())
		}
		rep.Health = append(rep.Health, h)
	}
	if left := *listen - time.Since(start); left > 0 {
		time.Sleep(left)
	}
	rep.Listened = time.Since(start).Round(time.Millisecond).String()
	rep.XIDs = mon.XIDs("", start)
	if e := mon.ListenError(); e != "" {
		rep.Notes = append(rep.Notes, e)
	}
	mon.Close()
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	for _, l := range m.Lines() {
		fmt.Println(l)
	}
	for _, h := range rep.Health {
		fmt.Println(healthLine(h))
	}
	if len(rep.XIDs) == 0 {
		fmt.Printf("XID events: none in %s of listening (NVML reports only events raised after registration; older ones are in the kernel log)\n", rep.Listened)
	}
	for _, x := range rep.XIDs {
		fmt.Println("XID event:", x)
	}
	for _, n := range rep.Notes {
		fmt.Println("note:", n)
	}
	return nil
}

// healthLine renders a GPU's health on one line.
func healthLine(h gpuinfo.Health) string { return "health: " + h.String() }
