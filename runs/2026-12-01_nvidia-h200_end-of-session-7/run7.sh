#!/usr/bin/env bash
# End of session 7: the proof run (run.sh), then issue 12 item 4's 8 B set
# on the 16 CPU cores: base (e3c8020, the session's start) and final taking
# turns, each invocation conftest bench --by-size with its own raw libucc
# loop, bounded to 250 s; then the large sizes at 4 ranks (final) if time is left.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
b=$(cd "$(dirname "$0")" && pwd)
bash "$b/run.sh"
cd "$b/../.."
U=$OUT/u; mkdir -p "$U"
xz -dc "$b/conftest-base.xz" > /tmp/conftest-base && chmod +x /tmp/conftest-base
cp "$b/conftest" /tmp/conftest-final
source scripts/ucc-gpu-env.sh "$b/debs" > "$U/env.log" 2>&1 || { echo ucc env failed; exit 0; }
start=$SECONDS
step() { local label=$1 cap=$2; shift 2; local left=$((250 - (SECONDS - start))); [ $left -le 8 ] && { echo "skip $label" >> "$U/bench.log"; return; }
	echo "== $label t=$((SECONDS-start)) load=$(cut -d' ' -f1 /proc/loadavg)" >> "$U/bench.log"
	timeout $((left < cap ? left : cap)) env "$@" >> "$U/bench.log" 2>&1; echo "rc=$?" >> "$U/bench.log"; }
c=(bench --backend ucc --peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size --repeat 5)
s8() { local v=$1 fp=$2 tag=$3
	step "8B 2r $v $fp $tag" 25 GOCOLL_UCC_FINGERPRINTS=$fp /tmp/conftest-$v "${c[@]}" --nproc 2 --sizes 8 --iters 50 --json "$U/s8-$v-$fp-$tag.json"; }
s8 final auto a; s8 base auto a; s8 base auto b; s8 final auto b
s8 final auto c; s8 base auto c; s8 base auto d; s8 final auto d
s8 final off a; s8 base off a; s8 base off b; s8 final off b
step "large 4r final" 80 /tmp/conftest-final bench --backend ucc --peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size --repeat 3 --nproc 4 --sizes 1M,16M,64M --iters 4 --json "$U/large4-final.json"
grep -E "^== |^rc=|^goal|^skip" "$U/bench.log" | head -60
tar -C "$U" -czf "$OUT/ucc.tgz" . && rm -rf "$U"
