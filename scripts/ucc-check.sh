#!/usr/bin/env bash
# Compiles scripts/ucc-check.c on this machine with gcc and runs it where the
# real libucc is: it dlopens libucc.so.1, prints the version, runs ucc_init
# and a one-rank context, and says which directories the UCC and UCX
# libraries and modules came from (see the .c file for what that proves).
#
#   scripts/ucc-check.sh              # runs it inside the sid root (scripts/ucc-run.sh)
#   scripts/ucc-check.sh --here       # runs it here: the GPU machine, after
#                                     # `source scripts/ucc-gpu-env.sh`
#   scripts/ucc-check.sh --build FILE # only compiles it to FILE (it runs on any
#                                     # glibc >= this machine's: carry it)
#
# Headers: GOCOLL_UCC_INCLUDE (set by ucc-gpu-env.sh), else the sid root's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ucc-common.sh"

mode=root out=
case "${1:-}" in
--here) mode=here ;;
--build)
	mode=build
	out=${2:?usage: scripts/ucc-check.sh --build FILE}
	;;
"") ;;
*)
	echo "usage: scripts/ucc-check.sh [--here | --build FILE]" >&2
	exit 2
	;;
esac
inc=${GOCOLL_UCC_INCLUDE:-$(ucc_root_dir)/usr/include}
if [ ! -f "$inc/ucc/api/ucc.h" ]; then
	echo "ucc-check.sh: no ucc/api/ucc.h under $inc (build the root with scripts/ucc-root.sh, or source scripts/ucc-gpu-env.sh)" >&2
	exit 1
fi

tmp=$(mktemp -d /tmp/ucc-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# Only ucc/ from that include directory: the root's own libc headers must not
# shadow this machine's.
mkdir "$tmp/include"
ln -s "$inc/ucc" "$tmp/include/ucc"
gcc -std=c11 -O1 -Wall -Wextra -Werror -I"$tmp/include" -o "$tmp/ucc-check" "$here/ucc-check.c" -ldl
case "$mode" in
root) "$here/ucc-run.sh" -- "$tmp/ucc-check" ;;
here) "$tmp/ucc-check" ;;
build) cp "$tmp/ucc-check" "$out" ;;
esac
