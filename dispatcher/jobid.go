package dispatcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/gocoll/gocoll/store"
)

// pgUIDKey is the default group's store key under which rank 0 publishes
// the group's uid.
const pgUIDKey = "pg_uid"

// newPGUID draws a uid for a default group: 8 random bytes in hex, so
// that two runs' flight-recorder dumps never pass for one job, even when
// the launcher gives no run id.
func newPGUID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// publishUID runs on rank 0 before the init barrier: it draws the default
// group's uid and sets it in the store, where the barrier's arrival
// guarantees the others find it. A failed Set is left to the barrier,
// which fails on the same store.
func (pg *ProcessGroup) publishUID(ctx context.Context) {
	if pg.rank != 0 {
		return
	}
	uid := newPGUID()
	pg.recorder.setJob(pg.cfg.RunID, uid)
	_ = pg.store.Set(ctx, pgUIDKey, []byte(uid))
}

// learnUID runs on the other ranks after the init barrier, which rank 0
// passed after publishing: the key is there. Without the barrier it waits
// for the key in the background, up to the group's timeout, so that Init
// does not wait for rank 0; until then the dumps carry no uid.
func (pg *ProcessGroup) learnUID(ctx context.Context, barrier bool) {
	if pg.rank == 0 {
		return
	}
	pg.recorder.setJob(pg.cfg.RunID, "")
	get := func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, pg.timeout)
		defer cancel()
		var v []byte
		var ok bool
		if barrier {
			v, ok = store.TryGet(ctx, pg.store, pgUIDKey)
		} else {
			var err error
			v, err = pg.store.Get(ctx, pgUIDKey)
			ok = err == nil
		}
		if ok {
			pg.recorder.setJob(pg.cfg.RunID, string(v))
		}
	}
	if barrier {
		get(ctx)
		return
	}
	go get(context.WithoutCancel(ctx))
}

// setJob records the job the recorder's dumps belong to. A nil recorder
// (turned off) ignores it.
func (fr *FlightRecorder) setJob(runID, pgUID string) {
	if fr == nil {
		return
	}
	fr.mu.Lock()
	fr.runID, fr.pgUID = runID, pgUID
	fr.mu.Unlock()
}
