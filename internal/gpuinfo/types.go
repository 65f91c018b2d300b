// Package gpuinfo is gocoll's window on NVML (github.com/NVIDIA/go-nvml):
// which GPUs a machine has and how they are linked (the machine section of
// conformance and bench reports), their health (`conftest gpus`), the XID
// events a GPU raised since a group started, and time-bounded snapshots of
// a rank's GPU for the errors and flight-recorder dumps of a failed op.
//
// NVML is opened at run time (go-nvml dlopens libnvidia-ml.so.1), so the
// package builds with Go and gcc alone. Without cgo, without the library,
// or with GOCOLL_NVML=0, Open fails with an error that wraps
// ErrUnavailable and reads "NVML unavailable: <why>", and every caller
// prints that one line instead of the section it could not fill.
//
// The types of this file are plain Go, present in every build, so that
// cgo-free packages (metrics, the flight recorder's schema) can carry
// them; the NVML calls live in the cgo-only files.
package gpuinfo

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrUnavailable is wrapped by every error that means NVML cannot be used
// here (no cgo, no libnvidia-ml, no driver, GOCOLL_NVML=0).
var ErrUnavailable = errors.New("NVML unavailable")

// Environment variables of the package (README, "Configuration").
const (
	// EnvNVML set to a false value (0, false, off, ...) turns NVML off:
	// Open fails with ErrUnavailable.
	EnvNVML = "GOCOLL_NVML"
	// EnvLibrary is the path of libnvidia-ml.so.1 (default: the loader's
	// search, as go-nvml does).
	EnvLibrary = "GOCOLL_NVML_LIBRARY"
)

// Unknown is the value of a numeric field that NVML did not report (not
// supported on this GPU, ECC off, or the call failed; Snapshot.Errors
// says which calls failed).
const Unknown = -1

// GPU is one GPU as NVML enumerates it (PCI bus order).
type GPU struct {
	// Index is NVML's index (nvidia-smi's GPU number).
	Index int `json:"index"`
	// Name is the product name ("NVIDIA H200").
	Name string `json:"name"`
	// UUID is the GPU's UUID ("GPU-…"), the stable name CUDA_VISIBLE_DEVICES accepts.
	UUID string `json:"uuid"`
	// BusID is the PCI bus id as NVML spells it ("00000000:19:00.0").
	BusID string `json:"pci_bus_id"`
	// MemoryTotal is the GPU's memory in bytes.
	MemoryTotal uint64 `json:"memory_total_bytes"`
}

// Machine is the machine section of a report: the driver, the GPUs and the
// NVLink/PCIe topology between them.
type Machine struct {
	// Driver is the kernel driver's version ("580.159.04").
	Driver string `json:"driver_version"`
	// CUDADriver is the CUDA version the driver supports ("13.0").
	CUDADriver string `json:"cuda_driver_version"`
	// NVML is the NVML library's version.
	NVML string `json:"nvml_version"`
	// NCCL is the NCCL version, filled by callers that have NCCL loaded.
	NCCL string `json:"nccl_version,omitempty"`
	// GPUs are the GPUs of the section, in the order of Topo's rows.
	GPUs []GPU `json:"gpus"`
	// Topo is the matrix of `nvidia-smi topo -m`: Topo[i][j] is "X" on the
	// diagonal, "NV<n>" for n bonded NVLinks, else the closest common PCIe
	// ancestor (PIX, PXB, PHB, NODE, SYS).
	Topo [][]string `json:"topology"`
}

// TopoLegend explains Machine.Topo's cells, as nvidia-smi's legend does.
const TopoLegend = "X = self; NV# = # bonded NVLinks; PIX = one PCIe bridge; PXB = several PCIe bridges; " +
	"PHB = a PCIe host bridge; NODE = host bridges of one NUMA node; SYS = across NUMA nodes (SMP interconnect)"

