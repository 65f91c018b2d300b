package dispatcher

// The flight recorder's dumps: what triggers one (a failed op, a peer's
// or this rank's signal, the dump pipe) and how a snapshot of the ring is
// taken and written.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/frtrace"
	"github.com/gocoll/gocoll/internal/watch"
)

// isFault reports whether an op's error is a fault worth a dump (a
// timeout, a remote error, an abort, …) rather than the caller's: an op
// refused for its arguments or as unsupported tells nothing the error does
// not already say, and a dump per refused call would litter the dump
// directory with files that analyze then reads as a failed job.
func isFault(err error) bool {
	return !errors.Is(err, backend.ErrInvalidArgument) && !errors.Is(err, backend.ErrUnsupported)
}

// onError dumps once, on the first failed op, unless turned off.
func (fr *FlightRecorder) onError(err error) {
	fr.mu.Lock()
	acts := fr.dumps.Error(err.Error())
	fr.mu.Unlock()
	fr.perform(acts)
}

// peerSignal dumps once per dump signal a peer posted.
func (fr *FlightRecorder) peerSignal(v string) {
	fr.mu.Lock()
	acts := fr.dumps.PeerSignal(v)
	fr.mu.Unlock()
	fr.perform(acts)
}

// ownSignal notes the signal this rank posts after its own dump.
func (fr *FlightRecorder) ownSignal(v string) {
	fr.mu.Lock()
	fr.dumps.OwnSignal(v)
	fr.mu.Unlock()
}

// perform carries out the dump decisions (watch.Dumps returns only dumps).
func (fr *FlightRecorder) perform(acts []watch.Action[struct{}]) {
	for _, a := range acts {
		if a.Kind == watch.Dump {
			_, _ = fr.Dump(a.Reason)
		}
	}
}

// servePipe dumps each time a line is written to the FIFO at path.
func (fr *FlightRecorder) servePipe(path string) {
	defer os.Remove(path)
	for {
		// Opening a FIFO blocks until a writer comes; O_NONBLOCK plus a
		// poll keeps Close from hanging on it.
		f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return
		}
		sc := bufio.NewScanner(f)
		for {
			select {
			case <-fr.stop:
				f.Close()
				return
			default:
			}
			if sc.Scan() {
				if sc.Text() == "1" {
					_, _ = fr.Dump("on demand (pipe)")
				}
				continue
			}
			// EOF or EAGAIN: wait a little and reopen to get new writers.
			break
		}
		f.Close()
		select {
		case <-fr.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Snapshot returns the recorder's content as a dump, after noting the
// latest completions.
func (fr *FlightRecorder) Snapshot(reason string) frtrace.Dump {
	fr.refresh()
	// The sections of linked packages (the NVML snapshots of the GPUs),
	// bounded: the watchdog that dumps must not wait on a sick GPU.
	sctx, cancel := context.WithTimeout(context.Background(), sectionBound)
	sections := frtrace.CollectSections(sctx)
	cancel()
	fr.mu.Lock()
	defer fr.mu.Unlock()
	d := frtrace.Dump{Version: frtrace.Version, CommLibVersion: frtrace.Producer, Rank: fr.rank, WorldSize: fr.size,
		PGConfig: map[string]frtrace.PGConfig{}, PGStatus: map[string]frtrace.PGStatus{}, DumpReason: reason,
		RunID: fr.runID, PGUID: fr.pgUID, Sections: sections}
	now := time.Now()
	d.DumpTimeNs, d.DumpTime = now.UnixNano(), now.UTC().Format(time.RFC3339Nano)
	for k, v := range fr.groups {
		d.PGConfig[k] = v
	}
	for k, v := range fr.status {
		d.PGStatus[k] = *v
	}
	// Oldest first: after wrapping, the oldest entry is at nextID % cap.
	n := len(fr.ring)
	start := 0
	if n == cap(fr.ring) {
		start = int(fr.nextID % uint64(n))
	}
	for i := range n {
		d.Entries = append(d.Entries, fr.entry(&fr.ring[(start+i)%n]))
	}
	return d
}

// sectionBound bounds the dump sections' collection (frtrace.Sections):
// the default watchdog interval, so that a dump taken by a watchdog never
// holds it past one round.
const sectionBound = 100 * time.Millisecond

// DumpPath is the file this rank dumps to.
func (fr *FlightRecorder) DumpPath() string { return fr.opts.DumpPrefix + strconv.Itoa(fr.rank) }

// Dump writes the snapshot to DumpPath, atomically (write then rename), and
// returns the path.
func (fr *FlightRecorder) Dump(reason string) (string, error) {
	// Profiling names hold "->" and "<-"; keep them readable.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(fr.Snapshot(reason)); err != nil {
		return "", err
	}
	path := fr.DumpPath()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("dispatcher: flight recorder dump: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("dispatcher: flight recorder dump: %w", err)
	}
	fr.mu.Lock()
	fr.ndumps++
	fr.mu.Unlock()
	fr.opts.Logger.Info("flight recorder dumped", "rank", fr.rank, "path", path, "reason", reason)
	return path, nil
}

// Dumps returns how many dumps the recorder has written, for whatever
// reason: a program (or a test) can check that nothing went wrong enough
// to dump.
func (fr *FlightRecorder) Dumps() int {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return fr.ndumps
}
