#!/usr/bin/env bash
# ucc12f call 3 (session 7) on nvidia-h200's 16 CPU cores (no GPU use):
# main (e3c8020, this session's start), new1 (f796765, landed: gu_fp_ahead,
# L's descriptor cached, the board's slot addressing, the plan filled field
# by field, completion without the lock at submit) and new2 (27fff11: new1
# plus the verify in gu_drive, the reduction table, the 128-byte handle)
# taking turns, every invocation conftest bench --by-size with its own raw
# libucc loop; the fingerprint check on unless the label says off.
# Results: $OUT/ucc12f-3.tgz.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
mkdir -p /tmp/b
for v in main new2; do xz -dc "$b/conftest-$v.xz" > /tmp/b/conftest-$v; chmod +x /tmp/b/conftest-$v; done
{ date -u; nproc; uptime; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-118}
L=$R/bench.log
step() { local label=$1 cap=$2; shift 2
	local left=$((deadline - SECONDS)); [ $left -le 8 ] && { echo "skip $label" >> "$L"; return; }
	echo "== $label t=${SECONDS}s $(cut -d' ' -f1-3 /proc/loadavg)" >> "$L"
	timeout $((left < cap ? left : cap)) "$@" >> "$L" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$L"; }
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size)
s8() { local v=$1 n=$2 fp=$3 tag=$4
	GOCOLL_UCC_FINGERPRINTS=$fp step "8B ${n}r $v $fp $tag" 20 /tmp/b/conftest-$v bench --backend ucc --nproc $n --sizes 8 --iters 50 "${raw[@]}" --repeat 5 --json "$R/s8-$n-$v-$fp-$tag.json"; }
lg() { local v=$1 n=$2 sizes=$3 rep=$4 tag=$5
	step "$sizes ${n}r $v auto $tag" 60 /tmp/b/conftest-$v bench --backend ucc --nproc $n --sizes $sizes --iters 4 "${raw[@]}" --repeat $rep --json "$R/lg-$n-$v-$sizes-$tag.json"; }
lg new2 4 1M 5 c; lg main 4 1M 5 c; lg new2 4 1M 5 d; lg main 4 1M 5 d
s8 new2 2 auto d; s8 main 2 auto d; s8 new2 2 auto e; s8 main 2 auto e
s8 new2 4 auto b; s8 main 4 auto b
s8 new2 2 off b; s8 main 2 off b
uptime >> "$R/machine.txt"
grep -E "^== |^rc=|^goal|^skip" "$L" | head -80
tar -C "$R" -czf "$OUT/ucc12f-3.tgz" .
