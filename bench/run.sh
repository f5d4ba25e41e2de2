#!/bin/sh
# run.sh -- nbgrad's forward benchmark (make bench runs: sh bench/run.sh build).
#
#   sh bench/run.sh [BUILD_DIR]
#
# 1. The library (BUILD_DIR/bench/bench-forward): each case in double and float precision: wall time (best of 3
#    after a warm-up; one run when the warm-up exceeds NBG_BENCH_LONG=5 s; the 4096^2 case 1 run), samples per
#    second (pixels x steps), peak RSS and an image checksum (the sum of the pixels).
#    Against the vector units (BUILD_DIR/bench/bench-peak): the FMA rate independent chains of the kernel's vector
#    type reach, against heavy256's forward rate times its arithmetic per sample (counted by bench/flops.sh).
# 2. The program (BUILD_DIR/nbgrad) on the same command lines, and, when NB_REF_BIN names a reference nanoBragg
#    binary, that binary too (with -nopgm -nonoise -noprogress -floatfile <tmp> -intfile /dev/null, in an empty
#    temporary directory, OMP_NUM_THREADS = the same thread count), with the ratio reference_time / nbgrad_time
#    and both checksums.
#
#    Start-up: the median of 200 runs of `nbgrad --version` and of an 8x8 image, for the program as built and for
#    the same program linked the old way (BUILD_DIR/bench/nbgrad-linked: every library loaded at every run).
# 3. Gradients and refinement (BUILD_DIR/bench/bench-grad), as ratios to the forward call.
# 4. File formats (BUILD_DIR/bench/bench-formats): bytes and write/read times of SMV, raw float, NXmx and CBF.
# 5. Many shots (bench/bench-batch.sh): shots per second of nbgrad batch on one process and on MPI ranks (200
#    shots of 256^2, and 10^4 of 32^2: NBG_BENCH_BATCH_SHOTS); and
#    (bench/bench-ensemble.sh) nbgrad ensemble on 10^3 stills (NBG_BENCH_ENSEMBLE_SHOTS) on one thread, whole detectors
#    and spot regions.
# 6. The CUDA backend (BUILD_DIR/bench/bench-cuda) where there is a GPU: kernel, copy, set-up and call times on
#    cubic4k, samples per second and the fraction of the GPU's peak (with the arithmetic per sample counted by
#    ncu when it is on the PATH) on the heavy case at 512 and 2048, gradients over the forward call, and the cold
#    start of the program.
#
# 7. The Python package (bench/bench_python.py): call overhead, the wheel's portable builds against -march=native,
#    the PyTorch adapter's forward + backward against nbgrad.grad.
#
# Threads: $NBG_THREADS, or all cores.  Environment: NB_REF_BIN, NBG_THREADS, NBG_BENCH_REPS (3), NBG_BENCH_LONG (5).
# Takes about 3 minutes on 2 cores with a reference binary (the reference's heavy-sampling case alone is ~1 min).

