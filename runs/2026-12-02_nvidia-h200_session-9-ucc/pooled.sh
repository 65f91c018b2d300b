#!/usr/bin/env bash
# The pooled figures of docs/perf.md's "Thirteenth round" from this device
# call's JSON (base = e832654, new = main with the recorder's ring written at
# set-up and the bench's pre-warm); ../2026-12-01_nvidia-h200_ucc12g/pool.py (ucc12e's): the median of the
# per-turn differences ours - raw over all turns of a build.
cd "$(dirname "$0")"
p() { python3 ../2026-12-01_nvidia-h200_ucc12g/pool.py "$@"; }
echo "## 8 B, 2 ranks, check on"
for v in base new; do p "$v" s8-2-$v-auto-*.json; done
echo "## 8 B, 2 ranks, check off"
for v in base new; do p "$v" s8-2-$v-off-*.json; done
