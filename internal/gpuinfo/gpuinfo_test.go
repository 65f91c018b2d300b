//go:build cgo

package gpuinfo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gocoll/gocoll/internal/knob"
)

// The tests fake whole machines with go-nvml's mock package (its DGX
// H200 and A100 servers), adding what those leave out: PCI bus ids,
// NVLinks, PCIe ancestry, health counters and an event set.

func pciOf(bus string) nvml.PciInfo {
	var p nvml.PciInfo
	for i := range len(bus) {
		p.BusId[i] = int8(bus[i])
	}
	return p
}

// healthy gives a mock device readings of a healthy, idle GPU.
func healthy(d *server.Device) {
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciOf("0000" + d.PciBusID), nvml.SUCCESS }
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{Total: d.MemoryInfo.Total, Used: 512 << 20, Free: d.MemoryInfo.Total - 512<<20}, nvml.SUCCESS
	}
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 7, Memory: 3}, nvml.SUCCESS }
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 31, nvml.SUCCESS }
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 74500, nvml.SUCCESS }
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return nvml.ClocksEventReasonGpuIdle, nvml.SUCCESS }
	d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) { return 0, nvml.SUCCESS }
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.SUCCESS }
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeAll, nvml.SUCCESS }
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	d.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	d.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS }
}

func devs(s *server.Server) []*server.Device {
	out := make([]*server.Device, len(s.Devices))
	for i, d := range s.Devices {
		out[i] = d.(*server.Device)
		healthy(out[i])
	}
	return out
}

// nvSwitched wires every GPU's links to NVSwitches, as on an HGX H200
// board (nvidia-smi topo -m shows NV18 between every pair).
func nvSwitched(ds []*server.Device, links int) {
	for _, d := range ds {
		d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			if l >= links {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
		}
		d.GetP2PStatusFunc = func(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
	}
}

func open(t *testing.T, s nvml.Interface) *Lib {
	t.Helper()
	l, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestMachineHGXH200(t *testing.T) {
	s := dgxh200.New()
	ds := devs(s)
	nvSwitched(ds, 18)
	m, err := open(t, s).Machine()
	if err != nil {
		t.Fatal(err)
	}
	if m.Driver != "550.54.15" || m.CUDADriver != "12.4" || len(m.GPUs) != 8 {
		t.Fatalf("driver %q CUDA %q, %d GPUs; want 550.54.15, 12.4, 8", m.Driver, m.CUDADriver, len(m.GPUs))
	}
	if g := m.GPUs[3]; g.Index != 3 || g.UUID != ds[3].UUID || !strings.Contains(g.Name, "H200") || g.BusID != "00000000:03:00.0" || g.MemoryTotal == 0 {
		t.Fatalf("GPU3 = %+v", g)
	}
	for i, row := range m.Topo {
		for j, c := range row {
			want := "NV18"
			if i == j {
				want = "X"
			}
			if c != want {
				t.Fatalf("topo[%d][%d] = %q, want %q", i, j, c, want)
			}
		}
	}
	sel, err := m.Select([]int{5, 2})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Join(sel.Lines(), "\n")
	for _, want := range []string{"machine: driver 550.54.15, CUDA driver 12.4", "GPU5 NVIDIA H200", ds[2].UUID,
		"machine:        GPU5   GPU2", "machine: GPU5   X      NV18", "machine: GPU2   NV18   X", "legend"} {
		if !strings.Contains(lines, want) {
			t.Errorf("section lacks %q:\n%s", want, lines)
		}
	}
	if _, err := m.Select([]int{8}); err == nil {
		t.Error("Select of a ninth GPU on an 8-GPU machine: no error")
	}
}

// A DGX A100-like box wired by hand: GPU0 and GPU1 joined by 12 direct
// links, GPU2 only on PCIe (a PCIe switch with GPU1, across NUMA nodes
// from GPU0).
func TestMachineDirectLinksAndPCIe(t *testing.T) {
	s := dgxa100.New()
	s.Devices = s.Devices[:3]
	ds := devs(s)
	for k, peer := range map[int]int{0: 1, 1: 0} {
		d, p := ds[k], ds[peer]
		d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			if l >= 12 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) { return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS }
		// NVML spells the remote's bus id with an 8-digit domain; the
		// matrix must match it against the 4-digit one of GetPciInfo.
		d.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) { return pciOf("0000" + p.PciBusID), nvml.SUCCESS }
	}
	pcieSwitch := func(peer nvml.Device) func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		return func(o nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			if o == peer {
				return nvml.TOPOLOGY_SINGLE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
	}
	ds[1].GetTopologyCommonAncestorFunc, ds[2].GetTopologyCommonAncestorFunc = pcieSwitch(ds[2]), pcieSwitch(ds[1])
	m, err := open(t, s).Machine()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"X", "NV12", "SYS"}, {"NV12", "X", "PIX"}, {"SYS", "PIX", "X"}}
	if fmt.Sprint(m.Topo) != fmt.Sprint(want) {
		t.Fatalf("topology %v, want %v", m.Topo, want)
	}
}

