package python

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestEmbedsEveryHelper: every .py file of the directory is in the binary,
// byte for byte, and Write puts it where an interpreter can run it.
func TestEmbedsEveryHelper(t *testing.T) {
	onDisk, err := filepath.Glob("*.py")
	if err != nil {
		t.Fatal(err)
	}
	if len(onDisk) == 0 || !slices.Equal(onDisk, Names()) {
		t.Fatalf("embedded %v, on disk %v", Names(), onDisk)
	}
	dir := t.TempDir()
	for _, name := range onDisk {
		want, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		path, err := Write(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: the written copy differs from the source", name)
		}
	}
	if _, err := Source("missing.py"); err == nil {
		t.Error("Source of a missing helper succeeded")
	}
}
