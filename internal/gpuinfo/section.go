package gpuinfo

import (
	"os"
	"strconv"
)

// VisibleMachine opens NVML and returns the machine section of the GPUs a
// CUDA process here sees (CUDA_VISIBLE_DEVICES, in CUDA's order), the
// first n of them when n > 0 (the GPUs of n local ranks), with the
// topology between them. note is Visible's, when CUDA_VISIBLE_DEVICES
// ends early.
func VisibleMachine(n int) (m Machine, note string, err error) {
	lib, err := Open(Options{})
	if err != nil {
		return Machine{}, "", err
	}
	defer lib.Close()
	all, err := lib.Machine()
	if err != nil {
		return Machine{}, "", err
	}
	env, set := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	vis, note, err := Visible(all.GPUs, env, set)
	if err != nil {
		return Machine{}, note, err
	}
	if n > 0 && n < len(vis) {
		vis = vis[:n]
	}
	idx := make([]int, len(vis))
	for i, g := range vis {
		idx[i] = g.Index
	}
	m, err = all.Select(idx)
	return m, note, err
}

// SectionLines is the machine section of the GPUs of n local ranks (all
// visible ones when n <= 0) as report lines, with the NCCL version when
// nccl is not "". Where NVML is unavailable it is the one line saying why.
func SectionLines(n int, nccl string) []string {
	m, note, err := VisibleMachine(n)
	if err != nil {
		line := "machine: " + err.Error()
		if nccl != "" {
			line += "; NCCL " + nccl
		}
		return []string{line}
	}
	m.NCCL = nccl
	lines := m.Lines()
	if note != "" {
		lines = append(lines, "machine: "+note)
	}
	if n > len(m.GPUs) {
		lines = append(lines, "machine: "+strconv.Itoa(n)+" ranks, but only "+strconv.Itoa(len(m.GPUs))+" GPUs are visible")
	}
	return lines
}
