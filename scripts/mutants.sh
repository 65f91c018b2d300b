#!/usr/bin/env bash
# Plants small, realistic bugs one at a time in a scratch copy of the
# committed tree (a git worktree of HEAD) and reports, for
# each, whether the unit tests and the cpupool conformance run catch it,
# and how long each run takes with the bug in it. The tests must catch
# what they claim to: a mutant that survives both is a gap.
#
#   scripts/mutants.sh [--nproc N] [--only NAME]
#
# Each mutant is an exact text replacement; if the text is gone (the code
# moved), the script says so and fails rather than reporting a false catch.
set -euo pipefail
cd "$(dirname "$0")/.."
nproc=4
only=""
while [ $# -gt 0 ]; do
	case "$1" in
	--nproc) nproc=$2; shift 2 ;;
	--only) only=$2; shift 2 ;;
	*) echo "usage: $0 [--nproc N] [--only NAME]" >&2; exit 2 ;;
	esac
done

# name|file|old|new (old and new are Python string literals' contents)
mutants=(
	'wrong-root|backends/cpupool/ops.go|coll.Broadcast(ctx, b.comm, tag, src, opts.RootRank)|coll.Broadcast(ctx, b.comm, tag, src, 0)'
	'wrong-block|backends/cpupool/ops.go|copy(blocks[b.cfg.Rank], in)|copy(blocks[b.cfg.Rank%3], in)'
	'min-for-max|internal/reduce/reduce.go|	case tensor.Float64:\n		k.Combine = arith[float64](base)|	case tensor.Float64:\n		if base == reduceop.Max {\n			base = reduceop.Min\n		}\n		k.Combine = arith[float64](base)'
	'wait-returns-early|backends/cpupool/cpupool.go|	w.b.help(w.j, true)\n	return w.HostWork.Wait(ctx)|	return nil'
	'skipped-seq|dispatcher/call.go|		seq = pg.collSeq.Add(1)|		if op == backend.OpBroadcast {\n			pg.collSeq.Add(1)\n		}\n		seq = pg.collSeq.Add(1)'
	'dropped-timeout|backends/cpupool/cpupool.go|	to := m.Timeout\n|	to := time.Duration(0)\n'
)

scratch=$(mktemp -d)
trap 'git worktree remove --force "$scratch/tree" >/dev/null 2>&1 || true; rm -rf "$scratch"' EXIT
git worktree add --detach -q "$scratch/tree" HEAD

printf '%-20s %-12s %8s %-12s %8s\n' mutant "unit tests" seconds conformance seconds
caught=0 total=0
for m in "${mutants[@]}"; do
	IFS='|' read -r name file old new <<<"$m"
	[ -n "$only" ] && [ "$only" != "$name" ] && continue
	total=$((total + 1))
	(cd "$scratch/tree" && git checkout -q HEAD -- .)
	MUT_FILE="$scratch/tree/$file" MUT_OLD="$old" MUT_NEW="$new" python3 - <<'PY' || { echo "mutant $name: its text is not in $file any more; update scripts/mutants.sh" >&2; exit 1; }
import os, sys
p, old, new = os.environ["MUT_FILE"], os.environ["MUT_OLD"], os.environ["MUT_NEW"]
old, new = old.encode().decode("unicode_escape"), new.encode().decode("unicode_escape")
s = open(p).read()
if s.count(old) != 1:
    sys.exit(1)
open(p, "w").write(s.replace(old, new))
PY
	start=$(date +%s)
	if (cd "$scratch/tree" && go test -count=1 -timeout 10m ./internal/... ./backend ./dispatcher ./backends/cpupool >"$scratch/$name.unit.log" 2>&1); then
		unit=missed
	else
		unit=caught
	fi
	unit_s=$(($(date +%s) - start))
	start=$(date +%s)
	if (cd "$scratch/tree" && timeout 900 go run ./cmd/conftest --backend cpupool --nproc "$nproc" >"$scratch/$name.conf.log" 2>&1); then
		conf=missed
	else
		conf="caught"
	fi
	conf_s=$(($(date +%s) - start))
	summary=$(grep -Eo '[0-9]+ passed, [0-9]+ failed' "$scratch/$name.conf.log" | tail -1 || true)
	[ "$conf" = caught ] && [ -n "$summary" ] && conf="caught ($summary)"
	printf '%-20s %-12s %8s %-12s %8s\n' "$name" "$unit" "$unit_s" "$conf" "$conf_s"
	if [ "$unit" = caught ] || [ "${conf%% *}" = caught ]; then
		caught=$((caught + 1))
	fi
done
echo "caught $caught of $total"
[ "$caught" -eq "$total" ]
