#!/bin/sh
# Installs what the store package's interop tests need: Debian's python3-torch
# (torch 1.13), run with /usr/bin/python3. Idempotent and non-interactive.
set -eu
if /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
	exit 0
fi
export DEBIAN_FRONTEND=noninteractive
SUDO=
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
$SUDO apt-get update -q
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-torch
/usr/bin/python3 -c 'import torch; print("store-deps: torch", torch.__version__)'
