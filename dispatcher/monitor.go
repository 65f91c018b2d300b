package dispatcher

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/watch"
)

// Defaults of the heartbeat monitor, PyTorch's.
const (
	DefaultHeartbeatTimeout = 480 * time.Second
	DefaultCoordCheck       = time.Second
)

// dumpSignalKey is the key, in the default group's store, through which a
// rank asks every other rank to dump its flight recorder.
const dumpSignalKey = "fr/dump_signal"

// MonitorOptions configure the heartbeat monitor: a goroutine per process
// that ends the process, after dumping the flight recorder and every
// goroutine's stack, when a backend's watchdog stops advancing; and that
// dumps when a peer asks through the store. A zero field takes its
// variable's value (GOCOLL_ name, or its TORCH_NCCL_ alias), else its
// default; a set field wins over the variable.
type MonitorOptions struct {
	// Disable turns the monitor off (GOCOLL_ENABLE_MONITORING=0).
	Disable bool
	// HeartbeatTimeout is how long a watchdog heartbeat may stand still
	// (GOCOLL_HEARTBEAT_TIMEOUT_SEC; zero: 480 s; negative is invalid).
	HeartbeatTimeout time.Duration
	// CoordCheck is how often the store is polled for a peer's dump signal
	// (GOCOLL_COORD_CHECK_MILSEC; zero: 1 s; negative is invalid).
	CoordCheck time.Duration
	// Exit ends the process; nil means os.Exit. Tests replace it.
	Exit func(code int)
	// Logger gets the fatal line. Nil means slog.Default().
	Logger *slog.Logger
}

// monitor is the heartbeat monitor of a process (its default group): a
// thin goroutine that feeds the watchdogs' counts and the time to a
// watch.Heartbeat, the peers' dump signals to the flight recorder, and
// performs what they return.
type monitor struct {
	opts MonitorOptions
	root *ProcessGroup
	now  func() time.Time // the clock; time.Now outside tests
	stop chan struct{}
	done sync.WaitGroup
}

func startMonitor(root *ProcessGroup, opts MonitorOptions) *monitor {
	m := &monitor{opts: opts, root: root, now: time.Now, stop: make(chan struct{})}
	m.done.Go(m.run)
	return m
}

func (m *monitor) close() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	m.done.Wait()
}

// heartbeats returns the watchdog counters of every backend of every group.
func (m *monitor) heartbeats() map[backend.Heartbeater]uint64 {
	m.root.mu.Lock()
	groups := append([]*ProcessGroup(nil), m.root.groups...)
	m.root.mu.Unlock()
	out := map[backend.Heartbeater]uint64{}
	for _, g := range groups {
		for _, s := range g.backends {
			if h, ok := s.b.(backend.Heartbeater); ok && s.b != nil {
				out[h] = h.Heartbeat()
			}
		}
	}
	return out
}

func (m *monitor) run() {
	tick := time.NewTicker(m.opts.CoordCheck)
	defer tick.Stop()
	hb := watch.NewHeartbeat[backend.Heartbeater](m.opts.HeartbeatTimeout)
	for {
		select {
		case <-m.stop:
			return
		case <-tick.C:
		}
		m.checkSignal()
		now := m.now()
		for h, beat := range m.heartbeats() {
			if acts := hb.Observe(now, h, h.(backend.Backend).Name(), beat); acts != nil {
				m.perform(acts)
			}
		}
		if hb.Fired() {
			return
		}
	}
}

// checkSignal hands the dump signal a peer posted, if any, to the flight
// recorder, which dumps once per signal.
func (m *monitor) checkSignal() {
	fr := m.root.recorder
	if fr == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.CoordCheck)
	defer cancel()
	st := m.root.store
	if ok, err := st.Check(ctx, dumpSignalKey); err != nil || !ok {
		return
	}
	v, err := st.Get(ctx, dumpSignalKey)
	if err != nil {
		return
	}
	fr.peerSignal(string(v))
}

// perform carries out the heartbeat monitor's actions: dump the flight
// recorder, then every goroutine's stack, log one line, end the process.
func (m *monitor) perform(acts []watch.Action[backend.Heartbeater]) {
	path, stackPath := "", ""
	for _, a := range acts {
		switch a.Kind {
		case watch.Dump:
			if fr := m.root.recorder; fr != nil {
				path, _ = fr.Dump(a.Reason)
			}
		case watch.Stacks:
			stackPath = m.dumpStacks()
		case watch.Fatal:
			m.opts.Logger.Error("gocoll: fatal: "+a.Reason+"; ending the process", "rank", m.root.rank, "flight_recorder", path, "stacks", stackPath)
		case watch.Exit:
			m.opts.Exit(a.Code)
		}
	}
}

// dumpStacks writes every goroutine's stack next to the flight recorder's
// dump and returns the file.
func (m *monitor) dumpStacks() string {
	stacks := make([]byte, 1<<20)
	for {
		n := runtime.Stack(stacks, true)
		if n < len(stacks) {
			stacks = stacks[:n]
			break
		}
		stacks = make([]byte, 2*len(stacks))
	}
	stackPath := fmt.Sprintf("%s%d.stacks", DefaultDumpPrefix, m.root.rank)
	if fr := m.root.recorder; fr != nil {
		stackPath = fr.DumpPath() + ".stacks"
	}
	_ = os.WriteFile(stackPath, stacks, 0o644)
	return stackPath
}

// dumpSignalWait is how long DumpAll waits for its dump signal to reach the
// store before it returns, leaving the write to finish (within
// dumpSignalTimeout) on its own. A reachable store takes a SET, which has
// no reply, in a round trip at most; one across a cut link never does, and
// the caller, which is failing an op, should not wait for it.
const (
	dumpSignalWait    = 100 * time.Millisecond
	dumpSignalTimeout = 5 * time.Second
)

// DumpAll dumps this process's flight recorder and asks every rank, through
// the store, to dump theirs. It returns the local dump file, or "" when the
// recorder is off. Backends receive it as backend.Config.DumpAll. It
// returns within dumpSignalWait of the local dump even when the store does
// not answer: the signal is then written in the background.
func (pg *ProcessGroup) DumpAll(reason string) string {
	root := pg.root
	path := ""
	if root.recorder != nil {
		path, _ = root.recorder.Dump(reason)
	}
	sig := fmt.Sprintf("rank %d: %s", root.rank, reason)
	if root.recorder != nil {
		root.recorder.ownSignal(sig) // this rank has dumped already
	}
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		ctx, cancel := context.WithTimeout(context.Background(), dumpSignalTimeout)
		defer cancel()
		_ = root.store.Set(ctx, dumpSignalKey, []byte(sig))
	}()
	t := time.NewTimer(dumpSignalWait)
	defer t.Stop()
	select {
	case <-sent:
	case <-t.C:
	}
	return path
}