func TestHealth(t *testing.T) {
	s := dgxh200.New()
	ds := devs(s)
	d := ds[1]
	d.GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, cnt nvml.EccCounterType) (uint64, nvml.Return) {
		if typ == nvml.MEMORY_ERROR_TYPE_UNCORRECTED && cnt == nvml.AGGREGATE_ECC {
			return 2, nvml.SUCCESS
		}
		return 0, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 1, 2, true, false, nvml.SUCCESS }
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
		return nvml.ClocksEventReasonSwPowerCap | uint64(nvml.ClocksThrottleReasonHwThermalSlowdown), nvml.SUCCESS
	}
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	l := open(t, s)
	h, err := l.Health(1)
	if err != nil {
		t.Fatal(err)
	}
	if h.ECC != (ECC{0, 0, 0, 2}) || h.RemapCorrectable != 1 || h.RemapUncorrectable != 2 || !h.RemapPending || h.RetiredPending != "n/a" {
		t.Fatalf("health %+v", h)
	}
	if fmt.Sprint(h.Throttle) != "[sw_power_cap hw_thermal_slowdown]" {
		t.Fatalf("throttle %v", h.Throttle)
	}
	if h.PowerMW != Unknown || len(h.Errors) != 1 || !strings.Contains(h.Errors[0], "power") {
		t.Fatalf("a failed power reading: PowerMW %d, errors %q", h.PowerMW, h.Errors)
	}
	h0, err := l.Health(0)
	if err != nil || h0.TempC != 31 || h0.UtilGPU != 7 || h0.MemoryUsed != 512<<20 || len(h0.Errors) != 0 {
		t.Fatalf("GPU0 health %+v, %v", h0, err)
	}
}

