package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

// The raw NCCL peer of conftest bench: the NCCL calls of each op, straight
// from C on the backend's own communicator and internal stream, with no
// Go, dispatcher or Work in between. Types are NCCL's ABI (nccl.h is not
// needed): ncclFloat32 = 7, ncclSum = 0, enums are ints.
typedef int (*gb_allreduce_t)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*gb_allgather_t)(const void *, void *, size_t, int, void *, void *);
typedef int (*gb_reducescatter_t)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*gb_broadcast_t)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*gb_reduce_t)(const void *, void *, size_t, int, int, int, void *, void *);
typedef int (*gb_send_t)(const void *, size_t, int, int, void *, void *);
typedef int (*gb_recv_t)(void *, size_t, int, int, void *, void *);
typedef int (*gb_group_t)(void);
typedef const char *(*gb_errstr_t)(int);
typedef int (*gb_ctx_t)(void *);
typedef int (*gb_sync_t)(void *);

static struct {
	gb_allreduce_t allreduce;
	gb_allgather_t allgather;
	gb_reducescatter_t reducescatter;
	gb_broadcast_t broadcast;
	gb_reduce_t reduce;
	gb_send_t send;
	gb_recv_t recv;
	gb_group_t group_start, group_end;
	gb_errstr_t errstr;
	gb_ctx_t set_ctx;
	gb_sync_t sync;
} gb;

// gb_raw_init binds the entry points of the libnccl the backend loaded
// (RTLD_NOLOAD: the same handle, not a second copy) and the two driver
// calls; 0 on success, else the index of the missing symbol + 1.
static int gb_raw_init(const char *path, uintptr_t set_ctx, uintptr_t sync) {
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL) return -1;
	const char *names[] = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
		"ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd", "ncclGetErrorString"};
	void **slots[] = {(void **)&gb.allreduce, (void **)&gb.allgather, (void **)&gb.reducescatter, (void **)&gb.broadcast,
		(void **)&gb.reduce, (void **)&gb.send, (void **)&gb.recv, (void **)&gb.group_start, (void **)&gb.group_end,
		(void **)&gb.errstr};
	for (int i = 0; i < 10; i++) {
		*slots[i] = dlsym(h, names[i]);
		if (*slots[i] == NULL) return i + 1;
	}
	gb.set_ctx = (gb_ctx_t)set_ctx;
	gb.sync = (gb_sync_t)sync;
	return 0;
}

static const char *gb_errstr(int r) { return gb.errstr(r); }

enum { GB_ALLREDUCE, GB_ALLGATHER, GB_REDUCESCATTER, GB_BROADCAST, GB_REDUCE, GB_ALLTOALL, GB_SENDRECV };

// gb_raw_run queues iters calls of op back to back on stream s and then
// synchronises s once: nccl-tests' timing loop. count is nccl-tests'
// count (the largest buffer's elements). Returns an ncclResult_t, or
// 1000 + a CUresult.
static int gb_raw_run(int op, int iters, uintptr_t ctx, uintptr_t comm, uintptr_t s, uintptr_t in, uintptr_t out,
		size_t count, int rank, int n) {
	int r = gb.set_ctx((void *)ctx);
	if (r) return 1000 + r;
	void *c = (void *)comm, *st = (void *)s;
	size_t part = count / (size_t)n;
	for (int it = 0; it < iters; it++) {
		switch (op) {
		case GB_ALLREDUCE: r = gb.allreduce((void *)in, (void *)out, count, 7, 0, c, st); break;
		case GB_ALLGATHER: r = gb.allgather((void *)in, (void *)out, part, 7, c, st); break;
		case GB_REDUCESCATTER: r = gb.reducescatter((void *)in, (void *)out, part, 7, 0, c, st); break;
		case GB_BROADCAST: r = gb.broadcast((void *)in, (void *)out, count, 7, 0, c, st); break;
		case GB_REDUCE: r = gb.reduce((void *)in, (void *)out, count, 7, 0, 0, c, st); break;
		case GB_ALLTOALL:
			// nccl-tests' alltoall: one send and one receive per peer in a group.
			r = gb.group_start();
			for (int p = 0; p < n && r == 0; p++) {
				r = gb.send((char *)in + p * part * 4, part, 7, p, c, st);
				if (r == 0) r = gb.recv((char *)out + p * part * 4, part, 7, p, c, st);
			}
			if (r == 0) r = gb.group_end(); else gb.group_end();
			break;
		case GB_SENDRECV:
			r = gb.group_start();
			if (r == 0) r = gb.send((void *)in, count, 7, (rank + 1) % n, c, st);
			if (r == 0) r = gb.recv((void *)out, count, 7, (rank - 1 + n) % n, c, st);
			if (r == 0) r = gb.group_end(); else gb.group_end();
			break;
		default: return 5; // ncclInvalidUsage
		}
		if (r) return r;
	}
	r = gb.sync(st);
	return r ? 1000 + r : 0;
}
*/
import "C"

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/tensor"
)

