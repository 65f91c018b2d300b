package shm

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
)

// TestCopyNT checks copyNT against copy at every alignment of both ends
// and lengths either side of ntMin and of the 64-byte body, and that it
// writes nothing past the copy.
func TestCopyNT(t *testing.T) {
	src := make([]byte, 3*ntMin+256)
	for i := range src {
		src[i] = byte(rand.Uint32())
	}
	lens := []int{0, 1, 63, 4096, ntMin - 1, ntMin, ntMin + 1, ntMin + 63, ntMin + 64, 2*ntMin + 17, 3 * ntMin}
	for _, n := range lens {
		for _, doff := range []int{0, 1, 7, 31, 32, 33, 63} {
			for _, soff := range []int{0, 3, 32} {
				dst := make([]byte, n+doff+64)
				for i := range dst {
					dst[i] = 0xA5
				}
				got := copyNT(dst[doff:doff+n], src[soff:soff+n])
				if got != n {
					t.Fatalf("n %d doff %d soff %d: copied %d", n, doff, soff, got)
				}
				if !bytes.Equal(dst[doff:doff+n], src[soff:soff+n]) {
					t.Fatalf("n %d doff %d soff %d: bytes differ", n, doff, soff)
				}
				for i, c := range append(dst[:doff:doff], dst[doff+n:]...) {
					if c != 0xA5 {
						t.Fatalf("n %d doff %d soff %d: byte %d outside the copy written", n, doff, soff, i)
					}
				}
			}
		}
	}
	// A shorter destination bounds the copy, as copy does.
	dst := make([]byte, ntMin+5)
	if got := copyNT(dst, src); got != len(dst) || !bytes.Equal(dst, src[:len(dst)]) {
		t.Fatalf("short destination: copied %d", got)
	}
}

// TestRingLargeWrap writes runs of ntMin and more through a streaming ring
// (Ring.Stream) whose end they straddle (copyIn's two streamed parts) and
// reads them back.
func TestRingLargeWrap(t *testing.T) {
	a, b := pair(t, 4*ntMin)
	w, r := a.Out, b.In
	w.Stream = true
	ctx := context.Background()
	for i, n := range []int{ntMin + 100, 2*ntMin - 7, 3 * ntMin, ntMin + 1, 3*ntMin + 64} {
		msg := make([]byte, n)
		for j := range msg {
			msg[j] = byte(rand.Uint32())
		}
		if err := w.Write(ctx, msg, nil, 0); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if k, err := r.Read(got); err != nil || k != n {
			t.Fatalf("run %d: read %d of %d: %v", i, k, n, err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("run %d (%d bytes): bytes differ", i, n)
		}
	}
}
