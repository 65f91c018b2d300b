package ucc

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// abiStructs are the structs ucc_dl.h declares by hand, by their ucc.h
// names, with their fields in gu_layout's numbering; the last field of
// ucc_ep_map_t is its anonymous union, named by its first member.
var abiStructs = []struct {
	name   string
	fields []string
}{
	{"ucc_lib_params_t", []string{"mask", "thread_mode", "coll_types", "reduction_types", "sync_type"}},
	{"ucc_oob_coll_t", []string{"allgather", "req_test", "req_free", "coll_info", "n_oob_eps", "oob_ep"}},
	{"ucc_context_params_t", []string{"mask", "type", "sync_type", "oob", "ctx_id", "mem_params"}},
	{"ucc_team_params_t", []string{"mask", "flags", "ordering", "outstanding_colls", "ep", "ep_list", "ep_range", "team_size",
		"sync_type", "oob", "p2p_conn", "mem_params", "ep_map", "id"}},
	{"ucc_coll_buffer_info_t", []string{"buffer", "count", "datatype", "mem_type"}},
	{"ucc_coll_buffer_info_v_t", []string{"buffer", "counts", "displacements", "datatype", "mem_type"}},
	{"ucc_coll_args_t", []string{"mask", "coll_type", "src", "dst", "op", "flags", "root", "error_type", "tag",
		"global_work_buffer", "cb", "timeout", "active_set", "src_memh", "dst_memh"}},
	{"ucc_ep_map_t", []string{"type", "ep_num", "strided"}},
	{"ucc_team_p2p_conn_t", []string{"conn_info_lookup", "conn_info_release", "conn_ctx", "req_test", "req_free"}},
}

// abiConstants are the enum values the Go side hard-codes.
var abiConstants = map[string]uint64{
	"UCC_COLL_TYPE_ALLGATHER": collAllgather, "UCC_COLL_TYPE_ALLGATHERV": collAllgatherv, "UCC_COLL_TYPE_ALLREDUCE": collAllreduce,
	"UCC_COLL_TYPE_ALLTOALL": collAlltoall, "UCC_COLL_TYPE_ALLTOALLV": collAlltoallv, "UCC_COLL_TYPE_BARRIER": collBarrier,
	"UCC_COLL_TYPE_BCAST": collBcast, "UCC_COLL_TYPE_GATHER": collGather, "UCC_COLL_TYPE_REDUCE": collReduce,
	"UCC_COLL_TYPE_REDUCE_SCATTER": collReduceScatter,
	"UCC_COLL_ARGS_FLAG_IN_PLACE":  flagInPlace, "UCC_COLL_ARGS_FLAG_COUNT_64BIT | UCC_COLL_ARGS_FLAG_DISPLACEMENTS_64BIT": flag64,
	"UCC_DT_INT8": predefined(0), "UCC_DT_INT32": predefined(2), "UCC_DT_INT64": predefined(3), "UCC_DT_UINT8": predefined(5),
	"UCC_DT_FLOAT32": predefined(11), "UCC_DT_FLOAT64": predefined(12), "UCC_DT_BFLOAT16": predefined(13),
	"UCC_OP_SUM": opSum, "UCC_OP_PROD": opProd, "UCC_OP_MAX": opMax, "UCC_OP_MIN": opMin,
	"UCC_OP_BAND": opBAnd, "UCC_OP_BOR": opBOr, "UCC_OP_BXOR": opBXor,
	"UCC_THREAD_MULTIPLE": 2, "UCC_CONTEXT_EXCLUSIVE": 0, "UCC_COLLECTIVE_EP_RANGE_CONTIG": 0,
	"UCC_LIB_PARAM_FIELD_THREAD_MODE": 1 << 0, "UCC_CONTEXT_PARAM_FIELD_TYPE": 1 << 0, "UCC_CONTEXT_PARAM_FIELD_OOB": 1 << 2,
	"UCC_TEAM_PARAM_FIELD_EP": 1 << 2, "UCC_TEAM_PARAM_FIELD_EP_RANGE": 1 << 4, "UCC_TEAM_PARAM_FIELD_OOB": 1 << 7,
	"UCC_COLL_ARGS_FIELD_FLAGS": 1 << 0, "UCC_COLL_ARGS_FIELD_TAG": 1 << 1, "UCC_COLL_ARGS_FIELD_ACTIVE_SET": 1 << 4,
	"offsetof(ucc_coll_req_t, status)": 0,
}

// uccInclude finds the directory holding ucc/api/ucc.h: GOCOLL_UCC_INCLUDE,
// else the system's.
func uccInclude() string {
	cands := []string{os.Getenv("GOCOLL_UCC_INCLUDE"), "/usr/include", "/usr/local/include", "/opt/hpcx/ucc/include"}
	for _, d := range cands {
		if d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "ucc", "api", "ucc.h")); err == nil {
			return d
		}
	}
	return ""
}

// TestABI compiles a program against the real ucc.h that prints the size
// and every field offset of the structs ucc_dl.h mirrors, and the enum
// values the Go side uses, and compares them with the declarations.
func TestABI(t *testing.T) {
	inc := uccInclude()
	if inc == "" {
		t.Skip("ucc/api/ucc.h not found (set GOCOLL_UCC_INCLUDE to the include directory of libucc-dev, e.g. an unpacked .deb's usr/include)")
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to compile against ucc.h")
	}
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include <ucc/api/ucc.h>\nint main(void) {\n")
	for _, s := range abiStructs {
		fmt.Fprintf(&src, "\tprintf(\"%s -1 %%zu\\n\", sizeof(%s));\n", s.name, s.name)
		for i, f := range s.fields {
			fmt.Fprintf(&src, "\tprintf(\"%s %d %%zu\\n\", offsetof(%s, %s));\n", s.name, i, s.name, f)
		}
	}
	names := slices.Sorted(maps.Keys(abiConstants))
	for i, name := range names {
		fmt.Fprintf(&src, "\tprintf(\"const %%llu %d\\n\", (unsigned long long)(%s));\n", i, name)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "abi.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "abi")
	if out, err := exec.Command(cc, "-I", inc, "-o", bin, filepath.Join(dir, "abi.c")).CombinedOutput(); err != nil {
		t.Fatalf("compiling against %s/ucc/api/ucc.h: %v\n%s", inc, err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	index := map[string]int{}
	for i, s := range abiStructs {
		index[s.name] = i
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.Fields(line)
		if parts[0] == "const" {
			v, _ := strconv.ParseUint(parts[1], 10, 64)
			i, _ := strconv.Atoi(parts[2])
			name := names[i]
			want := abiConstants[name]
			if v != want {
				t.Errorf("%s is %d in ucc.h, %d in the Go side", name, v, want)
			}
			checked++
			continue
		}
		s := index[parts[0]]
		f, _ := strconv.Atoi(parts[1])
		real, _ := strconv.Atoi(parts[2])
		what := "sizeof"
		if f >= 0 {
			what = "offsetof " + abiStructs[s].fields[f]
		}
		if got := layout(s, f); got != real {
			t.Errorf("%s %s: ucc.h says %d, ucc_dl.h %d", parts[0], what, real, got)
		}
		checked++
	}
	t.Logf("%d sizes, offsets and constants checked against %s/ucc/api/ucc.h", checked, inc)
}
