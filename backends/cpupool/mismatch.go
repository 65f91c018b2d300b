package cpupool

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/reduceop"
	"github.com/gocoll/gocoll/tensor"
)

// Mismatched collectives. Every data frame of a collective carries the
// op's fingerprint (op, dtype, reduce op, element count: see fingerprint),
// so the rank that receives a message of an op described differently
// fails it before it reads the payload. It then tells every peer
// (FailTag) with the same words, so that every rank fails with
// ErrInvalidArgument naming the two ranks, their ops, dtypes and sizes,
// whichever rank happened to find out, and in every run.

// describe spells a fingerprint out: "allreduce float32 x 1024 (SUM)".
func describe(fp tcpmesh.Fingerprint) string {
	if fp.Op == 0 {
		return "an op without a fingerprint"
	}
	s := backend.Op(fp.Op - 1).String()
	if fp.DType != 0 || fp.Count != 0 {
		s += " " + tensor.DType(fp.DType).String()
		if fp.Count != tcpmesh.AnyCount {
			s += fmt.Sprintf(" x %d", fp.Count)
		}
	}
	if fp.ReduceOp != 0 {
		s += fmt.Sprintf(" (%s)", reduceop.Type(fp.ReduceOp-1))
	}
	return s
}

// mismatchDetail is the words every rank uses for a mismatch between rank
// a's op (fa) and rank b's (fb): the same on both sides, lower rank first.
func mismatchDetail(a int, fa tcpmesh.Fingerprint, b int, fb tcpmesh.Fingerprint) string {
	if b < a {
		a, fa, b, fb = b, fb, a, fa
	}
	return fmt.Sprintf("the ranks passed different collectives: rank %d %s, rank %d %s", a, describe(fa), b, describe(fb))
}

// sizeDetail is the same for a size mismatch found from the bytes.
func sizeDetail(a, aBytes, b, bBytes int) string {
	if b < a {
		a, aBytes, b, bBytes = b, bBytes, a, aBytes
	}
	return fmt.Sprintf("the ranks passed tensors of different sizes: rank %d %d bytes, rank %d %d bytes", a, aBytes, b, bBytes)
}

// pair is two ranks, sorted.
func pair(a, b int) []int {
	r := []int{a, b}
	slices.Sort(r)
	return r
}

// mismatchKind fills e for a mismatch that this rank found or a peer
// reported, and reports whether err was one.
func (b *Backend) mismatchKind(e *backend.OpError, j *job, err error) bool {
	var me *tcpmesh.MismatchError
	var tse *tcpmesh.SizeError
	var cse *coll.SizeError
	var roe *tcpmesh.RemoteOpError
	switch {
	case errors.As(err, &me):
		e.Detail = mismatchDetail(b.cfg.Rank, me.Ours, me.Rank, me.Theirs)
		e.Ranks = pair(b.cfg.Rank, me.Rank)
	case errors.As(err, &tse):
		e.Detail = sizeDetail(b.cfg.Rank, tse.Want, tse.Rank, tse.Got)
		e.Ranks = pair(b.cfg.Rank, tse.Rank)
	case errors.As(err, &cse):
		e.Detail = sizeDetail(cse.Rank, cse.Bytes, cse.PeerRank, cse.PeerBytes)
		e.Ranks = pair(cse.Rank, cse.PeerRank)
	case errors.As(err, &roe) && (roe.Code == tcpmesh.CodeSize || roe.Code == tcpmesh.CodeMismatch):
		// The finder's own words, so that every rank says the same.
		e.Detail, e.Ranks = roe.Reason, []int{roe.Rank}
		if roe.Peer >= 0 {
			e.Ranks = pair(roe.Rank, roe.Peer)
		}
	default:
		return false
	}
	e.Kind, e.Err = backend.ErrInvalidArgument, nil
	return true
}

// mismatchOf reports whether err (an op's raw error) is this rank's own
// discovery of a mismatch, with its FailTag code and the peer at odds.
func mismatchOf(err error) (code byte, peer int, ok bool) {
	var me *tcpmesh.MismatchError
	var tse *tcpmesh.SizeError
	var cse *coll.SizeError
	switch {
	case errors.As(err, &me):
		return tcpmesh.CodeMismatch, me.Rank, true
	case errors.As(err, &tse):
		return tcpmesh.CodeSize, tse.Rank, true
	case errors.As(err, &cse):
		return tcpmesh.CodeSize, cse.PeerRank, true
	}
	return 0, -1, false
}

// detailOf is an *OpError's detail, or the error's text.
func detailOf(err error) string {
	var oe *backend.OpError
	if errors.As(err, &oe) {
		return oe.Detail
	}
	return err.Error()
}
