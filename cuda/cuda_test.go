package cuda_test

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// device0 returns device 0 or skips with "no CUDA device".
func device0(t *testing.T) *cuda.Device {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	d, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestUnavailableNamesLibraryAndEnv(t *testing.T) {
	err := cuda.Load()
	if err == nil {
		t.Skip("libcuda is present")
	}
	if !errors.Is(err, cuda.ErrUnavailable) {
		t.Fatalf("error does not wrap ErrUnavailable: %v", err)
	}
	if !errors.Is(err, cuda.ErrNoDevice) && (!strings.Contains(err.Error(), "libcuda.so.1") || !strings.Contains(err.Error(), cuda.LibraryEnv)) {
		t.Fatalf("error should name libcuda.so.1 and %s: %v", cuda.LibraryEnv, err)
	}
	if _, err := cuda.GetDevice(0); !errors.Is(err, cuda.ErrUnavailable) {
		t.Fatalf("GetDevice: %v", err)
	}
}

func TestDeviceInfo(t *testing.T) {
	d := device0(t)
	name, err := d.Name()
	if err != nil || name == "" {
		t.Fatalf("Name: %q %v", name, err)
	}
	pci, err := d.PCIBusID()
	if err != nil || !strings.Contains(pci, ":") {
		t.Fatalf("PCIBusID: %q %v", pci, err)
	}
	maj, minor, err := d.ComputeCapability()
	if err != nil || maj < 3 {
		t.Fatalf("ComputeCapability: %d.%d %v", maj, minor, err)
	}
	least, greatest, err := d.StreamPriorityRange()
	if err != nil || greatest > least {
		t.Fatalf("StreamPriorityRange: %d %d %v", least, greatest, err)
	}
	free, total, err := d.MemInfo()
	if err != nil || free <= 0 || total < free {
		t.Fatalf("MemInfo: %d %d %v", free, total, err)
	}
	v, _ := cuda.DriverVersion()
	nor, _ := d.Attribute(cuda.AttrCanUseStreamWaitValueNOR)
	t.Logf("%s %s sm_%d%d driver %d priorities [%d,%d] mem %d/%d waitValueNOR=%d lib=%s", name, pci, maj, minor, v, greatest, least, free, total, nor, cuda.LibraryPath())
}

func TestStreamPriority(t *testing.T) {
	d := device0(t)
	_, greatest, _ := d.StreamPriorityRange()
	s, err := d.NewStream(cuda.StreamOptions{HighPriority: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	if s.Priority() != greatest {
		t.Fatalf("priority %d, want %d", s.Priority(), greatest)
	}
}

func TestMemoryCopiesMemset(t *testing.T) {
	d := device0(t)
	s, err := d.NewStream(cuda.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	ctx := cuda.WithStream(context.Background(), s)
	x, err := cuda.Empty(ctx, 0, tensor.Float32, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	if err := s.Memset32(x.Ptr(), 0x3f800000, 1000); err != nil { // 1.0f
		t.Fatal(err)
	}
	h, err := cuda.ToHost(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := h.Float64s()
	for i, v := range got {
		if v != 1 {
			t.Fatalf("x[%d] = %v, want 1", i, v)
		}
	}
	// Round trip through FromHost and a device-to-device copy.
	src := tensor.New(tensor.Int32, 8)
	for i := range 8 {
		binary.LittleEndian.PutUint32(src.Bytes()[4*i:], uint32(i*7))
	}
	y, err := cuda.FromHost(ctx, 0, src)
	if err != nil {
		t.Fatal(err)
	}
	z, err := cuda.Empty(ctx, 0, tensor.Int32, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CopyDtoD(z.Ptr(), y.Ptr(), 32); err != nil {
		t.Fatal(err)
	}
	hz, err := cuda.ToHost(ctx, z)
	if err != nil {
		t.Fatal(err)
	}
	if string(hz.Bytes()) != string(src.Bytes()) {
		t.Fatalf("round trip: %v != %v", hz.Bytes(), src.Bytes())
	}
	y.Free()
	z.Free()
	if dev, err := cuda.PointerDevice(x.Ptr()); err != nil || dev != 0 {
		t.Fatalf("PointerDevice: %d %v", dev, err)
	}
}

func TestBufferRetainDefersFree(t *testing.T) {
	d := device0(t)
	b, err := d.Alloc(context.Background(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	p := b.Ptr()
	b.Retain()
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if b.Ptr() != p {
		t.Fatal("memory freed while retained")
	}
	if err := b.Free(); err == nil {
		t.Fatal("second Free succeeded")
	}
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	if b.Ptr() != 0 {
		t.Fatal("memory not freed after the last release")
	}
}

// TestGateHoldsStream proves a gate keeps a stream's later work from running
// until the host opens it, and that the host is not blocked meanwhile.
func TestGateHoldsStream(t *testing.T) {
	d := device0(t)
	s, err := d.NewStream(cuda.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	ctx := cuda.WithStream(context.Background(), s)
	x, err := cuda.Zeros(ctx, 0, tensor.Int32, 256)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	pinned, err := d.HostAlloc(1024, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Free()
	ev, err := d.NewEvent(false)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}

	g, err := d.NewGate()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free()
	func() {
		defer g.Open() // never leave a gate closed
		if err := g.Hold(s); err != nil {
			t.Fatal(err)
		}
		if err := s.Memset32(x.Ptr(), 42, 256); err != nil {
			t.Fatal(err)
		}
		if err := cuda.CopyToPinned(ctx, pinned, x); err != nil {
			t.Fatal(err)
		}
		if err := ev.Record(s); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if done, err := ev.Query(); err != nil || done {
			t.Fatalf("event completed while the gate was closed (done=%v err=%v)", done, err)
		}
		if v := binary.LittleEndian.Uint32(pinned.Bytes()); v != 0 {
			t.Fatalf("copy ran behind a closed gate: %d", v)
		}
	}()
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ev.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint32(pinned.Bytes()[4*255:]); v != 42 {
		t.Fatalf("after open: %d, want 42", v)
	}
}

func TestEventTimingAndCrossStreamWait(t *testing.T) {
	d := device0(t)
	a, _ := d.NewStream(cuda.StreamOptions{})
	b, _ := d.NewStream(cuda.StreamOptions{})
	defer a.Destroy()
	defer b.Destroy()
	start, _ := d.NewEvent(true)
	end, _ := d.NewEvent(true)
	link, _ := d.NewEvent(false)
	defer start.Destroy()
	defer end.Destroy()
	defer link.Destroy()
	g, err := d.NewGate()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free()
	func() {
		defer g.Open()
		g.Hold(a)
		start.Record(a)
		end.Record(a)
		// b waits for a: its event must not complete before the gate opens.
		if err := b.WaitStream(a, link); err != nil {
			t.Fatal(err)
		}
		bev, _ := d.NewEvent(false)
		defer bev.Destroy()
		bev.Record(b)
		time.Sleep(10 * time.Millisecond)
		if done, _ := bev.Query(); done {
			t.Fatal("b ran ahead of gated a")
		}
	}()
	if err := b.SynchronizeContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := end.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if dur, err := cuda.ElapsedTime(start, end); err != nil || dur < 0 {
		t.Fatalf("ElapsedTime: %v %v", dur, err)
	}
}

func TestGraphCapture(t *testing.T) {
	d := device0(t)
	s, _ := d.NewStream(cuda.StreamOptions{})
	defer s.Destroy()
	ctx := cuda.WithStream(context.Background(), s)
	x, err := cuda.Zeros(ctx, 0, tensor.Int32, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	s.Synchronize()
	if st, err := s.CaptureStatus(); err != nil || st != cuda.CaptureNone {
		t.Fatalf("status %v %v", st, err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := s.BeginCapture(cuda.CaptureModeThreadLocal); err != nil {
		t.Fatal(err)
	}
	if st, err := s.CaptureStatus(); err != nil || st != cuda.CaptureActive {
		t.Fatalf("status during capture %v %v", st, err)
	}
	s.Memset32(x.Ptr(), 9, 64)
	gr, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer gr.Destroy()
	if err := gr.Launch(s); err != nil {
		t.Fatal(err)
	}
	h, err := cuda.ToHost(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	if v := h.At(63); v != 9 {
		t.Fatalf("graph did not run: %v", v)
	}
}

// TestBufferOutlivesItsStream: a Buffer whose allocation stream was
// destroyed, with work still queued there, is freed safely when its last
// reference goes (the order a backend's stash sees: the caller frees the
// tensor and destroys its stream, the op's stash lets go later). Using the
// destroyed handle for the free is undefined behaviour (cuStreamDestroy);
// on nvidia-h200 it crashed the process in cuMemFreeAsync. The pool must
// still serve allocations on a new stream afterwards.
func TestBufferOutlivesItsStream(t *testing.T) {
	d := device0(t)
	const words = 1 << 18
	for i := range 64 {
		s, err := d.NewStream(cuda.StreamOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := d.AllocOn(s, 4*words)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Memset32(b.Ptr(), uint32(i), words); err != nil {
			t.Fatal(err)
		}
		b.Retain() // a pending op's stash
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
		if err := s.Destroy(); err != nil {
			t.Fatal(err)
		}
		if s.Handle() != 0 {
			t.Fatalf("a destroyed stream still reports handle %#x", s.Handle())
		}
		if err := b.Release(); err != nil {
			t.Fatalf("round %d: the last release after the stream was destroyed: %v", i, err)
		}
	}
	s, err := d.NewStream(cuda.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	b, err := d.AllocOn(s, 4*words)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Memset32(b.Ptr(), 5, words); err != nil {
		t.Fatal(err)
	}
	var w [4]byte
	if err := s.CopyDtoH(unsafe.Pointer(&w[0]), b.Ptr()+4*(words-1), 4); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint32(w[:]); got != 5 {
		t.Fatalf("after the frees, a new buffer read %d, want 5", got)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
}
