package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gocoll/gocoll/internal/gpuinfo"
)

func twoGPUs() ([]gpuinfo.GPU, error) {
	return []gpuinfo.GPU{{Index: 0, UUID: "GPU-aaaa"}, {Index: 1, UUID: "GPU-bbbb"}}, nil
}

func noNVML() ([]gpuinfo.GPU, error) {
	return nil, fmt.Errorf("%w: libnvidia-ml.so.1 not found", gpuinfo.ErrUnavailable)
}

func TestGPURanks(t *testing.T) {
	cuda1 := func() (int, error) { return 1, nil }
	noCUDA := func() (int, error) { return 0, errors.New("cuda: unavailable") }
	for _, c := range []struct {
		name    string
		d       discovery
		backend string
		nproc   int
		set     bool
		want    int
		err     string // substring of the error
		out     string // substring of the printed lines
	}{
		{"one rank per GPU", discovery{list: twoGPUs}, "nccl", 2, false, 2, "", "one rank per visible GPU: 2 (GPU0 GPU-aaaa, GPU1 GPU-bbbb)"},
		{"CUDA_VISIBLE_DEVICES by UUID", discovery{list: twoGPUs, env: "GPU-bbbb", envSet: true}, "nccl", 2, false, 1, "", "1 (GPU1 GPU-bbbb)"},
		{"more ranks than GPUs", discovery{list: twoGPUs, env: "1", envSet: true}, "nccl", 2, true, 0, "2 ranks need 2 GPUs (one per rank), but 1 visible (GPU1 GPU-bbbb)", ""},
		{"a GPU named twice", discovery{list: twoGPUs, env: "0,GPU-aaaa", envSet: true}, "nccl", 2, false, 0, "names GPU0 (GPU-aaaa) twice", ""},
		{"--nproc within the GPUs", discovery{list: twoGPUs}, "cpu:cpupool,cuda:nccl", 1, true, 1, "", ""},
		{"no GPU visible", discovery{list: twoGPUs, env: "", envSet: true}, "nccl", 2, false, 0, "no GPU is visible", ""},
		{"no GPU visible, CPU served", discovery{list: twoGPUs, env: "", envSet: true}, "cpu:cpupool,cuda:nccl", 2, false, 2, "", "no visible GPU; 2 ranks on CPU tensors"},
		{"cpupool is left alone", discovery{list: noNVML}, "cpupool", 4, true, 4, "", ""},
		{"no NVML: CUDA counts", discovery{list: noNVML, cudaCount: cuda1}, "nccl", 2, false, 1, "", "NVML unavailable: libnvidia-ml.so.1 not found; CUDA sees 1 GPUs"},
		{"no NVML: CUDA refuses two ranks", discovery{list: noNVML, cudaCount: cuda1}, "nccl", 2, true, 0, "2 ranks need 2 GPUs", ""},
		{"neither NVML nor CUDA", discovery{list: noNVML, cudaCount: noCUDA}, "nccl", 2, false, 0, "no GPU found for --backend nccl: NVML unavailable", ""},
	} {
		var out strings.Builder
		got, err := c.d.ranks(&out, c.backend, c.nproc, c.set)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err == "" && got != c.want:
			t.Errorf("%s: %d ranks, want %d", c.name, got, c.want)
		}
		if !strings.Contains(out.String(), c.out) {
			t.Errorf("%s: printed %q, want %q", c.name, out.String(), c.out)
		}
	}
}
