package cuda

/*
#include "dl.h"
*/
import "C"

import (
	"context"
	"fmt"
	"time"
)

// Event flags (CUevent_flags).
const (
	eventDefault       = 0
	eventDisableTiming = 2
)

// Event is a CUDA event. Events are created with timing disabled unless
// asked, as PyTorch does: that is the fastest kind to record, query and wait.
type Event struct {
	handle uintptr
	ctx    uintptr
	device int
	timing bool
}

// NewEvent creates an event on d; timing enables ElapsedTime.
func (d *Device) NewEvent(timing bool) (*Event, error) {
	flags := C.unsigned(eventDisableTiming)
	if timing {
		flags = eventDefault
	}
	var h C.uintptr_t
	if err := check("cuEventCreate", C.gc_event_create(C.uintptr_t(d.ctx), &h, flags)); err != nil {
		return nil, err
	}
	return &Event{handle: uintptr(h), ctx: d.ctx, device: d.ordinal, timing: timing}, nil
}

// Handle returns the CUevent handle.
func (e *Event) Handle() uintptr { return e.handle }

// Timing reports whether the event records timestamps.
func (e *Event) Timing() bool { return e.timing }

// Device returns the device ordinal.
func (e *Event) Device() int { return e.device }

// Record captures the work queued on s so far.
func (e *Event) Record(s *Stream) error {
	return check("cuEventRecord", C.gc_event_record(C.uintptr_t(e.ctx), C.uintptr_t(e.handle), C.uintptr_t(s.Handle())))
}

// Query reports, without blocking, whether the captured work has completed.
// An event never recorded counts as completed (CUDA's rule).
func (e *Event) Query() (bool, error) {
	r := C.gc_event_query(C.uintptr_t(e.ctx), C.uintptr_t(e.handle))
	if r == resultNotReady {
		return false, nil
	}
	return r == 0, check("cuEventQuery", r)
}

// Synchronize blocks the thread until the event has completed.
func (e *Event) Synchronize() error {
	return check("cuEventSynchronize", C.gc_event_sync(C.uintptr_t(e.ctx), C.uintptr_t(e.handle)))
}

// Wait polls the event until it completes or ctx is done; unlike
// Synchronize it can be abandoned.
func (e *Event) Wait(ctx context.Context) error {
	for delay := 2 * time.Microsecond; ; delay = min(2*delay, time.Millisecond) {
		done, err := e.Query()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cuda: waiting for event: %w", ctx.Err())
		case <-time.After(delay):
		}
	}
}

// ElapsedTime returns the time between two completed timing events.
func ElapsedTime(start, end *Event) (time.Duration, error) {
	var ms C.float
	if err := check("cuEventElapsedTime", C.gc_event_elapsed(C.uintptr_t(start.ctx), &ms, C.uintptr_t(start.handle), C.uintptr_t(end.handle))); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Destroy releases the event. Pending waits on it still resolve.
func (e *Event) Destroy() error {
	if e == nil || e.handle == 0 {
		return nil
	}
	h := e.handle
	e.handle = 0
	return check("cuEventDestroy", C.gc_event_destroy(C.uintptr_t(e.ctx), C.uintptr_t(h)))
}

// NewEvents creates n events on d in one cgo crossing, for pools.
func (d *Device) NewEvents(n int, timing bool) ([]*Event, error) {
	flags := C.unsigned(eventDisableTiming)
	if timing {
		flags = eventDefault
	}
	hs := make([]C.uintptr_t, n)
	if err := check("cuEventCreate", C.gc_event_create_n(C.uintptr_t(d.ctx), &hs[0], C.int(n), flags)); err != nil {
		return nil, err
	}
	out := make([]*Event, n)
	for i, h := range hs {
		out[i] = &Event{handle: uintptr(h), ctx: d.ctx, device: d.ordinal, timing: timing}
	}
	return out, nil
}
