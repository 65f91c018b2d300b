package store

import (
	"net"
	"syscall"
	"unsafe"
)

// unacked returns how many bytes written to nc its peer has not
// acknowledged (the socket's send queue, SIOCOUTQ: sent and unacknowledged,
// plus not yet sent), and whether nc could tell. Seconds after a request
// was written, a non-zero count means that the server's host never
// received it: the link or the host is down.
func unacked(nc net.Conn) (int, bool) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var n int32
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&n)))
	}); err != nil || errno != 0 {
		return 0, false
	}
	return int(n), true
}
