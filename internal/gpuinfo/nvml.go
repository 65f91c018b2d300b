//go:build cgo

package gpuinfo

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gocoll/gocoll/internal/knob"
)

// Options configure Open. The zero value is the defaults.
type Options struct {
	// Library is the path of libnvidia-ml.so.1 (default: GOCOLL_NVML_LIBRARY,
	// else the loader's search).
	Library string
	// Env looks variables up (default os.LookupEnv); tests replace it.
	Env knob.Env
}

// Lib is an initialised NVML. Its methods are safe for concurrent use.
// Close it when done (NVML counts its initialisations).
type Lib struct {
	n      nvml.Interface
	mu     sync.Mutex
	closed bool
}

// Open loads and initialises NVML. Every failure wraps ErrUnavailable and
// reads "NVML unavailable: …".
func Open(opts Options) (*Lib, error) {
	env := opts.Env
	if env == nil {
		env = os.LookupEnv
	}
	if name, v, ok := env.Lookup(EnvNVML); ok {
		on, err := knob.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", name, v, err)
		}
		if !on {
			return nil, fmt.Errorf("%w: %s=%s", ErrUnavailable, name, v)
		}
	}
	path := opts.Library
	if path == "" {
		_, path, _ = env.Lookup(EnvLibrary)
	}
	var lopts []nvml.LibraryOption
	if path != "" {
		lopts = append(lopts, nvml.WithLibraryPath(path))
	}
	lib, err := initLib(nvml.New(lopts...))
	if err != nil && path != "" {
		err = fmt.Errorf("%w (%s=%s)", err, EnvLibrary, path)
	}
	return lib, err
}

// New wraps an NVML interface (go-nvml's, or a mock of pkg/nvml/mock) and
// initialises it.
func New(n nvml.Interface) (*Lib, error) { return initLib(n) }

func initLib(n nvml.Interface) (lib *Lib, err error) {
	// go-nvml panics on some loader failures instead of returning them.
	defer func() {
		if r := recover(); r != nil {
			lib, err = nil, fmt.Errorf("%w: %v", ErrUnavailable, r)
		}
	}()
	if ret := n.Init(); ret == nvml.ERROR_LIBRARY_NOT_FOUND {
		return nil, fmt.Errorf("%w: libnvidia-ml.so.1 not found (no NVIDIA driver here, or %s names another path)", ErrUnavailable, EnvLibrary)
	} else if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: nvmlInit: %v", ErrUnavailable, nvml.ErrorString(ret))
	}
	return &Lib{n: n}, nil
}

// Close shuts NVML down (once).
func (l *Lib) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if ret := l.n.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("gpuinfo: nvmlShutdown: %v", nvml.ErrorString(ret))
	}
	return nil
}

// callError is an NVML call's failure, naming the call.
type callError struct {
	call string
	ret  nvml.Return
}

func (e *callError) Error() string {
	return fmt.Sprintf("gpuinfo: %s: %v", e.call, nvml.ErrorString(e.ret))
}

func nvErr(call string, ret nvml.Return) error { return &callError{call, ret} }

// lost reports whether err is NVML's ERROR_GPU_IS_LOST.
func lost(err error) bool {
	var ce *callError
	return errors.As(err, &ce) && ce.ret == nvml.ERROR_GPU_IS_LOST
}

// Machine reads the machine section of every GPU NVML sees (the caller
// narrows it with Machine.Select), with the topology between them.
func (l *Lib) Machine() (Machine, error) {
	var m Machine
	var ret nvml.Return
	if m.Driver, ret = l.n.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		return m, nvErr("nvmlSystemGetDriverVersion", ret)
	}
	if v, ret := l.n.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		m.CUDADriver = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	m.NVML, _ = l.n.SystemGetNVMLVersion()
	devs, gpus, err := l.devices()
	if err != nil {
		return m, err
	}
	m.GPUs = gpus
	m.Topo = l.topology(devs, gpus)
	return m, nil
}

// GPUs enumerates the GPUs in NVML order.
func (l *Lib) GPUs() ([]GPU, error) {
	_, gpus, err := l.devices()
	return gpus, err
}

