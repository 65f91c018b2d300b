#!/usr/bin/env bash
# The dispatcher's per-op cost before and after a change, alone and end to
# end, before and after taking turns, every run under the team's benchmark
# lock:
#
#   scripts/bench-dispatch-e2e.sh BEFORE_REV [ROUNDS]
#
# BEFORE_REV is a commit (e.g. 8afe047, main before session 5's dispatcher
# work); "after" is the working tree. ROUNDS (default 4) rounds of:
#   1. BenchmarkDispatchAllreduce (a do-nothing backend: the dispatcher
#      alone), recorder off and on: CPU ns per op, user + sys of a fixed
#      10 M-op run (steadier than wall time on a shared machine);
#   2. conftest bench --backend cpupool --nproc 2 --peers openmpi -n 0
#      --iters 100 --sizes 8,4096 --tune '--depth 1' (a blocking loop of
#      200 000 ops at 8 B): the in-place time (ours) and Open MPI's beside
#      it, from the same invocation;
# then ROUNDS rounds of BenchmarkDispatchVsDirect (cpupool at world 1, the
# same 8 B allreduce + Wait on the backend and through the dispatcher;
# delta = dispatcher - direct, ns per op). Before goes first in odd rounds,
# after in even ones. Raw lines go to $OUT (default
# /tmp/bench-dispatch-e2e.<pid>); a summary (min, median, max per series)
# is printed at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
before=${1:?usage: scripts/bench-dispatch-e2e.sh BEFORE_REV [ROUNDS]}
rounds=${2:-4}
out=${OUT:-/tmp/bench-dispatch-e2e.$$}
. "$here/scripts/bench-dispatch-common.sh"
load() { cut -d' ' -f1 /proc/loadavg; }
cpu() { # side sub
	local t
	t=$( { flock "$lock" /usr/bin/time -f '%U %S' "$out/disp-$1.test" -test.run '^$' -test.bench "BenchmarkDispatchAllreduce/$2\$" -test.benchtime 10000000x >/dev/null; } 2>&1 | tail -1)
	echo "$1 cpu/$2 $(echo "$t" | awk '{printf "cpu-ns/op=%.1f", ($1+$2)*1e9/10000000}')" >>"$raw"
}
e2e() { # side
	local l
	l=$(load)
	(cd "$here" && flock "$lock" "$out/conftest-$1" bench --backend cpupool --nproc 2 --peers openmpi -n 0 --iters 100 \
		--sizes 8,4096 --tune '--depth 1' 2>&1) | tee -a "$out/conftest-$1.txt" |
		awk -v s="$1" -v l="$l" '$1 ~ /^[0-9]+$/ && $3 == "float" {printf "%s conftest-%sB us=%s openmpi-us=%s load=%s\n", s, $1, $10, $16, l}' >>"$raw"
}
direct() { # side
	flock "$lock" "$out/disp-$1.test" -test.run '^$' -test.bench BenchmarkDispatchVsDirect -test.benchtime 100000x |
		awk -v s="$1" '/ns\/op/ {line = s " " $1; for (i = 3; i < NF; i += 2) line = line " " $(i+1) "=" $i; print line}' >>"$raw"
}
order() { if [ $(($1 % 2)) = 1 ]; then echo before after; else echo after before; fi; }
for r in $(seq "$rounds"); do
	for side in $(order "$r"); do
		cpu "$side" recorder-off
		cpu "$side" recorder-on
		e2e "$side"
	done
done
for r in $(seq "$rounds"); do
	for side in $(order "$r"); do direct "$side"; done
done
summarize
