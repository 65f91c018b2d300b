package ucc

import (
	"testing"
	"unsafe"
)

// TestHandleSize keeps the handle, a small op's one allocation, within the
// 128-byte size class (work.go says why its fields are in that order).
func TestHandleSize(t *testing.T) {
	if n := unsafe.Sizeof(handle{}); n > 128 {
		t.Fatalf("handle is %d bytes, over the 128-byte size class", n)
	}
}
