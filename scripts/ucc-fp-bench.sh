#!/usr/bin/env bash
# The cost of ucc's fingerprint check (backends/ucc/fingerprint.go): 8 B and
# 1 MiB allreduce at 2 ranks, GOCOLL_UCC_FINGERPRINTS=auto (on, the shared
# memory board) against off, in one invocation, the two settings taking turns
# PAIRS times, under the team's benchmark lock. Prints one line per run
# (setting, size, time in µs) from conftest bench's --json rows.
#
#   scripts/ucc-fp-bench.sh [PAIRS [ITERS]]      # defaults 5 and 2000
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-5}
iters=${2:-2000}
out=$(mktemp -d /tmp/ucc-fp-bench.XXXXXX)
go build -o "$out/conftest" ./cmd/conftest
scripts/ucc-root.sh >/dev/null
run() { # SETTING INDEX
	GOCOLL_UCC_FINGERPRINTS=$1 "$out/conftest" bench --backend ucc --wrap 'scripts/ucc-run.sh --' --peers none \
		--sizes 8,1M -n "$iters" --nproc 2 --json "$out/$1-$2.json" >"$out/$1-$2.log" 2>&1
	python3 - "$out/$1-$2.json" "$1" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
for rep in f["reports"]:
    for r in rep["series"][0]["rows"]:
        res = r.get("in_place") or r.get("out_of_place")
        print(sys.argv[2], r["bytes"], res["time_us"])
PY
}
flock /tmp/gocoll-bench.lock bash -c "$(declare -f run); out=$out iters=$iters; for i in \$(seq $pairs); do run auto \$i; run off \$i; done"
echo "raw output: $out"
