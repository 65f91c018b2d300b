package coll

import (
	"context"
	"encoding/binary"
	"fmt"
)

// SizeError is a collective's failure because a peer passed a buffer of
// another size than this rank's.
type SizeError struct {
	Rank, Bytes         int // this rank and its size
	PeerRank, PeerBytes int
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("rank %d passed %d bytes, rank %d passed %d bytes", e.PeerRank, e.PeerBytes, e.Rank, e.Bytes)
}

// sizeCheck is the exchange of total sizes that precedes a ring's data: each
// rank tells its right neighbour its total and checks its left
// neighbour's. Without it, ranks whose sizes differ but cut into segments
// of equal length would pair up the wrong messages: one rank would finish
// with garbage and another wait forever. Small messages need no check: a
// mismatch there shows as a message of the wrong length, which the
// transport fails. Cost: one 8-byte message per ring op, sent with the
// first data and checked before the first data is used.
type sizeCheck struct {
	q            Request
	mine, theirs [8]byte
	total        int
}

func (s *sizeCheck) start(ctx context.Context, t Transport, tag uint64, total int) error {
	n, r := t.Size(), t.Rank()
	s.total = total
	binary.LittleEndian.PutUint64(s.mine[:], uint64(total))
	s.q = t.Irecv(mod(r-1, n), tag, s.theirs[:])
	if err := t.Send(ctx, mod(r+1, n), tag, s.mine[:]); err != nil {
		s.q.Cancel()
		s.q = nil
		return err
	}
	return nil
}

// finish waits for the left neighbour's size and compares it.
func (s *sizeCheck) finish(ctx context.Context, t Transport) error {
	q := s.q
	s.q = nil
	if err := q.Wait(ctx); err != nil {
		return err
	}
	if got := int(binary.LittleEndian.Uint64(s.theirs[:])); got != s.total {
		return &SizeError{Rank: t.Rank(), Bytes: s.total, PeerRank: mod(t.Rank()-1, t.Size()), PeerBytes: got}
	}
	return nil
}

// cancel withdraws the size receive if it is still posted.
func (s *sizeCheck) cancel() {
	if s.q != nil {
		s.q.Cancel()
		s.q = nil
	}
}
