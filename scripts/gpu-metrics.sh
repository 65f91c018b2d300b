#!/usr/bin/env bash
# Builds .gpu/conftest (stripped) and .gpu/metrics.sh, the GPU proof of the
# metrics (issue 13 item 6): `conftest --backend nccl` at world 1 with
# GOCOLL_METRICS_ADDR set, and curl of rank 0's /metrics every second while
# it runs. On the device (GPU.md):
#   run: carry [".gpu"] (or GPU_DIR), kind nvidia-h200, command `bash .gpu/metrics.sh`
# The scrapes, the conftest log and its report come back as one tarball.
# GPU_DIR (default .gpu) is where the bundle goes; carry that folder.
# Built beside it when present: before.test (dispatcher without metrics),
# after.test and metrics.test, for the interleaved benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
D=${GPU_DIR:-.gpu}
mkdir -p "$D"
CGO_ENABLED=1 go build -ldflags='-s -w' -o "$D/conftest" ./cmd/conftest
cat > "$D/metrics.sh" <<'RUN'
#!/usr/bin/env bash
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
M="$OUT/m"
mkdir -p "$M"
D="$(cd "$(dirname "$0")" && pwd)" # the bundle: conftest and the benchmarks
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  ls -l /usr/lib/x86_64-linux-gnu/libnccl.so*; nproc; } > "$M/machine.txt" 2>&1
scrape() {
	if command -v curl >/dev/null; then curl -sf -m 2 "$1"; else
		python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())' "$1"; fi
}
# The failure specs run their ranks as child processes, which serve no
# scrape of rank 0's: LABELS (default: all but them) keeps the run short.
# GOCOLL_METRICS_ADDR for conftest alone: the benchmarks below would
# otherwise start metrics in their metrics-off cases.
GOCOLL_METRICS_ADDR=127.0.0.1:9400 GOCOLL_CONFTEST_CHILD_DIR="$M/children" timeout 60 "$D/conftest" --backend nccl --nproc 1 --timeout 15s --run-timeout 50s \
	--label-filter "${LABELS:-!timeout && !errors}" --report "$M/report" > "$M/conftest.log" 2>&1 &
pid=$!
n=0
while kill -0 "$pid" 2>/dev/null; do
	if scrape http://127.0.0.1:9400/metrics > "$M/scrape.tmp" 2>/dev/null; then
		n=$((n + 1)); mv "$M/scrape.tmp" "$M/scrape-$(printf %03d "$n").txt"
	fi
	sleep 1
done
wait "$pid"; rc=$?
rm -f "$M/scrape.tmp"
echo "conftest rc=$rc; scrapes taken during the run: $n (curl: $(command -v curl || echo none))" | tee "$M/summary.txt"
tail -n 3 "$M/conftest.log"
last=$(ls "$M"/scrape-*.txt 2>/dev/null | tail -n 1)
if [ -n "$last" ]; then
	echo "== $last, without buckets and help lines"
	grep -v '^#' "$last" | grep -v '_bucket' | grep -v '^gocoll_op\|^gocoll_ops' | head -n 40
	echo "== op series of the last 3 groups"
	g=$(grep -o 'group="[0-9]*"' "$last" | sort -u -t'"' -k2n | tail -n 3 | tr '\n' '|' | sed 's/|$//; s/|/\\|/g')
	grep '^gocoll_op' "$last" | grep -v '_bucket' | grep "$g" | head -n 30
	echo "== series in it: $(grep -vc '^#' "$last"); families: $(grep -c '^# TYPE' "$last")"
fi
# The dispatcher's cost with metrics off and on, on this machine's cores
# (before.test: dispatcher without metrics; after.test: with them, off;
# metrics.test: off and on), interleaved, after the conftest run.
if [ -x "$D/metrics.test" ] && [ "${BENCH_ROUNDS:-6}" -gt 0 ]; then
	ts=""; taskset -c 2-5 true 2>/dev/null && ts="taskset -c 2-5"
	for i in $(seq "${BENCH_ROUNDS:-6}"); do
		for b in before after metrics; do
			$ts "$D/$b.test" -test.run '^$' -test.bench DispatchAllreduce -test.benchtime 200000x -test.benchmem 2>/dev/null | grep ^Bench | sed "s/^/$b /" >> "$M/bench.txt"
		done
	done
	awk '{k=$1" "$2; v[k]=v[k]" "$4} END{for (k in v) print k":"v[k]}' "$M/bench.txt" | sort
fi
tar -C "$OUT" -czf /tmp/metrics-run.tgz m && rm -rf "$M" && mv /tmp/metrics-run.tgz "$OUT/"
RUN
chmod +x "$D/metrics.sh"
du -sh "$D"
