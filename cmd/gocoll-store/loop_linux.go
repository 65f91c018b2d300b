package main

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/internal/uring"
)

// loopConfig is one benchmark row.
type loopConfig struct {
	addr  string
	conns int
	rate  int // offered ops/s over all connections; 0 = closed loop
	dur   time.Duration
	cpu   int  // CPU to pin the loop's thread to; -1: none
	ring  bool // closed loop on io_uring rather than epoll
}

// Phases of a benchmark connection.
const (
	phIdle    = iota
	phWaitAck // SET+WAIT sent, reading STOP_WAITING (1 byte)
	phGetVal  // GET sent, reading the value (8 + 16 bytes)
)

// bconn is one client connection of the event loop.
type bconn struct {
	fd         int
	first, get []byte
	phase      int
	got, need  int
	buf        [8 + 16]byte
	start      time.Duration   // op start (closed) or scheduled start (open)
	backlog    []time.Duration // open loop: scheduled starts not begun yet
}

// runLoop drives cfg.conns raw, non-blocking TCP connections from one
// OS thread, outside Go's netpoller, with no goroutine switch per op. The
// closed loop runs on io_uring when cfg.ring is set (a share of one
// io_uring_enter per op), else on epoll (two writes, two reads and a share
// of one epoll_wait per op).
func runLoop(cfg loopConfig) (result, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cfg.cpu >= 0 {
		var mask [16]uint64
		mask[cfg.cpu/64] |= 1 << (cfg.cpu % 64)
		if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask))); e != 0 {
			return result{}, fmt.Errorf("pin client thread to CPU %d: %w", cfg.cpu, e)
		}
		// The thread goes back to the pool unpinned: allow every CPU again.
		defer func() {
			for i := range mask {
				mask[i] = ^uint64(0)
			}
			_, _, _ = syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
		}()
	}
	sa, err := sockaddr(cfg.addr)
	if err != nil {
		return result{}, err
	}
	val := []byte("0123456789abcdef")
	cs := make([]*bconn, cfg.conns)
	defer func() {
		for _, c := range cs {
			if c != nil {
				syscall.Close(c.fd)
			}
		}
	}()
	for i := range cs {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			return result{}, err
		}
		c := &bconn{fd: fd}
		cs[i] = c
		if err := syscall.Connect(fd, sa); err != nil {
			return result{}, fmt.Errorf("connect %s: %w", cfg.addr, err)
		}
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		if err := syscall.SetNonblock(fd, true); err != nil {
			return result{}, err
		}
		c.first, c.get = benchOp("/bench/"+strconv.Itoa(i), val)
	}
	ru0 := threadCPU()
	t0 := time.Now()
	var lats []time.Duration
	var errs int
	if cfg.rate == 0 && cfg.ring {
		lats, errs, err = ringLoop(cs, val, cfg.dur)
	} else {
		lats, errs, err = epollLoop(cs, val, cfg)
	}
	if err != nil {
		return result{}, err
	}
	r := result{conns: cfg.conns, rate: cfg.rate, ops: len(lats), dur: cfg.dur, errs: errs,
		clientCPU: (threadCPU() - ru0).Seconds() / time.Since(t0).Seconds()}
	r.p50, r.p99 = percentiles(lats)
	return r, nil
}

// benchWarmUp is the start of each row that is not measured.
const benchWarmUp = 300 * time.Millisecond

// tally is a row's clock and results, shared by both loops.
type tally struct {
	t0   time.Time
	end  time.Duration // warm-up plus the measured time
	lats []time.Duration
	errs int
}

func newTally(dur time.Duration) *tally {
	return &tally{t0: time.Now(), end: benchWarmUp + dur, lats: make([]time.Duration, 0, 1<<16)}
}

func (t *tally) now() time.Duration { return time.Since(t.t0) }

// step is called when c's current read is complete. After STOP_WAITING it
// moves c on to its GET and returns the bytes to send; after the value it
// records the op and returns nil, and the time, for the next op to start.
func (t *tally) step(c *bconn, val []byte) (get []byte, at time.Duration) {
	if c.phase == phWaitAck {
		if c.buf[0] != 0 {
			t.errs++
		}
		c.phase, c.got, c.need = phGetVal, 0, 8+16
		return c.get, 0
	}
	if c.buf[0] != 16 || string(c.buf[8:]) != string(val) {
		t.errs++
	}
	at = t.now()
	if c.start >= benchWarmUp && at <= t.end {
		t.lats = append(t.lats, at-c.start)
	}
	c.phase = phIdle
	return nil, at
}

