// Command gen writes gocoll's generated code from spec/ops.yaml: the Backend
// interface, option structs, the Op table and the Unimplemented type in
// package backend; one ProcessGroup method per op in package dispatcher;
// internal/stage's delegation of the ops to the host backend; and
// docs/ops.md. Its output depends only on the spec, so running it twice
// gives the same bytes.
//
// Usage (from //go:generate in package backend):
//
//	go run ../gen -spec ../spec/ops.yaml -root ..
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
)

const (
	pkgBackend = "github.com/gocoll/gocoll/backend"
	pkgTensor  = "github.com/gocoll/gocoll/tensor"
)

func main() {
	specPath := flag.String("spec", "spec/ops.yaml", "the op spec")
	root := flag.String("root", ".", "the module root, where backend/, dispatcher/ and docs/ are")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("gen: ")
	if err := run(*specPath, *root); err != nil {
		log.Fatal(err)
	}
}

func run(specPath, root string) error {
	s, err := LoadSpec(specPath)
	if err != nil {
		return err
	}
	files := map[string]func(*Spec) ([]byte, error){
		"backend/zz_generated_ops.go":        genBackendOps,
		"backend/zz_generated_backend.go":    genBackendInterface,
		"dispatcher/zz_generated_ops.go":     genDispatcher,
		"internal/stage/zz_generated_ops.go": genStage,
		"docs/ops.md":                        genDocs,
	}
	for rel, fn := range files {
		out, err := fn(s)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if err := writeIfChanged(filepath.Join(root, rel), out); err != nil {
			return err
		}
	}
	return nil
}

// writeIfChanged leaves the file, and its mtime, alone when the content is
// already right, so that a no-op generate does not disturb build caches.
func writeIfChanged(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}
