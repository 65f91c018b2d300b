#!/usr/bin/env bash
# ucc12g's device call (session 7) on nvidia-h200's 16 CPU cores (no GPU use):
# main (3e8856d, this round's start) and new (wt-ucc12g: handles from a chunk
# of 31 kept in the record (new = a8ceaa7), the
# earlier works' judge before gu_fp_ahead) taking turns, every invocation
# conftest bench --by-size with its own raw libucc loop; the fingerprint
# check on unless the label says off. Results: $OUT/ucc12g.tgz.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
# BIN: where the builds go (a local test in the sid root, which has no xz,
# sets BIN to a directory with both builds already unpacked).
if [ -z "$BIN" ]; then
	BIN=/tmp/b; mkdir -p $BIN
	for v in main new; do xz -dc "$b/conftest-$v.xz" > $BIN/conftest-$v; chmod +x $BIN/conftest-$v; done
fi
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-280}
L=$R/bench.log
step() { local label=$1 cap=$2; shift 2
	local left=$((deadline - SECONDS)); [ $left -le 8 ] && { echo "skip $label" >> "$L"; return; }
	echo "== $label t=${SECONDS}s $(cut -d' ' -f1-3 /proc/loadavg)" >> "$L"
	timeout $((left < cap ? left : cap)) "$@" >> "$L" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$L"; }
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size)
s8() { local v=$1 n=$2 fp=$3 tag=$4
	GOCOLL_UCC_FINGERPRINTS=$fp step "8B ${n}r $v $fp $tag" 25 $BIN/conftest-$v bench --backend ucc --nproc $n --sizes 8 --iters 50 "${raw[@]}" --repeat 5 --json "$R/s8-$n-$v-$fp-$tag.json"; }
# 2 ranks, check on: 6 invocations each (30 turns), the order swapped every other pair.
s8 new 2 auto a; s8 main 2 auto a; s8 main 2 auto b; s8 new 2 auto b
s8 new 2 auto c; s8 main 2 auto c; s8 main 2 auto d; s8 new 2 auto d
s8 new 2 auto e; s8 main 2 auto e; s8 main 2 auto f; s8 new 2 auto f
# 2 ranks, check off: 3 each.
s8 new 2 off a; s8 main 2 off a; s8 main 2 off b; s8 new 2 off b; s8 new 2 off c; s8 main 2 off c
# 4 ranks, check on: 1 each.
s8 new 4 auto a; s8 main 4 auto a
cat /proc/loadavg >> "$R/machine.txt"
grep -E "^== |^rc=|^goal|^skip" "$L" | head -80
tar -C "$R" -czf "$OUT/ucc12g.tgz" .
