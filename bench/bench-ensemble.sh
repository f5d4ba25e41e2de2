#!/bin/sh
# bench-ensemble.sh -- nbgrad ensemble at scale: SHOTS stills refined together (F by EM, 3 angles a shot), on the
# whole detectors and on spot regions (-spots 3), one process with THREADS threads.
#
#   sh bench/bench-ensemble.sh BUILD_DIR [SHOTS] [PIXELS] [THREADS]
#
# The data: SHOTS (default 1000) random orientations of a 100 A cubic cell, N 5, an F table over h, k, l in -3..3
# (343 entries, uniform in 50..150), Poisson noise; the start: every F 15 % off (rms), every misset 0.2 deg off.
# Prints wall time and shots per second per thread of one cycle (local fits and the global step), how the global step
# ended, the adjoint passes over all shots, the run's own account of its time in units of its first pass (one adjoint
# pass over the shots: the evaluation-cost ratio of the global step's passes to it, and the whole run in passes), and
# F's rms error against the truth over the entries fitted.
B=${1:-build}
N=${2:-1000}
P=${3:-96}
T=${4:-$(nproc 2>/dev/null || echo 1)}
NB="$B/nbgrad"
[ -x "$NB" ] || { echo "bench-ensemble: $NB is missing"; exit 2; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/nbg-bench-ensemble.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT
NB=$(cd "$(dirname "$NB")" && pwd)/$(basename "$NB")
cd "$TMP" || exit 2
BASE="-cell 100 100 100 90 90 90 -N 5 -lambda 1 -detpixels $P -pixel 0.1 -distance 100 -oversample 1"
"$NB" shots -n "$N" -seed 9 -o shots.jsonl > /dev/null || exit 1
awk 'BEGIN { srand(12345); for (h = -3; h <= 3; ++h) for (k = -3; k <= 3; ++k) for (l = -3; l <= 3; ++l) {
         F = 50 + 100 * rand(); u = rand(); v = rand(); g = sqrt(-2 * log(1 - u)) * cos(6.283185307 * v);
         printf "%d %d %d %.6f\n", h, k, l, F > "truth.hkl"; printf "%d %d %d %.6f\n", h, k, l, F * (1 + 0.15 * g) > "start.hkl" } }'
# the start: each misset 0.2 deg (rms) off
awk 'BEGIN { srand(777) } {
         if (match($0, /"misset": *\[[^]]*\]/)) {
             s = substr($0, RSTART, RLENGTH); sub(/"misset": *\[/, "", s); sub(/\]/, "", s); split(s, m, ",");
             for (i = 1; i <= 3; ++i) { u = rand(); v = rand(); m[i] += 0.2 * sqrt(-2 * log(1 - u)) * cos(6.283185307 * v) }
             $0 = substr($0, 1, RSTART - 1) sprintf("\"misset\": [%.9f, %.9f, %.9f]", m[1], m[2], m[3]) substr($0, RSTART + RLENGTH)
         }
         print }' shots.jsonl > start.jsonl
mkdir obs
t0=$(date +%s.%N)
OMP_NUM_THREADS=$T "$NB" batch $BASE -hkl truth.hkl -nodump -shots shots.jsonl -noisefile 'obs/{id}.img' -seed 5 \
    > batch.txt 2>&1 || { echo "bench-ensemble: batch failed: $(tail -n 1 batch.txt)"; exit 1; }
t1=$(date +%s.%N)
echo "nbgrad ensemble: $N stills of ${P}x$P pixels, 343 F, rotx,roty,rotz a shot, 1 cycle, $T thread(s)"
echo "batch (the data): $(awk -v a="$t0" -v b="$t1" -v n="$N" 'BEGIN { printf "%.1f s, %.0f shots/s", b - a, n / (b - a) }')"
echo "| run | wall s | shots/s per thread | global step | passes (all shots) | one adjoint pass s | global s a pass / first pass | whole run in passes | F rms error (entries fitted) |"
echo "|---|---|---|---|---|---|---|---|---|"
for sp in "" "-spots 3"; do
    s0=$(date +%s.%N)
    OMP_NUM_THREADS=$T "$NB" ensemble $BASE -hkl start.hkl -nodump -shots start.jsonl -observed 'obs/{id}.img' \
        -global F -local rotx,roty,rotz -cycles 1 $sp -hklout out.hkl > ens.txt 2> err.txt ||
        { echo "| ${sp:-whole} | failed: $(tail -n 1 err.txt) |"; continue; }
    s1=$(date +%s.%N)
    step=$(sed -n 's/.*cycle 1: loss [^ ]* (\([0-9]* [A-Z]* iterations\), \([^;]*\);.*/\1, \2/p' err.txt | tail -n 1)
    passes=$(sed -n 's/.*; \([0-9]*\) evaluations so far.*/\1/p' err.txt | tail -n 1)
    # the run's own account, in units of its first pass (one adjoint pass over the shots: loss and dL/dF)
    unit=$(sed -n 's/.*one adjoint pass over its shots \([0-9.e+-]*\) s;.*/\1/p' err.txt | tail -n 1)
    ratio=$(sed -n 's/.* passes (\([0-9.na]*\) of the first pass each).*/\1/p' err.txt | tail -n 1)
    whole=$(sed -n 's/.*; whole \([0-9.na]*\) passes.*/\1/p' err.txt | tail -n 1)
    err=$(awk 'FNR == NR { t[$1 " " $2 " " $3] = $4; next } { d = ($4 - t[$1 " " $2 " " $3]) / t[$1 " " $2 " " $3];
               s += d * d; n++ } END { if (n) printf "%.2f %% (%d)", 100 * sqrt(s / n), n }' truth.hkl out.hkl)
    awk -v r="${sp:-whole detectors}" -v a="$s0" -v b="$s1" -v n="$N" -v t="$T" -v st="$step" -v p="$passes" \
        -v e="$err" -v u="$unit" -v q="$ratio" -v h="$whole" \
        'BEGIN { w = b - a; printf "| %s | %.1f | %.1f | %s | %s | %s | %s | %s | %s |\n", r, w, n / w / t, st, p, u, q, h, e }'
done