B=${1:-build}
START=$(pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd) || exit 2
cd "$ROOT" || exit 2
case "$B" in /*) ;; *) B="$ROOT/$B" ;; esac

BF="$B/bench/bench-forward"
NB="$B/nbgrad"
for f in "$BF" "$NB"; do
    if [ ! -x "$f" ]; then
        echo "bench: $f is missing (run make first)"
        exit 2
    fi
done

if [ -z "$NBG_THREADS" ]; then
    NBG_THREADS=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
fi
export NBG_THREADS
REPS=${NBG_BENCH_REPS:-3}

REF=""
if [ -n "$NB_REF_BIN" ]; then
    case "$NB_REF_BIN" in /*) REF=$NB_REF_BIN ;; *) REF="$START/$NB_REF_BIN" ;; esac
    if [ ! -x "$REF" ]; then
        echo "bench: NB_REF_BIN=$NB_REF_BIN is not an executable file; timing nbgrad only"
        REF=""
    fi
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/nbg-bench.XXXXXX") || { echo "bench: cannot make a temporary directory"; exit 2; }
trap 'rm -rf "$TMP"' EXIT
trap 'rm -rf "$TMP"; exit 130' INT TERM

echo "nbgrad benchmark: $(uname -m), $(getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?') cores, $NBG_THREADS threads"
echo

# --- 1. the library ------------------------------------------------------------------------------------------
"$BF" || status=1
echo
if [ -x "$B/bench/bench-peak" ]; then
    "$B/bench/bench-peak" || status=1
fi

# --- 2. the program, and the reference ------------------------------------------------------------------------
CUBIC="-cell 100 100 100 90 90 90 -default_F 100 -lambda 6.2 -N 5 -distance 100"
TRIC="-cell 70 80 90 85 95 105 -misset 10 5 3 -N 8 -lambda 1.5 -default_F 100 -distance 100"
HEAVY="-oversample 2 -mosaic 0.5 -mosaic_dom 10 -phi 0.01 -osc 0.5 -phisteps 5 -hdivrange 0.1 -vdivrange 0.1 -hdivsteps 3 -vdivsteps 3 -dispersion 0.1 -dispsteps 3"

case_args() {
    case "$1" in
        cubic1k) echo "$CUBIC -detpixels 1024" ;;
        cubic4k) echo "$CUBIC -detpixels 4096" ;;
        tric1k) echo "$TRIC -detpixels 1024" ;;
        heavy256) echo "$CUBIC $HEAVY -detpixels 256" ;;
        heavy512) echo "$CUBIC $HEAVY -detpixels 512" ;;
    esac
}
case_reps() {
    case "$1" in
        cubic4k) echo 1 ;;
        *) echo "$REPS" ;;
    esac
}

echo
echo "command line: nbgrad (CLI, double and -precision float) $( [ -n "$REF" ] && echo "vs the reference $REF" )," \
     "$NBG_THREADS threads; wall time includes start-up and writing the float image"
if [ -n "$REF" ]; then
    printf '%-9s %10s %10s %10s %9s %9s %8s %8s %18s %18s %9s\n' case nbgrad_s nbgrad_f_s ref_s ref/nbgrad \
        ref/nb_f nb_MB ref_MB nbgrad_checksum ref_checksum rel_diff
else
    printf '%-9s %10s %10s %8s %18s\n' case nbgrad_s nbgrad_f_s nb_MB nbgrad_checksum
fi
for c in cubic1k cubic4k tric1k heavy256 heavy512; do
    args=$(case_args "$c")
    reps=$(case_reps "$c")
    d="$TMP/nbgrad.$c"
    mkdir -p "$d"
    # shellcheck disable=SC2086
    set -- $("$BF" exec "$d" "$reps" -- "$NB" $args -threads "$NBG_THREADS" -precision float -floatfile "$d/img.bin")
    nbf_t=${1:-nan}
    [ $# -eq 3 ] || { echo "$c: nbgrad -precision float failed"; status=1; }
    # shellcheck disable=SC2086
    set -- $("$BF" exec "$d" "$reps" -- "$NB" $args -threads "$NBG_THREADS" -floatfile "$d/img.bin")
    if [ $# -ne 3 ]; then
        echo "$c: nbgrad failed"
        status=1
        continue
    fi
    nb_t=$1
    nb_mb=$(awk -v k="$3" 'BEGIN { printf "%.1f", k / 1024 }')
    nb_sum=$("$BF" sum "$d/img.bin")
    rm -rf "$d"
    if [ -z "$REF" ]; then
        printf '%-9s %10.3f %10.3f %8s %18s\n' "$c" "$nb_t" "$nbf_t" "$nb_mb" "$nb_sum"
        continue
    fi
    d="$TMP/ref.$c"
    mkdir -p "$d"
    # shellcheck disable=SC2086
    set -- $(OMP_NUM_THREADS=$NBG_THREADS "$BF" exec "$d" "$reps" -- "$REF" $args -nopgm -nonoise -noprogress \
        -floatfile "$d/img.bin" -intfile /dev/null)
    if [ $# -ne 3 ]; then
        echo "$c: the reference failed"
        status=1
        continue
    fi
    ref_t=$1
    ref_mb=$(awk -v k="$3" 'BEGIN { printf "%.1f", k / 1024 }')
    ref_sum=$("$BF" sum "$d/img.bin")
    rm -rf "$d"
    awk -v c="$c" -v nt="$nb_t" -v ft="$nbf_t" -v rt="$ref_t" -v nm="$nb_mb" -v rm="$ref_mb" -v ns="$nb_sum" \
        -v rs="$ref_sum" \
        'BEGIN { d = ns - rs; if (d < 0) d = -d; r = (rs != 0) ? d / (rs < 0 ? -rs : rs) : d;
                 printf "%-9s %10.3f %10.3f %10.3f %8.2fx %8.2fx %8s %8s %18s %18s %9.2e\n", c, nt, ft, rt, rt / nt,
                        rt / ft, nm, rm, ns, rs, r }'
done

# --- 2b. start-up: the program on --version and on an 8x8 image --------------------------------------------------
# (BUILD_DIR/bench/bench-startup: the median of NBG_BENCH_STARTUP_RUNS=200 runs, fork to exit) for the program as
# built (the formats plug-in and nbgrad-mpi loaded only when a run needs them) and, when make bench built it,
# BUILD_DIR/bench/nbgrad-linked: the same program linked the old way (HDF5, CBFlib, Open MPI and the numerical
# libraries as shared libraries, loaded by every run); their ratio, and the shared libraries each loads.
echo
echo "--- start-up (bench/bench-startup: median of ${NBG_BENCH_STARTUP_RUNS:-200} runs) ---"
BS="$B/bench/bench-startup"
if [ -x "$BS" ]; then
    d="$TMP/startup"
    mkdir -p "$d"
    TINY="-detpixels 8 -cell 70 80 90 90 90 90 -default_F 100 -N 5 -floatfile $d/x.bin"
    SRUNS=${NBG_BENCH_STARTUP_RUNS:-200}
    startup_ms() { # startup_ms LABEL PROGRAM ARGS...: the median in ms
        "$BS" -n "$SRUNS" "$@" > "$d/out" || { echo "?"; return; }
        cat "$d/out" >&2
        sed -n 's/.* median *\([0-9.]*\) ms.*/\1/p' "$d/out"
    }
    libs() { LD_TRACE_LOADED_OBJECTS=1 "$1" 2>/dev/null | grep -c '=>\|ld-linux'; }
    OLD="$B/bench/nbgrad-linked"
    # shellcheck disable=SC2086
    {
        nv=$(startup_ms "nbgrad --version" "$NB" --version)
        nt=$(startup_ms "nbgrad 8x8 image" "$NB" $TINY)
        if [ -x "$OLD" ]; then
            ov=$(startup_ms "nbgrad-linked --version" "$OLD" --version)
            ot=$(startup_ms "nbgrad-linked 8x8 image" "$OLD" $TINY)
        fi
        if [ -n "$REF" ]; then
            rt=$(startup_ms "reference 8x8 image" "$REF" -detpixels 8 -cell 70 80 90 90 90 90 -default_F 100 -N 5 \
                 -nopgm -nonoise -noprogress -floatfile "$d/r.bin" -intfile /dev/null)
        fi
    } 2>&1
    echo "nbgrad: $(libs "$NB") shared libraries loaded (ldd); --version ${nv} ms, 8x8 image ${nt} ms (median)"
    if [ -x "$OLD" ]; then
        echo "nbgrad-linked (everything linked as shared libraries): $(libs "$OLD") shared libraries;" \
             "--version ${ov} ms, 8x8 image ${ot} ms"
        awk -v nv="$nv" -v nt="$nt" -v ov="$ov" -v ot="$ot" 'BEGIN { if (nv > 0 && nt > 0)
            printf "start-up, linked / as built: --version %.2fx, 8x8 image %.2fx\n", ov / nv, ot / nt }'
    fi
    [ -n "$REF" ] && awk -v nt="$nt" -v rt="$rt" 'BEGIN { if (nt > 0) printf "8x8 image, reference / nbgrad: %.2fx\n", rt / nt }'
    rm -rf "$d"
