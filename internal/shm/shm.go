// Package shm is a pair of single-producer/single-consumer byte rings in a
// shared-memory file (/dev/shm), one per direction, so that two processes
// on one host exchange bytes with one memcpy on each side and no system
// call on the fast path.
//
// Life cycle: the lower rank Creates the file (space reserved up front with
// fallocate, so a full tmpfs fails here with an error rather than with
// SIGBUS later), the other rank Opens it, and the creator Unlinks it as soon
// as the peer has mapped it: from then on the memory lives only as long as
// the two mappings, and nothing is left behind if either process dies.
//
// Waiting: a reader with nothing to read, or a writer with no space, spins
// a little (runtime.Gosched), then sleeps on a futex in the shared page with
// a short timeout; the other side wakes it only when it announced that it
// sleeps, so a busy pair makes no system calls. Close and a peer's death
// (MarkDead, from the TCP connection that watches the peer) wake the
// sleepers; the timeout bounds how late either is noticed even if a
// wake-up is lost.
package shm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Errors of ring operations.
var (
	// ErrClosed is returned by waits after Close.
	ErrClosed = errors.New("shm: closed")
	// ErrPeerDead is returned once the peer is known to be gone and the
	// ring holds nothing more to read (or can take nothing more).
	ErrPeerDead = errors.New("shm: peer gone")
)

const (
	magic      = 0x676373686d303031 // "gcshm001"
	headerSize = 4096
	ctrlSize   = 256
	// Offsets in a ring's control block; each field the two sides write
	// sits on its own cache line.
	offTail     = 0   // producer's position (bytes ever written)
	offHead     = 64  // consumer's position (bytes ever read)
	offDataSeq  = 128 // futex word the consumer sleeps on
	offConsWait = 132 // consumer announces it sleeps
	offPolling  = 136 // how many of the consumer's goroutines poll the ring now
	offSpaceSeq = 192 // futex word the producer sleeps on
	offProdWait = 196 // producer announces it sleeps

	// publishChunk bounds how much a large write copies before it makes
	// the bytes visible, so the reader copies out while the writer copies in.
	publishChunk = 128 << 10
	// sleepSlice bounds a writer's futex sleep while it waits for space:
	// between sleeps it looks at its context.
	sleepSlice = 20 * time.Millisecond
	// idleSlice bounds a reader's futex sleep (wait) with nobody polling.
	// Close and MarkDead wake the sleepers (kick), so it only bounds how
	// late a lost wake-up would be noticed. It is long because every sleep
	// is a blocking system call that holds a P: the Go runtime's sysmon
	// takes the P back after 20 µs (when no other P is idle) and, having
	// done so, polls every 20 µs for the next millisecond. With a 20 ms
	// slice, the three pair readers of each of 4 ranks, idle while the
	// ranks' small ops ran over the lanes, kept every rank's sysmon waking
	// 5000 times a second, and with more ranks than cores every wake-up
	// took a core from a rank in the middle of an op (docs/perf.md,
	// issue 17, fourth pass).
	idleSlice = time.Second
	pollSlice = 200 * time.Microsecond
)

// DefaultRingBytes is the default capacity of each direction.
const DefaultRingBytes = 4 << 20

// Pair is one mapped pair file: Out is the ring this side writes, In the
// ring it reads.
type Pair struct {
	Out, In *Ring

	mu  sync.Mutex // orders Close and MarkDead (which touch the futex words) with Unmap
	mem []byte     // nil once unmapped
}

