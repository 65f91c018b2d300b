package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/dl"
)

// LibraryEnv names the environment variable that points at libucc.
const LibraryEnv = "GOCOLL_UCC_LIBRARY"

// MpoolElemSizeEnv is UCC's own variable for the size of each buffer of
// its host memory pool, where its collectives take their scratch space.
// Load sets it to DefaultMpoolElemSize before UCC reads it, unless it is
// set already (a user's value wins).
//
// Why: UCC's default (1 MiB) sends the scratch of any larger collective
// to malloc and free, once per op. In a C program of one thread that
// memory comes back from glibc's main arena warm; the backend's UCC calls
// come from whichever threads Go runs its goroutines on, each with its own
// glibc arena, which gives freed memory back to the kernel and faults it
// in again: at 16 MiB, about 350 page faults per allreduce (5641 in 16 ops
// where the raw libucc loop had none), a millisecond of a 3 ms op. With
// pool buffers of 32 MiB (glibc's largest mmap threshold: above it every
// malloc is a fresh mapping anyway, in any program) the scratch stays
// mapped: 6 faults. The pool grows on demand (UCC_MC_CPU_MPOOL_MAX_ELEMS
// buffers at most, 8 by default) and only the pages a collective touches
// become resident. conftest bench gives the raw libucc loop the same
// value, so that both run with the same UCC settings.
const MpoolElemSizeEnv = "UCC_MC_CPU_MPOOL_ELEM_SIZE"

// DefaultMpoolElemSize is the value Load gives MpoolElemSizeEnv.
const DefaultMpoolElemSize = "32mb"

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
		if _, set := os.LookupEnv(MpoolElemSizeEnv); !set {
			// Before the library loads: UCC reads its components'
			// variables then.
			if err := os.Setenv(MpoolElemSizeEnv, DefaultMpoolElemSize); err != nil {
				lib.err = fmt.Errorf("%w: ucc: setting %s: %w", backend.ErrUnavailable, MpoolElemSizeEnv, err)
				return
			}
		}
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
