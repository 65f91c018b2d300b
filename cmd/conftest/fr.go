package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/gocoll/gocoll/internal/frtrace"
)

// errMismatch makes `conftest fr analyze` exit non-zero when the ranks
// disagree.
var errMismatch = errors.New("the ranks' flight recorders disagree")

const frUsage = "usage: conftest fr analyze [--job ID] DIR"

// fr runs `conftest fr analyze [--job ID] DIR`: it reads the gocoll
// flight-recorder dumps in DIR, takes one job's (the newest, or the one
// --job names), and prints the first collective on which its ranks
// disagree (PyTorch's fr_trace). The exit status is 1 on a mismatch, 2 on
// a usage or read error.
func fr(args []string) (int, error) {
	if len(args) < 1 || args[0] != "analyze" {
		fmt.Fprintln(os.Stderr, frUsage)
		return 2, errors.New(frUsage)
	}
	fs := flag.NewFlagSet("conftest fr analyze", flag.ContinueOnError)
	job := fs.String("job", "", "analyze the job whose id (run id or pg_uid) contains this text; default: the newest")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), frUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args[1:]); err != nil {
		return 2, err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2, errors.New(frUsage)
	}
	return frAnalyze(os.Stdout, fs.Arg(0), *job)
}

func frAnalyze(w io.Writer, dir, pick string) (int, error) {
	l, err := frtrace.LoadJobs(dir)
	if err != nil {
		return 2, err
	}
	chosen := 0 // the newest
	if pick != "" {
		chosen = -1
		for i := range l.Jobs {
			if strings.Contains(l.Jobs[i].ID, pick) {
				chosen = i
				break
			}
		}
		if chosen < 0 {
			return 2, fmt.Errorf("no job in %s matches --job %q; the jobs there: %s", dir, pick, jobList(l.Jobs, -1))
		}
	}
	j := &l.Jobs[chosen]
	fmt.Fprintf(w, "job %s: dumps of ranks %v, the last at %s\n", j.ID, j.Ranks(), j.Newest.UTC().Format(time.RFC3339))
	if len(l.Jobs) > 1 {
		fmt.Fprintf(w, "warning: %s also holds dumps of %s, left out: %s (--job picks one)\n", dir, plural(len(l.Jobs)-1, "other run"), jobList(l.Jobs, chosen))
	}
	for _, r := range j.Ranks() {
		if old := j.Duplicates[r]; len(old) > 0 {
			fmt.Fprintf(w, "warning: rank %d has %d dumps in this job; read the newest, left out %s\n", r, len(old)+1, strings.Join(old, ", "))
		}
	}
	if l.Skipped > 0 {
		fmt.Fprintf(w, "skipped %s (not gocoll flight-recorder dumps)\n", plural(l.Skipped, "file"))
	}
	rep := frtrace.Analyze(j.Dumps)
	fmt.Fprint(w, rep.String())
	if rep.Mismatch != nil {
		return 1, errMismatch
	}
	return 0, nil
}

// jobList describes the jobs other than skip, the newest first.
func jobList(jobs []frtrace.Job, skip int) string {
	var parts []string
	for i := range jobs {
		if i != skip {
			parts = append(parts, fmt.Sprintf("%s (ranks %v, %s)", jobs[i].ID, jobs[i].Ranks(), jobs[i].Newest.UTC().Format(time.RFC3339)))
		}
	}
	return strings.Join(parts, "; ")
}

// plural counts things in English: "1 other run", "2 other runs".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