// Ring is one direction of a pair. Write must not be called concurrently
// with Write, nor Read with Read (one producer, one consumer); the caller
// serializes each side.
type Ring struct {
	data     []byte
	size     uint64
	mask     uint64
	tail     *atomic.Uint64
	head     *atomic.Uint64
	dataSeq  *atomic.Uint32
	consWait *atomic.Uint32
	polling  *atomic.Uint32
	spaceSeq *atomic.Uint32
	prodWait *atomic.Uint32

	// Stamped frames (stamp.go): key makes a frame's stamp, and
	// headCache is the producer's last look at head.
	key       uint64
	headCache uint64

	closed atomic.Bool
	dead   atomic.Bool
	// Spin is how many times a wait yields (runtime.Gosched) before it
	// sleeps on the futex.
	Spin int
	// Yield, when > 0, is how long Await polls with sched_yield between
	// polls when it may not spin (spin <= 0: more ranks than cores share
	// the host) before it sleeps: the core goes to whichever peer the
	// kernel runs next, at the cost of a system call per poll rather than
	// a futex sleep and wake-up per message (Open MPI's yield_when_idle).
	Yield time.Duration
	// Budget, when not nil, is where the waits take their spin from
	// when they are given one (spin > 0), and what they tell how their
	// sleeps went.
	Budget *SpinBudget
	// Stream makes the writer's copies of ntMin bytes or more stream past
	// its cache (non-temporal stores, copyNT), so that the reader fetches
	// them from memory rather than from the writer's core. Which is
	// faster depends on where the two cores are: far apart (another
	// core complex, another socket) a modified line's trip between them
	// costs more than memory; close (a shared cache) it costs less. Only
	// the writer sets it, between writes.
	Stream bool
}

// HostID identifies this host's boot: the host name and the kernel's boot
// id. Two processes can share /dev/shm only if their HostIDs are equal (a
// different /dev/shm with an equal id, as in some containers, is caught
// when Open fails).
func HostID() (string, error) {
	hn, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("shm: host name: %w", err)
	}
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("shm: boot id: %w", err)
	}
	return hn + "/" + strings.TrimSpace(string(b)), nil
}

// Dir is where pair files are made.
var Dir = "/dev/shm"

// Create makes, sizes and maps a new pair file for rings of ringBytes (a
// power of two) each, named after prefix plus a random suffix. The caller
// is the "lower" side: it writes ring 0 and reads ring 1. It returns the
// file's path, which the peer passes to Open; the caller Unlinks it once
// the peer has mapped it (or failed to).
func Create(prefix string, ringBytes int) (*Pair, string, error) {
	if ringBytes <= 0 || ringBytes&(ringBytes-1) != 0 {
		return nil, "", fmt.Errorf("shm: ring size %d is not a power of two", ringBytes)
	}
	var key [8]byte // the stamps' key (stamp.go)
	if _, err := rand.Read(key[:]); err != nil {
		return nil, "", fmt.Errorf("shm: random key: %w", err)
	}
	mem, path, err := createFile(prefix, headerSize+2*ringBytes)
	if err != nil {
		return nil, "", err
	}
	binary.LittleEndian.PutUint64(mem[8:], uint64(ringBytes))
	copy(mem[offKey:offKey+8], key[:])
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&mem[0])), magic) // last: Open checks it
	return newPair(mem, ringBytes, 0), path, nil
}

// Open maps a pair file made by Create, as the "upper" side (writes ring 1,
// reads ring 0).
func Open(path string) (*Pair, error) {
	mem, err := mapFile(path, headerSize)
	if err != nil {
		return nil, err
	}
	rb := binary.LittleEndian.Uint64(mem[8:])
	if atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[0]))) != magic || rb == 0 || rb&(rb-1) != 0 || uint64(len(mem)) != headerSize+2*rb {
		_ = syscall.Munmap(mem)
		return nil, fmt.Errorf("shm: %s is not a gocoll pair file", path)
	}
	return newPair(mem, int(rb), 1), nil
}

