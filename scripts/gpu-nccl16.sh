#!/usr/bin/env bash
# Builds .gpu/nccl16/ (or $D): conftest and the nccl test binary (gzip'd),
# conftest-before (the same bench at BEFORE, default main) and run.sh,
# issue 16 item 3's proof on nvidia-h200 in one device call (`run` with
# carry [".gpu/nccl16"], command `bash .gpu/nccl16/run.sh`):
#   - SUITES=1 (default): the nccl package's tests (`nccl.test -test.v`),
#     the same built with -race (RACE=1, default), and `conftest --backend
#     nccl --nproc 1`;
#   - HOSTCOST_N=3 (default): `conftest bench hostcost --backend nccl
#     --reps 5`, before and after taking turns, N times (torch 2.11 beside
#     the second after, TORCH=1);
#   - PROF=1 (default): a CPU profile of the after binary's current-stream
#     modes (PROF_HZ=2000 samples a second, PROF_OPS=400000 calls per mode;
#     each sample labelled with its mode: pprof -tagfocus mode=NAME);
#   - ABLATE=0 (default; 1 runs it first): BenchmarkIssueCrossing, the
#     current-stream op split into the C loop, the cgo crossing, rotating
#     end events and the backend, ABLATE_N=3 rounds of ABLATE_OPS=100000;
#   - QUICK='' (default): a -test.run pattern of nccl tests to run first
#     (for a call that leaves SUITES=0).
# Everything comes back as one tarball, nccl16.tgz. The device gets the
# session's checkout (main), not a worktree: build into main's ignored
# .gpu/ (D=/work/main/.gpu/nccl16 scripts/gpu-nccl16.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
D=${D:-.gpu/nccl16}
rm -rf "$D"
mkdir -p "$D"
D=$(cd "$D" && pwd)
export CGO_ENABLED=1
go build -trimpath -ldflags='-s -w' -o "$D/conftest" ./cmd/conftest
go test -c -trimpath -ldflags='-s -w' -o "$D/nccl.test" ./backends/nccl
if [ "${RACE:-1}" = 1 ]; then
	go test -c -race -trimpath -o "$D/nccl-race.test" ./backends/nccl 2>/dev/null
	gzip -9 "$D/nccl-race.test"
