#!/usr/bin/env bash
# Session 15, H200 host: cpupool allreduce against Open MPI, 2 and 4 ranks,
# base (0a3f3d0, session 13's end), 0f5dca2 (first chooser), cur (HEAD) with
# the lane copies auto / cached / streamed, and cur with LaneBytes 2 MiB.
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd); BIN=/tmp/b; mkdir -p $BIN
for x in cur 0a3f3d0 0f5dca2; do xz -dc "$b/ct-$x.xz" > $BIN/ct-$x; chmod +x $BIN/ct-$x; done
{ date -u; nproc; lscpu | grep -E "Model name|L3"; cat /proc/loadavg; } > "$R/machine.txt"
S=8,4K,64K,256K,1M,4M,16M,64M
one() { # label bin np tune
	f=$R/$1-np$3-r$r
	timeout 120 $BIN/ct-$2 bench --backend cpupool --nproc $3 --peers openmpi -n 0 --sizes $S --tune "--depth 1 $4" --json $f.json > $f.txt 2>&1
	echo "== $1 np$3 r$r $(cat /proc/loadavg | cut -d' ' -f1)" >> $R/summary.txt
	grep -E '^ +[0-9]+ +[0-9]+ +float' $f.txt | awk '{printf "%10s %10s %s\n", $1, $10, $17}' >> $R/summary.txt
}
for r in 1 2; do
	one base 0a3f3d0 2 ""; one auto cur 2 ""; one cached cur 2 "--lanecopies cached"; one streamed cur 2 "--lanecopies streamed"
	one lane2m cur 2 "--lane 2097152"; one first 0f5dca2 2 ""
	one base 0a3f3d0 4 ""; one auto cur 4 ""; one cached cur 4 "--lanecopies cached"; one streamed cur 4 "--lanecopies streamed"
done
cat $R/machine.txt
tar -C "$R" -czf "$OUT/s15a.tgz" .
