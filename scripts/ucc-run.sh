#!/usr/bin/env bash
# Runs a command inside the Debian sid root (scripts/ucc-root.sh), where
# libucc.so.1 and UCX are installed: the way host-built Go binaries (static,
# or linked against the host's glibc 2.36, which the root's newer glibc runs)
# dlopen the real libucc here and in CI.
#
#   scripts/ucc-run.sh [--] CMD [ARGS...]
#   scripts/ucc-run.sh -- /tmp/x/conftest --backend ucc --nproc 4
#
# Inside the root, at the same paths as on the host: this repository, the
# host's /tmp, the directory of CMD (when CMD is a path), and every path in
# GOCOLL_UCC_BIND (colon-separated); /proc, /sys, /dev, /dev/pts, /dev/shm,
# /etc/hosts and /etc/resolv.conf are the host's. The command runs in the
# current directory when that is visible inside, else in /. Its environment is
# the caller's GOCOLL_*, UCX_*, UCC_*, TORCH_*, NCCL_*, GLOO_*, GO*, the
# launcher's (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE), HOME, USER, TERM, TMPDIR, TZ, LANG, LC_*, OUT, CI, PATH
# (with the root's standard directories appended), and the names listed in
# GOCOLL_UCC_ENV (space-separated); nothing else (LD_* of the host would
# point at the host's libraries). Exit status: the command's.
#
# Each run mounts in its own private mount namespace (unshare), so runs may
# overlap and the mounts vanish with the run however it ends; the EXIT trap
# also unmounts them. Where unshare is refused, the mounts are made in the
# host's namespace under an exclusive lock: a second run then refuses with a
# message, and the trap unmounts at the end (a run killed with SIGKILL leaves
# them to the next run, which unmounts them first; GOCOLL_UCC_RUN_NS=host
# forces this mode). Needs root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ucc-common.sh"

