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
// Nothing else may use b meanwhile. With each, Go calls the loop once per
// op (iters crossings of one op each, nothing else of Go between them but
// the pass through the scheduler that submit makes, reschedEvery): the
// floor of any binding that issues an op per cgo call.
func (b *Backend) rawAllreduce(buf []byte, iters int, each bool) error {
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
	addr, count := C.uintptr_t(uintptr(unsafe.Pointer(&buf[0]))), C.uint64_t(len(buf)/4)
	if !each {
		return result("ucc_collective (raw loop)", C.gu_raw_allreduce(b.team, b.ctx, addr, count, C.int64_t(iters)))
	}
	for range iters {
		if st := C.gu_raw_allreduce(b.team, b.ctx, addr, count, 1); st != 0 {
			return result("ucc_collective (raw loop)", st)
		}
		if b.reschedDueLocked() {
			runtime.Gosched()
		}
	}
	return nil
}
