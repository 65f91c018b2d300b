package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// rawAllreduce runs iters float32 SUM allreduces of buf in place on b's
// team the way a C program calling UCC directly does (gu_raw_allreduce,
// the loop of cmd/conftest/benchc/ucc-bench-raw.c), with nothing of the
// backend in between: the peer that the package's benchmarks compare the
// backend's issue and wait path against, in the same process and team.
// Nothing else may use b meanwhile.
func (b *Backend) rawAllreduce(buf []byte, iters int) error {
	if len(buf) < 4 || len(buf)%4 != 0 {
		return fmt.Errorf("ucc: raw allreduce of %d bytes: want a positive multiple of 4", len(buf))
	}
	var pin runtime.Pinner
	pin.Pin(&buf[0])
	defer pin.Unpin()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.usableLocked(0, 0); err != nil {
		return err
	}
	st := C.gu_raw_allreduce(b.team, b.ctx, C.uintptr_t(uintptr(unsafe.Pointer(&buf[0]))), C.uint64_t(len(buf)/4), C.int64_t(iters))
	return result("ucc_collective (raw loop)", st)
}