else
    echo "bench-startup is not built"
fi

# --- 3. gradients and refinement, as ratios to the forward call ------------------------------------------------
echo
if [ -x "$B/bench/bench-grad" ]; then
    "$B/bench/bench-grad" || status=1
else
    echo "bench-grad is not built (GSL=0 build)"
fi
# --- 4. file formats: sizes and write/read times of a 4096^2 image against SMV ----------------------------------
echo
"$B/bench/bench-formats" "${NBG_BENCH_FORMAT_PIXELS:-4096}" || status=1
# --- 5. many shots: nbgrad batch with and without MPI ranks ------------------------------------------------------
echo
sh "$ROOT/bench/bench-batch.sh" "$B" || status=1
# and at scale: 10^4 small shots (32x32 pixels), where the per-shot overheads (shot list, plan, file) show
echo
sh "$ROOT/bench/bench-batch.sh" "$B" "${NBG_BENCH_BATCH_SHOTS:-10000}" 32 || status=1
# --- 5b. many stills refined together: nbgrad ensemble on 10^3 stills, whole detectors and spot regions -------------
echo
sh "$ROOT/bench/bench-ensemble.sh" "$B" "${NBG_BENCH_ENSEMBLE_SHOTS:-1000}" 96 1 || status=1
# --- 6. the CUDA backend ------------------------------------------------------------------------------------------
echo
BC="$B/bench/bench-cuda"
if [ ! -x "$BC" ]; then
    echo "bench-cuda is not built"