func (l *Lib) devices() ([]nvml.Device, []GPU, error) {
	n, ret := l.n.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nil, nvErr("nvmlDeviceGetCount", ret)
	}
	devs := make([]nvml.Device, 0, n)
	gpus := make([]GPU, 0, n)
	for i := range n {
		d, ret := l.n.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, nil, nvErr(fmt.Sprintf("nvmlDeviceGetHandleByIndex(%d)", i), ret)
		}
		g, err := identify(d, i)
		if err != nil {
			return nil, nil, err
		}
		devs, gpus = append(devs, d), append(gpus, g)
	}
	return devs, gpus, nil
}

// identify reads a device's identity; index is its NVML index.
func identify(d nvml.Device, index int) (GPU, error) {
	g := GPU{Index: index}
	var ret nvml.Return
	if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return g, nvErr(fmt.Sprintf("nvmlDeviceGetUUID(GPU%d)", index), ret)
	}
	g.Name, _ = d.GetName()
	if p, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
		g.BusID = busID(p)
	}
	if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
		g.MemoryTotal = mem.Total
	}
	return g, nil
}

// busID is the PciInfo's bus id string, or one built from its numbers
// when NVML left the string empty.
func busID(p nvml.PciInfo) string {
	var b strings.Builder
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	if b.Len() > 0 {
		return b.String()
	}
	return fmt.Sprintf("%08x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
}

// topology builds nvidia-smi topo -m's matrix: NV<n> where n NVLinks join
// the two GPUs (directly, or both through NVSwitches with P2P over NVLink
// working), else the PCIe common ancestor.
func (l *Lib) topology(devs []nvml.Device, gpus []GPU) [][]string {
	type links struct {
		peers   map[string]int // remote bus id (normalised) → active links
		switch_ int            // active links to NVSwitches
	}
	ls := make([]links, len(devs))
	for i, d := range devs {
		ls[i].peers = map[string]int{}
		for link := range nvml.NVLINK_MAX_LINKS {
			st, ret := d.GetNvLinkState(link)
			if ret != nvml.SUCCESS {
				if ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_NOT_SUPPORTED {
					break // past the GPU's last link, or no NVLink at all
				}
				continue
			}
			if st != nvml.FEATURE_ENABLED {
				continue
			}
			if t, ret := d.GetNvLinkRemoteDeviceType(link); ret == nvml.SUCCESS && t == nvml.NVLINK_DEVICE_TYPE_SWITCH {
				ls[i].switch_++
				continue
			}
			if p, ret := d.GetNvLinkRemotePciInfo(link); ret == nvml.SUCCESS {
				ls[i].peers[NormalizeBusID(busID(p))]++
			}
		}
	}
	topo := make([][]string, len(devs))
	for i := range devs {
		topo[i] = make([]string, len(devs))
		for j := range devs {
			switch {
			case i == j:
				topo[i][j] = "X"
			case ls[i].peers[NormalizeBusID(gpus[j].BusID)] > 0:
				topo[i][j] = fmt.Sprintf("NV%d", ls[i].peers[NormalizeBusID(gpus[j].BusID)])
			case ls[i].switch_ > 0 && ls[j].switch_ > 0 && p2pNVLink(devs[i], devs[j]):
				topo[i][j] = fmt.Sprintf("NV%d", min(ls[i].switch_, ls[j].switch_))
			default:
				topo[i][j] = ancestor(devs[i], devs[j])
			}
		}
	}
	return topo
}

func p2pNVLink(a, b nvml.Device) bool {
	st, ret := a.GetP2PStatus(b, nvml.P2P_CAPS_INDEX_NVLINK)
	return ret == nvml.SUCCESS && st == nvml.P2P_STATUS_OK
}

// ancestor names the closest common PCIe ancestor as nvidia-smi does.
func ancestor(a, b nvml.Device) string {
	lvl, ret := a.GetTopologyCommonAncestor(b)
	if ret != nvml.SUCCESS {
		return "?"
	}
	switch lvl {
	case nvml.TOPOLOGY_INTERNAL:
		return "X"
	case nvml.TOPOLOGY_SINGLE:
		return "PIX"
	case nvml.TOPOLOGY_MULTIPLE:
		return "PXB"
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return "PHB"
	case nvml.TOPOLOGY_NODE:
		return "NODE"
	}
	return "SYS"
}

// device returns the NVML device whose PCI bus id is busID (any domain
// width, as CUDA and NVML spell them).
func (l *Lib) device(bus string) (nvml.Device, GPU, error) {
	devs, gpus, err := l.devices()
	if err != nil {
		return nil, GPU{}, err
	}
	want := NormalizeBusID(bus)
	for i, g := range gpus {
		if NormalizeBusID(g.BusID) == want {
			return devs[i], g, nil
		}
	}
	return nil, GPU{}, fmt.Errorf("gpuinfo: NVML has no GPU at PCI %s", bus)
}

// Health reads the health of the GPU with NVML index i.
func (l *Lib) Health(i int) (Health, error) {
	d, ret := l.n.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return Health{}, nvErr(fmt.Sprintf("nvmlDeviceGetHandleByIndex(%d)", i), ret)
	}
	g, err := identify(d, i)
	if err != nil {
		return Health{GPU: g, Lost: lost(err)}, err
	}
	return readHealth(d, g), nil
}

