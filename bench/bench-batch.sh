#!/bin/sh
# bench-batch.sh -- shots per second of `nbgrad batch`: one process with all cores' threads, and MPI ranks of one
# thread each (1 and 2 ranks; more where the machine has the cores), on the same shot list, in one run.
#
#   sh bench/bench-batch.sh BUILD_DIR [SHOTS] [PIXELS]
#
# The shots: SHOTS (default 200) random orientations of a triclinic cell (nbgrad shots), each a PIXELS^2 (default
# 256) detector with Poisson noise, written as SMV.  Prints a table of shots/s and the ratio to the 1-process run.
B=${1:-build}
N=${2:-200}
P=${3:-256}
NB="$B/nbgrad"
[ -x "$NB" ] || { echo "bench-batch: $NB is missing"; exit 2; }
# The shots' files go to a memory file system (/dev/shm) where there is one: on a disk, creating 10^4 small files
# costs 0.4-4 s of system time depending on the file system's state (measured on ext4, the same run varying 10x
# from one minute to the next), which would measure the disk, not nbgrad.  NBG_BENCH_DIR overrides.
DIR=${NBG_BENCH_DIR:-/dev/shm}
[ -d "$DIR" ] && [ -w "$DIR" ] || DIR=${TMPDIR:-/tmp}
TMP=$(mktemp -d "$DIR/nbg-bench-batch.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT
NB=$(cd "$(dirname "$NB")" && pwd)/$(basename "$NB")
cd "$TMP" || exit 2
"$NB" shots -n "$N" -seed 1 -o shots.jsonl > /dev/null || exit 1
BASE="-cell 70 80 90 85 95 105 -N 8 -default_F 100 -lambda 1 -detpixels $P -pixel 0.2 -distance 120 -oversample 1"
cores=$(nproc 2>/dev/null || echo 1)
rate() { sed -n 's/.*(\([0-9.e+]*\) shots\/s.*/\1/p' "$1" | tail -n 1; }
run() { # NAME RANKS THREADS
    rm -rf out && mkdir out
    if [ "$2" = 0 ]; then
        OMP_NUM_THREADS=$3 "$NB" batch $BASE -shots shots.jsonl -noisefile 'out/{id}.img' -seed 1 > log.txt 2>&1
    else
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=$3 mpirun -n "$2" --oversubscribe \
            --bind-to none "$NB" batch $BASE -shots shots.jsonl -noisefile 'out/{id}.img' -seed 1 > log.txt 2>&1
    fi || { echo "| $1 | failed: $(tail -n 1 log.txt) |"; return; }
    r=$(rate log.txt)
    [ -z "$base" ] && base=$r
    awk -v n="$1" -v r="$r" -v b="$base" 'BEGIN { printf "| %s | %.1f | %.2f |\n", n, r, r / b }'
}
echo "nbgrad batch: $N shots of ${P}x$P pixels ($cores cores; files in $DIR, $(stat -f -c %T "$DIR"))"
echo "| run | shots/s | ratio |"
echo "|---|---|---|"
base=""
run "1 process, $cores threads" 0 "$cores"
if command -v mpirun > /dev/null 2>&1; then
    run "mpirun -n 1, 1 thread" 1 1
    run "mpirun -n 2, 1 thread each" 2 1
    if [ "$cores" -ge 4 ]; then
        run "mpirun -n $cores, 1 thread each" "$cores" 1
    fi
else
    echo "| mpirun | not installed |"
fi
