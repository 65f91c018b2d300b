#!/usr/bin/env bash
# pagefaults.sh: where a conftest bench run takes page faults inside its
# timed loops (docs/perf.md, issue 17, eleventh pass: a fault costs 13-17 µs
# on the 2-core dev VMs, and a fresh process's heap faulted in the first
# sizes of every table). Needs perf and root.
#
#   scripts/pagefaults.sh CONFTEST_BIN [BENCH_FLAGS...]
#   scripts/pagefaults.sh /tmp/ct --backend cpupool --nproc 2 --peers none -n 2000 --sizes 8 --tune '--depth 1'
#
# It records every page fault (perf record -e page-faults -c 1 -g) of the
# run and its children, prints the bench's table, then counts the faults
# whose call chain passes through main.measure (each size's warm-up and
# timed ops; not the buffers' set-up in benchDevice.prepare) and, below,
# those of the backends'
# own goroutines (internal/coll, backends/cpupool, tcpmesh, shm), each by
# its first four frames. Flags default to the example above (without BIN).
set -euo pipefail
bin=${1:?usage: scripts/pagefaults.sh CONFTEST_BIN [BENCH_FLAGS...]}
shift
[ $# -gt 0 ] || set -- --backend cpupool --nproc 2 --peers none -n 2000 --sizes 8 --tune '--depth 1'
data=$(mktemp /tmp/pagefaults.XXXXXX)
trap 'rm -f "$data"' EXIT
perf record -q -e page-faults -c 1 -g -o "$data" -- "$bin" bench "$@" 2>&1 | grep -E '^ +[0-9]+ +[0-9]+ +' || true
perf script -i "$data" -F comm,ip,sym 2>/dev/null | awk '
	# A sample: a line naming the command, then one frame a line.
	/^[^ \t]/ { flush(); chain = ""; next }
	NF >= 2 { chain = chain " " $2 }
	function flush(   a, key) {
		if (chain == "") return
		split(chain, a, " ")
		key = a[1] " < " a[2] " < " a[3] " < " a[4]
		if (chain ~ /main\.measure/ && chain !~ /benchDevice\)\.prepare/) { loop++; l[key]++ }
		else if (chain ~ /internal\/coll|backends\/cpupool|tcpmesh|internal\/shm/) { own++; o[key]++ }
		else other++
	}
	END {
		flush()
		printf "faults in measure (warm-up and timed ops): %d\n", loop
		for (k in l) printf "  %6d %s\n", l[k], k | "sort -rn | head -8"
		close("sort -rn | head -8")
		printf "faults in the backends'"'"' goroutines, outside those loops (the pre-warm among them): %d\n", own
		for (k in o) printf "  %6d %s\n", o[k], k | "sort -rn | head -8"
		close("sort -rn | head -8")
		printf "other faults (start-up, set-up, the launcher): %d\n", other
	}'
