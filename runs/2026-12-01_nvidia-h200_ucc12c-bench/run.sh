#!/usr/bin/env bash
# ucc12c (session 5) on nvidia-h200's 16 CPU cores (no GPU use): conftest
# bench --by-size (ours and the raw libucc loop taking turns per size, 5
# turns, per-turn ratios and their median). main before the early
# fingerprint publication (base) and after it (new) taking turns at 8 B;
# the check off; 4 ranks; 1-64 MiB at 2 and 4 ranks, unpinned and pinned
# (--pin: one CPU of distinct cores per rank). Results: $OUT/ucc12c.tgz.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
mkdir -p /tmp/b
for v in base new; do xz -dc "$b/conftest-$v.xz" > /tmp/b/conftest-$v; chmod +x /tmp/b/conftest-$v; done
{ date -u; nproc; uptime; lscpu | grep -E 'Model name|^CPU\(s\)|NUMA|Thread|Core|Socket'; lscpu -p=CPU,CORE,SOCKET,NODE | head -40; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
# one CPU of each distinct core, skipping CPU 0
pin=$(lscpu -p=CPU,CORE | grep -v '^#' | awk -F, '!seen[$2]++ {print $1}' | grep -vx 0 | head -4 | paste -sd,)
echo "pin=$pin" >> "$R/machine.txt"
deadline=${DEADLINE:-330}
step() { local label=$1; shift
	local left=$((deadline - SECONDS)); [ $left -le 10 ] && { echo "skip $label" >> "$R/bench.log"; return; }
	echo "== $label t=${SECONDS}s $(cut -d' ' -f1-3 /proc/loadavg)" >> "$R/bench.log"
	timeout $((left < 130 ? left : 130)) "$@" >> "$R/bench.log" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$R/bench.log"; }
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size --repeat 5)
for r in 1 2; do
	for v in base new; do
		step "8B 2r $v r$r" /tmp/b/conftest-$v bench --backend ucc --nproc 2 --sizes 8 --iters 50 "${raw[@]}" --json "$R/s-$v-r$r.json"
	done
done
GOCOLL_UCC_FINGERPRINTS=off step "8B 2r new fp-off" /tmp/b/conftest-new bench --backend ucc --nproc 2 --sizes 8 --iters 50 "${raw[@]}" --json "$R/s-new-off.json"
for v in new base; do
	step "8B 4r $v" /tmp/b/conftest-$v bench --backend ucc --nproc 4 --sizes 8 --iters 50 "${raw[@]}" --json "$R/s4-$v.json"
done
for n in 2 4; do
	step "large ${n}r new unpinned" /tmp/b/conftest-new bench --backend ucc --nproc $n --sizes 1M,4M,16M,64M --iters 4 "${raw[@]}" --json "$R/l$n-new.json"
	step "large ${n}r new pinned" /tmp/b/conftest-new bench --backend ucc --nproc $n --sizes 1M,4M,16M,64M --iters 4 "${raw[@]}" --pin "$pin" --json "$R/l$n-new-pin.json"
done
uptime >> "$R/machine.txt"
grep -E "^== |^rc=|^goal|^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ " "$R/bench.log" | head -120
tar -C "$R" -czf "$OUT/ucc12c.tgz" .
