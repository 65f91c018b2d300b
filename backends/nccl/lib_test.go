package nccl

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
)

// stubLib compiles a shared library at dir/name that exports every symbol
// in syms (each returning 0) plus the C in extra, or skips without a C
// compiler.
func stubLib(t *testing.T, dir, name string, syms []string, extra string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build stub libraries", cc)
	}
	var src strings.Builder
	for _, s := range syms {
		fmt.Fprintf(&src, "int %s(void) { return 0; }\n", s)
	}
	src.WriteString(extra)
	c := filepath.Join(dir, name+".c")
	if err := os.WriteFile(c, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, name+".so")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", so, c).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, out)
	}
	return so
}

// TestLoaderChild is run by TestLoadErrors in a child process, since Load
// binds the process's one libnccl once.
func TestLoaderChild(t *testing.T) {
	if os.Getenv("GOCOLL_NCCL_LOADER_CHILD") != "1" {
		t.Skip("run by TestLoadErrors")
	}
	err := Load()
	fmt.Printf("load: %v\nErrUnavailable: %v\npath: %s\nalltoall: %v\n", err, errors.Is(err, backend.ErrUnavailable), LibraryPath(), hasSymbol("ncclAlltoAll"))
}

// TestLoadErrors loads stub libcuda and libnccl builds: a missing library,
// one that lacks a required entry point, one too old, and one that loads.
// The errors must name the library, the path or symbol at fault and
// GOCOLL_NCCL_LIBRARY, as DESIGN.md asks.
func TestLoadErrors(t *testing.T) {
	if os.Getenv("GOCOLL_NCCL_LOADER_CHILD") == "1" {
		t.Skip("child")
	}
	if cuda.Load() == nil {
		t.Skip("a real libcuda is loaded here; the stubs would not be used")
	}
	dir := t.TempDir()
	src, err := os.ReadFile("../../cuda/dl.c")
	if err != nil {
		t.Fatal(err)
	}
	var cu []string
	for _, m := range regexp.MustCompile(`X\(\w+, "(\w+)"`).FindAllStringSubmatch(string(src), -1) {
		cu = append(cu, m[1])
	}
	if len(cu) < 20 {
		t.Fatalf("found %d CUDA entry points in cuda/dl.c", len(cu))
	}
	libcuda := stubLib(t, dir, "libcuda-stub", cu, "")
	var required, all []string
	for _, s := range spec().Symbols {
		if s.Name == "ncclGetVersion" {
			continue
		}
		all = append(all, s.Name)
		if !s.Optional {
			required = append(required, s.Name)
		}
	}
	version := func(v int) string { return fmt.Sprintf("int ncclGetVersion(int *v) { *v = %d; return 0; }\n", v) }
	noGroupEnd := make([]string, 0, len(required))
	for _, s := range required {
		if s != "ncclGroupEnd" {
			noGroupEnd = append(noGroupEnd, s)
		}
	}
	cases := []struct {
		name, lib string
		want      []string
	}{
		{"missing", filepath.Join(dir, "libnccl-none.so"),
			[]string{"cannot load the NCCL library libnccl.so.2 (set GOCOLL_NCCL_LIBRARY to its path)", "libnccl-none.so"}},
		{"no ncclGroupEnd", stubLib(t, dir, "libnccl-nogroupend", noGroupEnd, version(22803)),
			[]string{"cannot load the NCCL library libnccl.so.2 (set GOCOLL_NCCL_LIBRARY to its path)", "libnccl-nogroupend.so: symbol ncclGroupEnd not found"}},
		{"too old", stubLib(t, dir, "libnccl-old", required, version(21703)),
			[]string{"libnccl-old.so is NCCL 21703; gocoll needs 2.18 or newer (set GOCOLL_NCCL_LIBRARY)"}},
		{"required only", stubLib(t, dir, "libnccl-required", required, version(22803)),
			[]string{"load: <nil>", "libnccl-required.so", "alltoall: false"}},
		{"everything", stubLib(t, dir, "libnccl-all", all, version(22803)),
			[]string{"load: <nil>", "alltoall: true"}},
	}
	for _, tc := range cases {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestLoaderChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "GOCOLL_NCCL_LOADER_CHILD=1", cuda.LibraryEnv+"="+libcuda, LibraryEnv+"="+tc.lib)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: child: %v\n%s", tc.name, err, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.name, w, out)
			}
		}
		if !strings.Contains(string(out), "load: <nil>") && !strings.Contains(string(out), "ErrUnavailable: true") {
			t.Errorf("%s: the error does not wrap ErrUnavailable:\n%s", tc.name, out)
		}
	}
}
