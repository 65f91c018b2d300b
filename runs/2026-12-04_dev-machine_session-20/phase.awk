# phase.awk: 2-rank sweeps (sweeps.sh lines) by the machine's phase in
# each half of the invocation, read from the 1 MiB row: ours is slow
# above 130 us (fast 61-108, slow 129-217), Open MPI above 400 us (fast
# 105-169, slow 575-812). Prints, per class, the sweeps and how many
# met every goal of the issue (judge.awk's).
function judge(line,   i, a, b, s, o, x, miss, n, f) {
  n = split(line, f, " ")
  miss = ""
  for (i = 2; i <= n; i++) {
    if (split(f[i], a, ":") != 2) continue
    split(a[2], b, "/"); s = a[1] + 0; o = b[1] + 0; x = b[3] + 0
    if (s == 8 && o > 2) miss = miss " 8B " o
    else if (s == 4096 && o > 5) miss = miss " 4K " o
    else if (s >= 65536 && x < 1.0) miss = miss " " s "B x" x
  }
  return miss
}
{
  for (i = 2; i <= NF; i++) { split($i, a, ":"); split(a[2], b, "/"); if (a[1] == "1048576") { o = b[1]; m = b[2] } }
  c = (o > 130 ? "ours-slow" : "ours-fast") "/" (m > 400 ? "ompi-slow" : "ompi-fast")
  n[c]++; ms = judge($0)
  if (ms == "") ok[c]++; else misses[c] = misses[c] "\n    " FILENAME " #" FNR ":" ms
}
END {
  for (c in n) printf "%-20s %3d sweeps, every goal in %3d%s\n", c, n[c], ok[c], misses[c]
}