// epollLoop drives the connections with epoll and a read or write per
// request; it also serves the open loop, whose timed waits it needs.
func epollLoop(cs []*bconn, val []byte, cfg loopConfig) (lats []time.Duration, errs int, fatal error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, 0, err
	}
	defer syscall.Close(epfd)
	for i, c := range cs {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(i)}
		if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
			return nil, 0, err
		}
	}
	tl := newTally(cfg.dur)
	now, end := tl.now, tl.end
	send := func(c *bconn, b []byte) {
		for len(b) > 0 {
			n, err := syscall.Write(c.fd, b)
			if err == syscall.EAGAIN || err == syscall.EINTR {
				continue // a full 1 MB send buffer: cannot happen with one op in flight
			}
			if err != nil {
				fatal = fmt.Errorf("write: %w", err)
				return
			}
			b = b[n:]
		}
	}
	begin := func(c *bconn, at time.Duration) {
		c.start, c.phase, c.got, c.need = at, phWaitAck, 0, 1
		send(c, c.first)
	}
	// Open loop: op number seq is due at seq*period and goes to
	// connection seq % conns.
	var period time.Duration
	seq := 0
	if cfg.rate > 0 {
		period = time.Second / time.Duration(cfg.rate)
	} else {
		for _, c := range cs {
			begin(c, now())
		}
	}
	events := make([]syscall.EpollEvent, len(cs))
	for fatal == nil {
		t := now()
		if t >= end {
			break
		}
		wait := end - t
		if cfg.rate > 0 {
			for ; time.Duration(seq)*period <= t; seq++ {
				due := time.Duration(seq) * period
				c := cs[seq%len(cs)]
				if c.phase == phIdle {
					begin(c, due)
				} else {
					c.backlog = append(c.backlog, due)
				}
			}
			wait = min(wait, time.Duration(seq)*period-t)
		}
		n, err := epollWait(epfd, events, wait)
		if err != nil {
			return nil, 0, err
		}
		for _, ev := range events[:n] {
			c := cs[ev.Fd]
			if c.phase == phIdle {
				fatal = errors.New("server sent bytes that no request asked for")
				break
			}
			m, err := syscall.Read(c.fd, c.buf[c.got:c.need])
			if err == syscall.EAGAIN || err == syscall.EINTR {
				continue
			}
			if err != nil || m == 0 {
				fatal = fmt.Errorf("read: %v (server closed the connection?)", err)
				break
			}
			if c.got += m; c.got < c.need {
				continue
			}
			get, t := tl.step(c, val)
			if get != nil {
				send(c, get)
				continue
			}
			switch {
			case cfg.rate == 0:
				begin(c, t)
			case len(c.backlog) > 0:
				at := c.backlog[0]
				c.backlog = c.backlog[1:]
				begin(c, at)
			}
		}
	}
	return tl.lats, tl.errs, fatal
}

// threadCPU returns the calling thread's user+system CPU time.
func threadCPU() time.Duration {
	const rusageThread = 1
	var ru syscall.Rusage
	_ = syscall.Getrusage(rusageThread, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func sockaddr(addr string) (*syscall.SockaddrInet4, error) {
	ta, err := net.ResolveTCPAddr("tcp4", addr)
	if err != nil {
		return nil, err
	}
	sa := &syscall.SockaddrInet4{Port: ta.Port}
	copy(sa.Addr[:], ta.IP.To4())
	return sa, nil
}

// epollWait waits up to d with nanosecond resolution (epoll_pwait2,
// Linux ≥ 5.11), falling back to epoll_wait's milliseconds.
func epollWait(epfd int, events []syscall.EpollEvent, d time.Duration) (int, error) {
	const sysEpollPwait2 = 441
	for {
		ts := syscall.NsecToTimespec(int64(max(d, 0)))
		n, _, e := syscall.Syscall6(sysEpollPwait2, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(unsafe.Pointer(&ts)), 0, 0)
		switch e {
		case 0:
			return int(n), nil
		case syscall.EINTR:
			return 0, nil
		case syscall.ENOSYS:
			n, err := syscall.EpollWait(epfd, events, int((d+time.Millisecond-1)/time.Millisecond))
			if err == syscall.EINTR {
				return 0, nil
			}
			return n, err
		default:
			return 0, e
		}
	}
}

// ringLoop is the closed loop on io_uring: one io_uring_enter per batch of
// completions instead of a read or write per request, so that the client
// can drive a server faster than one epoll client on one core can.
func ringLoop(cs []*bconn, val []byte, dur time.Duration) (lats []time.Duration, errs int, err error) {
	r, err := uring.New(uint32(2 * len(cs)))
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	tl := newTally(dur)
	begin := func(i int, c *bconn, at time.Duration) error {
		c.start, c.phase, c.got, c.need = at, phWaitAck, 0, 1
		if err := r.Send(c.fd, c.first, uint64(i)<<1|1); err != nil {
			return err
		}
		return r.Recv(c.fd, c.buf[:1], uint64(i)<<1)
	}
	for i, c := range cs {
		if err := begin(i, c, tl.now()); err != nil {
			return nil, 0, err
		}
	}
	var fatal error
	for fatal == nil && tl.now() < tl.end {
		if _, err := r.Submit(1); err != nil {
			return nil, 0, err
		}
		r.Reap(func(cq uring.CQE) {
			i := int(cq.UserData >> 1)
			c := cs[i]
			if cq.UserData&1 == 1 {
				if cq.Res < 0 {
					fatal = fmt.Errorf("send: %v", syscall.Errno(-cq.Res))
				}
				return
			}
			if cq.Res <= 0 {
				fatal = fmt.Errorf("recv: %v (server closed the connection?)", syscall.Errno(-cq.Res))
				return
			}
			if c.got += int(cq.Res); c.got < c.need {
				fatal = errors.Join(fatal, r.Recv(c.fd, c.buf[c.got:c.need], cq.UserData))
				return
			}
			if get, t := tl.step(c, val); get != nil {
				fatal = errors.Join(fatal, r.Send(c.fd, get, uint64(i)<<1|1), r.Recv(c.fd, c.buf[:c.need], cq.UserData))
			} else {
				fatal = errors.Join(fatal, begin(i, c, t))
			}
		})
	}
	return tl.lats, tl.errs, fatal
}
