#!/bin/bash
# usage: pfcount.sh BIN  -- faults whose callchain has main.measure, by leaf
perf record -q -e page-faults -c 1 -g -o /tmp/pf-$$.data -- "$1" bench --backend cpupool --nproc 2 --peers none -n ${N:-2000} --sizes ${SIZES:-8} --tune "--depth 1 ${TUNE:-}" 2>&1 | grep -E '^ +[0-9]+ +[0-9]+ +float' | awk '{printf "%s:%s ", $1, $10}'; echo
perf script -i /tmp/pf-$$.data -F comm,pid,ip,sym 2>/dev/null | awk '
/^ct/ {if (inrec) flush(); inrec=1; leaf=""; chain=""; next}
NF>=2 { if (leaf=="") leaf=$2; chain=chain" "$2 }
function flush() { if (chain ~ /main.measure/) { n++; c[leaf]++; if (chain ~ /FlightRecorder/) fr++; if (chain ~ /deferLane|works/) wl++ } else other++ }
END { flush(); print "faults in measure:", n, "flightrec:", fr, "deferLane:", wl, "outside measure:", other; for (k in c) print "   ", c[k], k }' | sort -k1,1 -rn | head -12
rm -f /tmp/pf-$$.data
