package cpupool

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/internal/shm"
	"github.com/gocoll/gocoll/store"
)

// defaults is what Options{} resolves to in an empty environment, with a
// group timeout of a minute, changed by change.
func defaults(change func(o *Options)) Options {
	o := Options{Threads: DefaultThreads, ConnectTimeout: time.Minute, SegmentBytes: coll.DefaultSegment,
		SmallBytes: coll.DefaultSmall, Window: coll.DefaultWindow, MaxMessageBytes: 4 << 30,
		Transport: "auto", ShmRingBytes: shm.DefaultRingBytes, LaneCopies: "auto", Bind: "auto"}
	if change != nil {
		change(&o)
	}
	return o
}

func TestResolveOptions(t *testing.T) {
	for _, c := range []struct {
		name    string
		in      Options
		timeout time.Duration
		env     map[string]string
		want    Options
		ifname  iface
	}{
		{"zero value", Options{}, time.Minute, nil, defaults(nil), iface{}},
		{"no group timeout", Options{}, 0, nil, defaults(func(o *Options) { o.ConnectTimeout = 5 * time.Minute }), iface{}},
		{"connect timeout field", Options{ConnectTimeout: time.Second}, time.Minute, nil, defaults(func(o *Options) { o.ConnectTimeout = time.Second }), iface{}},
		{"threads from env", Options{}, time.Minute, map[string]string{"GOCOLL_CPUPOOL_THREADS": "8"}, defaults(func(o *Options) { o.Threads = 8 }), iface{}},
		{"threads field wins", Options{Threads: 3}, time.Minute, map[string]string{"GOCOLL_CPUPOOL_THREADS": "8"}, defaults(func(o *Options) { o.Threads = 3 }), iface{}},
		{"transport from env", Options{}, time.Minute, map[string]string{"GOCOLL_CPUPOOL_TRANSPORT": "tcp"}, defaults(func(o *Options) { o.Transport = "tcp" }), iface{}},
		{"lane copies from env", Options{}, time.Minute, map[string]string{"GOCOLL_CPUPOOL_LANE_COPIES": "streamed"}, defaults(func(o *Options) { o.LaneCopies = "streamed" }), iface{}},
		{"lane copies field wins", Options{LaneCopies: "cached"}, time.Minute, map[string]string{"GOCOLL_CPUPOOL_LANE_COPIES": "streamed"}, defaults(func(o *Options) { o.LaneCopies = "cached" }), iface{}},
		{"bind from env", Options{}, time.Minute, map[string]string{"GOCOLL_CPUPOOL_BIND": "none"}, defaults(func(o *Options) { o.Bind = "none" }), iface{}},
		{"timing from env", Options{}, time.Minute, map[string]string{"GOCOLL_CPUPOOL_ENABLE_TIMING": "1"}, defaults(func(o *Options) { o.EnableTiming = true }), iface{}},
		{"bind field wins", Options{Bind: "auto"}, time.Minute, map[string]string{"GOCOLL_CPUPOOL_BIND": "none"}, defaults(nil), iface{}},
		{"transport field wins", Options{Transport: "shm"}, time.Minute, map[string]string{"GOCOLL_CPUPOOL_TRANSPORT": "tcp"}, defaults(func(o *Options) { o.Transport = "shm" }), iface{}},
		{"sizes", Options{SegmentBytes: 4096, SmallBytes: 64, Window: 2, SocketBufferBytes: 1 << 16, MaxMessageBytes: 1 << 20, ShmRingBytes: 1 << 14}, time.Minute, nil,
			defaults(func(o *Options) {
				o.SegmentBytes, o.SmallBytes, o.Window, o.SocketBufferBytes, o.MaxMessageBytes, o.ShmRingBytes = 4096, 64, 2, 1<<16, 1<<20, 1<<14
			}), iface{}},
		{"poll spin is left to the mesh", Options{PollSpin: -1}, time.Minute, nil, defaults(func(o *Options) { o.PollSpin = -1 }), iface{}},
		{"interface", Options{}, time.Minute, map[string]string{"GOCOLL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth0"}, defaults(nil), iface{"GOCOLL_SOCKET_IFNAME", "eth1"}},
		{"Gloo's interface", Options{}, time.Minute, map[string]string{"GLOO_SOCKET_IFNAME": "eth0"}, defaults(nil), iface{"GLOO_SOCKET_IFNAME", "eth0"}},
		{"host wins over the interface", Options{Host: "10.0.0.1"}, time.Minute, map[string]string{"GLOO_SOCKET_IFNAME": "eth0"}, defaults(func(o *Options) { o.Host = "10.0.0.1" }), iface{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ifi, err := resolveOptions(c.in, c.timeout, knob.Map(c.env))
			if err != nil || got != c.want || ifi != c.ifname {
				t.Fatalf("got %+v %+v, %v\nwant %+v %+v", got, ifi, err, c.want, c.ifname)
			}
			again, _, err := resolveOptions(got, c.timeout, knob.Map(c.env))
			if err != nil || again != got {
				t.Fatalf("resolving resolved options changed them: %+v, %v", again, err)
			}
		})
	}
}

