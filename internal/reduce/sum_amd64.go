package reduce

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// The Go compiler does not vectorise, and SUM on float32 and float64 is
// what allreduce runs most (AVG and PREMUL_SUM too): on amd64 with AVX2
// those go through the assembly loops of sum_amd64.s, eight (four)
// elements an instruction, which reach memory bandwidth where the scalar
// loop stays at a third of it. The results are the scalar loop's, bit
// for bit: IEEE addition per element, in the same operand order.

//go:noescape
func addF32AVX2(d, s *float32, n int)

//go:noescape
func addF64AVX2(d, s *float64, n int)

var haveAVX2 = cpu.X86.HasAVX2

// sumFloat32 is sum for float32.
func sumFloat32(d, s []float32) {
	s = s[:len(d)]
	if haveAVX2 && len(d) >= 32 {
		n := len(d) &^ 31
		addF32AVX2(unsafe.SliceData(d), unsafe.SliceData(s), n)
		d, s = d[n:], s[n:]
	}
	sum(d, s)
}

// sumFloat64 is sum for float64.
func sumFloat64(d, s []float64) {
	s = s[:len(d)]
	if haveAVX2 && len(d) >= 16 {
		n := len(d) &^ 15
		addF64AVX2(unsafe.SliceData(d), unsafe.SliceData(s), n)
		d, s = d[n:], s[n:]
	}
	sum(d, s)
}