[ "${1:-}" = -- ] && shift
if [ $# -eq 0 ]; then
	echo "usage: scripts/ucc-run.sh [--] CMD [ARGS...]" >&2
	exit 2
fi
if [ "$(id -u)" != 0 ]; then
	echo "ucc-run.sh: needs root (mount and chroot); run it with sudo" >&2
	exit 1
fi
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

root=$(ucc_root_dir)
if ! ucc_root_ready "$root"; then
	echo "ucc-run.sh: no sid root at $root; build it with scripts/ucc-root.sh" >&2
	exit 1
fi
root=$(cd "$root" && pwd -P)

# Into a private mount namespace, once (the variable marks the second pass).
if [ -z "${GOCOLL_UCC_RUN_NS:-}" ] && unshare --mount --propagation private true 2>/dev/null; then
	GOCOLL_UCC_RUN_NS=private exec unshare --mount --propagation private "$BASH" "$0" -- "$@"
fi
if [ "${GOCOLL_UCC_RUN_NS:-}" != private ]; then
	exec 9>"$root.run.lock"
	if ! flock -n 9; then
		echo "ucc-run.sh: another ucc-run.sh is using $root (lock $root.run.lock held), and this machine refuses unshare --mount, so runs cannot overlap; wait for it, or give this run its own root with GOCOLL_UCC_ROOT" >&2
		exit 1
	fi
fi
# Whatever an earlier killed run left mounted (in the host's namespace; in a
# private one, its copies).
ucc_umount_under "$root"

mounted=()
cleanup() {
	local i
	for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
		umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" 2>/dev/null || true
	done
	mounted=()
}
trap cleanup EXIT

# bind SRC [DST]: bind-mounts host path SRC at DST (default SRC) in the root.
bind() {
	local src=$1 dst="$root${2:-$1}"
	if [ -d "$src" ]; then
		mkdir -p "$dst"
	else
		mkdir -p "$(dirname "$dst")"
		[ -e "$dst" ] || : > "$dst"
	fi
	mount --bind "$src" "$dst"
	mounted+=("$dst")
}

# shared: host paths visible at the same path; a path inside one already
# bound needs no mount of its own.
shared=()
covered() {
	local p=$1 s
	for s in "${shared[@]}"; do
		[ "$p" = "$s" ] || [ "${p#"$s"/}" != "$p" ] && return 0
	done
	return 1
}
share() {
	local p
	p=$(cd "$1" 2>/dev/null && pwd -P) || {
		echo "ucc-run.sh: cannot share $1: not a directory" >&2
		exit 1
	}
	case "$p" in
	/ | /proc | /proc/* | /sys | /sys/* | /dev | /dev/*) return 0 ;;
	esac
	if [ "$p" = "$root" ] || [ "${p#"$root"/}" != "$p" ] || [ "${root#"$p"/}" != "$root" ]; then
		echo "ucc-run.sh: cannot share $p: it contains or lies inside the root $root" >&2
		exit 1
	fi
	covered "$p" && return 0
	# Never hide the root's own files (a path such as /usr/bin exists in
	# both); empty directories are earlier runs' mount points. /tmp, which the
	# root leaves empty, is always the host's.
	if [ "$p" != /tmp ] && [ -d "$root$p" ] && [ -n "$(find "$root$p" -mindepth 1 ! -type d -print -quit)" ]; then
		echo "ucc-run.sh: cannot share $p: the root has its own $p; put host files under /tmp or the repository" >&2
		exit 1
	fi
	bind "$p"
	shared+=("$p")
}

bind /proc
bind /sys
bind /dev
bind /dev/pts
bind /dev/shm
for f in /etc/hosts /etc/resolv.conf; do
	if [ -f "$f" ]; then bind "$(readlink -f "$f")" "$f"; fi
done
share /tmp
share "$here/.."
if [ -n "${GOCOLL_UCC_BIND:-}" ]; then
	IFS=: read -r -a extra <<< "$GOCOLL_UCC_BIND"
	for p in "${extra[@]}"; do
		if [ -n "$p" ]; then share "$p"; fi
	done
fi
cmd=$1
shift
# A command given as a path is the host's file, unless it lies in a directory
# the root has too (/usr/bin/env runs the root's env).
if [ "${cmd#*/}" != "$cmd" ]; then
	if [ ! -x "$cmd" ]; then
		echo "ucc-run.sh: $cmd: not an executable file" >&2
		exit 1
	fi
	dir=$(cd "$(dirname "$cmd")" && pwd -P)
	cmd="$dir/$(basename "$cmd")"
	if ! covered "$dir" && [ -d "$root$dir" ]; then
		if [ ! -x "$root$cmd" ]; then
			echo "ucc-run.sh: $cmd: the root has its own $dir, without this file; put host binaries under /tmp or the repository" >&2
			exit 1
		fi
	else
		share "$dir"
	fi
fi

cwd=$(pwd -P)
covered "$cwd" || cwd=/

envs=("PATH=$PATH:/usr/local/bin:/usr/bin:/bin")
while IFS= read -r -d '' kv; do
	name=${kv%%=*}
	case "$name" in
	GOCOLL_UCC_RUN_NS | PATH) continue ;;
	GOCOLL_* | UCX_* | UCC_* | TORCH_* | NCCL_* | GLOO_* | GO* | LC_*) ;;
	MASTER_ADDR | MASTER_PORT | RANK | WORLD_SIZE | LOCAL_RANK | LOCAL_WORLD_SIZE) ;;
	HOME | USER | LOGNAME | TERM | TMPDIR | TZ | LANG | OUT | CI) ;;
	*) [[ " ${GOCOLL_UCC_ENV:-} " == *" $name "* ]] || continue ;;
	esac
	envs+=("$kv")
done < <(env -0)

# The command runs as a child, not exec'd, so the trap unmounts after it;
# TERM/INT/HUP are passed on to it. Its stdin stays the caller's.
exec 3<&0
chroot "$root" /usr/bin/env -i -C "$cwd" "${envs[@]}" "$cmd" "$@" <&3 3<&- &
child=$!
exec 3<&-
trap 'kill -TERM $child 2>/dev/null' TERM
trap 'kill -INT $child 2>/dev/null' INT
trap 'kill -HUP $child 2>/dev/null' HUP
rc=0
while :; do
	wait $child && rc=0 || rc=$?
	# wait returns early (status > 128) when a trapped signal arrives; the
	# child is still running then.
	kill -0 $child 2>/dev/null || break
done
exit $rc
