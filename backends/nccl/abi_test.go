package nccl

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// ncclHeader returns the text of nccl.h, or skips.
func ncclHeader(t *testing.T) string {
	for _, p := range []string{os.Getenv("GOCOLL_NCCL_HEADER"), "/usr/include/nccl.h", "/usr/local/include/nccl.h"} {
		if p == "" {
			continue
		}
		if b, err := os.ReadFile(p); err == nil {
			t.Logf("checking against %s", p)
			return string(b)
		}
	}
	t.Skip("no nccl.h here (set GOCOLL_NCCL_HEADER)")
	return ""
}

var (
	ws       = regexp.MustCompile(`\s+`)
	comments = regexp.MustCompile(`(?s)/\*.*?\*/|//[^\n]*`)
)

func norm(s string) string {
	s = strings.ReplaceAll(s, "*", " * ")
	return strings.TrimSpace(ws.ReplaceAllString(s, " "))
}

// TestConfigLayoutMatchesHeader checks the hand-declared ncclConfig_t
// against nccl.h: the same fields in the same order with the same types,
// and the offsets of reference/nccl-cuda-abi.md (sizeof 80).
func TestConfigLayoutMatchesHeader(t *testing.T) {
	size, offs := configLayout()
	wantOffs := []int{0, 8, 12, 16, 20, 24, 28, 32, 40, 44, 48, 56, 60, 64, 68, 72, 76}
	if size != 80 || len(offs) != len(wantOffs) {
		t.Fatalf("sizeof %d, %d fields", size, len(offs))
	}
	for i := range offs {
		if offs[i] != wantOffs[i] {
			t.Fatalf("field %d at %d, want %d", i, offs[i], wantOffs[i])
		}
	}
	h := comments.ReplaceAllString(ncclHeader(t), "")
	m := regexp.MustCompile(`(?s)typedef struct ncclConfig_v\d+ \{(.*?)\} ncclConfig_t;`).FindStringSubmatch(h)
	if m == nil {
		t.Fatal("ncclConfig_t not found in nccl.h")
	}
	var got []string
	for _, f := range strings.Split(m[1], ";") {
		if f = norm(f); f != "" {
			got = append(got, f)
		}
	}
	want := []string{"size_t size", "unsigned int magic", "unsigned int version", "int blocking", "int cgaClusterSize",
		"int minCTAs", "int maxCTAs", "const char * netName", "int splitShare", "int trafficClass", "const char * commName",
		"int collnetEnable", "int CTAPolicy", "int shrinkShare", "int nvlsCTAs", "int nChannelsPerNetPeer", "int nvlinkCentricSched"}
	if len(got) < len(want) {
		t.Fatalf("header has %d fields: %q", len(got), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("field %d: header %q, ours %q", i, got[i], want[i])
		}
	}
	if len(got) > len(want) {
		t.Logf("header has %d more fields after ours (a newer layout; NCCL accepts the 2.28 size): %q", len(got)-len(want), got[len(want):])
	}
}

