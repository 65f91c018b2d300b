package shm

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// ReadPeer copies len(dst) bytes at addr in process pid's memory into dst
// with one system call per piece the kernel takes (Linux cross-memory
// attach, process_vm_readv: one copy, from the peer's pages into ours,
// where a ring costs two). The caller must know that the bytes stay put
// until it is done (a protocol with the peer says so).
func ReadPeer(pid int, dst []byte, addr uintptr) error {
	for len(dst) > 0 {
		local := []unix.Iovec{{Base: &dst[0]}}
		local[0].SetLen(len(dst))
		remote := []unix.RemoteIovec{{Base: addr, Len: len(dst)}}
		n, err := unix.ProcessVMReadv(pid, local, remote, 0)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("shm: reading %d bytes of process %d: %w", len(dst), pid, err)
		}
		if n <= 0 {
			return fmt.Errorf("shm: reading %d bytes of process %d: nothing read", len(dst), pid)
		}
		dst = dst[n:]
		addr += uintptr(n)
	}
	return nil
}
