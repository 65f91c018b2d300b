// Package dl opens a shared library at run time and resolves its entry
// points, for the packages that bind a native library without linking
// against it: cuda (libcuda.so.1) and backends/nccl (libnccl.so.2).
//
// It is the bottom layer of go-nvml's three (pkg/dl, the library's loader,
// its API): dlopen and dlsym behind one Spec, and errors that say which
// library, which path, which symbol and which environment variable points
// at the library. The packages above keep their entry points and their
// signatures in C, where the calls are made; they hand this package the
// names and take back the addresses.
package dl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

// gd_open is dlopen with its error read on the same thread, as dlerror
// requires; one cgo call does both.
static void *gd_open(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
	}
	return h;
}
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"unsafe"
)

// Symbol is one entry point of a library.
type Symbol struct {
	Name string
	// Optional symbols may be missing (entry points of newer versions);
	// their address is 0.
	Optional bool
}

// Spec says which library to open, where to look for it, and what it must
// export.
type Spec struct {
	// What names the library in errors, as a user knows it: "the NCCL
	// library libnccl.so.2".
	What string
	// Env names the environment variable that points at the library. When
	// it is set, its value is the only path tried.
	Env string
	// Candidates are the paths tried in order when Env is unset.
	Candidates []string
	// Symbols are resolved on each candidate; one that lacks a required
	// symbol is closed and the next is tried.
	Symbols []Symbol
}

// Library is an opened library with its symbols resolved.
type Library struct {
	spec   Spec
	path   string
	handle unsafe.Pointer
	addrs  []uintptr
}

// Error is a library that could not be opened or lacks a symbol.
type Error struct {
	What   string   // the library, as Spec.What
	Env    string   // the variable that points at it
	Path   string   // the path opened, for a missing symbol after Open
	Symbol string   // the missing symbol, for Lookup
	Tried  []string // why each candidate failed, for Open
}

// Error reads "cannot load the NCCL library libnccl.so.2 (set
// GOCOLL_NCCL_LIBRARY to its path): <why each path failed>", or "symbol
// ncclFoo not found in /usr/lib/libnccl.so.2 (the NCCL library
// libnccl.so.2; set GOCOLL_NCCL_LIBRARY to use another)".
func (e *Error) Error() string {
	if e.Symbol != "" {
		return fmt.Sprintf("symbol %s not found in %s (%s; set %s to use another)", e.Symbol, e.Path, e.What, e.Env)
	}
	return fmt.Sprintf("cannot load %s (set %s to its path): %s", e.What, e.Env, strings.Join(e.Tried, "; "))
}

// Open opens the library: the path in s.Env if it is set, else the first
// of s.Candidates that opens and exports every required symbol.
func Open(s Spec) (*Library, error) {
	paths := s.Candidates
	if p := os.Getenv(s.Env); p != "" {
		paths = []string{p}
	}
	var tried []string
	for _, p := range paths {
		l, why := open(s, p)
		if l != nil {
			return l, nil
		}
		tried = append(tried, why)
	}
	return nil, &Error{What: s.What, Env: s.Env, Tried: tried}
}

// open tries one path; it returns the library, or why the path failed.
func open(s Spec, path string) (*Library, string) {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	var buf [512]C.char
	h := C.gd_open(cp, &buf[0], C.size_t(len(buf)))
	if h == nil {
		return nil, C.GoString(&buf[0])
	}
	l := &Library{spec: s, path: path, handle: h, addrs: make([]uintptr, len(s.Symbols))}
	for i, sym := range s.Symbols {
		l.addrs[i] = l.sym(sym.Name)
		if l.addrs[i] == 0 && !sym.Optional {
			C.dlclose(h)
			return nil, fmt.Sprintf("%s: symbol %s not found", path, sym.Name)
		}
	}
	return l, ""
}

func (l *Library) sym(name string) uintptr {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	return uintptr(C.dlsym(l.handle, cn))
}

// Path returns the path that was opened.
func (l *Library) Path() string { return l.path }

// Addrs returns the addresses of Spec.Symbols, in order; 0 for a missing
// optional one. The caller hands them to its C side.
func (l *Library) Addrs() []uintptr { return l.addrs }

// Lookup returns the address of name, which need not be among
// Spec.Symbols, or an *Error naming the symbol, the library and its
// variable.
func (l *Library) Lookup(name string) (uintptr, error) {
	if p := l.sym(name); p != 0 {
		return p, nil
	}
	return 0, &Error{What: l.spec.What, Env: l.spec.Env, Path: l.path, Symbol: name}
}

// Has reports whether the library exports name.
func (l *Library) Has(name string) bool { return l.sym(name) != 0 }