// Lines renders the section as text lines (the Info lines of a
// conformance report, the header of a bench report).
func (m Machine) Lines() []string {
	head := fmt.Sprintf("machine: driver %s, CUDA driver %s, NVML %s", m.Driver, m.CUDADriver, m.NVML)
	if m.NCCL != "" {
		head += ", NCCL " + m.NCCL
	}
	lines := []string{head}
	for _, g := range m.GPUs {
		lines = append(lines, fmt.Sprintf("machine: GPU%d %s, %s, PCI %s, %d MiB", g.Index, g.Name, g.UUID, g.BusID, g.MemoryTotal>>20))
	}
	if len(m.Topo) == 0 {
		return lines
	}
	lines = append(lines, "machine: topology (nvidia-smi topo -m):")
	var b strings.Builder
	b.WriteString("machine:       ")
	for _, g := range m.GPUs {
		fmt.Fprintf(&b, " %-6s", "GPU"+strconv.Itoa(g.Index))
	}
	lines = append(lines, strings.TrimRight(b.String(), " "))
	for i, row := range m.Topo {
		b.Reset()
		fmt.Fprintf(&b, "machine: %-6s", "GPU"+strconv.Itoa(m.GPUs[i].Index))
		for _, c := range row {
			fmt.Fprintf(&b, " %-6s", c)
		}
		lines = append(lines, strings.TrimRight(b.String(), " "))
	}
	return append(lines, "machine: legend: "+TopoLegend)
}

// Select returns the section of the GPUs whose NVML indices are given, in
// that order, with the topology between them only.
func (m Machine) Select(indices []int) (Machine, error) {
	out := m
	out.GPUs, out.Topo = nil, nil
	pos := make([]int, len(indices))
	for k, idx := range indices {
		i := slices.IndexFunc(m.GPUs, func(g GPU) bool { return g.Index == idx })
		if i < 0 {
			return Machine{}, fmt.Errorf("gpuinfo: no GPU with NVML index %d (the machine has %d)", idx, len(m.GPUs))
		}
		pos[k] = i
		out.GPUs = append(out.GPUs, m.GPUs[i])
	}
	if len(m.Topo) == len(m.GPUs) {
		for _, i := range pos {
			row := make([]string, len(pos))
			for c, j := range pos {
				row[c] = m.Topo[i][j]
			}
			out.Topo = append(out.Topo, row)
		}
	}
	return out, nil
}

// ECC holds a GPU's ECC error counts; Unknown where ECC is off or the GPU
// does not count them.
type ECC struct {
	VolatileCorrected    int64 `json:"volatile_corrected"`
	VolatileUncorrected  int64 `json:"volatile_uncorrected"`
	AggregateCorrected   int64 `json:"aggregate_corrected"`
	AggregateUncorrected int64 `json:"aggregate_uncorrected"`
}

// XID is one XID event NVML delivered (EventTypeXidCriticalError).
type XID struct {
	// Time is when the listener received it.
	Time time.Time `json:"time"`
	// UUID and Index name the GPU.
	UUID  string `json:"uuid"`
	Index int    `json:"index"`
	// Code is the XID number.
	Code uint64 `json:"xid"`
	// Meaning is NVIDIA's name of the XID, "" for codes not in XIDMeaning.
	Meaning string `json:"meaning,omitempty"`
}

// String is "XID 79 (GPU has fallen off the bus) on GPU0 at 12:01:02.345".
func (x XID) String() string {
	s := fmt.Sprintf("XID %d", x.Code)
	if x.Meaning != "" {
		s += " (" + x.Meaning + ")"
	}
	return fmt.Sprintf("%s on GPU%d at %s", s, x.Index, x.Time.Format("15:04:05.000"))
}

