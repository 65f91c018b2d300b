package ucc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/gocoll/gocoll/internal/shm"
	"github.com/gocoll/gocoll/store"
)

// Values of Options.Fingerprints.
const (
	FingerprintsAuto = "auto" // shared memory when every rank is on one host, else TCP
	FingerprintsShm  = "shm"  // shared memory; New fails where it cannot be mapped
	FingerprintsTCP  = "tcp"  // the TCP side channel, even on one host
	FingerprintsOff  = "off"  // no check: ops go to UCC at issue, as before
)

// fpSetup builds the group's fingerprint board, after the UCC team is
// up (so every rank is there), over the group's store, within the
// wire-up's deadline. Every rank takes the same decisions from the same
// keys: the host identities decide shared memory or TCP ("auto"), and a
// rank that cannot map the shared file sends every rank to TCP.
func (b *Backend) fpSetup(ctx context.Context) error {
	mode := b.opts.Fingerprints
	if mode == FingerprintsOff {
		return nil
	}
	n, r := b.cfg.WorldSize, b.cfg.Rank
	g := &fpGate{rank: r, size: n, ahead: b.opts.FingerprintsAhead != AheadOff}
	if n == 1 {
		g.board = &shmBoard{r: heapRings(1, fpSlots)} // no peers: nothing to carry
		b.fp = g
		return nil
	}
	ctx, cancel := context.WithDeadline(ctx, b.oob.deadline)
	defer cancel()
	st := b.cfg.Store
	all := func(prefix string) ([][]byte, error) {
		keys := make([]string, n)
		for p := range keys {
			keys[p] = prefix + strconv.Itoa(p)
		}
		if err := st.Wait(ctx, keys...); err != nil {
			return nil, err
		}
		return st.MultiGet(ctx, keys)
	}
	id, err := shm.HostID()
	if err != nil {
		id = "unknown/" + strconv.Itoa(r) // no identity: a host of its own
	}
	if err := st.Set(ctx, "ucc/fp/host/"+strconv.Itoa(r), []byte(id)); err != nil {
		return fmt.Errorf("ucc: fingerprint board: %w", err)
	}
	ids, err := all("ucc/fp/host/")
	if err != nil {
		return fmt.Errorf("ucc: fingerprint board: the peers' hosts: %w", err)
	}
	oneHost := true
	for _, v := range ids {
		oneHost = oneHost && string(v) == id
	}
	if mode == FingerprintsShm && !oneHost {
		return fmt.Errorf("ucc: fingerprint board: ucc.Options.Fingerprints is %q but the ranks are on more than one host", mode)
	}
	if oneHost && mode != FingerprintsTCP {
		sb, err := b.shmSetup(ctx, all)
		switch {
		case err == nil:
			g.board = sb
			g.lazy = g.ahead
		case mode == FingerprintsShm || !errors.Is(err, errNoShm):
			return err
		}
	}
	if g.board == nil {
		host := "127.0.0.1"
		if !oneHost {
			if host, err = os.Hostname(); err != nil {
				return fmt.Errorf("ucc: fingerprint side channel: host name: %w", err)
			}
		}
		ps, err := store.NewPrefixStore("ucc/fp/tcp", st)
		if err != nil {
			return fmt.Errorf("ucc: fingerprint side channel: %w", err)
		}
		connect := b.opts.ConnectTimeout
		if dl, ok := ctx.Deadline(); ok {
			connect = min(connect, time.Until(dl))
		}
		if g.board, err = newTCPBoard(ctx, ps, r, n, host, connect, storeBound); err != nil {
			return err
		}
	}
	b.fp = g
	return nil
}

// errNoShm marks a board that some rank could not map: "auto" then takes
// TCP, on every rank.
var errNoShm = errors.New("ucc: the fingerprint board cannot be shared on this host")

// shmSetup makes (rank 0) or maps (the others) the shared board; every
// rank reports how that went under "ucc/fp/mapped/<rank>", and rank 0
// unlinks the file once all have.
func (b *Backend) shmSetup(ctx context.Context, all func(string) ([][]byte, error)) (*shmBoard, error) {
	st, r, n := b.cfg.Store, b.cfg.Rank, b.cfg.WorldSize
	var sb *shmBoard
	var path string
	var err error
	if r == 0 {
		sb, path, err = createShmBoard(n)
		v := path
		if err != nil {
			v = "" // the others read "no board" and fail their map
		}
		if serr := st.Set(ctx, "ucc/fp/shm", []byte(v)); serr != nil {
			return nil, fmt.Errorf("ucc: fingerprint board: %w", serr)
		}
	} else {
		var v []byte
		if v, err = st.Get(ctx, "ucc/fp/shm"); err == nil {
			if len(v) == 0 {
				err = errors.New("rank 0 could not make it")
			} else {
				sb, err = openShmBoard(string(v), r, n)
			}
		}
	}
	report := ""
	if err != nil {
		report = err.Error()
	} else {
		sb.register()
	}
	if serr := st.Set(ctx, "ucc/fp/mapped/"+strconv.Itoa(r), []byte(report)); serr != nil {
		err = errors.Join(err, serr)
	}
	reports, aerr := all("ucc/fp/mapped/")
	if path != "" {
		_ = shm.Unlink(path) // every rank has mapped it, or failed to, or the wait ended
	}
	if aerr != nil {
		err = errors.Join(err, aerr)
	}
	for p, v := range reports {
		if len(v) > 0 && err == nil {
			err = fmt.Errorf("%w: rank %d: %s", errNoShm, p, v)
		}
	}
	if err != nil {
		if sb != nil {
			_ = sb.close()
		}
		if !errors.Is(err, errNoShm) {
			err = fmt.Errorf("%w: %w", errNoShm, err)
		}
		return nil, err
	}
	sb.learnPids()
	return sb, nil
}
