package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/gocoll/gocoll/internal/frtrace"
)

// errMismatch makes `conftest fr analyze` exit non-zero when the ranks
// disagree.
var errMismatch = errors.New("the ranks' flight recorders disagree")

// fr runs `conftest fr analyze DIR`: it reads every rank's flight-recorder
// dump in DIR and prints the first collective on which the ranks disagree
// (PyTorch's fr_trace). The exit status is 1 on a mismatch, 2 on a usage
// or read error.
func fr(args []string) (int, error) {
	if len(args) != 2 || args[0] != "analyze" {
		fmt.Fprintln(os.Stderr, "usage: conftest fr analyze DIR")
		return 2, errors.New("usage: conftest fr analyze DIR")
	}
	return frAnalyze(os.Stdout, args[1])
}

func frAnalyze(w io.Writer, dir string) (int, error) {
	dumps, err := frtrace.Load(dir)
	if err != nil {
		return 2, err
	}
	rep := frtrace.Analyze(dumps)
	fmt.Fprint(w, rep.String())
	if rep.Mismatch != nil {
		return 1, errMismatch
	}
	return 0, nil
}
