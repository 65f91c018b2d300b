#!/usr/bin/env bash
# Compiles scripts/ucc-check.c on this machine with gcc and runs it where the
# real libucc is: it dlopens libucc.so.1, prints the version, and runs
# ucc_init and a one-rank context (see the .c file for what that proves).
#
#   scripts/ucc-check.sh           # headers from the sid root; runs inside it (scripts/ucc-run.sh)
#   scripts/ucc-check.sh --here    # runs here, with the headers and libraries of
#                                  # scripts/ucc-gpu-env.sh (source it first): the GPU machine
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ucc-common.sh"

mode=root
if [ "${1:-}" = --here ]; then
	mode=here
fi
if [ "$mode" = root ]; then
	inc=$(ucc_root_dir)/usr/include
else
	inc=${GOCOLL_UCC_INCLUDE:-}
	if [ -z "$inc" ]; then
		echo "ucc-check.sh --here: GOCOLL_UCC_INCLUDE is not set; source scripts/ucc-gpu-env.sh first" >&2
		exit 1
	fi
fi
if [ ! -f "$inc/ucc/api/ucc.h" ]; then
	echo "ucc-check.sh: no ucc/api/ucc.h under $inc" >&2
	exit 1
fi

tmp=$(mktemp -d /tmp/ucc-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# Only ucc/ from that include directory: the root's own libc headers must not
# shadow the host's.
mkdir "$tmp/include"
ln -s "$inc/ucc" "$tmp/include/ucc"
gcc -std=c11 -O1 -Wall -Wextra -Werror -I"$tmp/include" -o "$tmp/ucc-check" "$here/ucc-check.c" -ldl
if [ "$mode" = root ]; then
	"$here/ucc-run.sh" -- "$tmp/ucc-check"
else
	"$tmp/ucc-check"
fi
