package ucc

import (
	"testing"
	"unsafe"
)

// TestHandleSize keeps the handle, a small async op's one allocation,
// within the 64-byte size class (work.go says why).
func TestHandleSize(t *testing.T) {
	if n := unsafe.Sizeof(handle{}); n > 64 {
		t.Fatalf("handle is %d bytes, over the 64-byte size class", n)
	}
	// A chunk of handles (handleChunk) and its 8-byte malloc header in
	// the 4096-byte size class.
	if n := unsafe.Sizeof([handleChunk]handle{}) + 8; n > 4096 {
		t.Fatalf("a chunk of %d handles is %d bytes with its malloc header, over the 4096-byte size class", handleChunk, n)
	}
}
