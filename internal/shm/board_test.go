package shm

import (
	"context"
	"errors"
	"testing"
	"time"
)

// boards maps one board file of n ranks n times, as n processes would.
func boards(t *testing.T, n int) []*Board {
	t.Helper()
	b0, path, err := CreateBoard("test-board-", n, 0, 40)
	if err != nil {
		t.Fatal(err)
	}
	bs := []*Board{b0}
	for r := 1; r < n; r++ {
		b, err := OpenBoard(path, n, r)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	if err := Unlink(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, b := range bs {
			b.Close()
			_ = b.Unmap()
		}
	})
	return bs
}

// TestBoardPostAwait: a posted slot is seen whole under its stamp, in
// either slot; a rank that has posted past the stamp is reported with the
// later stamp; a dead rank and a closed board end the wait.
func TestBoardPostAwait(t *testing.T) {
	ctx := context.Background()
	bs := boards(t, 3)
	if got := bs[0].SlotBytes(); got != 64 {
		t.Fatalf("slot of %d bytes, want 40 rounded up to 64", got)
	}
	post := func(b *Board, stamp uint64, v byte) {
		s := b.Slot(b.rank, b.Next())
		for i := 8; i < len(s); i++ {
			s[i] = v
		}
		b.Post(stamp)
	}
	for k := uint64(1); k <= 5; k++ {
		post(bs[0], k, byte(k))
		i, later, err := bs[1].Await(ctx, 0, k, -1, time.Second, nil)
		if err != nil || i != int((k-1)&1) || later != 0 {
			t.Fatalf("stamp %d: slot %d, later %d, %v", k, i, later, err)
		}
		if s := bs[1].Slot(0, i); s[8] != byte(k) || s[63] != byte(k) {
			t.Fatalf("stamp %d: slot holds %d..%d", k, s[8], s[63])
		}
	}
	// Rank 0 has posted 4 and 5: 4 is still there, 3 is gone.
	if i, _, err := bs[2].Await(ctx, 0, 4, -1, time.Second, nil); err != nil || i != 1 {
		t.Fatalf("stamp 4: slot %d, %v", i, err)
	}
	if i, later, err := bs[2].Await(ctx, 0, 3, -1, time.Second, nil); err != nil || i != -1 || later != 5 {
		t.Fatalf("stamp 3 after 5: slot %d, later %d, %v (want -1, 5)", i, later, err)
	}
	bs[1].MarkDead(2)
	if _, _, err := bs[1].Await(ctx, 2, 1, -1, time.Second, nil); !errors.Is(err, ErrPeerDead) {
		t.Fatalf("dead rank: %v", err)
	}
	check := errors.New("the check's reason")
	if _, _, err := bs[2].Await(ctx, 1, 1, -1, time.Millisecond, func() error { return check }); !errors.Is(err, check) {
		t.Fatalf("check: %v", err)
	}
	bs[2].Close()
	if _, _, err := bs[2].Await(ctx, 1, 1, -1, time.Second, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
}

// TestBoardWakesSleeper: a wait that sleeps (no spin, no yield phase, a
// slice far longer than the test's deadline) is woken by the Post it
// waits for.
func TestBoardWakesSleeper(t *testing.T) {
	bs := boards(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := bs[2].Await(ctx, 1, 7, -1, time.Hour, nil)
		done <- err
	}()
	for bs[1].sleepers(1).Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	bs[1].Post(7)
	if err := <-done; err != nil {
		t.Fatalf("the sleeper was not woken by the post: %v", err)
	}
}

// TestOpenBoardRejects: a board file opened for another world size, and a
// file that is no board, are refused.
func TestOpenBoardRejects(t *testing.T) {
	b, path, err := CreateBoard("test-board-", 3, 0, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Unmap(); _ = Unlink(path) }()
	if _, err := OpenBoard(path, 4, 1); err == nil {
		t.Fatal("a board of 3 ranks opened as one of 4")
	}
	p, ppath, err := Create("test-pair-", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Unmap(); _ = Unlink(ppath) }()
	if _, err := OpenBoard(ppath, 3, 1); err == nil {
		t.Fatal("a pair file opened as a board")
	}
}