elif ! "$BC" one cubic256 float >/dev/null 2>&1; then
    "$BC"
else
    # the arithmetic per sample of the heavy case's forward kernel, counted by Nsight Compute where it is present:
    # floating-point instructions (a fused multiply-add counted as 2) over the 512x512x3000 samples of heavy512
    if command -v ncu >/dev/null 2>&1; then
        for prec in float double; do
            case $prec in float) p=f ;; *) p=d ;; esac
            m="smsp__sass_thread_inst_executed_op_${p}add_pred_on.sum,smsp__sass_thread_inst_executed_op_${p}mul_pred_on.sum,smsp__sass_thread_inst_executed_op_${p}fma_pred_on.sum"
            fl=$(ncu --csv --metrics "$m" --kernel-name regex:nbgi_forward_kernel --launch-count 1 \
                   "$BC" one heavy512 "$prec" 2>/dev/null |
                 awk -F'","' -v s=$((512 * 512 * 3000)) '
                     /op_.(add|mul|fma)_pred_on/ { v = $NF; gsub(/[",]/, "", v); n += (($0 ~ /fma_pred/) ? 2 : 1) * v; ok = 1 }
                     END { if (ok) printf "%.0f", n / s }')
            if [ -n "$fl" ] && [ "$fl" != 0 ]; then
                echo "ncu: $fl floating-point operations per sample in the $prec forward kernel (heavy512)"
                case $prec in
                    float) NBG_FLOPS_PER_SAMPLE_FLOAT=$fl; export NBG_FLOPS_PER_SAMPLE_FLOAT ;;
                    *) NBG_FLOPS_PER_SAMPLE_DOUBLE=$fl; export NBG_FLOPS_PER_SAMPLE_DOUBLE ;;
                esac
            fi
        done
    fi
    "$BC" || status=1
    # cold start: process start to the first image written, with the CUDA context created on the way
    d="$TMP/cold"
    mkdir -p "$d"
    for c in cubic1k cubic4k; do
        # shellcheck disable=SC2086
        set -- $("$BF" exec "$d" 1 -- "$NB" $(case_args "$c") -device cuda -precision float -floatfile "$d/img.bin")
        [ $# -eq 3 ] && echo "cold start, nbgrad -device cuda -precision float, $c: $1 s (process start to the float image written)"
    done
    rm -rf "$d"
fi

# --- 7. the Python package ------------------------------------------------------------------------------------
# (bench/bench_python.py) nbgrad.simulate's overhead over the library call, the wheel's two builds of the library
# (baseline x86-64, x86-64-v3) against -march=native, and the PyTorch adapter's forward + backward over nbgrad.grad
# (where torch is importable); built into BUILD_DIR/py/lib as make test-python builds it.
PY=${PYTHON:-python3}
echo
echo "--- the Python package (bench/bench_python.py) ---"
if (cd python && NBGRAD_BUILD="$B/py" $PY setup.py -q build_py -d "$B/py/lib" build_ext -b "$B/py/lib" \
        -t "$B/py/tmp") >"$TMP/pybuild.log" 2>&1; then
    PYTHONPATH="$B/py/lib" $PY bench/bench_python.py --runs 5 --threads "$NBG_THREADS" || status=1
else
    echo "bench: the Python package did not build (python/setup.py), skipped:"
    tail -n 5 "$TMP/pybuild.log"
fi
exit ${status:-0}
