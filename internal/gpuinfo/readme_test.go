package gpuinfo

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEListsVariables: the package's variables are in the README's
// configuration table.
func TestREADMEListsVariables(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{EnvNVML, EnvLibrary} {
		if !strings.Contains(string(readme), "| `"+n+"` |") {
			t.Errorf("README.md does not list `%s`", n)
		}
	}
}
