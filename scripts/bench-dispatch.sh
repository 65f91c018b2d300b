#!/usr/bin/env bash
# Measures the dispatcher's per-op cost before and after a change, in one
# invocation, interleaved, each run under the team's benchmark lock:
#
#   scripts/bench-dispatch.sh BEFORE_REV [ROUNDS]
#
# BEFORE_REV is a commit (e.g. main~5); "after" is the working tree. Per
# round, before then after:
#   1. BenchmarkDispatchAllreduce (a do-nothing backend: the dispatcher
#      alone), recorder off and on: ns/op and allocs, plus the CPU time per
#      op of a fixed 2 M-op run (user + sys over the op count; steadier than
#      wall time on a shared machine);
#   2. BenchmarkDispatchVsDirect (cpupool at world 1, the same allreduce +
#      Wait straight on the backend and through the dispatcher, alternating
#      batches; the file is copied into BEFORE's tree when it lacks it);
#   3. conftest bench --backend cpupool, 8 B allreduce, 2 ranks, -n 20000
#      --repeat 3 (the fastest of 3 kept), and after with --depth 1 (a
#      blocking loop);
#   4. the same with --backend ucc in the sid root, when it is built.
# The raw lines go to $OUT (default /tmp/bench-dispatch.<pid>); a summary
# (min and median per series) is printed at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
before=${1:?usage: scripts/bench-dispatch.sh BEFORE_REV [ROUNDS]}
rounds=${2:-3}
out=${OUT:-/tmp/bench-dispatch.$$}
. "$here/scripts/bench-dispatch-common.sh"
ucc=no
if [ -e "${GOCOLL_UCC_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/gocoll/ucc-sid}/usr/lib" ]; then ucc=yes; fi

bench() { # side name binary args...
	local side=$1 name=$2 bin=$3
	shift 3
	flock "$lock" "$bin" -test.run '^$' "$@" | awk -v s="$side" '/ns\/op/ {
		line = s " " $1; for (i = 3; i < NF; i += 2) line = line " " $(i+1) "=" $i; print line }' >>"$raw"
}
cpu() { # side sub binary
	local t
	t=$( { flock "$lock" /usr/bin/time -f '%U %S' "$3" -test.run '^$' -test.bench "BenchmarkDispatchAllreduce/$2\$" -test.benchtime 2000000x >/dev/null; } 2>&1 | tail -1)
	echo "$1 cpu/$2 $(echo "$t" | awk '{printf "cpu-ns/op=%.1f", ($1+$2)*1e9/2000000}')" >>"$raw"
}
cbench() { # side label wrap binary args...
	local side=$1 label=$2 wrap=$3 bin=$4 v
	shift 4
	v=$(cd "$here" && flock "$lock" $wrap "$bin" bench --op allreduce -b 8 -e 8 -n 20000 --nproc 2 --repeat 3 --peers none "$@" 2>&1 | awk '$1 == 8 {print $10}')
	echo "$side $label us/op=${v:-NaN}" >>"$raw"
}
for r in $(seq "$rounds"); do
	for side in before after; do
		bench $side nop "$out/disp-$side.test" -test.bench BenchmarkDispatchAllreduce -test.benchmem -test.benchtime 300000x
		cpu $side recorder-off "$out/disp-$side.test"
		cpu $side recorder-on "$out/disp-$side.test"
		bench $side direct "$out/disp-$side.test" -test.bench BenchmarkDispatchVsDirect -test.benchtime 100000x
		cbench $side conftest-cpupool "" "$out/conftest-$side" --backend cpupool
		if [ $ucc = yes ]; then cbench $side conftest-ucc "scripts/ucc-run.sh --" "$out/conftest-$side" --backend ucc; fi
	done
	cbench after conftest-cpupool-depth1 "" "$out/conftest-after" --backend cpupool --tune '--depth 1'
	if [ $ucc = yes ]; then cbench after conftest-ucc-depth1 "scripts/ucc-run.sh --" "$out/conftest-after" --backend ucc --tune '--depth 1'; fi
done
summarize
