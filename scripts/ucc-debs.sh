#!/usr/bin/env bash
# Downloads Debian sid's libucc1, libucc-dev and libucx0 .debs (about 2 MB)
# into OUTDIR, for the GPU machine (Ubuntu 24.04, no libucc), where
# scripts/ucc-gpu-env.sh unpacks them with dpkg -x.
#
#   scripts/ucc-debs.sh OUTDIR          # e.g. scripts/ucc-debs.sh .ucc/debs, then carry .ucc
#
# apt runs with a private sid source list and private lists and cache
# directories, all passed through -o options, so the system's apt
# configuration, lists and cache stay as they are. The mirror is this
# machine's own (scripts/ucc-common.sh; GOCOLL_DEBIAN_MIRROR overrides);
# GOCOLL_DEBIAN_KEYRING is the keyring that signs it (default Debian's).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ucc-common.sh"

if [ $# -ne 1 ]; then
	echo "usage: scripts/ucc-debs.sh OUTDIR" >&2
	exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
mirror=$(ucc_debian_mirror)
keyring=${GOCOLL_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
if [ ! -r "$keyring" ]; then
	echo "ucc-debs.sh: no keyring $keyring (apt-get install debian-archive-keyring, or set GOCOLL_DEBIAN_KEYRING)" >&2
	exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/parts" "$tmp/prefs" "$tmp/lists/partial" "$tmp/cache/archives/partial"
echo "deb [signed-by=$keyring] $mirror sid main" > "$tmp/sources.list"
# apt drops to the _apt user to download; it must reach the private dirs.
chmod -R a+rX "$tmp"
if id _apt >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
	chown -R _apt "$tmp/lists/partial" "$tmp/cache/archives/partial"
fi
apt=(
	-o "Dir::Etc::SourceList=$tmp/sources.list"
	-o "Dir::Etc::SourceParts=$tmp/parts"
	-o "Dir::Etc::Preferences=$tmp/preferences"
	-o "Dir::Etc::PreferencesParts=$tmp/prefs"
	-o "Dir::State::Lists=$tmp/lists"
	-o "Dir::Cache=$tmp/cache"
)
apt-get "${apt[@]}" -q update > "$tmp/update.log" 2>&1 || {
	cat "$tmp/update.log" >&2
	echo "ucc-debs.sh: apt-get update of the private sid list failed" >&2
	exit 1
}
# apt-get download writes into the current directory; it runs as _apt
# there too when it can, so the files are downloaded in tmp and moved.
mkdir "$tmp/get"
chmod a+rwx "$tmp/get"
(cd "$tmp/get" && apt-get "${apt[@]}" -q download libucc1 libucc-dev libucx0)
rm -f "$out"/libucc1_*.deb "$out"/libucc-dev_*.deb "$out"/libucx0_*.deb
mv "$tmp"/get/*.deb "$out"/
ls -l "$out"/*.deb
