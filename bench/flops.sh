#!/bin/sh
# flops.sh -- the forward kernel's arithmetic per sample, counted (bench-peak's FLOPS_PER_SAMPLE, VOPS_PER_SAMPLE),
# and the gradient's (double, every parameter: what bench-grad's gradient / forward ratio divides).
#
#   sh bench/flops.sh [WORK_DIR]
#
# Builds an AVX2 copy of the library and bench-flops (valgrind does not run AVX-512 code; the arithmetic per sample is
# the same operations, half as wide) into WORK_DIR (a temporary folder, removed after; outside build/, whose
# dependency files make reads), runs heavy256's forward on 16 rows under valgrind's
# callgrind with per-instruction counts (about a minute per precision), and adds up the floating-point instructions
# executed (bench/flops.py: objdump's mnemonics; an FMA 2 per lane, add, subtract, multiply, divide, square root 1).
# Needs valgrind (Debian: apt-get install valgrind) and objdump.
ROOT=$(cd "$(dirname "$0")/.." && pwd) || exit 2
cd "$ROOT" || exit 2
if [ -n "$1" ]; then
    W=$1
else
    W=$(mktemp -d "${TMPDIR:-/tmp}/nbgrad-flops.XXXXXX") || exit 2
    trap 'rm -rf "$W"' EXIT
fi
for t in valgrind objdump python3; do
    command -v $t >/dev/null 2>&1 || { echo "flops.sh: $t is missing"; exit 2; }
done
make -s -j"$(nproc)" B="$W" OPT="-O3 -march=x86-64-v3" "$W/bench/bench-flops" || exit 1
for p in d f g; do
    n=$("$W/bench/bench-flops" $p) || exit 1
    OMP_NUM_THREADS=1 valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$W/callgrind-$p.out" \
        "$W/bench/bench-flops" $p >/dev/null 2>&1 || exit 1
    echo "$p (d, f: forward in double, float; g: gradient in double): $n samples"
    python3 bench/flops.py "$W/callgrind-$p.out" "$W/bench/bench-flops" "$n"
done
