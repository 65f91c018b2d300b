package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// moduleRoot is the module this test runs in: gen/ is one level down.
const moduleRoot = ".."

// copyModule copies what the generated packages need (not backends/, which
// may hold cgo code that is slow to build) into a temp dir.
func copyModule(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	for _, p := range []string{"go.mod", "go.sum", "spec", "gen", "backend", "dispatcher", "tensor", "cuda", "store", "docs", "internal", "reduceop"} {
		src := filepath.Join(moduleRoot, p)
		err := filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(moduleRoot, path)
			out := filepath.Join(dst, rel)
			if info.IsDir() {
				if info.Name() == "testdata" {
					return filepath.SkipDir
				}
				return os.MkdirAll(out, 0o755)
			}
			if strings.HasSuffix(path, "_test.go") {
				return nil
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(out, data, 0o644)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// TestGeneratedFilesAreCurrent regenerates into a copy and compares with
// the committed files, so a stale generate fails here as well as in CI.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	dir := t.TempDir()
	for _, sub := range []string{"backend", "dispatcher", "docs", "internal/stage"} {
		os.MkdirAll(filepath.Join(dir, sub), 0o755)
	}
	if err := run(filepath.Join(moduleRoot, "spec/ops.yaml"), dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"backend/zz_generated_ops.go", "backend/zz_generated_backend.go", "dispatcher/zz_generated_ops.go", "internal/stage/zz_generated_ops.go", "docs/ops.md"} {
		got, _ := os.ReadFile(filepath.Join(dir, f))
		want, err := os.ReadFile(filepath.Join(moduleRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go generate ./...", f)
		}
	}
	// Deterministic: a second run gives the same bytes.
	first, _ := os.ReadFile(filepath.Join(dir, "dispatcher/zz_generated_ops.go"))
	os.Remove(filepath.Join(dir, "dispatcher/zz_generated_ops.go"))
	if err := run(filepath.Join(moduleRoot, "spec/ops.yaml"), dir); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(filepath.Join(dir, "dispatcher/zz_generated_ops.go"))
	if !bytes.Equal(first, second) {
		t.Error("two runs of the generator differ")
	}
}

const newOp = `
  - name: allreduce_sparse
    go_name: AllreduceSparse
    doc: AllreduceSparse is an op added by the generator test.
    kind: collective
    profiling: allreduce_sparse
    flags: [reduces]
    args:
      - {name: tensors, type: tensors, role: inout, doc: the tensors}
    options:
      - {name: ReduceOp, type: reduce_op, default: SUM, doc: the reduction}
      - {name: Timeout, type: duration, default: 0, doc: the timeout}
    rules:
      - {check: nonempty, args: [tensors], msg: "requires non-empty tensor list"}
`

const newOpTest = `package addop

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// old is a backend written before the op existed: it embeds Unimplemented
// and so still satisfies backend.Backend.
type old struct{ backend.Unimplemented }

func (old) Name() string                          { return "old" }
func (old) Capabilities() backend.Capabilities    { return backend.Capabilities{} }
func (old) Rank() int                             { return 0 }
func (old) Size() int                             { return 1 }
func (old) Close(context.Context) error           { return nil }
func (old) Abort(context.Context, error) error    { return nil }

var _ backend.Backend = old{}

func TestNewOp(t *testing.T) {
	backend.Register(backend.Driver{Name: "old", Devices: []tensor.DeviceType{tensor.CPU},
		New: func(context.Context, backend.Config) (backend.Backend, error) { return old{}, nil }})
	pg, err := dispatcher.Init(context.Background(), dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "old"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.AllreduceSparse(context.Background(), nil, backend.AllreduceSparseOptions{}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Fatalf("validation of the new op: %v", err)
	}
	_, err = pg.AllreduceSparse(context.Background(), []*tensor.Tensor{tensor.New(tensor.Float32, 1)}, backend.AllreduceSparseOptions{})
	if !errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), "allreduce_sparse") {
		t.Fatalf("new op on an old backend: %v", err)
	}
	if op, ok := backend.LookupOp("allreduce_sparse"); !ok || op.Info().Profiling != "allreduce_sparse" {
		t.Fatal("the op table lacks the new op")
	}
}
`

// TestAddAnOp walks the add-an-op path of the README: append an op to the
// spec, run go generate, and build; a backend that predates the op keeps
// compiling and answers ErrUnsupported.
func TestAddAnOp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a copy of the module")
	}
	dir := copyModule(t)
	specPath := filepath.Join(dir, "spec/ops.yaml")
	spec, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(specPath, append(spec, newOp...), 0o644); err != nil {
		t.Fatal(err)
	}
	goCmd(t, dir, "generate", "./backend/...")
	docs, _ := os.ReadFile(filepath.Join(dir, "docs/ops.md"))
	if !strings.Contains(string(docs), "| allreduce_sparse | `AllreduceSparse` |") {
		t.Fatal("docs/ops.md lacks the new op")
	}
	os.MkdirAll(filepath.Join(dir, "addop"), 0o755)
	if err := os.WriteFile(filepath.Join(dir, "addop/addop_test.go"), []byte(newOpTest), 0o644); err != nil {
		t.Fatal(err)
	}
	stage, _ := os.ReadFile(filepath.Join(dir, "internal/stage/zz_generated_ops.go"))
	if !strings.Contains(string(stage), "func (b *Backend) AllreduceSparse(") {
		t.Fatal("internal/stage has no staged delegation of the new op")
	}
	// internal/stage builds only with a method for every op of the Backend
	// interface: the generated one for the new op.
	goCmd(t, dir, "vet", "./backend/...", "./dispatcher/...", "./internal/stage", "./addop/...")
	goCmd(t, dir, "test", "./addop/")
}

func TestSpecErrors(t *testing.T) {
	base := "ops:\n  - name: x\n    doc: X does.\n    kind: collective\n    profiling: x\n"
	cases := map[string]string{
		base + "    kind2: 1\n": "field kind2 not found",
		strings.Replace(base, "kind: collective", "kind: weird", 1):                                                            `kind "weird"`,
		strings.Replace(base, "X does.", "Does.", 1):                                                                           `doc must start with "X "`,
		base + "    options:\n      - {name: Root, type: int, default: 1, doc: r}\n":                                           `default "1" must be the zero value "0"`,
		base + "    rules:\n      - {check: nope, args: [], msg: m}\n":                                                         `unknown check`,
		base + "    args:\n      - {name: t, type: tensors, role: in}\n    rules:\n      - {check: root, args: [t], msg: m}\n": `"t" is not an option`,
		base + "  - name: x\n    doc: X does.\n    kind: collective\n    profiling: x\n":                                       "declared twice",
		base + "    stage: hand\n": `stage "hand" is neither empty nor manual`,
	}
	for text, want := range cases {
		p := filepath.Join(t.TempDir(), "ops.yaml")
		os.WriteFile(p, []byte(text), 0o644)
		_, err := LoadSpec(p)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("spec\n%s\ngave %v, want %q", text, err, want)
		}
	}
}
