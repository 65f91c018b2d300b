# Sourced (bash) on the GPU machine, which has UCX 1.16 but no libucc: unpacks
# the sid .debs of scripts/ucc-debs.sh with dpkg -x, once, and points the
# loader, UCX and the ucc backend at them.
#
#   scripts/ucc-debs.sh .ucc/debs             # here; then carry .ucc to the GPU machine
#   source scripts/ucc-gpu-env.sh [DEBDIR]    # there; DEBDIR defaults to GOCOLL_UCC_DEBS, else .ucc/debs
#   scripts/ucc-check.sh --here               # dlopen, ucc_init, a one-rank context
#
# The .debs unpack into GOCOLL_UCC_PREFIX (default: DEBDIR/unpacked), again
# only when the set of .debs changed. Then:
#   LD_LIBRARY_PATH  gets the unpacked lib dir (libucc.so.1, sid's libucp/ucs/
#                    uct) and its ucx/ dir first;
#   UCX_MODULE_DIR   the unpacked UCX modules: without it, sid's libucx loads
#                    the machine's UCX 1.16 modules, which crash;
#   GOCOLL_UCC_LIBRARY the unpacked libucc.so.1, which the backend dlopens;
#   GOCOLL_UCC_INCLUDE the unpacked headers (ucc/api/ucc.h).
# libucc finds its components in ucc/ beside itself; libucc-dev holds their
# unversioned .so links, without which ucc_init reports "no CL components
# were found".

ucc_gpu_env() {
	local repo debs prefix lib marker want
	repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
	debs=${1:-${GOCOLL_UCC_DEBS:-$repo/.ucc/debs}}
	if ! ls "$debs"/libucc1_*.deb "$debs"/libucc-dev_*.deb "$debs"/libucx0_*.deb >/dev/null 2>&1; then
		echo "ucc-gpu-env: no libucc1, libucc-dev and libucx0 .debs in $debs (scripts/ucc-debs.sh $debs makes them)" >&2
		return 1
	fi
	debs=$(cd "$debs" && pwd)
	prefix=${GOCOLL_UCC_PREFIX:-$debs/unpacked}
	marker=$prefix/.gocoll-ucc-debs
	want=$(cd "$debs" && ls libucc1_*.deb libucc-dev_*.deb libucx0_*.deb)
	if [ ! -f "$marker" ] || [ "$(cat "$marker")" != "$want" ]; then
		rm -rf "$prefix"
		mkdir -p "$prefix"
		local d
		for d in "$debs"/libucc1_*.deb "$debs"/libucc-dev_*.deb "$debs"/libucx0_*.deb; do
			dpkg -x "$d" "$prefix" || {
				echo "ucc-gpu-env: dpkg -x $d failed" >&2
				return 1
			}
		done
		printf '%s\n' "$want" > "$marker"
	fi
	lib=$(dirname "$(find "$prefix" -name libucc.so.1 | head -n 1)")
	if [ ! -e "$lib/libucc.so.1" ] || [ ! -d "$lib/ucx" ] || [ ! -d "$lib/ucc" ]; then
		echo "ucc-gpu-env: $prefix lacks libucc.so.1, or ucx/ and ucc/ beside it" >&2
		return 1
	fi
	export LD_LIBRARY_PATH="$lib:$lib/ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export UCX_MODULE_DIR=$lib/ucx
	export GOCOLL_UCC_LIBRARY=$lib/libucc.so.1
	export GOCOLL_UCC_INCLUDE=$prefix/usr/include
	# Libraries the .debs depend on but do not carry (libnuma, ...).
	local missing
	missing=$(ldd "$lib/libucc.so.1" "$lib"/libucp.so.0 "$lib"/libucs.so.0 "$lib"/libuct.so.0 2>&1 | grep 'not found' | sort -u)
	if [ -n "$missing" ]; then
		echo "ucc-gpu-env: missing libraries:" >&2
		echo "$missing" >&2
		return 1
	fi
	echo "ucc-gpu-env: libucc $(cd "$debs" && ls libucc1_*.deb) from $prefix; UCX_MODULE_DIR=$UCX_MODULE_DIR"
}
ucc_gpu_env "$@"
