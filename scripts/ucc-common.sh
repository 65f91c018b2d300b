# Sourced by the scripts/ucc-*.sh scripts: where the Debian sid root lives,
# and which Debian mirror this machine uses. Nothing here runs on its own.
#
# Debian 12 has no libucc; Debian sid has libucc1/libucc-dev (and libucx0),
# built against glibc >= 2.38. So the tests run host-built binaries inside a
# sid root (scripts/ucc-root.sh builds it, scripts/ucc-run.sh runs in it).

# ucc_root_dir prints the root's path: GOCOLL_UCC_ROOT, else a cache folder
# outside the repository, so every clone and worktree shares one root.
ucc_root_dir() {
	printf '%s\n' "${GOCOLL_UCC_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/gocoll/ucc-sid}"
}

# ucc_root_ready succeeds when DIR is a complete root: ucc-root.sh writes the
# marker last, after debootstrap succeeded and just before the rename, so a
# root an interrupted build left behind never counts.
ucc_root_ready() {
	[ -f "$1/.gocoll-ucc-root" ]
}

# ucc_debian_mirror prints the Debian archive URI of this machine's own apt
# sources (the project writes no host name of its own): GOCOLL_DEBIAN_MIRROR
# if set, else the first "deb" entry of /etc/apt/sources.list.d/*.sources
# (deb822 URIs lines) or /etc/apt/sources.list (one-line deb entries) that is
# not a security archive, preferring a URI whose path ends in /debian.
ucc_debian_mirror() {
	if [ -n "${GOCOLL_DEBIAN_MIRROR:-}" ]; then
		printf '%s\n' "${GOCOLL_DEBIAN_MIRROR%/}"
		return 0
	fi
	local candidates
	candidates=$(
		{
			# deb822: one stanza per paragraph; take URIs of Types: deb stanzas
			# that are not Enabled: no and whose suites are not *-security.
			for f in /etc/apt/sources.list.d/*.sources; do
				[ -r "$f" ] || continue
				awk '
					function flush() {
						if (types ~ /(^| )deb( |$)/ && enabled != "no" && suites !~ /-security/) {
							n = split(uris, u, " ")
							for (i = 1; i <= n; i++) print u[i]
						}
						types = ""; uris = ""; suites = ""; enabled = ""
					}
					/^[ \t]*#/ { next }
					/^[ \t]*$/ { flush(); next }
					tolower($1) == "types:"   { $1 = ""; types = $0 }
					tolower($1) == "uris:"    { $1 = ""; uris = $0 }
					tolower($1) == "suites:"  { $1 = ""; suites = $0 }
					tolower($1) == "enabled:" { enabled = tolower($2) }
					END { flush() }
				' "$f"
			done
			# one-line format: deb [options] URI suite components...
			for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
				[ -r "$f" ] || continue
				awk '
					$1 != "deb" { next }
					{ i = 2; if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } }
					$(i + 1) ~ /-security/ { next }
					{ print $i }
				' "$f"
			done
		} | grep -v -e security -e '^$' || true
	)
	local uri
	uri=$(printf '%s\n' "$candidates" | grep -E '/debian/?$' | head -n 1)
	[ -n "$uri" ] || uri=$(printf '%s\n' "$candidates" | head -n 1)
	if [ -z "$uri" ]; then
		echo "ucc: no Debian mirror in this machine's apt sources; set GOCOLL_DEBIAN_MIRROR (e.g. the URI of a Debian archive)" >&2
		return 1
	fi
	printf '%s\n' "${uri%/}"
}

# ucc_umount_under unmounts every mount point at or below DIR, deepest first
# (what a killed run or an interrupted debootstrap may have left mounted).
ucc_umount_under() {
	local dir=$1 m
	dir=$(readlink -f "$dir" 2>/dev/null) || return 0
	# /proc/self/mounts escapes spaces as \040; the paths here have none.
	awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts |
		sort -r | while read -r m; do
		umount "$m" 2>/dev/null || umount -l "$m"
	done
}
