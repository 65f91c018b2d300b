package cuda

/*
#include "dl.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/gocoll/gocoll/internal/dl"
)

// LibraryEnv names the environment variable that points at libcuda.
const LibraryEnv = "GOCOLL_CUDA_LIBRARY"

// ErrUnavailable is returned (wrapped) when libcuda cannot be loaded or no
// device is present. backends map it to backend.ErrUnavailable.
var ErrUnavailable = errors.New("cuda: unavailable")

// ErrNoDevice is wrapped by ErrUnavailable errors when the driver loads but
// reports no device; tests skip on it with "no CUDA device".
var ErrNoDevice = errors.New("no CUDA device")

// Result codes that callers branch on.
const (
	resultSuccess      = 0
	resultNotReady     = 600
	resultNotSupported = 801
)

// Error is a failed driver call: the entry point and the CUresult.
type Error struct {
	Call string // the driver entry point, e.g. "cuMemAllocAsync"
	Code int    // the CUresult
}

// Error reads "cuda: cuMemAllocAsync: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory".
func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d): %s", e.Call, C.GoString(C.gc_error_name(C.CUresult(e.Code))), e.Code,
		C.GoString(C.gc_error_string(C.CUresult(e.Code))))
}

func check(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r)}
}

// loader holds the outcome of the one dlopen of libcuda. The library is
// process-wide by nature (the C side keeps its entry points), so this is the
// package's one piece of global state, set once.
var loader struct {
	once sync.Once
	err  error
	lib  *dl.Library
}

// spec says where Load looks for libcuda and which entry points it binds:
// those of dl.c's table.
func spec() dl.Spec {
	syms := make([]dl.Symbol, int(C.gc_sym_count()))
	for i := range syms {
		syms[i] = dl.Symbol{Name: C.GoString(C.gc_sym_name(C.int(i))), Optional: C.gc_sym_required(C.int(i)) == 0}
	}
	return dl.Spec{What: "the CUDA driver library libcuda.so.1", Env: LibraryEnv, Symbols: syms,
		Candidates: []string{"libcuda.so.1", "libcuda.so", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1"}}
}

// Load opens libcuda (GOCOLL_CUDA_LIBRARY, else the soname) and calls
// cuInit. It is called by every other entry point and is cheap after the
// first call. The error wraps ErrUnavailable and names the library and the
// variable that points to it.
func Load() error {
	loader.once.Do(func() {
		lib, err := dl.Open(spec())
		if err != nil {
			loader.err = fmt.Errorf("%w: %w", ErrUnavailable, err)
			return
		}
		addrs := lib.Addrs()
		C.gc_bind((*C.uintptr_t)(unsafe.Pointer(&addrs[0])))
		// The library loaded but cuInit failed: no device, or driver trouble.
		if r := C.gc_init(); r != 0 {
			msg := fmt.Sprintf("cuInit: %s (%d)", C.GoString(C.gc_error_name(r)), int(r))
			if r == 100 { // CUDA_ERROR_NO_DEVICE
				loader.err = fmt.Errorf("%w: %w: %s", ErrUnavailable, ErrNoDevice, msg)
			} else {
				loader.err = fmt.Errorf("%w: %s", ErrUnavailable, msg)
			}
			return
		}
		loader.lib = lib
	})
	return loader.err
}

// LibraryPath returns the path Load opened, or "" before a successful Load.
func LibraryPath() string {
	if Load() != nil {
		return ""
	}
	return loader.lib.Path()
}

// Symbol returns the address of a libcuda entry point, for C code in other
// packages (the NCCL backend) that calls the driver inside its own helpers.
// The error names the symbol, the library and LibraryEnv.
func Symbol(name string) (uintptr, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	return loader.lib.Lookup(name)
}

// DriverVersion returns the driver's CUDA version, 1000*major + 10*minor.
func DriverVersion() (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var v C.int
	if err := check("cuDriverGetVersion", C.gc_driver_version(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// DeviceCount returns the number of CUDA devices. Without a driver it
// returns an error wrapping ErrUnavailable.
func DeviceCount() (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var n C.int
	if err := check("cuDeviceGetCount", C.gc_device_count(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Available reports whether at least one CUDA device can be used, and if
// not, why (an error wrapping ErrUnavailable). Tests skip with that reason.
func Available() error {
	n, err := DeviceCount()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: %w", ErrUnavailable, ErrNoDevice)
	}
	return nil
}