fi
B=$(mktemp -d)
git worktree add -q --detach "$B" "${BEFORE:-main}"
(cd "$B" && go build -trimpath -ldflags='-s -w' -o "$D/conftest-before" ./cmd/conftest)
git worktree remove --force "$B"
git rev-parse "${BEFORE:-main}" > "$D/before.txt"
{ git rev-parse HEAD; git status --short; } > "$D/after.txt"
gzip -9 "$D/conftest" "$D/conftest-before" "$D/nccl.test"
cat > "$D/run.sh" <<RUN
#!/usr/bin/env bash
SUITES=${SUITES:-1} HOSTCOST_N=${HOSTCOST_N:-3} PROF=${PROF:-1} TORCH=${TORCH:-1} RACE=${RACE:-1}
PROF_HZ=${PROF_HZ:-2000} PROF_OPS=${PROF_OPS:-400000} ABLATE=${ABLATE:-0} ABLATE_N=${ABLATE_N:-3} ABLATE_OPS=${ABLATE_OPS:-100000} QUICK='${QUICK:-}'
RUN
cat >> "$D/run.sh" <<'RUN'
export NCCL_NVLS_ENABLE=0
H=$(cd "$(dirname "$0")" && pwd)
cd "$H/../.."
for f in conftest conftest-before nccl.test nccl-race.test; do [ -f "$H/$f.gz" ] && gunzip -c "$H/$f.gz" > /tmp/$f && chmod +x /tmp/$f; done
R=${OUT:-/tmp/out}/r; mkdir -p "$R"
cp "$H"/*.txt "$R/"
{ date -u; nvidia-smi -L; nproc; uptime; ls -l /usr/lib/x86_64-linux-gnu/libnccl.so*; } > "$R/machine.txt" 2>&1
sum() { echo "$1 rc=$2 $(grep -E '^(ok|PASS|FAIL)$|passed.*failed' "$R/$1.log" | tail -1) $(date -u +%T)" >> "$R/summary.txt"; }
if [ -n "$QUICK" ]; then
	(cd backends/nccl && CUDA_VISIBLE_DEVICES=0 timeout 60 /tmp/nccl.test -test.v -test.count=1 -test.run "$QUICK" -test.timeout=55s > "$R/nccl-quick.log" 2>&1; echo $? > "$R/.rc"); sum nccl-quick "$(cat "$R/.rc")"
fi
if [ "$ABLATE" = 1 ]; then
	(cd backends/nccl && CUDA_VISIBLE_DEVICES=0 timeout 120 /tmp/nccl.test -test.run '^$' -test.bench IssueCrossing -test.benchtime "${ABLATE_OPS}x" -test.count "$ABLATE_N" > "$R/issue-crossing.log" 2>&1; echo $? > "$R/.rc"); sum issue-crossing "$(cat "$R/.rc")"
fi
if [ "$SUITES" = 1 ]; then
	(cd backends/nccl && CUDA_VISIBLE_DEVICES=0 timeout 90 /tmp/nccl.test -test.v -test.count=1 -test.timeout=85s > "$R/nccl-world1.log" 2>&1; echo $? > "$R/.rc"); sum nccl-world1 "$(cat "$R/.rc")"
	echo "nccl.test: pass $(grep -c -- '^--- PASS' "$R/nccl-world1.log") fail $(grep -c -- '^--- FAIL' "$R/nccl-world1.log") skip $(grep -c -- '^--- SKIP' "$R/nccl-world1.log")" >> "$R/summary.txt"
	if [ "$RACE" = 1 ]; then
		(cd backends/nccl && CUDA_VISIBLE_DEVICES=0 timeout 150 /tmp/nccl-race.test -test.v -test.count=1 -test.timeout=145s > "$R/nccl-race-world1.log" 2>&1; echo $? > "$R/.rc"); sum nccl-race-world1 "$(cat "$R/.rc")"
		echo "nccl-race.test: pass $(grep -c -- '^--- PASS' "$R/nccl-race-world1.log") fail $(grep -c -- '^--- FAIL' "$R/nccl-race-world1.log") skip $(grep -c -- '^--- SKIP' "$R/nccl-race-world1.log") races $(grep -c 'WARNING: DATA RACE' "$R/nccl-race-world1.log")" >> "$R/summary.txt"
	fi
	timeout 120 /tmp/conftest --backend nccl --nproc 1 --report "$R/conftest-world1" > "$R/conftest-world1.log" 2>&1; sum conftest-world1 $?
fi
for i in $(seq 1 "$HOSTCOST_N"); do
	tr=0; [ "$TORCH" = 1 ] && [ $i = 2 ] && tr=1
	timeout 60 /tmp/conftest-before bench hostcost --backend nccl --reps 5 --torch-runs 0 --json "$R/hostcost-before-$i.json" > "$R/hostcost-before-$i.log" 2>&1; sum hostcost-before-$i $?
	timeout 90 /tmp/conftest bench hostcost --backend nccl --reps 5 --torch-runs $tr --json "$R/hostcost-after-$i.json" > "$R/hostcost-after-$i.log" 2>&1; sum hostcost-after-$i $?
done
if [ "$PROF" = 1 ]; then
	timeout 60 /tmp/conftest bench hostcost --backend nccl --only 'current stream' --reps 1 --ops "$PROF_OPS" --torch-runs 0 --cpuprofile "$R/curstream-after.pprof" --cpuprofile-hz "$PROF_HZ" > "$R/curstream-after-prof.log" 2>&1; sum curstream-after-prof $?
fi
cat "$R/summary.txt"
grep -hE -- '--- FAIL|^\s*\[FAIL\]|panic:|SIGSEGV|DATA RACE' "$R"/nccl-world1.log "$R"/nccl-race-world1.log "$R"/conftest-world1.log 2>/dev/null | head -20
for i in $(seq 1 "$HOSTCOST_N"); do for v in before after; do f=$v-$i; echo "== $f"; grep -E '^goal|round by round|^  the Go|^\| (nccl raw|nccl \+|backend async|dispatcher async\+Wait)' "$R/hostcost-$f.log"; done; done
grep -hE '^\| torch' "$R"/hostcost-after-*.log
[ "$ABLATE" = 1 ] && grep -E '^Benchmark' "$R/issue-crossing.log"
rm -f "$R/.rc"
tar -C "$R" -czf "${OUT:-/tmp/out}/nccl16.tgz" . && rm -rf "$R"
RUN
chmod +x "$D/run.sh"
du -sh "$D"
