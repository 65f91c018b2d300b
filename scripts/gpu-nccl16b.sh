#!/usr/bin/env bash
# Builds .gpu/nccl16b/ for one device call on nvidia-h200 (GPU.md: `run`
# with carry [".gpu/nccl16b"], command `bash .gpu/nccl16b/run.sh`; copy
# .gpu/nccl16b into main's ignored .gpu/ first: the device gets main's
# checkout). Binaries: conftest, cuda.test and nccl.test of HEAD; with
# BEFORE=<commit> also cuda-before.test and nccl-before.test of that
# commit (the crash tests on the code before the fix; BEFORE_OVERLAY lists
# files copied from HEAD over that commit first, a newer version of a
# test, say); with BASE=<commit>, conftest-base and nccl-base.test of that
# commit, for before/after rounds (default: no base). run.sh:
#   - the before binaries' TestBufferOutlivesItsStream and
#     TestStashOutlivesCurrentStream (expected to crash), when present;
#   - `go test ./cuda ./backends/nccl` at world 1 (the test binaries, -v);
#   - `conftest --backend nccl --nproc 1`, and again under
#     GOCOLL_NCCL_ASYNC_ON_CURRENT_STREAM=1 (5 specs fail there by design;
#     the process must not crash), and nccl.test under the variable;
#   - BenchmarkIssueCrossing x5 with a CPU profile, and x3 with GOGC=off;
#   - with HOSTCOST=1, `conftest bench hostcost --backend nccl --reps 5`
#     HOSTCOST_N times (default 3; torch 2.11 in each) and, unless
#     HOSTCOST_PROF=0, a CPU profile of the current-stream modes.
# SUITES=0 leaves out the conftest suites and BenchmarkIssueCrossing.
# Everything comes back as one tarball, nccl16b.tgz.
set -euo pipefail
cd "$(dirname "$0")/.."
D=.gpu/nccl16b
rm -rf "$D"
mkdir -p "$D"
export CGO_ENABLED=1
go build -trimpath -ldflags='-s -w' -o "$D/conftest" ./cmd/conftest
go test -c -trimpath -ldflags='-s -w' -o "$D/cuda.test" ./cuda
go test -c -trimpath -ldflags='-s -w' -o "$D/nccl.test" ./backends/nccl
git rev-parse HEAD > "$D/commit.txt"
if [ -n "${BEFORE:-}" ]; then
	B=$(mktemp -d)
	git worktree add -q --detach "$B" "$BEFORE"
	for f in ${BEFORE_OVERLAY:-}; do cp "$f" "$B/$f"; done
	(cd "$B" && go test -c -trimpath -ldflags='-s -w' -o "$OLDPWD/$D/cuda-before.test" ./cuda &&
		go test -c -trimpath -ldflags='-s -w' -o "$OLDPWD/$D/nccl-before.test" ./backends/nccl)
	git worktree remove --force "$B"
	git rev-parse "$BEFORE" > "$D/before.txt"
fi
if [ -n "${BASE:-}" ]; then
	B=$(mktemp -d)
	git worktree add -q --detach "$B" "$BASE"
	(cd "$B" && go build -trimpath -ldflags='-s -w' -o "$OLDPWD/$D/conftest-base" ./cmd/conftest &&
		go test -c -trimpath -ldflags='-s -w' -o "$OLDPWD/$D/nccl-base.test" ./backends/nccl)
	git worktree remove --force "$B"
	git rev-parse "$BASE" > "$D/base.txt"