// TestPrototypesMatchHeader compares the parameter types of every NCCL
// function we call with nccl.h.
func TestPrototypesMatchHeader(t *testing.T) {
	h := comments.ReplaceAllString(ncclHeader(t), "")
	protos := map[string]string{
		"ncclGetVersion":           "int *",
		"ncclGetUniqueId":          "ncclUniqueId *",
		"ncclCommInitRankConfig":   "ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *",
		"ncclCommInitRankScalable": "ncclComm_t *, int, int, int, ncclUniqueId *, ncclConfig_t *",
		"ncclCommSplit":            "ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *",
		"ncclCommFinalize":         "ncclComm_t",
		"ncclCommDestroy":          "ncclComm_t",
		"ncclCommAbort":            "ncclComm_t",
		"ncclCommGetAsyncError":    "ncclComm_t, ncclResult_t *",
		"ncclCommCount":            "const ncclComm_t, int *",
		"ncclCommCuDevice":         "const ncclComm_t, int *",
		"ncclCommUserRank":         "const ncclComm_t, int *",
		"ncclRedOpCreatePreMulSum": "ncclRedOp_t *, void *, ncclDataType_t, ncclScalarResidence_t, ncclComm_t",
		"ncclRedOpDestroy":         "ncclRedOp_t, ncclComm_t",
		"ncclAllReduce":            "const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t",
		"ncclBroadcast":            "const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t",
		"ncclReduce":               "const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t",
		"ncclAllGather":            "const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t",
		"ncclReduceScatter":        "const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t",
		"ncclSend":                 "const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t",
		"ncclRecv":                 "void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t",
		"ncclAlltoAll":             "const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t",
		"ncclGather":               "const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t",
		"ncclScatter":              "const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t",
		"ncclGroupStart":           "void",
		"ncclGroupEnd":             "void",
	}
	for fn, want := range protos {
		m := regexp.MustCompile(`ncclResult_t\s+` + fn + `\s*\(([^)]*)\)\s*;`).FindStringSubmatch(h)
		if m == nil {
			if fn == "ncclAlltoAll" || fn == "ncclGather" || fn == "ncclScatter" || fn == "ncclCommInitRankScalable" {
				t.Logf("%s: not in this header (optional)", fn)
				continue
			}
			t.Errorf("%s: not declared in nccl.h", fn)
			continue
		}
		if strings.TrimSpace(m[1]) == "" {
			m[1] = "void"
		}
		var types []string
		for _, p := range strings.Split(m[1], ",") {
			p = norm(p)
			// Drop the parameter name: the last identifier after a type.
			f := strings.Fields(p)
			if len(f) > 1 && f[len(f)-1] != "*" {
				f = f[:len(f)-1]
			}
			types = append(types, strings.Join(f, " "))
		}
		if got := strings.Join(types, ", "); got != want {
			t.Errorf("%s(%s), ours (%s)", fn, got, want)
		}
	}
	// Enum values we hard-code.
	for _, s := range []string{`ncclInProgress\s*=\s*7`, `ncclRemoteError\s*=\s*6`, `ncclFloat32\s*=\s*7`, `ncclBfloat16\s*=\s*9`,
		`ncclFloat8e4m3\s*=\s*10`, `ncclFloat8e5m2\s*=\s*11`, `ncclAvg\s*=\s*4`, `ncclScalarHostImmediate\s*=\s*1`} {
		if !regexp.MustCompile(s).MatchString(h) {
			t.Errorf("nccl.h lacks %s", s)
		}
	}
}

// TestCUDASymbolsMatchHeader checks that cuda.h maps each API we call to the
// versioned symbol the cuda package asks dlsym for.
func TestCUDASymbolsMatchHeader(t *testing.T) {
	b, err := os.ReadFile("/usr/local/cuda/include/cuda.h")
	if err != nil {
		t.Skip("no /usr/local/cuda/include/cuda.h")
	}
	h := string(b)
	for api, sym := range map[string]string{
		"cuDevicePrimaryCtxRelease": "cuDevicePrimaryCtxRelease_v2", "cuStreamDestroy": "cuStreamDestroy_v2",
		"cuEventDestroy": "cuEventDestroy_v2", "cuMemAlloc": "cuMemAlloc_v2", "cuMemFree": "cuMemFree_v2",
		"cuMemGetInfo": "cuMemGetInfo_v2", "cuMemHostGetDevicePointer": "cuMemHostGetDevicePointer_v2",
		"cuMemcpyHtoDAsync": "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync": "cuMemcpyDtoHAsync_v2",
		"cuMemcpyDtoDAsync": "cuMemcpyDtoDAsync_v2", "cuStreamWaitValue32": "cuStreamWaitValue32_v2",
		"cuStreamWriteValue32": "cuStreamWriteValue32_v2", "cuStreamBeginCapture": "cuStreamBeginCapture_v2",
		"cuDeviceTotalMem": "cuDeviceTotalMem_v2", "cuEventElapsedTime": "cuEventElapsedTime_v2",
	} {
		// CUDA 13 wraps some in __CUDA_API_PTSZ/PTDS(sym).
		if !regexp.MustCompile(`#define\s+` + api + `\s+(__CUDA_API_\w+\()?` + sym + `\b`).MatchString(h) {
			t.Errorf("cuda.h does not map %s to %s", api, sym)
		}
	}
	for _, s := range []string{`CUDA_ERROR_NOT_READY\s*=\s*600`, `CU_STREAM_NON_BLOCKING\s*=\s*0x1`, `CU_EVENT_DISABLE_TIMING\s*=\s*0x2`,
		`CU_MEMHOSTALLOC_DEVICEMAP\s*=?\s*0x02`, `CU_STREAM_WAIT_VALUE_GEQ\s*=\s*0x0`, `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED\s*=\s*115`} {
		if !regexp.MustCompile(s).MatchString(h) {
			t.Errorf("cuda.h lacks %s", s)
		}
	}
}