// xidMeanings names the XIDs a collective job most often meets (NVIDIA's
// XID catalogue).
var xidMeanings = map[uint64]string{
	13: "graphics engine exception", 31: "GPU memory page fault", 32: "invalid or corrupted push buffer stream",
	38: "driver firmware error", 43: "GPU stopped processing", 45: "preemptive cleanup, due to a previous error",
	48: "double-bit ECC error", 61: "internal micro-controller breakpoint", 62: "internal micro-controller halt",
	63: "ECC page retirement or row remapping recorded", 64: "ECC page retirement or row remapping failure",
	68: "video processor exception", 69: "graphics engine class error", 74: "NVLink error",
	79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate", 94: "contained ECC error",
	95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error", 121: "C2C link error",
	140: "unrecovered ECC error", 143: "GPU initialization failure", 145: "NVLink RLW error", 149: "NVLink NETIR error",
	154: "GPU recovery action changed",
}

// XIDMeaning returns NVIDIA's name of XID code, or "" when the catalogue
// here does not have it.
func XIDMeaning(code uint64) string { return xidMeanings[code] }

// Health is what `conftest gpus` reports of a GPU besides its identity.
type Health struct {
	GPU
	// Lost: NVML answered ERROR_GPU_IS_LOST (the GPU fell off the bus or
	// stopped answering); nothing else could be read.
	Lost bool `json:"gpu_lost,omitempty"`
	// UtilGPU and UtilMemory are NVML's utilisation rates in percent.
	UtilGPU    int64 `json:"util_gpu_pct"`
	UtilMemory int64 `json:"util_memory_pct"`
	// MemoryUsed is the device memory in use, bytes.
	MemoryUsed int64 `json:"memory_used_bytes"`
	// TempC is the GPU temperature, PowerMW the board power in milliwatts.
	TempC   int64 `json:"temperature_c"`
	PowerMW int64 `json:"power_mw"`
	// Throttle names the current clock event (throttle) reasons.
	Throttle []string `json:"throttle"`
	// ECC are the ECC error counts.
	ECC ECC `json:"ecc"`
	// RetiredPending says whether retired pages await a reboot ("yes",
	// "no", "n/a" on GPUs that remap rows instead).
	RetiredPending string `json:"retired_pages_pending"`
	// Remapped rows (Ampere and later): correctable, uncorrectable, a
	// remap pending (needs a reset) and a remap failure.
	RemapCorrectable   int64 `json:"remapped_rows_correctable"`
	RemapUncorrectable int64 `json:"remapped_rows_uncorrectable"`
	RemapPending       bool  `json:"remap_pending"`
	RemapFailure       bool  `json:"remap_failure"`
	// Errors are the NVML calls that failed, other than "not supported".
	Errors []string `json:"errors,omitempty"`
}

// Snapshot is the state of a rank's GPU at a failure: its health and the
// XID events since its group started.
type Snapshot struct {
	Health
	// Time is when NVML was read.
	Time time.Time `json:"time"`
	// XIDs are the XID events of this GPU since XIDsSince.
	XIDs      []XID     `json:"xids"`
	XIDsSince time.Time `json:"xids_since"`
	// Stale, when set, says why Health is not current: NVML did not answer
	// within the snapshot's bound (Health is then the last complete read,
	// if any), or NVML is unavailable.
	Stale string `json:"stale,omitempty"`
}

// String renders the health on one line ("GPU0 NVIDIA H200 (GPU-…):
// util …, throttle …, ECC …, …").
func (h Health) String() string {
	var b strings.Builder
	h.writeName(&b)
	h.writeBody(&b)
	return strings.TrimSuffix(b.String(), "; ")
}

func (h Health) writeName(b *strings.Builder) {
	fmt.Fprintf(b, "GPU%d", h.Index)
	if h.Name != "" {
		fmt.Fprintf(b, " %s", h.Name)
	}
	if h.UUID != "" {
		fmt.Fprintf(b, " (%s)", h.UUID)
	}
	b.WriteString(": ")
}

