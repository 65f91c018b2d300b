package shm

import (
	"context"
	"testing"
	"time"
)

// TestPresence checks what a stamped-frame wait tells its peers: nothing
// while it finds its frames at once, "waiting" in every joined pair once
// it has to give the core up, "running" again when the frame comes; and
// that a pair that Unmap took away is no longer written.
func TestPresence(t *testing.T) {
	a, b := pair(t, 1<<12)
	c, d := pair(t, 1<<12)
	var pa, pb Presence
	pa.Add(a)
	pb.Add(b)
	pb.Add(d) // b's side of a second pair: its waits show there too
	var pc Presence
	pc.Add(c)
	ctx := context.Background()
	hdr := make([]byte, StampAlign)
	if err := a.Out.WriteStamped(ctx, hdr, nil, 0, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.In.AwaitStamped(ctx, 50*time.Microsecond, time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	if pb.Waiting() || a.In.PeerWaiting() || c.In.PeerWaiting() {
		t.Fatal("a wait that found its frame at once says it waits")
	}
	b.In.Consume(StampAlign)

	done := make(chan error, 1)
	go func() { done <- b.In.AwaitStamped(ctx, 50*time.Microsecond, time.Millisecond, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	for !a.In.PeerWaiting() || !c.In.PeerWaiting() {
		if time.Now().After(deadline) {
			t.Fatal("a wait with no frame in sight never said it waits")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if !pb.Waiting() {
		t.Fatal("the words say waiting, the Presence does not")
	}
	if err := a.Out.WriteStamped(ctx, hdr, nil, 0, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if pb.Waiting() || a.In.PeerWaiting() || c.In.PeerWaiting() {
		t.Fatal("the frame came and the wait still says it waits")
	}

	// d unmapped: b's Presence writes a's word only.
	if err := d.Unmap(); err != nil {
		t.Fatal(err)
	}
	pb.set(presWaiting)
	if !a.In.PeerWaiting() {
		t.Fatal("set did not reach the pair still mapped")
	}
	if len(pb.words) != 1 {
		t.Fatalf("%d words after Unmap, want 1", len(pb.words))
	}
}
