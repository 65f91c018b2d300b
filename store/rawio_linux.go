package store

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// rawIO reads and writes a TCP connection's non-blocking socket with raw
// system calls, through net's RawConn so that the poller still does the
// waiting, deadlines and Close. A non-blocking read or write returns at
// once, so the runtime need not be told it entered a system call; that
// spares the hand-off of the processor to another thread that a system
// call of a few microseconds otherwise often causes, which on a server
// that owns one core costs as much as the read or write itself.
//
// A rawIO is one direction: reads from one goroutine at a time, or writes
// from one goroutine at a time.
type rawIO struct {
	rc    syscall.RawConn
	trap  uintptr // SYS_READ or SYS_WRITE
	p     []byte
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

// newRawIO returns raw reads and writes for nc, or nils when nc has no raw
// connection.
func newRawIO(nc net.Conn) (rd, wr *rawIO) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, nil
	}
	rd, wr = &rawIO{rc: rc, trap: syscall.SYS_READ}, &rawIO{rc: rc, trap: syscall.SYS_WRITE}
	rd.fn, wr.fn = rd.do, wr.do
	return rd, wr
}

// do makes one read or write of r.p; false means "wait until ready".
func (r *rawIO) do(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(r.trap, fd, uintptr(unsafe.Pointer(unsafe.SliceData(r.p))), uintptr(len(r.p)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		r.n, r.errno = int(n), e
		return true
	}
}

// Read implements io.Reader.
func (r *rawIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.p = p
	err := r.rc.Read(r.fn)
	r.p = nil
	switch {
	case err != nil:
		return 0, err
	case r.errno != 0:
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", r.errno)}
	case r.n == 0:
		return 0, io.EOF
	}
	return r.n, nil
}

// Write implements io.Writer.
func (r *rawIO) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		r.p = p[done:]
		err := r.rc.Write(r.fn)
		r.p = nil
		if err != nil {
			return done, err
		}
		if r.errno != 0 {
			return done, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", r.errno)}
		}
		done += r.n
	}
	return done, nil
}
