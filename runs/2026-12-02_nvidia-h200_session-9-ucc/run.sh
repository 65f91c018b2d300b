#!/usr/bin/env bash
# Session 9's device call on nvidia-h200's CPU cores (no GPU use): the ucc
# backend's 8 B allreduce over raw libucc, base (e832654, session 8's end)
# and new (main: the flight recorder's ring written at set-up, the bench's
# pre-warm) taking turns, every invocation conftest bench --by-size with its
# own raw libucc loop; the fingerprint check on unless the label says off.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
for v in base new; do xz -dc "$b/conftest-$v.xz" > $BIN/conftest-$v; chmod +x $BIN/conftest-$v; done
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-420}
L=$R/bench.log
step() { local label=$1 cap=$2; shift 2
	local left=$((deadline - SECONDS)); [ $left -le 8 ] && { echo "skip $label" >> "$L"; return; }
	echo "== $label t=${SECONDS}s $(cut -d' ' -f1-3 /proc/loadavg)" >> "$L"
	timeout $((left < cap ? left : cap)) "$@" >> "$L" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$L"; }
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size)
s8() { local v=$1 n=$2 fp=$3 tag=$4
	GOCOLL_UCC_FINGERPRINTS=$fp step "8B ${n}r $v $fp $tag" 40 $BIN/conftest-$v bench --backend ucc --nproc $n --sizes 8 --iters 50 "${raw[@]}" --repeat 5 --json "$R/s8-$n-$v-$fp-$tag.json"; }
s8 new 2 auto a; s8 base 2 auto a; s8 base 2 auto b; s8 new 2 auto b
s8 new 2 auto c; s8 base 2 auto c; s8 base 2 auto d; s8 new 2 auto d
s8 new 2 auto e; s8 base 2 auto e
s8 new 2 off a; s8 base 2 off a; s8 base 2 off b; s8 new 2 off b
cat /proc/loadavg >> "$R/machine.txt"
grep -E "^== |^rc=|^goal|^skip" "$L" | head -80
tar -C "$R" -czf "$OUT/ucc13.tgz" .