// writeBody writes the readings, each part ending in "; ".
func (h Health) writeBody(b *strings.Builder) {
	if h.Lost {
		b.WriteString("NVML says the GPU is lost (fallen off the bus or not answering); ")
		return
	}
	fmt.Fprintf(b, "util %s%% (memory %s%%), memory used %s of %.1f GiB, %s C, %s W, throttle: %s; ",
		num(h.UtilGPU), num(h.UtilMemory), gib(h.MemoryUsed), float64(h.MemoryTotal)/(1<<30), num(h.TempC), watts(h.PowerMW),
		orNone(h.Throttle))
	fmt.Fprintf(b, "ECC volatile %s corrected/%s uncorrected, aggregate %s/%s; ",
		num(h.ECC.VolatileCorrected), num(h.ECC.VolatileUncorrected), num(h.ECC.AggregateCorrected), num(h.ECC.AggregateUncorrected))
	fmt.Fprintf(b, "retired pages pending %s, remapped rows %s/%s pending %v failure %v; ",
		h.RetiredPending, num(h.RemapCorrectable), num(h.RemapUncorrectable), h.RemapPending, h.RemapFailure)
	if len(h.Errors) > 0 {
		fmt.Fprintf(b, "NVML errors: %s; ", strings.Join(h.Errors, ", "))
	}
}

// String renders the snapshot on one line, for error messages: the
// health, then the XID events since the group started.
func (s Snapshot) String() string {
	var b strings.Builder
	s.writeName(&b)
	if s.Stale != "" {
		b.WriteString(s.Stale)
		b.WriteString("; ")
		if !s.Time.IsZero() {
			fmt.Fprintf(&b, "as read at %s: ", s.Time.Format("15:04:05.000"))
			s.writeBody(&b)
		}
	} else {
		s.writeBody(&b)
	}
	writeXIDs(&b, s)
	return b.String()
}

func writeXIDs(b *strings.Builder, s Snapshot) {
	since := "group start"
	if !s.XIDsSince.IsZero() {
		since = s.XIDsSince.Format("15:04:05.000")
	}
	if len(s.XIDs) == 0 {
		fmt.Fprintf(b, "XIDs since %s: none", since)
		return
	}
	parts := make([]string, len(s.XIDs))
	for i, x := range s.XIDs {
		parts[i] = x.String()
	}
	fmt.Fprintf(b, "XIDs since %s: %s", since, strings.Join(parts, ", "))
}

func num(v int64) string {
	if v == Unknown {
		return "?"
	}
	return strconv.FormatInt(v, 10)
}

func gib(v int64) string {
	if v == Unknown {
		return "?"
	}
	return fmt.Sprintf("%.1f", float64(v)/(1<<30))
}

func watts(mw int64) string {
	if mw == Unknown {
		return "?"
	}
	return fmt.Sprintf("%.0f", float64(mw)/1000)
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// throttleNames are NVML's clock event reasons, by bit.
var throttleNames = []struct {
	bit  uint64
	name string
}{
	{0x1, "gpu_idle"}, {0x2, "applications_clocks_setting"}, {0x4, "sw_power_cap"}, {0x8, "hw_slowdown"},
	{0x10, "sync_boost"}, {0x20, "sw_thermal_slowdown"}, {0x40, "hw_thermal_slowdown"},
	{0x80, "hw_power_brake_slowdown"}, {0x100, "display_clock_setting"},
}

// ThrottleReasons names the bits of an NVML clock event reasons mask.
func ThrottleReasons(mask uint64) []string {
	var out []string
	for _, t := range throttleNames {
		if mask&t.bit != 0 {
			out = append(out, t.name)
			mask &^= t.bit
		}
	}
	if mask != 0 {
		out = append(out, fmt.Sprintf("0x%x", mask))
	}
	return out
}

// NormalizeBusID spells a PCI bus id as NVML does
// ("domain:bus:device.function", an 8-digit domain, lower case), so that
// CUDA's "0000:19:00.0" and NVML's "00000000:19:00.0" compare equal.
func NormalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok {
		return s
	}
	dom = strings.TrimLeft(dom, "0")
	if len(dom) < 8 {
		dom = strings.Repeat("0", 8-len(dom)) + dom
	}
	return dom + ":" + rest
}