// readHealth reads everything Health holds; calls that fail leave Unknown
// and, unless the GPU does not support them, a line in Errors.
func readHealth(d nvml.Device, g GPU) Health {
	h := Health{GPU: g, UtilGPU: Unknown, UtilMemory: Unknown, MemoryUsed: Unknown, TempC: Unknown, PowerMW: Unknown,
		ECC: ECC{Unknown, Unknown, Unknown, Unknown}, RetiredPending: "n/a", RemapCorrectable: Unknown, RemapUncorrectable: Unknown}
	bad := func(call string, ret nvml.Return) bool {
		switch ret {
		case nvml.SUCCESS:
			return false
		case nvml.ERROR_GPU_IS_LOST:
			h.Lost = true
		case nvml.ERROR_NOT_SUPPORTED:
		default:
			h.Errors = append(h.Errors, call+": "+nvml.ErrorString(ret))
		}
		return true
	}
	if u, ret := d.GetUtilizationRates(); !bad("utilization", ret) {
		h.UtilGPU, h.UtilMemory = int64(u.Gpu), int64(u.Memory)
	}
	if h.Lost {
		return h // a lost GPU answers nothing; do not wait on each call
	}
	if m, ret := d.GetMemoryInfo(); !bad("memory", ret) {
		h.MemoryUsed = int64(m.Used)
		if h.MemoryTotal == 0 {
			h.MemoryTotal = m.Total
		}
	}
	if t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); !bad("temperature", ret) {
		h.TempC = int64(t)
	}
	if p, ret := d.GetPowerUsage(); !bad("power", ret) {
		h.PowerMW = int64(p)
	}
	mask, ret := d.GetCurrentClocksEventReasons()
	if ret == nvml.ERROR_FUNCTION_NOT_FOUND || ret == nvml.ERROR_NOT_SUPPORTED {
		mask, ret = d.GetCurrentClocksThrottleReasons()
	}
	if !bad("clock event reasons", ret) {
		h.Throttle = ThrottleReasons(mask)
	}
	for _, c := range []struct {
		dst *int64
		typ nvml.MemoryErrorType
		cnt nvml.EccCounterType
	}{
		{&h.ECC.VolatileCorrected, nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC},
		{&h.ECC.VolatileUncorrected, nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC},
		{&h.ECC.AggregateCorrected, nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.AGGREGATE_ECC},
		{&h.ECC.AggregateUncorrected, nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC},
	} {
		if v, ret := d.GetTotalEccErrors(c.typ, c.cnt); !bad("ECC counts", ret) {
			*c.dst = int64(v)
		}
	}
	if st, ret := d.GetRetiredPagesPendingStatus(); !bad("retired pages", ret) {
		h.RetiredPending = "no"
		if st == nvml.FEATURE_ENABLED {
			h.RetiredPending = "yes"
		}
	}
	if corr, unc, pending, failed, ret := d.GetRemappedRows(); !bad("remapped rows", ret) {
		h.RemapCorrectable, h.RemapUncorrectable, h.RemapPending, h.RemapFailure = int64(corr), int64(unc), pending, failed
	}
	h.Errors = dedup(h.Errors)
	return h
}

func dedup(s []string) []string {
	var out []string
	for _, x := range s {
		if len(out) == 0 || out[len(out)-1] != x {
			out = append(out, x)
		}
	}
	return out
}
