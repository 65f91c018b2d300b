package store

import (
	"context"
	"log/slog"
	"sync"
	"syscall"
	"time"
)

// logLimiter passes log lines through a token bucket (a burst of
// logBurst, then logRate a second) and counts the rest, so that a flood of
// refused or broken connections cannot turn into a flood of log lines (and
// of disk). The count is logged with the next line that passes.
type logLimiter struct {
	log *slog.Logger

	mu      sync.Mutex
	tokens  float64
	last    time.Time
	dropped int
}

const (
	logBurst = 32
	logRate  = 10
)

// logLimited logs a warning through the server's limiter.
func (s *TCPServer) logLimited(msg string, args ...any) {
	s.logs.emit(s.log, slog.LevelWarn, msg, args...)
}

// emit logs at level through the limiter, on l.log or else on fallback.
func (l *logLimiter) emit(fallback *slog.Logger, level slog.Level, msg string, args ...any) {
	now := time.Now()
	l.mu.Lock()
	if l.last.IsZero() {
		l.tokens = logBurst
	} else {
		l.tokens = min(logBurst, l.tokens+now.Sub(l.last).Seconds()*logRate)
	}
	l.last = now
	ok := l.tokens >= 1
	var dropped int
	if ok {
		l.tokens--
		dropped, l.dropped = l.dropped, 0
	} else {
		l.dropped++
	}
	l.mu.Unlock()
	log := l.log
	if log == nil {
		log = fallback
	}
	if log == nil || !ok {
		return
	}
	if dropped > 0 {
		log.Warn("store server: log lines left out (over 10 a second)", "count", dropped)
	}
	log.Log(context.Background(), level, msg, args...)
}

// spareFD holds one open descriptor that the accept loop gives up when the
// process is out of them, to accept and refuse the connection waiting.
type spareFD struct {
	mu sync.Mutex
	fd int
	ok bool
}

func (f *spareFD) open() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ok {
		return
	}
	fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err == nil {
		f.fd, f.ok = fd, true
	}
}

// release closes the spare descriptor, reporting whether there was one.
func (f *spareFD) release() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ok {
		return false
	}
	_ = syscall.Close(f.fd)
	f.ok = false
	return true
}

func (f *spareFD) close() { f.release() }

// nofileLimit returns the soft RLIMIT_NOFILE, or 0 when unknown.
func nofileLimit() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur > 1<<30 {
		return 0
	}
	return int(r.Cur)
}

// RaiseNofile raises the soft RLIMIT_NOFILE of the process to its hard
// limit and returns the new soft limit. A server meant for thousands of
// clients (gocoll-store serve) calls it before NewTCPServer, whose default
// MaxConns follows the soft limit.
func RaiseNofile() (int, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
			return 0, err
		}
	}
	return int(r.Cur), nil
}
