#!/usr/bin/env bash
# ucc12f call 1 (session 7) on nvidia-h200's 16 CPU cores (no GPU use):
# main (e3c8020, this session's start) and new (wt-ucc12f) taking turns,
# every invocation conftest bench --by-size with its own raw libucc loop
# (ucc-bench-raw); the fingerprint check on (the default) unless the label
# says off. Results: $OUT/ucc12f-1.tgz.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
mkdir -p /tmp/b
for v in main new; do xz -dc "$b/conftest-$v.xz" > /tmp/b/conftest-$v; chmod +x /tmp/b/conftest-$v; done
{ date -u; nproc; uptime; lscpu | grep -E 'Model name|NUMA node|Thread'; for f in enabled defrag; do echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f)"; done; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-250}
L=$R/bench.log
step() { local label=$1 cap=$2; shift 2
	local left=$((deadline - SECONDS)); [ $left -le 8 ] && { echo "skip $label" >> "$L"; return; }
	echo "== $label t=${SECONDS}s $(cut -d' ' -f1-3 /proc/loadavg)" >> "$L"
	timeout $((left < cap ? left : cap)) "$@" >> "$L" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$L"; }
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size)
s8() { local v=$1 n=$2 fp=$3 tag=$4
	GOCOLL_UCC_FINGERPRINTS=$fp step "8B ${n}r $v $fp $tag" 20 /tmp/b/conftest-$v bench --backend ucc --nproc $n --sizes 8 --iters 50 "${raw[@]}" --repeat 5 --json "$R/s8-$n-$v-$fp-$tag.json"; }
lg() { local v=$1 fp=$2 rep=$3 tag=$4
	GOCOLL_UCC_FINGERPRINTS=$fp step "16M,64M 4r $v $fp $tag" 60 /tmp/b/conftest-$v bench --backend ucc --nproc 4 --sizes 16M,64M --iters 4 "${raw[@]}" --repeat $rep --json "$R/lg-4-$v-$fp-$tag.json"; }
s8 main 2 auto a; s8 new 2 auto a; s8 main 2 auto b; s8 new 2 auto b; s8 main 2 auto c; s8 new 2 auto c
s8 main 2 off a; s8 new 2 off a
lg main auto 4 a; lg new auto 4 a; lg main auto 4 b; lg new auto 4 b
lg new off 3 a
uptime >> "$R/machine.txt"
grep -E "^== |^rc=|^goal|^skip" "$L" | head -80
tar -C "$R" -czf "$OUT/ucc12f-1.tgz" .
