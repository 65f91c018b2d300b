package ucc

/*
#include <stdint.h>
#include <stddef.h>
*/
import "C"

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/cgo"
	"strconv"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/store"
)

// oob is the out-of-band allgather UCC wires its context and team up with,
// built on the group's store as PyTorch's ProcessGroupUCC does: the post
// sets this rank's piece under a key of the round, the test checks, without
// blocking, whether every rank's key exists and then reads them all. UCC
// calls the test from its progress loop, so the post must not wait for the
// peers.
//
// Every rank runs the same allgathers in the same order (context, then
// team), so a round counter names them.
type oob struct {
	st         store.Store
	rank, size int
	round      int
	timeout    time.Duration // bounds each store call
	deadline   time.Time     // ends the wire-up (Options.ConnectTimeout)
}

// oobReq is one allgather in progress.
type oobReq struct {
	o    *oob
	keys []string
	dst  unsafe.Pointer
	size int
	done bool
	park time.Duration // the test's sleep while the peers are missing
}

func (o *oob) key(round, rank int) string {
	return "ucc/oob/" + strconv.Itoa(round) + "/" + strconv.Itoa(rank)
}

func (o *oob) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), o.timeout)
}

// The status codes the callbacks return (ucc_status_t).
const (
	oobOK         = C.int(statusOK)
	oobInProgress = C.int(statusInProgress)
	oobError      = C.int(-6) // UCC_ERR_NO_MESSAGE
)

//export goUccOobAllgather
func goUccOobAllgather(info C.uintptr_t, src, dst unsafe.Pointer, size C.size_t, req *C.uintptr_t) C.int {
	o := cgo.Handle(info).Value().(*oob)
	r := &oobReq{o: o, dst: dst, size: int(size)}
	round := o.round
	o.round++
	for p := range o.size {
		r.keys = append(r.keys, o.key(round, p))
	}
	val := C.GoBytes(src, C.int(size))
	ctx, cancel := o.ctx()
	defer cancel()
	if err := o.st.Set(ctx, r.keys[o.rank], val); err != nil {
		slog.Error("gocoll ucc: out-of-band allgather: publishing this rank's address", "rank", o.rank, "err", err)
		return oobError
	}
	*req = C.uintptr_t(cgo.NewHandle(r))
	return oobOK
}

//export goUccOobTest
func goUccOobTest(req C.uintptr_t) C.int {
	r := cgo.Handle(req).Value().(*oobReq)
	if r.done {
		return oobOK
	}
	ctx, cancel := r.o.ctx()
	defer cancel()
	ok, err := r.o.st.Check(ctx, r.keys...)
	if err != nil {
		slog.Error("gocoll ucc: out-of-band allgather: checking the peers' keys", "rank", r.o.rank, "err", err)
		return oobError
	}
	if !ok {
		if time.Now().After(r.o.deadline) {
			slog.Error("gocoll ucc: out-of-band allgather: the peers did not all arrive within ucc.Options.ConnectTimeout", "rank", r.o.rank)
			return oobError
		}
		// UCC's context creation calls the test in a loop: sleep, so that
		// ranks waiting for a late peer do not hammer the store.
		r.park = min(max(2*r.park, 100*time.Microsecond), 10*time.Millisecond)
		time.Sleep(r.park)
		return oobInProgress
	}
	vals, err := r.o.st.MultiGet(ctx, r.keys)
	if err != nil {
		slog.Error("gocoll ucc: out-of-band allgather: reading the peers' keys", "rank", r.o.rank, "err", err)
		return oobError
	}
	dst := unsafe.Slice((*byte)(r.dst), r.size*len(vals))
	for p, v := range vals {
		if len(v) != r.size {
			slog.Error("gocoll ucc: out-of-band allgather: a peer's piece has the wrong size", "rank", r.o.rank, "peer", p,
				"got", len(v), "want", r.size)
			return oobError
		}
		copy(dst[p*r.size:], v)
	}
	r.done = true
	return oobOK
}

//export goUccOobFree
func goUccOobFree(req C.uintptr_t) C.int {
	cgo.Handle(req).Delete()
	return oobOK
}

func (o *oob) String() string {
	return fmt.Sprintf("oob(rank %d of %d, round %d)", o.rank, o.size, o.round)
}
