package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// progress is the one-line status of a long bench run (rows done of the
// total, elapsed), redrawn on stderr when stderr is a terminal and absent
// otherwise, so that logs and pipes get the tables alone.
type progress struct {
	mu    sync.Mutex
	w     io.Writer // nil: no terminal, no progress
	total int
	rows  int
	n     int
	start time.Time
}

// isTerminal reports whether f is a terminal (a TCGETS that succeeds).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// newProgress counts the rows that the series will print at n ranks.
func newProgress(series []benchSeries, ops []string, sizes []int, n, repeat int) *progress {
	p := &progress{n: n, start: time.Now()}
	if isTerminal(os.Stderr) {
		p.w = os.Stderr
	}
	for _, s := range series {
		sops := ops
		if s.ops != nil {
			sops = s.ops
		}
		for _, op := range sops {
			for _, b := range sizes {
				if opCount(op, b, n) > 0 {
					p.total += (1 + len(s.also)) * max(1, repeat)
				}
			}
		}
	}
	return p
}

// step counts one row (rank 0's line of a series, op and size).
func (p *progress) step(s benchSample) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rows++
	if p.w != nil {
		fmt.Fprintf(p.w, "\r\033[K%d ranks: %d of %d rows, %s %s %d B, %s elapsed", p.n, p.rows, p.total, s.series, s.op, s.bytes,
			time.Since(p.start).Round(time.Second))
	}
}

// done clears the line.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w != nil && p.rows > 0 {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