// createFile makes a new file in Dir named prefix plus a random suffix,
// reserves total bytes and maps them (shared, populated); on failure no
// file is left behind. The caller writes its header, magic last.
func createFile(prefix string, total int) ([]byte, string, error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, "", fmt.Errorf("shm: random name: %w", err)
	}
	path := filepath.Join(Dir, prefix+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("shm: create: %w", err)
	}
	defer f.Close()
	// fallocate, not ftruncate: a tmpfs without room must fail now, not
	// raise SIGBUS when a page is first touched.
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(total)); err != nil {
		_ = os.Remove(path)
		return nil, "", fmt.Errorf("shm: reserving %d bytes in %s: %w", total, Dir, err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, total, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		_ = os.Remove(path)
		return nil, "", fmt.Errorf("shm: mmap: %w", err)
	}
	return mem, path, nil
}

// mapFile maps the whole of a file made by createFile (shared,
// populated), refusing one of fewer than least bytes; the caller checks
// its header.
func mapFile(path string, least int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shm: stat: %w", err)
	}
	if st.Size() < int64(least) {
		return nil, fmt.Errorf("shm: %s is %d bytes, too small", path, st.Size())
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("shm: mmap: %w", err)
	}
	return mem, nil
}

// Unlink removes the pair file's name; the mappings stay valid.
func Unlink(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("shm: unlink: %w", err)
	}
	return nil
}

func newPair(mem []byte, ringBytes, side int) *Pair {
	r := [2]*Ring{}
	for i := range r {
		c := mem[ctrlSize*(i+1):]
		d := mem[headerSize+i*ringBytes : headerSize+(i+1)*ringBytes]
		r[i] = &Ring{
			data: d, size: uint64(ringBytes), mask: uint64(ringBytes - 1),
			tail:     (*atomic.Uint64)(unsafe.Pointer(&c[offTail])),
			head:     (*atomic.Uint64)(unsafe.Pointer(&c[offHead])),
			dataSeq:  (*atomic.Uint32)(unsafe.Pointer(&c[offDataSeq])),
			consWait: (*atomic.Uint32)(unsafe.Pointer(&c[offConsWait])),
			polling:  (*atomic.Uint32)(unsafe.Pointer(&c[offPolling])),
			spaceSeq: (*atomic.Uint32)(unsafe.Pointer(&c[offSpaceSeq])),
			prodWait: (*atomic.Uint32)(unsafe.Pointer(&c[offProdWait])),
			Spin:     64,
			key:      binary.LittleEndian.Uint64(mem[offKey:]) + uint64(i)<<1,
		}
	}
	return &Pair{mem: mem, Out: r[side], In: r[1-side]}
}

// Unmap releases the mapping. The caller must make sure no Read or Write
// runs or starts on its rings (Close them and wait first).
func (p *Pair) Unmap() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mem == nil {
		return nil
	}
	err := syscall.Munmap(p.mem)
	p.mem = nil
	if err != nil {
		return fmt.Errorf("shm: munmap: %w", err)
	}
	return nil
}

// Close makes the local waits on both rings return ErrClosed, now and
// later. It may be called more than once, and after Unmap.
func (p *Pair) Close() {
	p.Out.closed.Store(true)
	p.In.closed.Store(true)
	p.kick()
}

// MarkDead records that the peer is gone: once nothing is left to read,
// reads fail with ErrPeerDead, and writes that wait for space fail.
func (p *Pair) MarkDead() {
	p.Out.dead.Store(true)
	p.In.dead.Store(true)
	p.kick()
}

func (p *Pair) kick() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mem != nil {
		p.Out.kick()
		p.In.kick()
	}
}

// kick wakes whoever sleeps on this ring's futex words, so that a flag
// change is seen at once rather than at the end of a sleep slice.
func (r *Ring) kick() {
	r.dataSeq.Add(1)
	futexWake(r.dataSeq)
	r.spaceSeq.Add(1)
	futexWake(r.spaceSeq)
}

// Fits reports whether n bytes can be written now without waiting.
func (r *Ring) Fits(n int) bool { return r.size-(r.tail.Load()-r.head.Load()) >= uint64(n) }

// Cap is the ring's capacity in bytes.
func (r *Ring) Cap() int { return int(r.size) }

// Buffered is how many bytes wait to be read.
func (r *Ring) Buffered() int { return int(r.tail.Load() - r.head.Load()) }

