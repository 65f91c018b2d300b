#!/usr/bin/env bash
# ucc12e call 1 (session 6) on nvidia-h200's 16 CPU cores (no GPU use):
# main (82615e3) and new (wt-ucc12e: ops posted ahead of the fingerprint
# check) taking turns, every invocation conftest bench --by-size with its
# own raw libucc loop (ucc-bench-raw), the check on (the default) unless
# the label says off. Results: $OUT/ucc12e-1.tgz.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
mkdir -p /tmp/b
for v in main new; do xz -dc "$b/conftest-$v.xz" > /tmp/b/conftest-$v; chmod +x /tmp/b/conftest-$v; done
{ date -u; nproc; uptime; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-280}
L=$R/bench.log
step() { local label=$1 cap=$2; shift 2
	local left=$((deadline - SECONDS)); [ $left -le 8 ] && { echo "skip $label" >> "$L"; return; }
	echo "== $label t=${SECONDS}s $(cut -d' ' -f1-3 /proc/loadavg)" >> "$L"
	timeout $((left < cap ? left : cap)) "$@" >> "$L" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$L"; }
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size)
s8() { local v=$1 n=$2 fp=$3 tag=$4
	GOCOLL_UCC_FINGERPRINTS=$fp step "8B ${n}r $v $fp $tag" 20 /tmp/b/conftest-$v bench --backend ucc --nproc $n --sizes 8 --iters 50 "${raw[@]}" --repeat 5 --json "$R/s8-$n-$v-$fp-$tag.json"; }
l1() { local v=$1 n=$2 tag=$3
	step "1M ${n}r $v auto $tag" 24 /tmp/b/conftest-$v bench --backend ucc --nproc $n --sizes 1M --iters 4 "${raw[@]}" --repeat 7 --json "$R/l1-$n-$v-$tag.json"; }
s8 main 2 auto a; s8 new 2 auto a; s8 main 2 auto b; s8 new 2 auto b
l1 main 4 a; l1 new 4 a; l1 main 4 b; l1 new 4 b
l1 main 2 a; l1 new 2 a
s8 new 2 off a; s8 main 4 auto a; s8 new 4 auto a
step "4M-64M 4r new" 40 /tmp/b/conftest-new bench --backend ucc --nproc 4 --sizes 4M,16M,64M --iters 4 "${raw[@]}" --repeat 3 --json "$R/l4-new.json"
step "4M-64M 2r new" 30 /tmp/b/conftest-new bench --backend ucc --nproc 2 --sizes 4M,16M,64M --iters 4 "${raw[@]}" --repeat 3 --json "$R/l2-new.json"
uptime >> "$R/machine.txt"
grep -E "^== |^rc=|^goal|^skip" "$L" | head -80
tar -C "$R" -czf "$OUT/ucc12e-1.tgz" .