// rawNCCLName is the raw NCCL peer's series.
const rawNCCLName = "raw-nccl"

// rawNCCL runs each op as NCCL calls from C on the nccl backend's own
// communicator and internal stream: the peer that shows what the backend
// adds over NCCL itself, measured in the same process between our runs.
type rawNCCL struct {
	comm, ctx uintptr
	stream    *cuda.Stream
	rank, n   int
}

func newRawNCCL(ctx context.Context, pg *dispatcher.ProcessGroup, dev *benchDevice) (*rawNCCL, error) {
	if dev.dev == nil {
		return nil, errNoRawNCCL
	}
	b, err := pg.Backend(tensor.CUDA)
	if err != nil {
		return nil, err
	}
	nb, ok := b.(*nccl.Backend)
	if !ok {
		return nil, fmt.Errorf("--raw-nccl: the CUDA backend is %T, not nccl's", b)
	}
	comm, err := nb.Comm(ctx, dev.dev.Ordinal())
	if err != nil {
		return nil, err
	}
	s, err := nb.Stream(ctx, dev.dev.Ordinal())
	if err != nil {
		return nil, err
	}
	setCtx, err := cuda.Symbol("cuCtxSetCurrent")
	if err != nil {
		return nil, err
	}
	sync, err := cuda.Symbol("cuStreamSynchronize")
	if err != nil {
		return nil, err
	}
	path := C.CString(nccl.LibraryPath())
	defer C.free(unsafe.Pointer(path))
	if r := C.gb_raw_init(path, C.uintptr_t(setCtx), C.uintptr_t(sync)); r != 0 {
		return nil, fmt.Errorf("--raw-nccl: binding %s failed (%d)", nccl.LibraryPath(), int(r))
	}
	return &rawNCCL{comm: comm, ctx: s.Context(), stream: s, rank: pg.Rank(), n: pg.Size()}, nil
}

func (*rawNCCL) name() string { return rawNCCLName }

func (*rawNCCL) supports(op string, inPlace bool, n int) bool {
	return !(inPlace && (op == opAlltoall || op == opSendrecv)) // nccl-tests has no in-place for them either
}

func (r *rawNCCL) run(_ context.Context, c *benchCase, iters int) error {
	op := map[string]C.int{opAllreduce: C.GB_ALLREDUCE, opAllgather: C.GB_ALLGATHER, opReduceScatter: C.GB_REDUCESCATTER,
		opBroadcast: C.GB_BROADCAST, opReduce: C.GB_REDUCE, opAlltoall: C.GB_ALLTOALL, opSendrecv: C.GB_SENDRECV}[c.op]
	res := C.gb_raw_run(op, C.int(iters), C.uintptr_t(r.ctx), C.uintptr_t(r.comm), C.uintptr_t(r.stream.Handle()),
		C.uintptr_t(c.in.Ptr()), C.uintptr_t(c.out.Ptr()), C.size_t(c.count), C.int(r.rank), C.int(r.n))
	switch {
	case res == 0:
		return nil
	case res >= 1000:
		return &cuda.Error{Call: "raw-nccl", Code: int(res - 1000)}
	}
	return fmt.Errorf("raw-nccl %s: %s (%d)", c.op, C.GoString(C.gb_errstr(res)), int(res))
}
