#!/usr/bin/env bash
# Issue 12 item 4's figures on this machine: ucc beside the raw libucc loop
# with conftest bench --by-size (ours and the raw loop taking turns per size,
# the median of the per-turn ratios; docs/perf.md, ucc "Eighth round"), inside
# the sid root, each invocation under the team's benchmark lock:
#   - 8 B at 2 ranks (and 4 where the machine has 8 or more CPUs), the
#     fingerprint check on (the default) and off;
#   - 1, 4, 16 and 64 MiB at the same world sizes, the check on.
# The tables and goal lines go to OUTDIR/*.log, the JSON beside them, and the
# goal lines to stdout. Run it on a quiet machine: under load the raw loop's
# spinning ranks lose their cores (milliseconds per op at 8 B on 2 shared
# cores), and its medians then say nothing.
#
#   scripts/ucc-bench-turns.sh [OUTDIR]     # default: a new /tmp/ucc-bench-turns.XXXXXX
#
# REPEAT (turns per size, default 5), ITERS_SMALL (--iters at 8 B, default
# 50: 100 000 ops) and ITERS_LARGE (default 4) change the counts; CONFTEST
# names a conftest binary to use instead of building one from this tree.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d /tmp/ucc-bench-turns.XXXXXX)}
mkdir -p "$out"
repeat=${REPEAT:-5}
small=${ITERS_SMALL:-50}
large=${ITERS_LARGE:-4}
bin=${CONFTEST:-}
if [ -z "$bin" ]; then
	bin=$out/conftest
	go build -o "$bin" ./cmd/conftest
fi
scripts/ucc-root.sh >/dev/null
nprocs=2
[ "$(nproc)" -ge 8 ] && nprocs=2,4 # 4 ranks on fewer cores oversubscribe: UCC's spinning collapses
{ date -u; uptime; nproc; git log --oneline -1; } >"$out/machine.txt"
run() { # NAME FINGERPRINTS ARGS...
	local name=$1 fp=$2
	shift 2
	echo "== $name (GOCOLL_UCC_FINGERPRINTS=$fp, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/goals.txt"
	GOCOLL_UCC_FINGERPRINTS=$fp flock /tmp/gocoll-bench.lock "$bin" bench --backend ucc --wrap 'scripts/ucc-run.sh --' \
		--peers raw-ucc --by-size --repeat "$repeat" --nproc "$nprocs" --json "$out/$name.json" "$@" >"$out/$name.log" 2>&1 || {
		echo "$name failed: $out/$name.log" >&2
		return 1
	}
	grep '^goal:' "$out/$name.log" | tee -a "$out/goals.txt"
}
run small-on auto --sizes 8 --iters "$small"
run small-off off --sizes 8 --iters "$small"
run large-on auto --sizes 1M,4M,16M,64M --iters "$large"
echo "logs and JSON: $out"
