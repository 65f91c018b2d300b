#!/usr/bin/env bash
# Session 16, call 2 on nvidia-h200: 22842fd (new: the stage's host ops
# without locks, the recorder's retire without refreshMu) against 34b780c
# (base), taking turns (scripts/ucc-turns.sh), ucc 8 B at --depth 1 and the
# default depth; then the staged CUDA specs of cpupool and ucc with the new
# conftest (scripts/stage-gpu.sh's filters).
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
export NCCL_NVLS_ENABLE=0
BIN=/tmp/b; mkdir -p $BIN
xz -dc "$b/ct.xz" > $BIN/ct; xz -dc "$b/ct-base.xz" > $BIN/ct-base; chmod +x $BIN/ct $BIN/ct-base
{ date -u; nproc; cat /proc/loadavg; cat /sys/devices/system/clocksource/clocksource0/current_clocksource; nvidia-smi -L; } > "$R/machine.txt" 2>&1
sem='(stream || async || lifetime) && !stress && !timeout'
ops='ops && !stress && !timeout'
st() { # name backend label-filter [focus]
	local name=$1 be=$2 lf=$3 focus=${4:-}
	timeout 25 $BIN/ct --backend "$be" --nproc 1 --label-filter "$lf" ${focus:+--focus "$focus"} \
		--timeout 10s --run-timeout 20s --report "$R/$name" > "$R/$name.log" 2>&1
	echo "$name rc=$? $(grep -E 'passed|failed' "$R/$name.log" | tail -1)" >> "$R/summary.txt"
}
st cpupool-stream "cpu:cpupool,cuda:cpupool" "$sem"
st cpupool-ops "cpu:cpupool,cuda:cpupool" "$ops" 'float32'
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
st ucc-stream "cpu:ucc,cuda:ucc" "$sem"
st ucc-ops "cpu:ucc,cuda:ucc" "$ops" 'float32'
raw=(--raw-bin "$b/ucc-bench-raw")
t() { local name=$1; shift; local s=$SECONDS
	timeout 170 scripts/ucc-turns.sh "$R/$name" $BIN/ct-base $BIN/ct "$@" "${raw[@]}" > /dev/null 2>&1
	{ echo "== $name ($((SECONDS - s)) s): base = 34b780c, new = 22842fd: $*"; cat "$R/$name/pooled.txt"; } >> "$R/summary.txt"; }
t d1 6 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
t d0 6 --nproc 2 --sizes 8 --iters 50 --repeat 3
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
for f in "$R"/*.log; do grep -E '\[FAIL\]|\[PANICKED\]|panic' "$f" | head -5; done
tar -C "$R" -czf "$OUT/s16b.tgz" .
