package main

import (
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gocoll/gocoll/backends/ucc"
)

// benchC holds the C peers of conftest bench, compiled at run time where
// their compilers are (gcc for the raw libucc loop, mpicc for Open MPI):
// the directory has no Go files, so go build leaves them alone.
//
//go:embed benchc/ucc-bench-raw.c benchc/bench-mpi.c
var benchC embed.FS

// benchSeries is one column group of the table: a name and how to run it
// at n ranks (its result lines; see benchLinePrefix).
type benchSeries struct {
	name string
	// also names the other series that its processes print (raw NCCL
	// runs inside our rank processes).
	also []string
	// ops are the ops it runs, where not all of them (the raw libucc loop:
	// allreduce).
	ops []string
	// launch runs it at n ranks over the sizes sz (comma-separated).
	launch func(n int, sz string, pr *progress) ([]benchSample, error)
}

// rawName is the raw libucc loop's series.
const rawName = "raw-ucc"

// peerFlags are conftest bench's flags for the C peers.
type peerFlags struct {
	wrap        string
	raw         bool
	rawThread   string
	uccInclude  string
	cpupool     bool
	mpi         bool
	mpirun      string
	rawBin      string // --raw-bin: the raw loop, built beforehand
	mpiPrebuilt string // --mpi-bin: the MPI program, built beforehand
	mpiBin      string // compiled by series (or mpiPrebuilt)
	depth       int    // --depth: the raw loop's window when set
}

// series compiles what the C peers need into dir and returns the raw
// libucc loop's series (for --backend ucc with --raw); the MPI program is
// compiled here too, so a missing compiler fails before any run.
func (pf *peerFlags) series(dir, be, iters string, wrap, pin []string) ([]benchSeries, error) {
	var out []benchSeries
	if be == "ucc" {
		// The backend sets UCC's pool size for itself when it is unset
		// (ucc.MpoolElemSizeEnv says why); set here, the raw loop gets the
		// same, so that both sides run with the same UCC settings.
		if _, set := os.LookupEnv(ucc.MpoolElemSizeEnv); !set {
			if err := os.Setenv(ucc.MpoolElemSizeEnv, ucc.DefaultMpoolElemSize); err != nil {
				return nil, err
			}
		}
		fmt.Printf("UCC settings of every ucc series: %s=%s\n", ucc.MpoolElemSizeEnv, os.Getenv(ucc.MpoolElemSizeEnv))
	}
	if be == "ucc" && pf.raw {
		if pf.rawThread != "single" && pf.rawThread != "multiple" {
			return nil, fmt.Errorf("bad --raw-thread %q (single or multiple)", pf.rawThread)
		}
		bin, err := pf.rawLoop(dir)
		if err != nil {
			return nil, err
		}
		thread := pf.rawThread
		out = append(out, benchSeries{name: rawName, launch: func(n int, sizes string, pr *progress) ([]benchSample, error) {
			// bench-rank queues its ops over hostWindow buffers of the
			// launch's largest size at once; the raw loop queues as many,
			// so that both run the same pattern.
			maxBytes := 0
			for _, f := range strings.Split(sizes, ",") {
				b, err := strconv.Atoi(f)
				if err != nil {
					return nil, fmt.Errorf("raw libucc loop: bad size %q", f)
				}
				maxBytes = max(maxBytes, b)
			}
			window := hostWindow(maxBytes)
			if pf.depth > 0 {
				window = pf.depth // bench-rank's --depth, passed to ours
			}
			return launchBench(n, func(port int) []string {
				shm := fmt.Sprintf("/dev/shm/gocoll-ucc-bench-raw-%d-%d", os.Getpid(), port)
				return append(append([]string{}, wrap...), bin, "--sizes", sizes, "--iters", iters, "--thread", thread, "--shm", shm,
					"--window", strconv.Itoa(window))
			}, true, rawName, pin, pr)
		}})
	}
	if pf.mpi {
		bin := pf.mpiPrebuilt
		if bin == "" {
			var err error
			if bin, err = buildC(dir, "bench-mpi.c", "mpicc", "-O2", "-Wall", "-Wextra", "-Werror"); err != nil {
				return nil, err
			}
		} else if err := isExecutable(bin, "--mpi-bin"); err != nil {
			return nil, err
		}
		pf.mpiBin = bin
	}
	return out, nil
}

// rawLoop returns the raw libucc loop's binary: --raw-bin, else
// benchc/ucc-bench-raw.c compiled into dir with gcc against the ucc
// headers (uccInclude).
func (pf *peerFlags) rawLoop(dir string) (string, error) {
	if pf.rawBin != "" {
		return pf.rawBin, isExecutable(pf.rawBin, "--raw-bin")
	}
	inc, err := uccInclude(pf.uccInclude)
	if err != nil {
		return "", err
	}
	// Only ucc/ from that directory: a root's own libc headers must not
	// shadow this machine's.
	incDir := filepath.Join(dir, "include")
	if err := os.MkdirAll(incDir, 0o755); err != nil {
		return "", err
	}
	if err := os.Symlink(filepath.Join(inc, "ucc"), filepath.Join(incDir, "ucc")); err != nil {
		return "", err
	}
	return buildC(dir, "ucc-bench-raw.c", "gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I"+incDir, "-ldl")
}

// isExecutable checks a prebuilt peer named by flag.
func isExecutable(path, flag string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s: %s is not an executable file", flag, path)
	}
	return nil
}

// mpiSeries runs the compiled MPI program under mpirun, one launcher
// process for all ranks, with bench-rank's flags (common).
func (pf *peerFlags) mpiSeries(common func(sz string) []string) benchSeries {
	return benchSeries{name: mpiName, launch: func(n int, sz string, pr *progress) ([]benchSample, error) {
		return launchBench(1, func(int) []string {
			return append(append(strings.Fields(pf.mpirun), "-np", strconv.Itoa(n), pf.mpiBin), common(sz)...)
		}, false, mpiName, nil, pr)
	}}
}

// uccInclude finds the directory holding ucc/api/ucc.h: the flag, else
// GOCOLL_UCC_INCLUDE (scripts/ucc-gpu-env.sh), else the sid root's
// (scripts/ucc-common.sh's rule for where the root lives).
func uccInclude(flagDir string) (string, error) {
	dir := flagDir
	if dir == "" {
		dir = os.Getenv("GOCOLL_UCC_INCLUDE")
	}
	if dir == "" {
		root := os.Getenv("GOCOLL_UCC_ROOT")
		if root == "" {
			cache := os.Getenv("XDG_CACHE_HOME")
			if cache == "" {
				cache = filepath.Join(os.Getenv("HOME"), ".cache")
			}
			root = filepath.Join(cache, "gocoll", "ucc-sid")
		}
		dir = filepath.Join(root, "usr", "include")
	}
	if _, err := os.Stat(filepath.Join(dir, "ucc", "api", "ucc.h")); err != nil {
		return "", fmt.Errorf("the raw libucc loop needs ucc/api/ucc.h (build the sid root with scripts/ucc-root.sh, or pass --ucc-include, or --raw=false): %w", err)
	}
	return dir, nil
}

// buildC writes the embedded benchc/name into dir and compiles it with cc
// (flags after the source, so that -l flags follow it).
func buildC(dir, name, cc string, flags ...string) (string, error) {
	src, err := benchC.ReadFile("benchc/" + name)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, src, 0o644); err != nil {
		return "", err
	}
	bin := strings.TrimSuffix(path, ".c")
	out, err := exec.Command(cc, append([]string{"-o", bin, path}, flags...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("compiling %s with %s: %w: %s", name, cc, err, out)
	}
	return bin, nil
}
