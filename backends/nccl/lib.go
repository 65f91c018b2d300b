package nccl

/*
#include "nccl_dl.h"
*/
import "C"

import (
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/internal/dl"
)

// LibraryEnv names the environment variable that points at libnccl.
const LibraryEnv = "GOCOLL_NCCL_LIBRARY"

// NCCL result codes the backend branches on.
const (
	ncclSuccess         = 0
	ncclInvalidArgument = 4
	ncclInvalidUsage    = 5
	ncclRemoteError     = 6
	ncclInProgress      = 7
)

// Error is a failed NCCL call.
type Error struct {
	Call   string // e.g. "ncclAllReduce"
	Code   int    // ncclResult_t
	Detail string // ncclGetLastError at the time, if any
}

// Error reads "nccl: ncclCommInitRankConfig: unhandled system error (2): <last error>".
func (e *Error) Error() string {
	s := fmt.Sprintf("nccl: %s: %s (%d)", e.Call, C.GoString(C.gn_error_string(C.int(e.Code))), e.Code)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// result turns gn_* return codes into errors: NCCL results, or CUDA errors
// offset by GN_CUDA_ERR.
func result(call string, r C.int) error {
	r &^= C.GN_CAPTURING
	switch {
	case r == 0 || r == ncclInProgress:
		return nil
	case r >= C.GN_CUDA_ERR:
		return &cuda.Error{Call: call, Code: int(r - C.GN_CUDA_ERR)}
	}
	return &Error{Call: call, Code: int(r), Detail: strings.TrimSpace(C.GoString(C.gn_last_error()))}
}

// lib is the outcome of the one dlopen of libnccl (process-wide, set once).
var lib struct {
	once    sync.Once
	err     error
	dl      *dl.Library
	version int
}

// spec says where Load looks for libnccl and which entry points it binds:
// those of nccl_dl.c's table.
func spec() dl.Spec {
	syms := make([]dl.Symbol, int(C.gn_sym_count()))
	for i := range syms {
		syms[i] = dl.Symbol{Name: C.GoString(C.gn_sym_name(C.int(i))), Optional: C.gn_sym_required(C.int(i)) == 0}
	}
	return dl.Spec{What: "the NCCL library libnccl.so.2", Env: LibraryEnv, Symbols: syms,
		Candidates: []string{"libnccl.so.2", "libnccl.so", "/usr/lib/x86_64-linux-gnu/libnccl.so.2",
			"/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"}}
}

// cudaSyms are the driver entry points that nccl_dl.c calls around NCCL
// (gn_set_cuda's parameters, in order).
var cudaSyms = [...]string{"cuCtxGetCurrent", "cuCtxSetCurrent", "cuEventRecord", "cuStreamWaitEvent", "cuStreamIsCapturing"}

// Load opens libcuda and libnccl (GOCOLL_NCCL_LIBRARY, else the soname). The
// error wraps backend.ErrUnavailable and names the library and its variable.
func Load() error {
	lib.once.Do(func() {
		if err := cuda.Load(); err != nil {
			lib.err = fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
			return
		}
		var ptrs [len(cudaSyms)]uintptr
		for i, name := range cudaSyms {
			p, err := cuda.Symbol(name)
			if err != nil {
				lib.err = fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
				return
			}
			ptrs[i] = p
		}
		C.gn_set_cuda(C.uintptr_t(ptrs[0]), C.uintptr_t(ptrs[1]), C.uintptr_t(ptrs[2]), C.uintptr_t(ptrs[3]), C.uintptr_t(ptrs[4]))
		l, err := dl.Open(spec())
		if err != nil {
			lib.err = fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
			return
		}
		addrs := l.Addrs()
		C.gn_bind((*C.uintptr_t)(unsafe.Pointer(&addrs[0])))
		lib.dl = l
		var v C.int
		C.gn_version(&v)
		lib.version = int(v)
		if lib.version < 21800 {
			lib.err = fmt.Errorf("%w: %s is NCCL %d; gocoll needs 2.18 or newer (set %s)", backend.ErrUnavailable, l.Path(), lib.version, LibraryEnv)
		}
	})
	return lib.err
}

// Version returns the loaded NCCL's version code (e.g. 22803 for 2.28.3).
func Version() (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	return lib.version, nil
}

// VersionString formats a version code as "2.28.3".
func VersionString(code int) string {
	if code >= 10000 { // NCCL_VERSION's scheme after 2.8: X*10000+Y*100+Z
		return fmt.Sprintf("%d.%d.%d", code/10000, code/100%100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/1000, code/100%10, code%100)
}

// LibraryPath returns the path of the loaded libnccl, or "".
func LibraryPath() string {
	if Load() != nil {
		return ""
	}
	return lib.dl.Path()
}

// hasSymbol reports whether the loaded NCCL exports name.
func hasSymbol(name string) bool { return lib.dl != nil && lib.dl.Has(name) }

// configLayout returns sizeof and the field offsets of the hand-declared
// ncclConfig_t, for the ABI test.
func configLayout() (size int, offsets []int) {
	for i := 0; ; i++ {
		o := C.gn_config_offset(C.int(i))
		if o == C.size_t(^uint(0)) {
			break
		}
		offsets = append(offsets, int(o))
	}
	return int(C.gn_config_size()), offsets
}