// Write copies a then b into the ring as one contiguous run of bytes,
// followed by pad bytes of padding (left as they are), waiting for space
// as needed, and returns once all is in (the buffers may be reused). A run
// that fits is made visible at once, so the reader never sees a header
// without its small payload. Padding lets the caller keep every run at an
// aligned offset of the ring, so that a reader may use the bytes in place
// (NextUnits).
func (r *Ring) Write(ctx context.Context, a, b []byte, pad int) error {
	return r.WriteCheck(ctx, a, b, pad, nil)
}

// WriteCheck is Write that calls check, when not nil, while it sleeps
// waiting for space; check's error ends the wait. A lane writer needs it:
// its reader may be a peer that has not reached the op, while a third
// rank dies.
func (r *Ring) WriteCheck(ctx context.Context, a, b []byte, pad int, check func() error) error {
	if n := uint64(len(a) + len(b) + pad); n <= r.size {
		t := r.tail.Load()
		if r.size-(t-r.head.Load()) < n {
			if err := r.waitSpace(ctx, n, check); err != nil {
				return err
			}
		}
		r.copyIn(t, a)
		r.copyIn(t+uint64(len(a)), b)
		r.publish(t + n)
		return nil
	}
	for i, p := range [3][]byte{a, b, nil} {
		left := uint64(len(p))
		if i == 2 {
			left = uint64(pad)
		}
		for left > 0 {
			t := r.tail.Load()
			free := r.size - (t - r.head.Load())
			if free == 0 {
				if err := r.waitSpace(ctx, min(left, r.size/4), check); err != nil {
					return err
				}
				continue
			}
			n := min(free, left, publishChunk)
			if i < 2 {
				r.copyIn(t, p[:n])
				p = p[n:]
			}
			r.publish(t + n)
			left -= n
		}
	}
	return nil
}

// NextUnits waits until at least unit bytes (or max, if smaller) can be
// read and returns, without consuming them, the longest run of whole units
// that lies contiguously in the ring, at most max bytes: a view of the
// shared memory, valid until Consume. The caller keeps runs aligned so
// that a unit never straddles the ring's end (Write's pad).
func (r *Ring) NextUnits(max, unit int) ([]byte, error) {
	need := uint64(min(unit, max))
	for {
		h := r.head.Load()
		avail := r.tail.Load() - h
		if avail < need {
			if err := r.wait(false, need); err != nil {
				return nil, err
			}
			continue
		}
		off := h & r.mask
		c := min(avail, uint64(max), r.size-off)
		if c >= uint64(unit) {
			c -= c % uint64(unit)
		}
		return r.data[off : off+c], nil
	}
}

// Consume releases n bytes that NextUnits returned.
func (r *Ring) Consume(n int) {
	r.head.Store(r.head.Load() + uint64(n))
	if r.prodWait.Load() != 0 {
		r.spaceSeq.Add(1)
		futexWake(r.spaceSeq)
	}
}

// Skip consumes n bytes (padding) unread, waiting for them as needed.
func (r *Ring) Skip(n int) error {
	if n == 0 {
		return nil
	}
	if r.tail.Load()-r.head.Load() < uint64(n) {
		if err := r.wait(false, uint64(n)); err != nil {
			return err
		}
	}
	r.Consume(n)
	return nil
}

func (r *Ring) copyIn(pos uint64, p []byte) {
	off := pos & r.mask
	if r.Stream {
		n := copyNT(r.data[off:], p)
		copyNT(r.data, p[n:])
		return
	}
	n := copy(r.data[off:], p)
	copy(r.data, p[n:])
}

func (r *Ring) publish(t uint64) {
	r.tail.Store(t)
	// Sequentially consistent atomics: either the consumer sees the new
	// tail after announcing its sleep, or we see its announcement here.
	// While the consumer has pollers, they read the bytes (or wake the
	// sleeper themselves), and the system call is saved.
	if r.consWait.Load() != 0 && r.polling.Load() == 0 {
		r.dataSeq.Add(1)
		futexWake(r.dataSeq)
	}
}

