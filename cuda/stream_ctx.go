// Package cuda loads the CUDA driver API at run time (dlopen of libcuda.so.1)
// and exposes what collectives need: devices, streams, events,
// stream-ordered memory and stream gates. The current stream rides in a
// context.Context, Go's stand-in for PyTorch's thread-local current stream.
//
// Nothing here links against CUDA: the package builds with Go and gcc alone,
// and every entry point returns an error wrapping ErrUnavailable where the
// driver is missing (set GOCOLL_CUDA_LIBRARY to point at libcuda.so.1).
// Every C helper makes the device's primary context current inside the same
// cgo call, since goroutines move between OS threads.
package cuda

/*
#include "dl.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Stream is a CUDA stream on one device. The zero handle is the device's
// legacy default stream.
type Stream struct {
	handle   uintptr // CUstream
	device   int
	ctx      uintptr // primary CUcontext of device
	owned    bool    // created by NewStream, destroyed by Destroy
	priority int
	life     *streamLife // nil for the default stream and after Destroy
}

// streamLife keeps a created stream's CUstream alive while buffers
// allocated on it still have to be freed there. A stream-ordered free is
// ordered by the stream it is queued on, and the allocation stream is the
// one that orders it after everything queued there (the caller's later
// kernels included); but using a handle after cuStreamDestroy is undefined
// behaviour (on nvidia-h200, cuMemFreeAsync on a destroyed stream
// crashed). So Destroy drops the stream's own reference and each live
// Buffer holds one: the driver's stream is destroyed when the last of them
// goes, after that buffer's free is queued. cuStreamDestroy with work
// still queued returns at once and releases the stream once that work is
// done, so the deferral changes nothing for the device.
type streamLife struct {
	handle uintptr
	ctx    uintptr
	refs   atomic.Int64 // the Stream's own (until Destroy) + one per live Buffer
}

// retain takes a reference for a Buffer allocated on the stream.
func (l *streamLife) retain() {
	if l != nil {
		l.refs.Add(1)
	}
}

// release drops a reference; the last one destroys the CUstream.
func (l *streamLife) release() error {
	if l == nil || l.refs.Add(-1) != 0 {
		return nil
	}
	return check("cuStreamDestroy", C.gc_stream_destroy(C.uintptr_t(l.ctx), C.uintptr_t(l.handle)))
}

// Handle returns the CUstream handle (0 for the default stream).
func (s *Stream) Handle() uintptr {
	if s == nil {
		return 0
	}
	return s.handle
}

// Device returns the device ordinal the stream belongs to.
func (s *Stream) Device() int {
	if s == nil {
		return 0
	}
	return s.device
}

// Context returns the primary CUcontext handle the stream belongs to.
func (s *Stream) Context() uintptr {
	if s == nil {
		return 0
	}
	return s.ctx
}

// Priority returns the priority the stream was created with (0 for the
// default stream; lower is higher priority).
func (s *Stream) Priority() int { return s.priority }

// String describes the stream, e.g. "cuda:0/stream 0x5581c2a0".
func (s *Stream) String() string {
	if s == nil || s.handle == 0 {
		return fmt.Sprintf("cuda:%d/default", s.Device())
	}
	return fmt.Sprintf("cuda:%d/stream %#x", s.device, s.handle)
}

type streamKey struct{}

// WithStream returns a context whose current stream is s.
func WithStream(ctx context.Context, s *Stream) context.Context {
	return context.WithValue(ctx, streamKey{}, s)
}

// CurrentStream returns the stream set by WithStream, or nil, which means
// the device's default stream.
func CurrentStream(ctx context.Context) *Stream {
	s, _ := ctx.Value(streamKey{}).(*Stream)
	return s
}

// StreamFor returns ctx's current stream for device d: the stream set by
// WithStream when it is on d, else d's default stream. PyTorch keeps one
// current stream per device; a context carries one, so a stream of another
// device means "the default stream" here.
func StreamFor(ctx context.Context, d *Device) *Stream {
	if s := CurrentStream(ctx); s != nil && s.device == d.ordinal && s.ctx != 0 {
		return s
	}
	return &d.defStream
}

// StreamOptions configure NewStream.
type StreamOptions struct {
	// Blocking makes the stream synchronise with the legacy default stream.
	// The default (false) is CU_STREAM_NON_BLOCKING, as PyTorch's pool uses.
	Blocking bool
	// HighPriority asks for the device's greatest priority. It overrides
	// Priority.
	HighPriority bool
	// Priority is a raw priority, clamped to the device's range; 0 is normal.
	Priority int
}

// NewStream creates a stream on d.
func (d *Device) NewStream(opts StreamOptions) (*Stream, error) {
	least, greatest, err := d.StreamPriorityRange()
	if err != nil {
		return nil, err
	}
	prio := opts.Priority
	if opts.HighPriority {
		prio = greatest
	}
	prio = max(min(prio, least), greatest)
	flags := C.unsigned(1) // CU_STREAM_NON_BLOCKING
	if opts.Blocking {
		flags = 0
	}
	var h C.uintptr_t
	if err := check("cuStreamCreateWithPriority", C.gc_stream_create(C.uintptr_t(d.ctx), &h, flags, C.int(prio))); err != nil {
		return nil, err
	}
	l := &streamLife{handle: uintptr(h), ctx: d.ctx}
	l.refs.Store(1)
	return &Stream{handle: uintptr(h), device: d.ordinal, ctx: d.ctx, owned: true, priority: prio, life: l}, nil
}

// Destroy releases a stream made by NewStream. Work already queued on it
// still runs. Destroying the default stream is a no-op. After Destroy the
// Stream's handle reads 0 and the stream must not be used; buffers
// allocated on it stay valid, and each is still freed in the stream's
// order when its last reference goes (the driver's stream is destroyed
// then, after the last of those frees is queued).
func (s *Stream) Destroy() error {
	if s == nil || !s.owned || s.handle == 0 {
		return nil
	}
	l := s.life
	s.handle, s.owned, s.life = 0, false, nil
	return l.release()
}

// Query reports, without blocking, whether everything queued on s is done.
func (s *Stream) Query() (bool, error) {
	r := C.gc_stream_query(C.uintptr_t(s.ctx), C.uintptr_t(s.handle))
	if r == resultNotReady {
		return false, nil
	}
	return r == 0, check("cuStreamQuery", r)
}

// Synchronize blocks the calling thread until s is idle.
func (s *Stream) Synchronize() error {
	return check("cuStreamSynchronize", C.gc_stream_sync(C.uintptr_t(s.ctx), C.uintptr_t(s.handle)))
}

// SynchronizeContext polls s until it is idle or ctx is done. Unlike
// Synchronize it can be abandoned, which a rank waiting on a dead peer needs.
func (s *Stream) SynchronizeContext(ctx context.Context) error {
	for delay := 5 * time.Microsecond; ; delay = min(2*delay, time.Millisecond) {
		done, err := s.Query()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cuda: waiting for %v: %w", s, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// WaitEvent makes s wait until e has completed, without blocking the host.
func (s *Stream) WaitEvent(e *Event) error {
	return check("cuStreamWaitEvent", C.gc_stream_wait_event(C.uintptr_t(s.ctx), C.uintptr_t(s.handle), C.uintptr_t(e.handle)))
}

// WaitStream makes s wait for everything queued on other so far, through
// the event e (recorded on other). One cgo crossing.
func (s *Stream) WaitStream(other *Stream, e *Event) error {
	return check("cuEventRecord/cuStreamWaitEvent", C.gc_record_wait(C.uintptr_t(s.ctx), C.uintptr_t(e.handle),
		C.uintptr_t(other.handle), C.uintptr_t(s.handle)))
}