fi
echo "${HOSTCOST:-0}" > "$D/hostcost.flag"
echo "${HOSTCOST_N:-3} ${HOSTCOST_PROF:-1} ${SUITES:-1}" > "$D/flags.cfg"
gzip -9 "$D"/*.test "$D"/conftest*
cat > "$D/run.sh" <<'RUN'
#!/usr/bin/env bash
export NCCL_NVLS_ENABLE=0
H=$(cd "$(dirname "$0")" && pwd)
cd "$H/../.."
for f in "$H"/*.gz; do b=$(basename "$f" .gz); gunzip -c "$f" > /tmp/$b; chmod +x /tmp/$b; done
R=${OUT:-/tmp/out}/r; mkdir -p "$R"; cp "$H"/*.txt "$R/"
{ date -u; nvidia-smi -L; nproc; uptime; } > "$R/machine.txt" 2>&1
T() { date -u +%T >> "$R/machine.txt"; }
sum() { echo "$1 rc=$2 $(grep -E '^(ok|PASS|FAIL)$|passed.*failed|SIGSEGV' "$R/$1.log" | tail -1)" >> "$R/summary.txt"; }
st() { local name=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$R/$name.log" 2>&1; sum "$name" $?; T; }
if [ -x /tmp/cuda-before.test ]; then
	(cd cuda && st cuda-before 30 /tmp/cuda-before.test -test.v -test.run 'TestBufferOutlivesItsStream$' -test.count=1)
	(cd backends/nccl && st nccl-before 40 /tmp/nccl-before.test -test.v -test.run 'TestStashOutlivesCurrentStream$' -test.count=1)
fi
(cd cuda && st cuda-test 40 /tmp/cuda.test -test.v -test.count=1)
(cd backends/nccl && CUDA_VISIBLE_DEVICES=0 st nccl-test 70 /tmp/nccl.test -test.v -test.count=1 -test.timeout=65s)
read -r HN HP SU < "$H/flags.cfg"
if [ "$SU" = 1 ]; then
st conftest-world1 60 /tmp/conftest --backend nccl --nproc 1 --report "$R/conftest-world1"
GOCOLL_NCCL_ASYNC_ON_CURRENT_STREAM=1 GOCOLL_CONFTEST_CHILD_DIR="$R/children" st conftest-world1-curstream-env 60 /tmp/conftest --backend nccl --nproc 1 --report "$R/conftest-world1-curstream-env"
if [ -x /tmp/nccl-base.test ]; then
	for i in 1 2 3; do
		(cd backends/nccl && st issue-crossing-base-$i 40 /tmp/nccl-base.test -test.run '^$' -test.bench 'BenchmarkIssueCrossing' -test.benchtime 100000x -test.count 3)
		(cd backends/nccl && st issue-crossing-$i 40 /tmp/nccl.test -test.run '^$' -test.bench 'BenchmarkIssueCrossing' -test.benchtime 100000x -test.count 3)
	done
else
	st issue-crossing 60 /tmp/nccl.test -test.run '^$' -test.bench 'BenchmarkIssueCrossing' -test.benchtime 100000x -test.count 5 -test.cpuprofile "$R/issue-crossing.pprof"
	GOGC=off st issue-crossing-gogc-off 40 /tmp/nccl.test -test.run '^$' -test.bench 'BenchmarkIssueCrossing' -test.benchtime 100000x -test.count 3
fi
fi
if [ "$(cat "$H/hostcost.flag")" = 1 ]; then
	for i in $(seq 1 "$HN"); do
		[ -x /tmp/conftest-base ] && st hostcost-base-$i 50 /tmp/conftest-base bench hostcost --backend nccl --reps 5 --torch-runs 0 --json "$R/hostcost-base-$i.json"
		st hostcost-$i 70 /tmp/conftest bench hostcost --backend nccl --reps 5 --torch-runs 1 --json "$R/hostcost-$i.json"
	done
	[ "$HP" = 1 ] && st hostcost-prof 40 /tmp/conftest bench hostcost --backend nccl --only 'current stream' --reps 2 --ops 100000 --torch-runs 0 --cpuprofile "$R/hostcost-curstream.pprof"
fi
cat "$R/summary.txt"
for f in "$R"/*.log; do echo "== $(basename "$f"): pass $(grep -c -- '^--- PASS' "$f") fail $(grep -c -- '^--- FAIL' "$f") skip $(grep -c -- '^--- SKIP' "$f")"; done
grep -hE -- '^--- FAIL|^\s*\[FAIL\]|SIGSEGV|panic:' "$R"/*.log | head -30
grep -E -- '--- (PASS|FAIL).*(OutlivesItsStream|OutlivesCurrentStream)' "$R"/*.log
grep -hE '^Benchmark' "$R"/issue-crossing*.log | sed -E 's/[ \t]+/ /g' | cut -c1-100
for f in "$R"/hostcost-*.log; do [ -f "$f" ] && { echo "== $(basename "$f")"; grep -E '^goal|round by round|^\| (nccl raw|nccl \+|backend async|dispatcher async\+Wait|torch)' "$f"; }; done
rm -rf "$R/children"
tar -C "$R" -czf "${OUT:-/tmp/out}/nccl16b.tgz" . && rm -rf "$R"
RUN
chmod +x "$D/run.sh"
du -sh "$D"