// eventSet is a mock event set fed by a channel.
func eventSet(events <-chan nvml.EventData) *mock.EventSet {
	return &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			select {
			case ev := <-events:
				return ev, nvml.SUCCESS
			case <-time.After(time.Duration(ms) * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
}

func TestMonitorXIDsAndSnapshot(t *testing.T) {
	s := dgxh200.New()
	ds := devs(s)
	events := make(chan nvml.EventData)
	var registered atomic.Int32
	for _, d := range ds {
		d.RegisterEventsFunc = func(types uint64, _ nvml.EventSet) nvml.Return {
			if types&nvml.EventTypeXidCriticalError == 0 {
				t.Errorf("registered %#x, without XID critical errors", types)
			}
			registered.Add(1)
			return nvml.SUCCESS
		}
	}
	ds[7].GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeClock, nvml.SUCCESS }
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return eventSet(events), nvml.SUCCESS }
	m, err := open(t, s).NewMonitor(MonitorOptions{Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if registered.Load() != 7 || len(m.Notes()) != 1 || !strings.Contains(m.Notes()[0], "GPU7") {
		t.Fatalf("registered on %d GPUs, notes %q; want 7 and a note on GPU7", registered.Load(), m.Notes())
	}
	events <- nvml.EventData{Device: ds[2], EventType: nvml.EventTypeXidCriticalError, EventData: 13}
	// XID 13 must be stamped before since: wait until the monitor holds it
	// rather than guessing how long that takes on a loaded machine.
	for deadline := time.Now().Add(5 * time.Second); len(m.XIDs("", time.Time{})) < 1; {
		if time.Now().After(deadline) {
			t.Fatal("the monitor never read XID 13")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond)
	since := time.Now()
	time.Sleep(5 * time.Millisecond)
	events <- nvml.EventData{Device: ds[2], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	events <- nvml.EventData{Device: ds[4], EventType: nvml.EventTypeXidCriticalError, EventData: 48}
	deadline := time.Now().Add(5 * time.Second)
	for len(m.XIDs("", since)) < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	snap := m.Snapshot(ctx, "0000:02:00.0", since) // CUDA's spelling of GPU2's bus id
	if snap.Index != 2 || snap.UUID != ds[2].UUID || snap.Stale != "" || snap.UtilGPU != 7 {
		t.Fatalf("snapshot %+v", snap)
	}
	if len(snap.XIDs) != 1 || snap.XIDs[0].Code != 79 || snap.XIDs[0].Index != 2 {
		t.Fatalf("XIDs since the group started: %v; want only XID 79 of GPU2 (13 came before, 48 is GPU4's)", snap.XIDs)
	}
	line := snap.String()
	for _, want := range []string{"GPU2 NVIDIA H200", "util 7% (memory 3%)", "31 C", "throttle: gpu_idle", "ECC volatile 0 corrected/0 uncorrected",
		"XID 79 (GPU has fallen off the bus) on GPU2"} {
		if !strings.Contains(line, want) {
			t.Errorf("snapshot line lacks %q: %s", want, line)
		}
	}
	if len(m.XIDs("", time.Time{})) != 3 {
		t.Errorf("all XIDs: %v", m.XIDs("", time.Time{}))
	}
}

// A GPU whose NVML hangs: the snapshot returns at its deadline, marked
// stale, with the XIDs (which need no NVML call); while the read hangs,
// no second read starts; once NVML answers, snapshots are current again.
func TestSnapshotBoundedWhenNVMLHangs(t *testing.T) {
	s := dgxh200.New()
	ds := devs(s)
	events := make(chan nvml.EventData, 1)
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return eventSet(events), nvml.SUCCESS }
	m, err := open(t, s).NewMonitor(MonitorOptions{Poll: 20 * time.Millisecond, Reuse: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	since := time.Now()
	events <- nvml.EventData{Device: ds[0], EventType: nvml.EventTypeXidCriticalError, EventData: 43}
	for len(m.XIDs("", since)) == 0 {
		time.Sleep(time.Millisecond)
	}
	// One good read first: the stale snapshot then carries it.
	if sn := m.Snapshot(context.Background(), ds[0].PciBusID, since); sn.Stale != "" {
		t.Fatal(sn.Stale)
	}
	release := make(chan struct{})
	var reads atomic.Int32
	ds[0].GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		reads.Add(1)
		<-release
		return nvml.Utilization{Gpu: 99}, nvml.SUCCESS
	}
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		t0 := time.Now()
		sn := m.Snapshot(ctx, ds[0].PciBusID, since)
		took := time.Since(t0)
		cancel()
		if took > time.Second {
			t.Fatalf("snapshot %d took %v with NVML hung", i, took)
		}
		if sn.Stale == "" || sn.UtilGPU != 7 || len(sn.XIDs) != 1 || sn.XIDs[0].Code != 43 {
			t.Fatalf("snapshot %d with NVML hung: stale %q, util %d, XIDs %v", i, sn.Stale, sn.UtilGPU, sn.XIDs)
		}
		if i == 0 && !strings.Contains(sn.Stale, "did not answer within 30ms") {
			t.Errorf("first stale reason %q", sn.Stale)
		}
		if i > 0 && !strings.Contains(sn.Stale, "has not answered a read started") {
			t.Errorf("later stale reason %q", sn.Stale)
		}
		if !strings.Contains(sn.String(), "XID 43 (GPU stopped processing)") {
			t.Errorf("stale line lacks the XID: %s", sn)
		}
	}
	if n := reads.Load(); n != 1 {
		t.Fatalf("%d reads started while one hung; want 1", n)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		sn := m.Snapshot(context.Background(), ds[0].PciBusID, since)
		if sn.Stale == "" && sn.UtilGPU == 99 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no current snapshot after NVML answered: %+v", sn)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestLostGPU(t *testing.T) {
	s := dgxh200.New()
	ds := devs(s)
	ds[0].GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_GPU_IS_LOST }
	ds[0].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		t.Error("read the memory of a lost GPU")
		return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
	}
	ds[0].GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciOf("0000" + ds[0].PciBusID), nvml.SUCCESS }
	h := readHealth(ds[0], GPU{Index: 0, UUID: ds[0].UUID, Name: "NVIDIA H200"})
	sn := Snapshot{Health: h, Time: time.Now()}
	if !h.Lost || !strings.Contains(sn.String(), "NVML says the GPU is lost") {
		t.Fatalf("lost GPU: %+v\n%s", h, sn)
	}
}

func TestOpenUnavailable(t *testing.T) {
	_, err := Open(Options{Env: knob.Map(map[string]string{EnvNVML: "0"})})
	if !errors.Is(err, ErrUnavailable) || err.Error() != "NVML unavailable: GOCOLL_NVML=0" {
		t.Fatalf("GOCOLL_NVML=0: %v", err)
	}
	_, err = Open(Options{Env: knob.Map(map[string]string{EnvNVML: "maybe"})})
	if err == nil || errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), `GOCOLL_NVML="maybe"`) {
		t.Fatalf("GOCOLL_NVML=maybe: %v", err)
	}
	_, err = Open(Options{Env: knob.Map(map[string]string{EnvLibrary: "/nonexistent/libnvidia-ml.so.1"})})
	if !errors.Is(err, ErrUnavailable) || !strings.HasPrefix(err.Error(), "NVML unavailable: ") ||
		!strings.Contains(err.Error(), "GOCOLL_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("missing library: %v", err)
	}
}
