package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// TestStampedFrames streams stamped frames of random sizes through a small
// ring (many laps, frames that wrap around its end) while the reader
// polls the stamps, and checks every byte: a frame is never seen before
// it is whole, nor a stale one of an earlier lap as new. The payloads
// are filled with the next positions' would-be stamps without the key
// and other lap-old values, which a position-only stamp would mistake.
func TestStampedFrames(t *testing.T) {
	const ring = 1 << 12
	a, b := pair(t, ring)
	ctx := context.Background()
	const frames = 3000
	sizes := make([]int, frames)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range sizes {
		sizes[i] = 8 * rng.IntN(ring/2/8-16)
	}
	werr := make(chan error, 1)
	go func() {
		defer close(werr)
		var pos uint64
		for i, n := range sizes {
			h := make([]byte, 16)
			binary.LittleEndian.PutUint64(h[8:], uint64(i))
			p := make([]byte, n)
			for j := 0; j+8 <= n; j += 8 {
				// Lap-old positions and their plain values.
				binary.LittleEndian.PutUint64(p[j:], pos+16+uint64(j)+ring|1)
			}
			pad := -(16 + n) & (StampAlign - 1)
			if err := a.Out.WriteStamped(ctx, h, p, pad, nil); err != nil {
				werr <- err // the reader failed and closed the rings
				return
			}
			pos += uint64(16 + n + pad)
		}
	}()
	var pos uint64
	for i, n := range sizes {
		if err := b.In.AwaitStamped(ctx, 50*time.Microsecond, time.Millisecond, nil); err != nil {
			t.Fatal(err)
		}
		x, y := b.In.FrameAt(8, 8)
		got := binary.LittleEndian.Uint64(append(append([]byte(nil), x...), y...))
		if got != uint64(i) {
			t.Fatalf("frame %d: header says %d", i, got)
		}
		x, y = b.In.FrameAt(16, n)
		body := append(append([]byte(nil), x...), y...)
		want := make([]byte, n)
		for j := 0; j+8 <= n; j += 8 {
			binary.LittleEndian.PutUint64(want[j:], pos+16+uint64(j)+ring|1)
		}
		if !bytes.Equal(body, want) {
			t.Fatalf("frame %d: payload differs", i)
		}
		whole := 16 + n + (-(16 + n) & (StampAlign - 1))
		b.In.Consume(whole)
		pos += uint64(whole)
	}
	if b.In.Stamped() {
		t.Fatal("a frame after the last one")
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
}

// TestStampedRefuses checks the frames WriteStamped rejects, and that a
// reader waiting for a frame fails once the peer is dead, or on its
// context's deadline, or on check's error.
func TestStampedRefuses(t *testing.T) {
	a, b := pair(t, 1<<12)
	ctx := context.Background()
	for _, c := range []struct{ hdr, buf, pad int }{{4, 60, 0}, {16, 40, 0}, {16, 1 << 12, 48}} {
		if err := a.Out.WriteStamped(ctx, make([]byte, c.hdr), make([]byte, c.buf), c.pad, nil); err == nil {
			t.Errorf("frame %+v accepted", c)
		}
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := b.In.AwaitStamped(short, -1, time.Millisecond, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait past the deadline: %v", err)
	}
	mine := errors.New("given up")
	if err := b.In.AwaitStamped(ctx, -1, time.Millisecond, func() error { return mine }); !errors.Is(err, mine) {
		t.Fatalf("wait with a failing check: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- b.In.AwaitStamped(ctx, -1, time.Second, nil) }()
	time.Sleep(20 * time.Millisecond)
	b.MarkDead()
	select {
	case err := <-done:
		if !errors.Is(err, ErrPeerDead) {
			t.Fatalf("wait after the peer died: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a dead peer's frame was waited for")
	}
}

// TestAwaitStampedYieldsBeforeSleep checks the order of a stamped-frame
// wait's phases when it may spin: it spins for spin, then polls with
// sched_yield until Yield has passed since it began, and only then
// announces that it sleeps (consWait): a wait announces no sleep sooner
// than Yield after it began.
func TestAwaitStampedYieldsBeforeSleep(t *testing.T) {
	a, b := pair(t, 1<<12)
	const yield = 3 * time.Millisecond
	b.In.Yield = yield
	ctx := context.Background()
	begun := time.Now()
	done := make(chan error, 1)
	go func() { done <- b.In.AwaitStamped(ctx, 50*time.Microsecond, time.Millisecond, nil) }()
	for b.In.consWait.Load() == 0 {
		if time.Since(begun) > 10*time.Second {
			t.Fatal("the wait never went to sleep")
		}
		time.Sleep(20 * time.Microsecond)
	}
	if slept := time.Since(begun); slept < yield {
		t.Fatalf("the wait announced its sleep %v after it began, before its yield of %v was over", slept, yield)
	}
	if err := a.Out.WriteStamped(ctx, make([]byte, StampAlign), nil, 0, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
