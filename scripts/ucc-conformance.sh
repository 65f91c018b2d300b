#!/usr/bin/env bash
# The ucc backend's conformance run on the real libucc: builds the sid root if
# needed (scripts/ucc-root.sh), builds conftest on the host, runs
# `conftest --backend ucc --nproc N` inside the root (scripts/ucc-run.sh) and
# prints the summary line. Exit status: conftest's.
#
#   scripts/ucc-conformance.sh [--nproc N] [-- CONFTEST_FLAGS...]
#
# Flags after -- go to conftest after the script's own, so they win:
# `-- --label-filter 'timeout||errors'`, `-- --report /tmp/ucc` (the host's
# /tmp is the root's), even `-- --backend cpupool` to test the plumbing.
# GOCOLL_UCC_CONFTEST_LOG keeps the full output there (default: a temp file,
# deleted when the run passes).
set -euo pipefail
cd "$(dirname "$0")/.."

nproc=4
while [ $# -gt 0 ]; do
	case "$1" in
	--nproc)
		nproc=${2:?--nproc needs a number}
		shift 2
		;;
	--nproc=*)
		nproc=${1#--nproc=}
		shift
		;;
	--)
		shift
		break
		;;
	*)
		echo "usage: scripts/ucc-conformance.sh [--nproc N] [-- CONFTEST_FLAGS...]" >&2
		exit 2
		;;
	esac
done

scripts/ucc-root.sh
tmp=$(mktemp -d /tmp/ucc-conformance.XXXXXX)
log=${GOCOLL_UCC_CONFTEST_LOG:-$tmp/conftest.log}
keep=0
trap '[ "$keep" = 1 ] || rm -rf "$tmp"' EXIT
go build -o "$tmp/conftest" ./cmd/conftest

echo "== conftest --backend ucc --nproc $nproc${*:+ $(printf '%q ' "$@")} (inside the sid root)"
rc=0
scripts/ucc-run.sh -- "$tmp/conftest" --backend ucc --nproc "$nproc" "$@" > "$log" 2>&1 || rc=$?
if [ "$rc" != 0 ]; then
	# The failures and the tail; the whole log stays.
	grep -E '^  FAILED|^\s*\[FAIL\]' "$log" | head -n 40 || true
	tail -n 40 "$log"
	[ "$log" = "$tmp/conftest.log" ] && keep=1
	echo "ucc-conformance: conftest exited $rc; full log: $log" >&2
fi
summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
echo "ucc-conformance: ${summary:-no summary line (see the log)}"
exit "$rc"
