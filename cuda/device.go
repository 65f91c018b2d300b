package cuda

/*
#include "dl.h"
*/
import "C"

import (
	"fmt"
	"sync"
)

// Device is a CUDA device with its primary context retained. Everything this
// package creates lives in primary contexts, because NCCL (a cudart user)
// and its threads use them; a private cuCtxCreate context would not match.
type Device struct {
	ordinal int
	dev     C.CUdevice
	ctx     uintptr // CUcontext of the primary context

	defStream Stream
}

// devices is the registry of opened devices: one *Device per ordinal, so
// that the primary context is retained once per process.
var devices struct {
	mu sync.Mutex
	m  map[int]*Device
}

// GetDevice returns device ordinal i, retaining its primary context on first
// use. The Device is shared and never released before the process exits.
func GetDevice(i int) (*Device, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	devices.mu.Lock()
	defer devices.mu.Unlock()
	if d := devices.m[i]; d != nil {
		return d, nil
	}
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	if i < 0 || i >= n {
		if n == 0 {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, ErrNoDevice)
		}
		return nil, fmt.Errorf("cuda: device %d out of range (%d devices)", i, n)
	}
	d := &Device{ordinal: i}
	if err := check("cuDeviceGet", C.gc_device_get(&d.dev, C.int(i))); err != nil {
		return nil, err
	}
	var ctx C.uintptr_t
	if err := check("cuDevicePrimaryCtxRetain", C.gc_primary_retain(&ctx, d.dev)); err != nil {
		return nil, err
	}
	d.ctx = uintptr(ctx)
	d.defStream = Stream{handle: 0, device: i, ctx: d.ctx}
	if devices.m == nil {
		devices.m = map[int]*Device{}
	}
	devices.m[i] = d
	return d, nil
}

// Ordinal returns the device's index.
func (d *Device) Ordinal() int { return d.ordinal }

// Context returns the CUcontext handle of the device's primary context, for
// C helpers in other packages that must make it current.
func (d *Device) Context() uintptr { return d.ctx }

// Name returns the product name, e.g. "NVIDIA H200".
func (d *Device) Name() (string, error) {
	var buf [256]C.char
	if err := check("cuDeviceGetName", C.gc_device_name(&buf[0], C.int(len(buf)), d.dev)); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// PCIBusID returns the PCI id, e.g. "0000:18:00.0".
func (d *Device) PCIBusID() (string, error) {
	var buf [64]C.char
	if err := check("cuDeviceGetPCIBusId", C.gc_device_pci(&buf[0], C.int(len(buf)), d.dev)); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// Device attributes used by this package and its tests (CUdevice_attribute).
const (
	AttrComputeCapabilityMajor   = 75
	AttrComputeCapabilityMinor   = 76
	AttrMultiprocessorCount      = 16
	AttrCanMapHostMemory         = 19
	AttrMemoryPoolsSupported     = 115
	AttrCanUseStreamWaitValueNOR = 123
)

// Attribute returns a device attribute (a CUdevice_attribute value).
func (d *Device) Attribute(attr int) (int, error) {
	var v C.int
	if err := check("cuDeviceGetAttribute", C.gc_device_attr(&v, C.int(attr), d.dev)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// ComputeCapability returns the SM version, e.g. (9, 0) for Hopper.
func (d *Device) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(AttrComputeCapabilityMajor); err != nil {
		return
	}
	minor, err = d.Attribute(AttrComputeCapabilityMinor)
	return
}

// TotalMemory returns the device memory size in bytes.
func (d *Device) TotalMemory() (int64, error) {
	var v C.size_t
	if err := check("cuDeviceTotalMem", C.gc_device_total_mem(&v, d.dev)); err != nil {
		return 0, err
	}
	return int64(v), nil
}

// MemInfo returns free and total device memory in bytes.
func (d *Device) MemInfo() (free, total int64, err error) {
	var f, t C.size_t
	if err = check("cuMemGetInfo", C.gc_mem_info(C.uintptr_t(d.ctx), &f, &t)); err != nil {
		return
	}
	return int64(f), int64(t), nil
}

// StreamPriorityRange returns the least and greatest stream priorities.
// Numerically lower is higher priority, so greatest <= least (e.g. 0, -5).
func (d *Device) StreamPriorityRange() (least, greatest int, err error) {
	var l, g C.int
	if err = check("cuCtxGetStreamPriorityRange", C.gc_priority_range(C.uintptr_t(d.ctx), &l, &g)); err != nil {
		return
	}
	return int(l), int(g), nil
}

// Synchronize blocks until every stream of the device is idle. It hangs
// while a stream gate is closed (GPU.md's trap), so tests avoid it.
func (d *Device) Synchronize() error {
	return check("cuCtxSynchronize", C.gc_ctx_sync(C.uintptr_t(d.ctx)))
}

// DefaultStream returns the device's legacy default stream (handle 0).
func (d *Device) DefaultStream() *Stream { return &d.defStream }
