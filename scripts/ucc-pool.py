#!/usr/bin/env python3
"""Pools `conftest bench --by-size --json` reports of the ucc backend against
its raw libucc loop (scripts/ucc-turns.sh): per size, every turn's ours / raw
ratio and ours - raw difference, over all the files given.

    scripts/ucc-pool.py LABEL FILE.json...
"""
import json
import statistics as st
import sys

label, by = sys.argv[1], {}
for path in sys.argv[2:]:
    with open(path) as f:
        reports = json.load(f)["reports"]
    for rep in reports:
        turns = {}
        for x in rep["turns"]:
            turns.setdefault((x["bytes"], x["turn"]), {})[x["series"]] = x["time_us"]
        for (size, _), v in sorted(turns.items()):
            if "ucc" in v and "raw-ucc" in v:
                by.setdefault(size, []).append((v["ucc"], v["raw-ucc"]))
for size, pairs in sorted(by.items()):
    ratio = [o / r for o, r in pairs]
    diff = [o - r for o, r in pairs]
    print(f"{label} {size} B: {len(pairs)} turns, median ratio {st.median(ratio):.3f} "
          f"({(st.median(ratio) - 1) * 100:+.1f} %), within 1.05: {sum(r <= 1.05 for r in ratio)}, "
          f"median diff {st.median(diff):+.2f} us, ours med {st.median([o for o, _ in pairs]):.2f} "
          f"raw med {st.median([r for _, r in pairs]):.2f}")
