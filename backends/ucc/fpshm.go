package ucc

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/gocoll/gocoll/internal/shm"
)

// shmBoard is the fingerprint board of ranks that share a host: one file
// in /dev/shm (shm.Dir) that rank 0 makes and every rank maps, unlinked
// as soon as every rank has mapped it (or failed to), so nothing is left
// behind, whatever exits when. The mapping goes with Close, or with the
// process.
//
// A peer that dies leaves its slots empty: gone sees it by its process id
// (gone, or a zombie), which every rank writes into its ring header.
type shmBoard struct {
	r    *fpRings
	rank int
	mem  []byte // the mapping, for munmap
	pids []int  // the peers' process ids, 0 where unknown
	// free is how far this rank may write without reading the peers'
	// checked words again (fpRings.room when it last looked). They only
	// grow, so the bound stays true. Why: each look reads a cache line
	// that its peer writes once per op, a cross-core miss per op and peer
	// on every issue.
	free uint64
}

var _ fpBoard = (*shmBoard)(nil)

// createShmBoard makes and maps the board file of n ranks; the caller
// publishes the path and unlinks it once every rank has mapped it.
func createShmBoard(n int) (*shmBoard, string, error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, "", fmt.Errorf("ucc: fingerprint board: random name: %w", err)
	}
	path := filepath.Join(shm.Dir, "gocoll-ucc-fp-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("ucc: fingerprint board: %w", err)
	}
	defer f.Close()
	size := fpBoardBytes(n, fpSlots)
	// fallocate: a full tmpfs fails now, not with SIGBUS at first touch.
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil {
		_ = os.Remove(path)
		return nil, "", fmt.Errorf("ucc: fingerprint board: reserving %d bytes in %s: %w", size, shm.Dir, err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		_ = os.Remove(path)
		return nil, "", fmt.Errorf("ucc: fingerprint board: mmap: %w", err)
	}
	return &shmBoard{r: newRings(mem, n, fpSlots), rank: 0, mem: mem}, path, nil
}

// openShmBoard maps the board file rank 0 made, as rank.
func openShmBoard(path string, rank, n int) (*shmBoard, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("ucc: fingerprint board: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("ucc: fingerprint board: %w", err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("ucc: fingerprint board: mmap: %w", err)
	}
	r, err := openRings(mem)
	if err == nil && r.n != n {
		err = fmt.Errorf("ucc: the fingerprint board %s is for %d ranks, not %d", path, r.n, n)
	}
	if err != nil {
		_ = syscall.Munmap(mem)
		return nil, err
	}
	return &shmBoard{r: r, rank: rank, mem: mem}, nil
}

// register writes this rank's process id; learnPids reads the peers'
// once every rank has registered.
func (s *shmBoard) register() { s.r.pid(s.rank).Store(uint64(os.Getpid())) }

func (s *shmBoard) learnPids() {
	s.pids = make([]int, s.r.n)
	for p := range s.pids {
		if p == s.rank {
			continue
		}
		pid := int(s.r.pid(p).Load())
		// A peer whose process this one cannot see (another pid
		// namespace) is left to the op's timeout: kill would say ESRCH.
		if pid > 0 && syscall.Kill(pid, 0) != syscall.ESRCH {
			s.pids[p] = pid
		}
	}
}

func (s *shmBoard) post(seq uint64, v fpSlot) bool {
	if !s.hasRoom(seq) {
		return false
	}
	s.r.put(s.rank, seq, v)
	return true
}

// hasRoom reports whether this rank may write its slot of seq (post's
// test, for gu_fp_ahead, which writes the slot in C).
func (s *shmBoard) hasRoom(seq uint64) bool {
	if seq >= s.free {
		if s.free = s.r.room(s.rank); seq >= s.free {
			return false
		}
	}
	return true
}

func (s *shmBoard) peek(peer int, seq uint64) (fpSlot, bool) { return s.r.get(peer, seq) }

func (s *shmBoard) checked(n uint64) { s.r.checked(s.rank).Store(n) }

func (s *shmBoard) gone(peer int) (int, error) {
	if peer >= len(s.pids) || s.pids[peer] == 0 {
		return peer, nil
	}
	if exited(s.pids[peer]) {
		return peer, fmt.Errorf("rank %d (pid %d) has exited", peer, s.pids[peer])
	}
	return peer, nil
}

// exited reports whether process pid has ended: it is gone (kill 0 says
// ESRCH), or a zombie that its parent has not reaped yet (a launcher
// that waits for its ranks in order reaps a killed one late).
func exited(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) S ...": the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] == 'Z' || b[i+2] == 'X'
}

func (s *shmBoard) kind() string { return "shm" }

func (s *shmBoard) close() error {
	if s.mem == nil {
		return nil
	}
	err := syscall.Munmap(s.mem)
	s.mem, s.r = nil, nil
	if err != nil {
		return fmt.Errorf("ucc: fingerprint board: munmap: %w", err)
	}
	return nil
}
