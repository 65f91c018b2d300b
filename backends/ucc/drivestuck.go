package ucc

/*
#include <stdlib.h>
#include "ucc_dl.h"
*/
import "C"

import (
	"time"
	"unsafe"
)

// driveStuck is the drive loop's C slice on a request that never
// finishes (a status word reading UCC_INPROGRESS, never handed to UCC),
// under b.mu as drive holds it, with b's context progressed and b.posting
// and b.driving as gu_drive's stop words: TestDriveSliceEnds checks that a
// slice of spin ends early when a non-driver wants the lock (lockOut) or a
// second goroutine waits. It returns the requests gu_drive left in
// progress (1). Nothing else may drive b meanwhile.
func (b *Backend) driveStuck(spin time.Duration) int {
	st := (*C.int32_t)(C.malloc(8))
	defer C.free(unsafe.Pointer(st))
	*st = C.GU_INPROGRESS
	req := [1]C.uintptr_t{C.uintptr_t(uintptr(unsafe.Pointer(st)))}
	var cerr C.int
	b.mu.Lock()
	defer b.mu.Unlock()
	return int(C.gu_drive(b.ctx, &req[0], 1, &cerr, (*C.int32_t)(unsafe.Pointer(&b.posting)), (*C.int32_t)(unsafe.Pointer(&b.driving)),
		C.int64_t(spin), C.int64_t(driveSpin), 0, nil, 0, 0, nil, 0, 0, 0, 0, nil))
}
