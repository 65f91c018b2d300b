#!/usr/bin/env bash
# The pooled figures of docs/perf.md's "Twelfth round" from the JSON of the one
# device call (call1: main = 3e8856d, new = the round's ucc change on it); python3
# pool.py (ucc12e's) per row: the median of the per-turn differences ours - raw.
cd "$(dirname "$0")"
p() { python3 pool.py "$@"; }
echo "## 8 B, 2 ranks, check on"
for v in main new; do p "$v" call1/s8-2-$v-auto-*.json; done
echo "## per invocation (5 turns each), in run order"
for t in a b c d e f; do for v in main new; do p "$v $t" call1/s8-2-$v-auto-$t.json; done; done
echo "## 8 B, 2 ranks, check off"
for v in main new; do p "$v" call1/s8-2-$v-off-*.json; done
echo "## 8 B, 4 ranks, check on"
for v in main new; do p "$v" call1/s8-4-$v-auto-*.json; done
