package gpuinfo

import (
	"fmt"
	"strings"
	"testing"
)

var four = []GPU{
	{Index: 0, UUID: "GPU-aaaa0000-1111"}, {Index: 1, UUID: "GPU-bbbb0000-2222"},
	{Index: 2, UUID: "GPU-bbbb9999-3333"}, {Index: 3, UUID: "GPU-dddd0000-4444"},
}

func indices(gs []GPU) []int {
	out := []int{}
	for _, g := range gs {
		out = append(out, g.Index)
	}
	return out
}

func TestVisible(t *testing.T) {
	for _, c := range []struct {
		env  string
		set  bool
		want []int
		note string // a substring of the note, "" for none
		err  string // a substring of the error, "" for none
	}{
		{"", false, []int{0, 1, 2, 3}, "", ""},
		{"", true, []int{}, "", ""},
		{"2,0", true, []int{2, 0}, "", ""},
		{" 3 , 1 ", true, []int{3, 1}, "", ""},
		{"GPU-dddd,GPU-bbbb9", true, []int{3, 2}, "", ""},
		{"GPU-AAAA0000-1111", true, []int{0}, "", ""},
		{"1,7,2", true, []int{1}, `entry 2 "7" names no GPU (NVML sees 4); CUDA ignores it and the entries after it`, ""},
		{"-1", true, []int{}, "so CUDA sees no GPU", ""},
		{"GPU-bbbb", true, []int{}, "is a prefix of 2 GPUs' UUIDs", ""},
		{"0,GPU-ffff", true, []int{0}, "matches no GPU's UUID", ""},
		{"1,1", true, nil, "", `names GPU1 (GPU-bbbb0000-2222) twice (entries 1 and 2): two ranks would share one GPU`},
		{"3,GPU-dddd0000", true, nil, "", "names GPU3 (GPU-dddd0000-4444) twice"},
		{"MIG-1234", true, nil, "", "is a MIG instance"},
	} {
		vis, note, err := Visible(four, c.env, c.set)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("CUDA_VISIBLE_DEVICES=%q: error %v, want one containing %q", c.env, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q: %v", c.env, err)
			continue
		}
		if got := indices(vis); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q: GPUs %v, want %v", c.env, got, c.want)
		}
		if (c.note == "") != (note == "") || !strings.Contains(note, c.note) {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q: note %q, want %q", c.env, note, c.note)
		}
	}
}

func TestCheckRanks(t *testing.T) {
	if err := CheckRanks(2, four[:2], "", false); err != nil {
		t.Fatal(err)
	}
	err := CheckRanks(2, four[1:2], "1", true)
	if err == nil {
		t.Fatal("2 ranks on 1 GPU: no error")
	}
	for _, want := range []string{"2 ranks need 2 GPUs", "1 visible (GPU1 GPU-bbbb0000-2222)", `CUDA_VISIBLE_DEVICES "1"`, "--nproc 1", "Duplicate GPU detected"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if err := CheckRanks(1, nil, "", true); err == nil || !strings.Contains(err.Error(), "no GPU is visible") {
		t.Errorf("no GPU: %v", err)
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{"0000:19:00.0": "00000000:19:00.0", "00000000:19:00.0": "00000000:19:00.0",
		"0000:AB:00.0": "00000000:ab:00.0", "0001:02:00.0": "00000001:02:00.0"} {
		if got := NormalizeBusID(in); got != want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestThrottleReasons(t *testing.T) {
	if got := strings.Join(ThrottleReasons(0x1|0x40|0x10000), ","); got != "gpu_idle,hw_thermal_slowdown,0x10000" {
		t.Errorf("ThrottleReasons = %s", got)
	}
	if ThrottleReasons(0) != nil {
		t.Error("no reasons: want nil")
	}
}
