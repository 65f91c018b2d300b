package cpupool

import (
	"errors"
	"slices"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/opcheck"
	"github.com/gocoll/gocoll/internal/tcpmesh"
)

// Mismatched collectives. Every data frame of a collective carries the
// op's fingerprint (op, dtype, reduce op, element count: see fingerprint),
// so the rank that receives a message of an op described differently
// fails it before it reads the payload. It then tells every peer
// (FailTag) with the same words, so that every rank fails with
// ErrInvalidArgument naming the two ranks, their ops, dtypes and sizes,
// whichever rank happened to find out, and in every run. The words are
// internal/opcheck's, which ucc's fingerprint board shares.

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
		e.Detail = opcheck.Detail(b.cfg.Rank, me.Ours, me.Rank, me.Theirs)
		e.Ranks = pair(b.cfg.Rank, me.Rank)
	case errors.As(err, &tse):
		e.Detail = opcheck.SizeDetail(b.cfg.Rank, tse.Want, tse.Rank, tse.Got)
		e.Ranks = pair(b.cfg.Rank, tse.Rank)
	case errors.As(err, &cse):
		e.Detail = opcheck.SizeDetail(cse.Rank, cse.Bytes, cse.PeerRank, cse.PeerBytes)
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
