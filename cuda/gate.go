package cuda

/*
#include "dl.h"
*/
import "C"

import (
	"sync/atomic"
)

// Stream-wait flags (CU_STREAM_WAIT_VALUE_*).
const (
	waitValueGEQ = 0
)

// Gate holds streams until the host opens it: Hold queues
// cuStreamWaitValue32_v2(stream, word, 1, GEQ) on a word of pinned,
// device-mapped host memory, and Open writes 1 into that word from the host.
// Tests use gates to keep a stream busy deterministically.
//
// The trap (GPU.md): while a gate is closed, anything that synchronises the
// whole device (cuMemAlloc, cuMemFreeHost, communicator creation,
// cuCtxSynchronize) waits on the gated stream and hangs. Create
// communicators and buffers first, use only stream-ordered calls while a
// gate is closed, and Open every gate in a deferred cleanup.
type Gate struct {
	mem  *HostBuffer
	word *uint32
}

// NewGate returns a closed gate on d.
func (d *Device) NewGate() (*Gate, error) {
	m, err := d.HostAlloc(64, HostDeviceMap|HostPortable)
	if err != nil {
		return nil, err
	}
	g := &Gate{mem: m, word: (*uint32)(m.Pointer())}
	atomic.StoreUint32(g.word, 0)
	return g, nil
}

// Hold makes s wait, from this point of its queue, until the gate opens.
func (g *Gate) Hold(s *Stream) error {
	return check("cuStreamWaitValue32_v2", C.gc_stream_wait_value32(C.uintptr_t(s.ctx), C.uintptr_t(s.handle),
		C.CUdeviceptr(g.mem.DevicePtr()), 1, waitValueGEQ))
}

// Open releases every stream held by the gate. It is idempotent.
func (g *Gate) Open() { atomic.StoreUint32(g.word, 1) }

// IsOpen reports whether Open was called.
func (g *Gate) IsOpen() bool { return atomic.LoadUint32(g.word) != 0 }

// Free opens the gate and releases its memory. Call it only once no other
// gate is closed (cuMemFreeHost may synchronise the device).
func (g *Gate) Free() error {
	g.Open()
	return g.mem.Free()
}

// Reset closes an opened gate again, so that it can hold streams anew
// (staging reuses its gates). Call it only once no stream is still
// waiting on the gate: such a stream would stay held.
func (g *Gate) Reset() { atomic.StoreUint32(g.word, 0) }