func TestResolveOptionsRejects(t *testing.T) {
	for _, c := range []struct {
		name string
		in   Options
		env  map[string]string
		want string
	}{
		{"transport env", Options{}, map[string]string{"GOCOLL_CPUPOOL_TRANSPORT": "bogus"}, `GOCOLL_CPUPOOL_TRANSPORT="bogus": want auto, tcp or shm`},
		{"transport field", Options{Transport: "carrier-pigeon"}, nil, `cpupool.Options.Transport="carrier-pigeon": want auto, tcp or shm`},
		{"lane copies env", Options{}, map[string]string{"GOCOLL_CPUPOOL_LANE_COPIES": "fast"}, `GOCOLL_CPUPOOL_LANE_COPIES="fast": want auto, cached or streamed`},
		{"bind env", Options{}, map[string]string{"GOCOLL_CPUPOOL_BIND": "core"}, `GOCOLL_CPUPOOL_BIND="core": want auto or none`},
		{"bind field", Options{Bind: "all"}, nil, `cpupool.Options.Bind="all": want auto or none`},
		{"threads env", Options{}, map[string]string{"GOCOLL_CPUPOOL_THREADS": "0"}, `GOCOLL_CPUPOOL_THREADS="0": want a positive value`},
		{"threads env word", Options{}, map[string]string{"GOCOLL_CPUPOOL_THREADS": "two"}, `GOCOLL_CPUPOOL_THREADS="two": want an integer`},
		{"threads field", Options{Threads: -1}, nil, `cpupool.Options.Threads=-1`},
		{"segment", Options{SegmentBytes: -1}, nil, `cpupool.Options.SegmentBytes=-1`},
		{"small", Options{SmallBytes: -1}, nil, `cpupool.Options.SmallBytes=-1`},
		{"window", Options{Window: -4}, nil, `cpupool.Options.Window=-4`},
		{"socket buffer", Options{SocketBufferBytes: -1}, nil, `cpupool.Options.SocketBufferBytes=-1`},
		{"max message", Options{MaxMessageBytes: -1}, nil, `cpupool.Options.MaxMessageBytes=-1`},
		{"ring not a power of two", Options{ShmRingBytes: 3000}, nil, `cpupool.Options.ShmRingBytes=3000: want a power of two`},
		{"ring negative", Options{ShmRingBytes: -4096}, nil, `cpupool.Options.ShmRingBytes=-4096`},
		{"connect timeout", Options{ConnectTimeout: -time.Second}, nil, `cpupool.Options.ConnectTimeout=-1s`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := resolveOptions(c.in, time.Minute, knob.Map(c.env))
			if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want ErrInvalidArgument naming %s", err, c.want)
			}
		})
	}
}

// TestBadTransportFailsInit: GOCOLL_CPUPOOL_TRANSPORT=bogus fails
// dispatcher.Init, naming the variable and the value; it used to be
// reported by the first allreduce.
func TestBadTransportFailsInit(t *testing.T) {
	t.Setenv(EnvTransport, "bogus")
	for _, bs := range []string{"cpupool", "cpu:cpupool"} {
		pg, err := dispatcher.Init(context.Background(), dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1, Backend: bs})
		if err == nil {
			pg.Close(context.Background())
		}
		if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), `GOCOLL_CPUPOOL_TRANSPORT="bogus"`) {
			t.Fatalf("Init(%q): %v, want an error naming the variable", bs, err)
		}
	}
	// A bad interface name is found at Init too.
	t.Setenv(EnvTransport, "")
	t.Setenv(EnvSocketIfname, "gocoll-no-such-if0")
	_, err := dispatcher.Init(context.Background(), dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "cpupool"})
	if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), `GOCOLL_SOCKET_IFNAME="gocoll-no-such-if0"`) {
		t.Fatalf("Init with a missing interface: %v", err)
	}
}

// TestZeroOptionsInEffect: Options{} passed explicitly, and nil, run with
// the defaults, which Backend.Options reports.
func TestZeroOptionsInEffect(t *testing.T) {
	for _, n := range []string{EnvThreads, EnvTransport, EnvLaneCopies, EnvBind, EnvTiming, EnvSocketIfname, "GLOO_SOCKET_IFNAME"} {
		t.Setenv(n, "")
	}
	for _, o := range []any{nil, Options{}, &Options{}, (*Options)(nil)} {
		b, err := New(context.Background(), backend.Config{Store: store.NewHashStore(), WorldSize: 1, Timeout: time.Minute, Options: o})
		if err != nil {
			t.Fatalf("New(%#v): %v", o, err)
		}
		got := b.(*Backend).Options()
		b.Close(context.Background())
		got.Host = ""
		if want := defaults(nil); got != want {
			t.Fatalf("New(%#v): options in effect %+v, want %+v", o, got, want)
		}
	}
}

// TestREADMEListsVariables: every variable that resolution reads is in the
// README's configuration table.
func TestREADMEListsVariables(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var read []string
	if _, _, err := resolveOptions(Options{}, 0, func(n string) (string, bool) { read = append(read, n); return "", false }); err != nil {
		t.Fatal(err)
	}
	if len(read) != 7 {
		t.Fatalf("%d variables read, want 7: %v", len(read), read)
	}
	for _, n := range read {
		if !strings.Contains(string(readme), "`"+n+"`") {
			t.Errorf("README.md does not list `%s`", n)
		}
	}
}
