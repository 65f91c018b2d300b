// Package python holds gocoll's Python helpers, the PyTorch side of its
// comparisons and interop checks, in one place, and embeds them, so that a
// Go program finds them wherever it runs: not through a path relative to
// the working directory or to the source tree.
//
//   - bench_torch.py: torch.distributed's side of `conftest bench`, every
//     op: gloo on the CPU (the gloo peer, torch 1.13), NCCL on GPUs (the
//     torch peer, torch 2.11).
//   - hostcost_torch.py: torch's host cost per all_reduce call (nccl or gloo,
//     world 1), the peer of `conftest bench hostcost`.
//   - store_torch211_check.py: torch 2.x against a gocoll-store server
//     (run by scripts/store-gpu-run.sh).
//
// They need a python with torch (Debian: python3-torch; .ci/store-deps.sh).
package python

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

//go:embed *.py
var files embed.FS

// Names lists the helpers.
func Names() []string {
	ents, _ := fs.ReadDir(files, ".")
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// Source returns the text of the helper name ("bench_torch.py").
func Source(name string) ([]byte, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("python: no helper %q (have %v): %w", name, Names(), err)
	}
	return b, nil
}

// Write writes the helper name into dir, for an interpreter to run, and
// returns its path.
func Write(dir, name string) (string, error) {
	b, err := Source(name)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", fmt.Errorf("python: writing %s: %w", name, err)
	}
	return path, nil
}
