package uring

import (
	"errors"
	"runtime"
	"syscall"
	"testing"
	"unsafe"
)

func newRing(t *testing.T) *Ring {
	t.Helper()
	runtime.LockOSThread() // the ring belongs to this thread
	t.Cleanup(runtime.UnlockOSThread)
	r, err := New(8)
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("no io_uring here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// reap submits and waits for exactly want completions, keyed by user data.
func reap(t *testing.T, r *Ring, want int) map[uint64]CQE {
	t.Helper()
	got := map[uint64]CQE{}
	for len(got) < want {
		if _, err := r.Submit(1); err != nil {
			t.Fatal(err)
		}
		r.Reap(func(c CQE) { got[c.UserData] = c })
	}
	return got
}

func TestSendRecvReadTimeout(t *testing.T) {
	r := newRing(t)
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])

	// A receive posted before the data arrives completes when it does.
	buf := make([]byte, 16)
	if err := r.Recv(fds[1], buf, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Send(fds[0], []byte("hello, ring"), 2); err != nil {
		t.Fatal(err)
	}
	got := reap(t, r, 2)
	if got[2].Res != 11 || got[1].Res != 11 || string(buf[:11]) != "hello, ring" {
		t.Fatalf("send %d, recv %d %q", got[2].Res, got[1].Res, buf[:max(got[1].Res, 0)])
	}

	// A closed peer: the receive gets 0, a send gets -EPIPE.
	_ = syscall.Shutdown(fds[0], syscall.SHUT_WR)
	_ = r.Recv(fds[1], buf, 3)
	if c := reap(t, r, 1)[3]; c.Res != 0 {
		t.Fatalf("recv after the peer's shutdown: %d, want 0", c.Res)
	}
	_ = syscall.Shutdown(fds[1], syscall.SHUT_RDWR)
	_ = r.Send(fds[0], []byte("x"), 4)
	if c := reap(t, r, 1)[4]; c.Res != -int32(syscall.EPIPE) {
		t.Fatalf("send to a shut socket: %d, want -EPIPE", c.Res)
	}

	// An eventfd read completes when another thread writes it.
	efd, _, errno := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	defer syscall.Close(int(efd))
	var ev [8]byte
	_ = r.Read(int(efd), ev[:], 5)
	go func() { _, _ = syscall.Write(int(efd), []byte{7, 0, 0, 0, 0, 0, 0, 0}) }()
	if c := reap(t, r, 1)[5]; c.Res != 8 || ev[0] != 7 {
		t.Fatalf("eventfd read: %d, %v", c.Res, ev)
	}

	// A timeout completes with -ETIME.
	ts := Timespec{Nsec: 1e6}
	_ = r.Timeout(&ts, 6)
	if c := reap(t, r, 1)[6]; c.Res != -int32(syscall.ETIME) {
		t.Fatalf("timeout: %d, want -ETIME", c.Res)
	}
}

// TestFullQueue queues more entries than the submission queue holds: the
// ring submits on its own to make room.
func TestFullQueue(t *testing.T) {
	r := newRing(t)
	ts := Timespec{}
	const n = 40
	for i := range n {
		if err := r.Timeout(&ts, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := reap(t, r, n); len(got) != n {
		t.Fatalf("%d completions, want %d", len(got), n)
	}
}

// TestABI checks the structures shared with the kernel against the sizes
// in include/uapi/linux/io_uring.h.
func TestABI(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"io_uring_sqe", unsafe.Sizeof(sqe{}), 64},
		{"io_uring_cqe", unsafe.Sizeof(CQE{}), 16},
		{"io_uring_params", unsafe.Sizeof(params{}), 120},
		{"io_sqring_offsets", unsafe.Sizeof(sqringOffsets{}), 40},
		{"io_cqring_offsets", unsafe.Sizeof(cqringOffsets{}), 40},
		{"__kernel_timespec", unsafe.Sizeof(Timespec{}), 16},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes, want %d", c.name, c.got, c.want)
		}
	}
	if off := unsafe.Offsetof(sqe{}.userData); off != 32 {
		t.Errorf("sqe.user_data at %d, want 32", off)
	}
}