// BeginPoll announces a goroutine of the consumer's side that polls the
// ring (with Peek and Read, never sleeping): while one does, the producer
// does not wake the consumer's sleeper, and the pollers must call
// WakeReader when they leave bytes they will not read. Pair it with
// EndPoll.
func (r *Ring) BeginPoll() { r.polling.Add(1) }

// EndPoll ends a BeginPoll. The last poller out wakes the sleeper if bytes
// are waiting, since the producer may have skipped that while it polled.
func (r *Ring) EndPoll() {
	if r.polling.Add(^uint32(0)) == 0 {
		r.WakeReader()
	}
}

// WakeReader wakes the consumer's sleeper if it sleeps while bytes wait.
func (r *Ring) WakeReader() {
	if r.consWait.Load() != 0 && r.tail.Load() != r.head.Load() {
		r.dataSeq.Add(1)
		futexWake(r.dataSeq)
	}
}

// Peek copies the next len(p) bytes without consuming them; it reports
// false, copying nothing, if fewer are buffered. Only the consumer may
// call it.
func (r *Ring) Peek(p []byte) bool {
	h := r.head.Load()
	if r.tail.Load()-h < uint64(len(p)) {
		return false
	}
	off := h & r.mask
	c := copy(p, r.data[off:])
	copy(p[c:], r.data)
	return true
}

// waitSpace waits until n bytes are free; see WriteCheck for check.
func (r *Ring) waitSpace(ctx context.Context, n uint64, check func() error) error {
	for i := 0; ; i++ {
		if r.size-(r.tail.Load()-r.head.Load()) >= n {
			return nil
		}
		if r.closed.Load() {
			return ErrClosed
		}
		if r.dead.Load() {
			return ErrPeerDead
		}
		if i < r.Spin {
			runtime.Gosched()
			continue
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("shm: waiting for ring space: %w", err)
		}
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		r.prodWait.Store(1)
		seq := r.spaceSeq.Load()
		if r.size-(r.tail.Load()-r.head.Load()) < n && !r.closed.Load() && !r.dead.Load() {
			futexWait(r.spaceSeq, seq, sleepSlice)
		}
		r.prodWait.Store(0)
	}
}

// Read implements io.Reader: it waits until at least one byte is there
// and copies out what fits in p.
func (r *Ring) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	h := r.head.Load()
	avail := r.tail.Load() - h
	if avail == 0 {
		// The reader is inside a frame: it waits for the rest itself,
		// pollers or not.
		if err := r.wait(false, 1); err != nil {
			return 0, err
		}
		avail = r.tail.Load() - h
	}
	n := min(avail, uint64(len(p)))
	off := h & r.mask
	c := copy(p[:n], r.data[off:])
	copy(p[c:n], r.data)
	r.head.Store(h + n)
	if r.prodWait.Load() != 0 {
		r.spaceSeq.Add(1)
		futexWake(r.spaceSeq)
	}
	return int(n), nil
}

// WaitData waits until there is something to read. It fails with ErrClosed
// after Close, and with ErrPeerDead once the peer is dead and the ring is
// empty (bytes written before the peer died are still read first). While
// pollers are active (BeginPoll) it leaves the bytes to them and sleeps,
// until a poller or a timeout wakes it.
func (r *Ring) WaitData() error { return r.wait(true, 1) }

