#!/usr/bin/env bash
# Issue 15's fault table on this host, with the cpupool backend
# (scripts/faults, one child process per rank):
#   - kill -9 of one rank of 4 and of 8 during an allreduce loop, RUNS runs
#     each (default 40), TCP and shared memory: how many survivors name the
#     killed rank, and the slowest detection;
#   - a rank that never joins (Init timeout NOJOIN_TIMEOUT, default 10s),
#     through InitFromEnv and through Init on an external store;
#   - float32 on one rank against int32 of the same size on the other;
#   - a size mismatch over TCP with 4 MiB tensors, SIZE_RUNS runs (default 20).
# Each experiment prints a line per run and a count; the script exits 1 when
# a goal was missed (100 % of survivors named, detection < 1 s, the missing
# rank named within the timeout + 10 %, no silent mismatch, one error text).
#
#   scripts/faults.sh            # the whole table (about 2 minutes)
#   RUNS=5 NOJOIN_TIMEOUT=2s scripts/faults.sh
set -uo pipefail
cd "$(dirname "$0")/.."

runs=${RUNS:-40}
size_runs=${SIZE_RUNS:-20}
timeout=${NOJOIN_TIMEOUT:-10s}
bin=$(mktemp -d)/faults
trap 'rm -rf "$(dirname "$bin")"' EXIT
go build -o "$bin" ./scripts/faults || exit 2

status=0
run() {
	echo "== faults $*"
	"$bin" "$@" || status=1
}
for world in 4 8; do
	for transport in tcp shm; do
		run kill -world "$world" -runs "$runs" -transport "$transport"
	done
done
run nojoin -world 4 -runs 1 -timeout "$timeout" -via env
run nojoin -world 4 -runs 1 -timeout "$timeout" -via store
run dtype -runs 5
run size -runs "$size_runs" -mib 4 -transport tcp
exit $status
