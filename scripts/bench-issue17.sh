#!/usr/bin/env bash
# bench-issue17.sh: issue 17's figures, cpupool allreduce against Open MPI
# in the same conftest bench invocation, at 2 and 4 ranks, interleaving a
# "before" and an "after" conftest binary round by round (docs/perf.md,
# "Issue 17"). Every invocation holds /tmp/gocoll-bench.lock.
#
#   scripts/bench-issue17.sh OUTDIR AFTER_BIN [BEFORE_BIN] [ROUNDS]
#
# e.g. (before = the tree before this session's cpupool commits):
#   git archive d9602ee | (mkdir -p /tmp/b && tar -x -C /tmp/b) && (cd /tmp/b && go build -o /tmp/conftest-before ./cmd/conftest)
#   go build -o /tmp/conftest-after ./cmd/conftest
#   scripts/bench-issue17.sh /tmp/bench17 /tmp/conftest-after /tmp/conftest-before 3
#
# Each run writes OUTDIR/<label>-np<N>-r<round>.json and .txt (the table,
# with the load average before it). SIZES, NPROCS and TUNE override the
# sizes, the world sizes and the bench-rank flags (default "--depth 1": a
# blocking loop on one buffer, as Open MPI's MPI_Allreduce loop).
#
# TURNS=N makes each invocation take turns with Open MPI one size at a time
# (--by-size --repeat N): for every size, N launches of each, ours first in
# odd turns. The summary line of a size is then the medians of the turns
# and x = 1 / the median of the per-turn ratios ours / Open MPI. Why: the
# 2-core machine drifts between phases (a 4-rank 8 B op at ~11 or ~20 µs,
# for Open MPI as for ours) faster than one sweep of eight sizes takes, so
# a sweep's ratio compares two runs taken in different phases (docs/perf.md,
# issue 17, fifteenth pass).
set -euo pipefail
out=${1:?OUTDIR}
after=${2:?AFTER_BIN}
before=${3:-}
rounds=${4:-3}
sizes=${SIZES:-8,4K,64K,256K,1M,16M,64M}
nprocs=${NPROCS:-2 4}
tune=${TUNE---depth 1}
turns=()
[ -n "${TURNS:-}" ] && turns=(--by-size --repeat "$TURNS")
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
	for np in $nprocs; do
		for label in before after; do
			bin=$after
			if [ "$label" = before ]; then
				[ -n "$before" ] || continue
				bin=$before
			fi
			f="$out/$label-np$np-r$r"
			flock /tmp/gocoll-bench.lock sh -c '
				{ date -u +%FT%TZ; uptime; } > "$1.txt"
				f=$1 bin=$2 np=$3 sizes=$4 label=$5 r=$6 tune=$7
				shift 7
				"$bin" bench --backend cpupool --nproc "$np" --peers openmpi -n 0 --sizes "$sizes" --tune "$tune" "$@" \
					--note "$label round $r: $(uptime | sed "s/.*load/load/")" --json "$f.json" >> "$f.txt" 2>&1
			' _ "$f" "$bin" "$np" "$sizes" "$label" "$r" "$tune" "${turns[@]}"
			if [ ${#turns[@]} -gt 0 ]; then
				# The turns table: size, medians of ours and Open MPI, the
				# ratios turn by turn, their median, min and max.
				sed -n '/^# turns/,$p' "$f.txt" | grep -E '^ +[0-9]+ ' | awk -v l="$label np$np r$r" -v n="$TURNS" \
					'{printf "%-16s %10s B  ours %10s us  openmpi %10s us  x %.2f (turns %.2f-%.2f)\n", l, $1, $2, $3, 1/$(4+n), 1/$(6+n), 1/$(5+n)}'
			else
				grep -E '^ +[0-9]+ +[0-9]+ +float' "$f.txt" | awk -v l="$label np$np r$r" '{printf "%-16s %10s B  ours %10s us  openmpi %10s us  x %s\n", l, $1, $10, $16, $17}'
			fi
		done
	done
done
