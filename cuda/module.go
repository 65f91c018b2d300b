package cuda

/*
#include <stdlib.h>
#include "dl.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// Module is a loaded CUDA module (cuModuleLoadData): PTX, which the driver
// compiles for the device, or a cubin. It lives in the device's primary
// context.
//
// Loading a module may synchronise the device, so load modules before any
// gate is closed (see Gate).
type Module struct {
	dev    *Device
	handle uintptr
}

// Function is a kernel of a Module.
type Function struct {
	mod    *Module
	handle uintptr
	name   string
}

// LoadModule loads image (PTX text or a cubin) into d's primary context.
// PTX must end with a NUL byte, as cuModuleLoadData reads a C string; one is
// appended if missing.
func (d *Device) LoadModule(image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("cuda: empty module image")
	}
	if image[len(image)-1] != 0 {
		image = append(image[:len(image):len(image)], 0)
	}
	cimg := C.CBytes(image)
	defer C.free(cimg)
	var h C.uintptr_t
	if err := check("cuModuleLoadData", C.gc_module_load(C.uintptr_t(d.ctx), &h, cimg)); err != nil {
		return nil, err
	}
	return &Module{dev: d, handle: uintptr(h)}, nil
}

// Function returns the kernel called name (its extern "C" name).
func (m *Module) Function(name string) (*Function, error) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	var h C.uintptr_t
	if err := check("cuModuleGetFunction("+name+")", C.gc_module_function(C.uintptr_t(m.dev.ctx), &h, C.uintptr_t(m.handle), cn)); err != nil {
		return nil, err
	}
	return &Function{mod: m, handle: uintptr(h), name: name}, nil
}

// Unload unloads the module; its functions must not be launched after.
func (m *Module) Unload() error {
	return check("cuModuleUnload", C.gc_module_unload(C.uintptr_t(m.dev.ctx), C.uintptr_t(m.handle)))
}

// KernelArgs packs a kernel's parameters in order, each aligned to its
// size, as cuLaunchKernel reads them.
type KernelArgs struct {
	buf     []byte
	offsets []C.size_t
}

func (a *KernelArgs) add(n int) []byte {
	off := (len(a.buf) + n - 1) / n * n
	for len(a.buf) < off+n {
		a.buf = append(a.buf, 0)
	}
	a.offsets = append(a.offsets, C.size_t(off))
	return a.buf[off : off+n]
}

// Ptr appends a device pointer parameter.
func (a *KernelArgs) Ptr(p uintptr) *KernelArgs {
	binary.LittleEndian.PutUint64(a.add(8), uint64(p))
	return a
}

// U64 appends an unsigned 64-bit parameter.
func (a *KernelArgs) U64(v uint64) *KernelArgs {
	binary.LittleEndian.PutUint64(a.add(8), v)
	return a
}

// I32 appends a 32-bit integer parameter.
func (a *KernelArgs) I32(v int32) *KernelArgs {
	binary.LittleEndian.PutUint32(a.add(4), uint32(v))
	return a
}

// F32 appends a float parameter.
func (a *KernelArgs) F32(v float32) *KernelArgs {
	binary.LittleEndian.PutUint32(a.add(4), math.Float32bits(v))
	return a
}

// Launch queues f on s with grid × block threads and shmem bytes of dynamic
// shared memory. It is stream-ordered: it never synchronises the device.
func (s *Stream) Launch(f *Function, grid, block [3]uint32, shmem uint32, args *KernelArgs) error {
	var buf [8]byte
	var offs [1]C.size_t
	argp, offp, n := unsafe.Pointer(&buf[0]), &offs[0], 0
	if args != nil && len(args.offsets) > 0 {
		argp, offp, n = unsafe.Pointer(&args.buf[0]), &args.offsets[0], len(args.offsets)
	}
	return check("cuLaunchKernel("+f.name+")", C.gc_launch(C.uintptr_t(s.ctx), C.uintptr_t(f.handle),
		C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]), C.uint(block[0]), C.uint(block[1]), C.uint(block[2]),
		C.uint(shmem), C.uintptr_t(s.handle), argp, offp, C.int(n)))
}
