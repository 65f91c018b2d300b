package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/dl"
)

// LibraryEnv names the environment variable that points at libucc.
const LibraryEnv = "GOCOLL_UCC_LIBRARY"

// UCC status codes the backend branches on (ucc_status_t).
const (
	statusOK             = 0
	statusInProgress     = 1
	statusInitialized    = 2
	statusNotSupported   = -1
	statusNotImplemented = -2
)

// Error is a failed UCC call.
type Error struct {
	Call   string // e.g. "ucc_collective_init"
	Status int    // ucc_status_t
}

// Error reads "ucc: ucc_collective_init: Operation is not supported (-1)".
func (e *Error) Error() string {
	return fmt.Sprintf("ucc: %s: %s (%d)", e.Call, C.GoString(C.gu_status_string(C.int(e.Status))), e.Status)
}

// unsupported reports whether UCC said it has no algorithm for the call.
func (e *Error) unsupported() bool {
	return e.Status == statusNotSupported || e.Status == statusNotImplemented
}

func result(call string, st C.int) error {
	if st == statusOK || st == statusInProgress || st == statusInitialized {
		return nil
	}
	return &Error{Call: call, Status: int(st)}
}

// lib is the outcome of the one dlopen of libucc (process-wide).
var lib struct {
	once sync.Once
	err  error
	dl   *dl.Library
}

// spec says where Load looks for libucc and which entry points it binds:
// those of ucc_dl.c's table.
func spec() dl.Spec {
	syms := make([]dl.Symbol, int(C.gu_sym_count()))
	for i := range syms {
		syms[i] = dl.Symbol{Name: C.GoString(C.gu_sym_name(C.int(i))), Optional: C.gu_sym_required(C.int(i)) == 0}
	}
	return dl.Spec{What: "the UCC library libucc.so.1", Env: LibraryEnv, Symbols: syms,
		Candidates: []string{"libucc.so.1", "libucc.so", "/usr/lib/x86_64-linux-gnu/libucc.so.1", "/opt/hpcx/ucc/lib/libucc.so.1", "/usr/local/ucc/lib/libucc.so.1"}}
}

// Load opens libucc (GOCOLL_UCC_LIBRARY, else the soname). The error wraps
// backend.ErrUnavailable and names the library and its variable.
func Load() error {
	lib.once.Do(func() {
		l, err := dl.Open(spec())
		if err != nil {
			lib.err = fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
			return
		}
		addrs := l.Addrs()
		C.gu_bind((*C.uintptr_t)(unsafe.Pointer(&addrs[0])))
		lib.dl = l
	})
	return lib.err
}

// Version returns the loaded UCC's version string, e.g. "1.9.0".
func Version() (string, error) {
	if err := Load(); err != nil {
		return "", err
	}
	return C.GoString(C.gu_version_string()), nil
}

// LibraryPath returns the path of the loaded libucc, or "".
func LibraryPath() string {
	if Load() != nil {
		return ""
	}
	return lib.dl.Path()
}

// layout returns sizeof (f = -1) or field f's offset of hand-declared
// struct s (ucc_dl.c's numbering), for the ABI test; -1 past the end.
func layout(s, f int) int {
	v := C.gu_layout(C.int(s), C.int(f))
	if v == C.size_t(^uint(0)) {
		return -1
	}
	return int(v)
}
