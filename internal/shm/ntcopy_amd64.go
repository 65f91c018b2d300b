package shm

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:noescape
func copyNTAVX2(dst, src *byte, n int)

var haveAVX2 = cpu.X86.HasAVX2

// ntMin is the least copy that copyNT streams past the cache.
const ntMin = 32 << 10

// copyNT copies src into dst (len(dst) >= len(src)) with non-temporal
// stores when it is large: the bytes go to memory, not to this core's
// cache, so the peer that reads them next does not fetch each line from
// a core that holds it modified.
func copyNT(dst, src []byte) int {
	n := min(len(dst), len(src))
	if !haveAVX2 || n < ntMin {
		return copy(dst, src)
	}
	head := int((32 - uintptr(unsafe.Pointer(&dst[0]))&31) & 31)
	copy(dst[:head], src[:head])
	body := (n - head) &^ 63
	copyNTAVX2(&dst[head], &src[head], body)
	copy(dst[head+body:n], src[head+body:n])
	return n
}
