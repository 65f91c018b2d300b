package cpupool

import (
	"fmt"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/internal/shm"
	"github.com/gocoll/gocoll/internal/tcpmesh"
)

// DefaultThreads is the default of Options.Threads, Gloo's.
const DefaultThreads = 2

// defaultConnectTimeout bounds the mesh's setup when neither
// Options.ConnectTimeout nor the group gives a timeout.
const defaultConnectTimeout = 5 * time.Minute

// defaultMaxMessage is the default of Options.MaxMessageBytes.
const defaultMaxMessage = 4 << 30

// iface is the interface that GOCOLL_SOCKET_IFNAME (or its alias) names,
// and which variable named it, for errors.
type iface struct{ variable, name string }

func field(name string) string { return "cpupool.Options." + name }

func size(name string, def int) knob.Knob[int] {
	return knob.Knob[int]{Field: field(name), Default: def, Check: knob.Positive[int]}
}

// The knobs of Options with a variable or a fixed default. ConnectTimeout's
// default is the group's timeout, so resolveOptions builds that one.
var (
	knobThreads = knob.Knob[int]{Field: field("Threads"), Env: []string{EnvThreads}, Default: DefaultThreads,
		Parse: knob.ParseInt, Check: knob.Positive[int]}
	knobTransport = knob.Knob[string]{Field: field("Transport"), Env: []string{EnvTransport}, Default: tcpmesh.TransportAuto,
		Check: knob.OneOf(tcpmesh.TransportAuto, tcpmesh.TransportTCP, tcpmesh.TransportShm)}
	knobLaneCopies = knob.Knob[string]{Field: field("LaneCopies"), Env: []string{EnvLaneCopies}, Default: CopiesAuto,
		Check: knob.OneOf(CopiesAuto, CopiesCached, CopiesStreamed)}
	knobBind = knob.Knob[string]{Field: field("Bind"), Env: []string{EnvBind}, Default: BindAuto,
		Check: knob.OneOf(BindAuto, BindNone)}
	knobTiming     = knob.Knob[bool]{Field: field("EnableTiming"), Env: []string{EnvTiming}, Parse: knob.ParseBool}
	knobSegment    = size("SegmentBytes", coll.DefaultSegment)
	knobSmall      = size("SmallBytes", coll.DefaultSmall)
	knobLane       = size("LaneBytes", 0) // 0: laneBytes picks by world size
	knobRawLane    = size("RawLaneBytes", 0)
	knobWindow     = size("Window", coll.DefaultWindow)
	knobSockBuf    = size("SocketBufferBytes", 0) // 0: the kernel's autotuning
	knobMaxMessage = knob.Knob[int64]{Field: field("MaxMessageBytes"), Default: defaultMaxMessage, Check: knob.Positive[int64]}
	knobShmRing    = knob.Knob[int]{Field: field("ShmRingBytes"), Default: shm.DefaultRingBytes,
		Check: func(n int) error {
			if n <= 0 || n&(n-1) != 0 {
				return knob.Want("a power of two")
			}
			return nil
		}}
)

// resolveOptions returns o with its zero fields filled from env, else
// their defaults, and every value checked; groupTimeout is the default of
// ConnectTimeout. It reads nothing but env, so tests give it a knob.Map.
// Host stays empty unless set: the address comes from the returned
// interface, or the host name, in defaultHost. The error wraps
// backend.ErrInvalidArgument and names the field or variable and the value.
func resolveOptions(o Options, groupTimeout time.Duration, env knob.Env) (Options, iface, error) {
	var err error
	num := func(dst *int, k knob.Knob[int]) {
		if err == nil {
			*dst, err = k.Resolve(env, *dst)
		}
	}
	num(&o.Threads, knobThreads)
	num(&o.SegmentBytes, knobSegment)
	num(&o.SmallBytes, knobSmall)
	num(&o.LaneBytes, knobLane)
	num(&o.RawLaneBytes, knobRawLane)
	num(&o.Window, knobWindow)
	num(&o.SocketBufferBytes, knobSockBuf)
	num(&o.ShmRingBytes, knobShmRing)
	if err == nil {
		o.MaxMessageBytes, err = knobMaxMessage.Resolve(env, o.MaxMessageBytes)
	}
	if err == nil {
		o.Transport, err = knobTransport.Resolve(env, o.Transport)
	}
	if err == nil {
		o.LaneCopies, err = knobLaneCopies.Resolve(env, o.LaneCopies)
	}
	if err == nil {
		o.Bind, err = knobBind.Resolve(env, o.Bind)
	}
	if err == nil {
		o.EnableTiming, err = knobTiming.Resolve(env, o.EnableTiming)
	}
	if err == nil {
		def := groupTimeout
		if def <= 0 {
			def = defaultConnectTimeout
		}
		o.ConnectTimeout, err = knob.Knob[time.Duration]{Field: field("ConnectTimeout"), Default: def,
			Check: knob.Positive[time.Duration]}.Resolve(env, o.ConnectTimeout)
	}
	if err != nil {
		return o, iface{}, fmt.Errorf("%w: cpupool: %w", backend.ErrInvalidArgument, err)
	}
	var ifi iface
	if o.Host == "" {
		ifi.variable, ifi.name, _ = env.Lookup(EnvSocketIfname, "GLOO_SOCKET_IFNAME")
	}
	return o, ifi, nil
}
