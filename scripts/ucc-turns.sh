#!/usr/bin/env bash
# Two builds of conftest taking turns at `conftest bench --backend ucc`, each
# invocation with its own raw libucc loop (--peers raw-ucc --by-size): the way
# docs/perf.md compares a change with main on the ucc backend's per-op cost,
# where a machine drifts between phases faster than one build's runs take.
#
#   scripts/ucc-turns.sh OUTDIR BASE NEW ROUNDS [conftest bench flags...]
#   scripts/ucc-turns.sh /tmp/t /tmp/ct-base /tmp/ct-new 4 --nproc 2 --sizes 8 --iters 50 --repeat 5
#
# Round r runs NEW then BASE when r is odd, BASE then NEW when even, each
# writing OUTDIR/{base,new}-r.json; OUTDIR/bench.log has every invocation's
# table. At the end scripts/ucc-pool.py pools each build's turns (the median
# of the per-turn differences ours - raw) into OUTDIR/pooled.txt and prints
# it. The environment passes through (GOCOLL_UCC_FINGERPRINTS=off, say, for
# the check off); on the GPU machine source scripts/ucc-gpu-env.sh first and
# pass --raw-bin, or let conftest build the raw loop with gcc.
set -euo pipefail
if [ $# -lt 4 ]; then
	sed -n '2,16p' "$0" >&2
	exit 2
fi
out=$1 base=$2 new=$3 rounds=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
log=$out/bench.log
one() { # build round
	local v=$1 r=$2 bin=$base
	shift 2
	[ "$v" = new ] && bin=$new
	echo "== $v round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$log"
	"$bin" bench --backend ucc --peers raw-ucc --by-size --json "$out/$v-$r.json" "$@" >> "$log" 2>&1 ||
		echo "rc=$? ($v round $r)" >> "$log"
}
for r in $(seq 1 "$rounds"); do
	if [ $((r % 2)) = 1 ]; then one new "$r" "$@"; one base "$r" "$@"; else one base "$r" "$@"; one new "$r" "$@"; fi
done
{
	for v in base new; do
		ls "$out/$v"-*.json >/dev/null 2>&1 && python3 "$here/ucc-pool.py" "$v" "$out/$v"-*.json
	done
} | tee "$out/pooled.txt"