// wait waits until need bytes are buffered; see WaitData.
func (r *Ring) wait(deferToPollers bool, need uint64) error {
	woke := !deferToPollers
	for i := 0; ; i++ {
		// dead is loaded before the emptiness check: bytes the peer wrote
		// before it died are visible once its death is.
		dead := r.dead.Load()
		if r.tail.Load()-r.head.Load() >= need && (woke || r.polling.Load() == 0) {
			return nil
		}
		if r.closed.Load() {
			return ErrClosed
		}
		if dead && r.tail.Load()-r.head.Load() < need {
			return ErrPeerDead
		}
		if i < r.Spin && (!deferToPollers || r.polling.Load() == 0) {
			runtime.Gosched()
			continue
		}
		r.consWait.Store(1)
		seq := r.dataSeq.Load()
		// Sleep while empty, or while pollers own the bytes. Announcing
		// before checking (seq-cst) pairs with publish and EndPoll, which
		// change the state before they look at consWait.
		if (r.tail.Load()-r.head.Load() < need || (!woke && r.polling.Load() != 0)) && !r.closed.Load() && !r.dead.Load() {
			d := idleSlice
			if r.polling.Load() != 0 {
				// Pollers wake us when they leave bytes behind, but one that
				// is busy elsewhere may not poll for a while: bound the wait.
				d = pollSlice
			}
			futexWait(r.dataSeq, seq, d)
			woke = true
		}
		r.consWait.Store(0)
	}
}

const (
	futexWaitOp = 0 // FUTEX_WAIT, not private: the word is shared between processes
	futexWakeOp = 1
)

func futexWait(addr *atomic.Uint32, val uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	_, _, _ = syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// schedYield gives the core to another runnable thread, if any, without
// telling the Go scheduler (the call returns within microseconds).
func schedYield() { _, _, _ = syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }

func futexWake(addr *atomic.Uint32) {
	_, _, _ = syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, 1<<30, 0, 0, 0)
}

// Await waits until at least n bytes are buffered, for a consumer that
// reads the ring itself (no reader goroutine, no pollers): it polls for up
// to spin (an op in flight expects its message within microseconds, and a
// futex wake-up costs more than that; it yields now and then), then
// sleeps on the futex in slices of at most slice, calling check (when
// not nil) between them so that the caller can give up for reasons of its
// own. It fails with ErrClosed, with ErrPeerDead once the peer is dead and
// fewer than n bytes remain, with ctx's error, or with check's.
func (r *Ring) Await(ctx context.Context, n int, spin, slice time.Duration, check func() error) error {
	return r.AwaitYield(ctx, n, spin, r.Yield, slice, check)
}

// AwaitYield is Await with yield in place of the ring's Yield: how long
// it polls with sched_yield, when spin <= 0, before it sleeps. A large
// op's waits use longer spins and yields than a small op's, as the peer
// they wait for is busy with the same op for milliseconds, and a sleep's
// wake-up (a halted virtual CPU's, above all) costs more than the spin.
func (r *Ring) AwaitYield(ctx context.Context, n int, spin, yield, slice time.Duration, check func() error) error {
	need := uint64(n)
	p := newPacer(spin, yield, r.Budget)
	for i := 0; ; i++ {
		dead := r.dead.Load()
		if r.tail.Load()-r.head.Load() >= need {
			p.ended()
			return nil
		}
		if r.closed.Load() {
			return ErrClosed
		}
		if dead {
			return ErrPeerDead
		}
		if p.poll(i) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("shm: waiting for %d bytes: %w", n, err)
		}
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		d := slice
		if dl, ok := ctx.Deadline(); ok {
			d = min(d, time.Until(dl)+time.Millisecond)
		}
		r.consWait.Store(1)
		seq := r.dataSeq.Load()
		// Announcing before checking (seq-cst) pairs with publish.
		if r.tail.Load()-r.head.Load() < need && !r.closed.Load() && !r.dead.Load() {
			p.sleeping()
			futexWait(r.dataSeq, seq, max(d, time.Microsecond))
		}
		r.consWait.Store(0)
	}
}

// PeekStable is Peek for a goroutine other than the consumer: it reports
// false, too, when the consumer moved on while it copied (the bytes may
// then be torn).
func (r *Ring) PeekStable(p []byte) bool {
	h := r.head.Load()
	if !r.Peek(p) {
		return false
	}
	return r.head.Load() == h
}
