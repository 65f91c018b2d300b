#!/usr/bin/env bash
# Runs one package's tests inside the sid root, where the real libucc is: the
# test binary is built on the host (`go test -race -c`; the root has no Go
# toolchain or gcc) and runs in the package's directory, as `go test` runs it.
#
#   scripts/ucc-test.sh [PKG [TESTBINARY_FLAGS...]]   # PKG defaults to ./backends/ucc
#   scripts/ucc-test.sh ./backends/ucc -test.run TestAllreduce -test.v
#
# The flags are the test binary's own (-test.run, -test.v, -test.count, ...);
# -test.timeout defaults to 10m. GOCOLL_UCC_TEST_RACE=0 builds without -race.
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=${1:-./backends/ucc}
[ $# -gt 0 ] && shift
dir=$(go list -f '{{.Dir}}' "$pkg")
tmp=$(mktemp -d /tmp/ucc-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
race=-race
[ "${GOCOLL_UCC_TEST_RACE:-1}" = 0 ] && race=
go test $race -c -o "$tmp/pkg.test" "$pkg"
if [ ! -x "$tmp/pkg.test" ]; then
	echo "ucc-test.sh: $pkg has no tests" >&2
	exit 0
fi
timeout=-test.timeout=10m
for a in "$@"; do
	case "$a" in -test.timeout* | --test.timeout*) timeout= ;; esac
done
cd "$dir"
"$OLDPWD/scripts/ucc-run.sh" -- "$tmp/pkg.test" $timeout "$@"
