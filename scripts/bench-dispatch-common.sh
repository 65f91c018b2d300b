# Sourced by scripts/bench-dispatch.sh and scripts/bench-dispatch-e2e.sh:
# the before and after builds and the summary, so the two measure the same
# binaries the same way. Expects: here (the tree's root), before (a commit),
# out (the output folder). Defines lock and raw, and summarize.
lock=/tmp/gocoll-bench.lock
# Absolute, since the builds run from inside the trees.
out=$(mkdir -p "$out" && cd "$out" && pwd)
tree=$out/before-tree
rm -rf "$tree" && mkdir -p "$tree"
git -C "$here" archive "$before" | tar -x -C "$tree"
# BenchmarkDispatchVsDirect is newer than some of the commits compared.
[ -f "$tree/dispatcher/direct_bench_test.go" ] || cp "$here/dispatcher/direct_bench_test.go" "$tree/dispatcher/"
for side in before after; do
	src=$here
	[ $side = before ] && src=$tree
	(cd "$src" && go test -c -o "$out/disp-$side.test" ./dispatcher && go build -o "$out/conftest-$side" ./cmd/conftest)
done
raw=$out/raw.txt
: >"$raw"

# summarize prints min, median and max per series of the raw lines
# ("side name key=value..."; a key "load" is context, not a series).
summarize() {
	python3 - "$raw" <<'PY'
import collections, statistics, sys
vals = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, name, *kv = line.split()
    for p in kv:
        k, _, v = p.partition("=")
        if k == "load":
            continue
        try:
            vals[(name, k, side)].append(float(v))
        except ValueError:
            pass
for (name, k, side), xs in sorted(vals.items()):
    xs.sort()
    print(f"{name:50s} {k:18s} {side:6s} min {xs[0]:9.2f}  median {statistics.median(xs):9.2f}  max {xs[-1]:9.2f}  (n={len(xs)})")
PY
	echo "raw: $raw"
}
