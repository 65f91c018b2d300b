// Package opcheck is how host backends describe a collective to their
// peers and word a disagreement: the fingerprint an op is checked by
// (tcpmesh.Fingerprint: op, dtype, reduce op, element count) and the
// sentences every rank of a group fails with when the ranks passed one
// collective differently. cpupool carries the fingerprint in its frames'
// headers, ucc on its fingerprint board; both fail with these words, so
// that a mismatch reads the same whichever backend found it, on every
// rank, in every run.
package opcheck

import (
	"fmt"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/reduceop"
	"github.com/gocoll/gocoll/tensor"
)

// Of is the fingerprint of an op: op, the dtype of its tensors, its reduce
// op (nil for an op that does not reduce) and its element count, the same
// on every rank (negative: the ranks' counts may differ, as in
// all-to-all, and are not compared).
func Of(op backend.Op, dt tensor.DType, r *backend.ReduceOp, count int) tcpmesh.Fingerprint {
	fp := tcpmesh.Fingerprint{Op: uint8(op) + 1, DType: uint8(dt), Count: uint64(count)}
	if count < 0 {
		fp.Count = tcpmesh.AnyCount
	}
	if r != nil {
		fp.ReduceOp = uint8(r.Type) + 1
	}
	return fp
}

// Describe spells a fingerprint out: "allreduce float32 x 1024 (SUM)".
func Describe(fp tcpmesh.Fingerprint) string {
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

// Detail is the words every rank uses for a mismatch between rank a's op
// (fa) and rank b's (fb): the same on both sides, lower rank first.
func Detail(a int, fa tcpmesh.Fingerprint, b int, fb tcpmesh.Fingerprint) string {
	if b < a {
		a, fa, b, fb = b, fb, a, fa
	}
	return fmt.Sprintf("the ranks passed different collectives: rank %d %s, rank %d %s", a, Describe(fa), b, Describe(fb))
}

// SizeDetail is the words for a size mismatch found from the bytes (an op
// whose fingerprints agree, or carry no count): lower rank first.
func SizeDetail(a, aBytes, b, bBytes int) string {
	if b < a {
		a, aBytes, b, bBytes = b, bBytes, a, aBytes
	}
	return fmt.Sprintf("the ranks passed tensors of different sizes: rank %d %d bytes, rank %d %d bytes", a, aBytes, b, bBytes)
}

// RootDetail is the words for ranks that agree on the op but name
// different roots (rank a root ra, rank b root rb), lower rank first.
func RootDetail(a int, fa tcpmesh.Fingerprint, ra int, b int, rb int) string {
	if b < a {
		a, ra, b, rb = b, rb, a, ra
	}
	return fmt.Sprintf("the ranks passed different roots: rank %d %s from root %d, rank %d the same from root %d", a, Describe(fa), ra, b, rb)
}
