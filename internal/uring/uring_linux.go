package uring

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// System call numbers and ABI constants (include/uapi/linux/io_uring.h).
const (
	sysSetup = 425
	sysEnter = 426

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	featSingleMmap = 1 << 0

	setupClamp        = 1 << 4
	setupSubmitAll    = 1 << 7
	setupCoopTaskrun  = 1 << 8
	setupSingleIssuer = 1 << 12
	setupDeferTaskrun = 1 << 13

	enterGetEvents = 1 << 0

	opTimeout = 11
	opRead    = 22
	opSend    = 26
	opRecv    = 27
)

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// sqe is a submission queue entry, 64 bytes.
type sqe struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	opFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	pad         uint64
}

// CQE is a completion: the UserData of its submission and the result, a
// byte count or file descriptor, or a negated errno.
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// Ring is one io_uring instance.
type Ring struct {
	fd      int
	sqMem   []byte
	cqMem   []byte
	sqeMem  []byte
	sqHead  *uint32
	sqTail  *uint32
	sqMask  uint32
	sqes    []sqe
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    []CQE
	tail    uint32 // next free SQ slot, published on Submit
	pending uint32 // entries prepared since the last Submit
}

// New sets up a ring of at least entries submission slots.
func New(entries uint32) (*Ring, error) {
	var p params
	p.flags = setupClamp | setupSubmitAll | setupCoopTaskrun | setupSingleIssuer | setupDeferTaskrun
	fd, _, e := syscall.RawSyscall(sysSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		if e == syscall.ENOSYS || e == syscall.EPERM || e == syscall.EINVAL {
			return nil, fmt.Errorf("%w: io_uring_setup: %v", ErrUnsupported, e)
		}
		return nil, fmt.Errorf("uring: io_uring_setup: %w", e)
	}
	r := &Ring{fd: int(fd)}
	if p.features&featSingleMmap == 0 {
		r.Close()
		return nil, fmt.Errorf("%w: kernel lacks IORING_FEAT_SINGLE_MMAP", ErrUnsupported)
	}
	sqSize := int(p.sqOff.array + p.sqEntries*4)
	cqSize := int(p.cqOff.cqes + p.cqEntries*uint32(unsafe.Sizeof(CQE{})))
	var err error
	if r.sqMem, err = syscall.Mmap(r.fd, offSQRing, max(sqSize, cqSize), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
		r.Close()
		return nil, fmt.Errorf("uring: mmap rings: %w", err)
	}
	r.cqMem = r.sqMem
	if r.sqeMem, err = syscall.Mmap(r.fd, offSQEs, int(p.sqEntries)*int(unsafe.Sizeof(sqe{})), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
		r.Close()
		return nil, fmt.Errorf("uring: mmap entries: %w", err)
	}
	at := func(mem []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	r.sqHead, r.sqTail = at(r.sqMem, p.sqOff.head), at(r.sqMem, p.sqOff.tail)
	r.sqMask = *at(r.sqMem, p.sqOff.ringMask)
	r.cqHead, r.cqTail = at(r.cqMem, p.cqOff.head), at(r.cqMem, p.cqOff.tail)
	r.cqMask = *at(r.cqMem, p.cqOff.ringMask)
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	r.cqes = unsafe.Slice((*CQE)(unsafe.Pointer(&r.cqMem[p.cqOff.cqes])), p.cqEntries)
	// Slot i of the submission array always names entry i.
	array := unsafe.Slice(at(r.sqMem, p.sqOff.array), p.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.tail = atomic.LoadUint32(r.sqTail)
	return r, nil
}

// Close unmaps the rings and closes the ring's descriptor; the kernel
// cancels what is still in flight.
func (r *Ring) Close() error {
	if r.sqeMem != nil {
		_ = syscall.Munmap(r.sqeMem)
	}
	if r.sqMem != nil {
		_ = syscall.Munmap(r.sqMem)
	}
	r.sqMem, r.cqMem, r.sqeMem, r.sqes, r.cqes = nil, nil, nil, nil, nil
	return syscall.Close(r.fd)
}

// next returns a zeroed submission slot, submitting what is queued first
// when the queue is full.
func (r *Ring) next() (*sqe, error) {
	for r.tail-atomic.LoadUint32(r.sqHead) >= uint32(len(r.sqes)) {
		if _, err := r.Submit(0); err != nil {
			return nil, err
		}
	}
	s := &r.sqes[r.tail&r.sqMask]
	*s = sqe{}
	r.tail++
	r.pending++
	return s, nil
}

// Send queues a send of all of b on the socket fd (MSG_WAITALL: the kernel
// goes on after a short send, so Res is len(b) or a negated errno).
func (r *Ring) Send(fd int, b []byte, userData uint64) error {
	s, err := r.next()
	if err != nil {
		return err
	}
	s.opcode, s.fd, s.addr, s.len, s.opFlags, s.userData = opSend, int32(fd), uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))), uint32(len(b)), syscall.MSG_NOSIGNAL|syscall.MSG_WAITALL, userData
	return nil
}

// Recv queues a receive into b from the socket fd.
func (r *Ring) Recv(fd int, b []byte, userData uint64) error {
	s, err := r.next()
	if err != nil {
		return err
	}
	s.opcode, s.fd, s.addr, s.len, s.userData = opRecv, int32(fd), uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))), uint32(len(b)), userData
	return nil
}

// Read queues a read into b from fd (an eventfd, say) at its current
// position.
func (r *Ring) Read(fd int, b []byte, userData uint64) error {
	s, err := r.next()
	if err != nil {
		return err
	}
	s.opcode, s.fd, s.addr, s.len, s.off, s.userData = opRead, int32(fd), uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))), uint32(len(b)), ^uint64(0), userData
	return nil
}

// Timespec is the kernel's struct __kernel_timespec.
type Timespec struct{ Sec, Nsec int64 }

// Timeout queues a completion (Res -ETIME) after the relative time *ts,
// which must stay untouched until then.
func (r *Ring) Timeout(ts *Timespec, userData uint64) error {
	s, err := r.next()
	if err != nil {
		return err
	}
	s.opcode, s.addr, s.len, s.userData = opTimeout, uint64(uintptr(unsafe.Pointer(ts))), 1, userData
	return nil
}

// Submit hands the queued entries to the kernel and waits until at least
// wait completions are ready. It returns the number of entries submitted.
func (r *Ring) Submit(wait int) (int, error) {
	atomic.StoreUint32(r.sqTail, r.tail)
	// GETEVENTS even without waiting: with DEFER_TASKRUN, that is what
	// runs the completions that are due.
	enter := syscall.Syscall6
	if wait == 0 {
		// Does not block, so the scheduler need not hear of it.
		enter = syscall.RawSyscall6
	}
	for {
		n, _, e := enter(sysEnter, uintptr(r.fd), uintptr(r.pending), uintptr(wait), enterGetEvents, 0, 0)
		switch e {
		case 0:
			r.pending -= uint32(n)
			return int(n), nil
		case syscall.EINTR:
			continue
		}
		return 0, fmt.Errorf("uring: io_uring_enter: %w", e)
	}
}

// Reap calls f for each ready completion, in order, and returns how many
// there were. f may queue new entries.
func (r *Ring) Reap(f func(CQE)) int {
	n := 0
	for {
		head, tail := atomic.LoadUint32(r.cqHead), atomic.LoadUint32(r.cqTail)
		if head == tail {
			return n
		}
		for ; head != tail; head++ {
			c := r.cqes[head&r.cqMask]
			atomic.StoreUint32(r.cqHead, head+1)
			n++
			f(c)
		}
	}
}
