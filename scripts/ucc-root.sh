#!/usr/bin/env bash
# Builds, when absent, the Debian sid root that the ucc backend's tests and
# conformance run in (Debian 12 has no libucc; sid's libucc1 needs glibc >=
# 2.38), and prints its path and the libucc version in it. Reused when present.
#
#   scripts/ucc-root.sh          # build if absent; print the path and versions
#
# The root: `debootstrap --variant=minbase --include=libucc1,libucc-dev,libucx0
# sid DIR`, DIR = GOCOLL_UCC_ROOT or ${XDG_CACHE_HOME:-~/.cache}/gocoll/ucc-sid,
# outside the repository (about 50 s and 600 MB the first time). The mirror is
# this machine's own (scripts/ucc-common.sh; GOCOLL_DEBIAN_MIRROR overrides).
# It builds into DIR.tmp.* and renames that to DIR only when debootstrap has
# succeeded, so an interrupted build is never taken for a root; concurrent
# calls serialize on DIR.lock. Needs root (debootstrap, chroot).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ucc-common.sh"

if [ "$(id -u)" != 0 ]; then
	echo "ucc-root.sh: needs root (debootstrap and chroot); run it with sudo" >&2
	exit 1
fi
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

root=$(ucc_root_dir)
mkdir -p "$(dirname "$root")"

versions() {
	chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' libucc1 libucc-dev libucx0
}

if ! ucc_root_ready "$root"; then
	exec 9>"$root.lock"
	flock 9
	# Another call may have built it while this one waited for the lock.
	if ! ucc_root_ready "$root"; then
		# Leftovers of interrupted builds (this one holds the lock, so none is
		# running): unmount what debootstrap may have left mounted, then delete
		# without crossing into another file system.
		for old in "$root".tmp.*; do
			if [ -d "$old" ]; then
				ucc_umount_under "$old"
				rm -rf --one-file-system "$old"
			else
				rm -f "$old"
			fi
		done
		if [ -e "$root" ]; then
			echo "ucc-root.sh: $root exists but is not a complete root (no .gocoll-ucc-root); delete it (nothing may be mounted under it) and rerun" >&2
			exit 1
		fi
		if ! command -v debootstrap >/dev/null; then
			apt-get update -q
			DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap
		fi
		mirror=$(ucc_debian_mirror)
		tmp=$(mktemp -d "$root.tmp.XXXXXX")
		chmod 755 "$tmp"
		keep_log=0
		cleanup() {
			ucc_umount_under "$tmp"
			rm -rf --one-file-system "$tmp"
			[ "$keep_log" = 1 ] || rm -f "$tmp.log"
		}
		trap cleanup EXIT
		trap 'exit 130' INT TERM HUP
		echo "ucc-root.sh: building the sid root in $root from $mirror (about a minute, 600 MB)"
		start=$(date +%s)
		debootstrap --variant=minbase --include=libucc1,libucc-dev,libucx0 \
			sid "$tmp" "$mirror" > "$tmp.log" 2>&1 || {
			keep_log=1
			tail -n 30 "$tmp.log" >&2
			echo "ucc-root.sh: debootstrap failed (log above; full log in $tmp.log)" >&2
			exit 1
		}
		rm -f "$tmp.log"
		# The downloaded .debs are not needed once installed.
		rm -f "$tmp"/var/cache/apt/archives/*.deb
		chroot "$tmp" dpkg-query -W -f '${Package} ${Version}\n' libucc1 libucc-dev libucx0 > "$tmp/.gocoll-ucc-root"
		mv -T "$tmp" "$root"
		trap - EXIT
		echo "ucc-root.sh: built in $(($(date +%s) - start)) s"
	fi
	exec 9>&-
fi

echo "ucc-root: $root ($(du -sh --one-file-system "$root" 2>/dev/null | cut -f1))"
versions | sed 's/^/ucc-root: /'
