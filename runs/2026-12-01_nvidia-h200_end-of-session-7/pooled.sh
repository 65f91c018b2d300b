#!/usr/bin/env bash
# The pooled 8 B figures of this call (base = e3c8020, final = the session's
# last tree), with ucc12g's pool.py: the median of per-turn ours - raw.
cd "$(dirname "$0")/ucc"
P=../../2026-12-01_nvidia-h200_ucc12g/pool.py
for fp in auto off; do for v in final base; do python3 $P "$v $fp" s8-$v-$fp-*.json; done; done
