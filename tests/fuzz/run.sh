#!/bin/sh
# run.sh -- runs the libFuzzer harnesses built by `make fuzz-build` (used by `make fuzz` and `make fuzz-ci`).
#
#   sh tests/fuzz/run.sh fuzz FUZZ_DIR SECONDS "LIBFUZZER_OPTS" TARGET...
#   sh tests/fuzz/run.sh ci   FUZZ_DIR SECONDS "LIBFUZZER_OPTS" TARGET...
#
# fuzz: each harness FUZZ_DIR/fuzz-TARGET fuzzes for SECONDS in fork mode, going on past crashes, leaks,
#       out-of-memory and timeouts, on the working corpus FUZZ_DIR/corpus/TARGET (kept between runs; new inputs
#       go there) with tests/fuzz/corpus/TARGET and tests/fuzz/regress/TARGET read as extra seeds.
# ci:   first every file of tests/fuzz/corpus/TARGET and tests/fuzz/regress/TARGET is run once (a plain regression
#       run), then each harness fuzzes for SECONDS from a fresh FUZZ_DIR/ci-corpus/TARGET seeded by those two
#       folders, stopping at the first finding.
#
# ci runs $FUZZ_JOBS harnesses at once (default 2; libFuzzer runs on one core; tests/lanes.sh), each lane taking the
# next target not yet taken; each target's lines are shown in the order of the targets at the end.
#
# The committed folders under tests/fuzz/ are only read.  A finding's input is saved as
# FUZZ_DIR/findings/TARGET/{crash,leak,oom,timeout,slow-unit}-<sha1>; the libFuzzer output is kept in
# FUZZ_DIR/logs/.  tests/fuzz/TARGET.dict, when present, is passed as a dictionary.  One line per run:
#
#   PASS|FAIL fuzz-TARGET <what> execs=N time=Ts [findings=K ...]
#
# and last "N passed, M failed".  The exit status is 0 only when nothing failed.

mode=$1
FZ=$2
secs=$3
opts=$4
shift 4
if [ -z "$mode" ] || [ -z "$FZ" ] || [ -z "$secs" ] || [ $# -eq 0 ]; then
    echo "usage: sh tests/fuzz/run.sh fuzz|ci FUZZ_DIR SECONDS \"LIBFUZZER_OPTS\" TARGET..." >&2
    exit 2
fi
case "$mode" in
    fuzz | ci) ;;
    *) echo "run.sh: unknown mode '$mode' (fuzz or ci)" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "$0")/../.." && pwd) || exit 2
cd "$ROOT" || exit 2
. "$ROOT/tests/lanes.sh"
case "$FZ" in
    /*) ;;
    *) FZ=$ROOT/$FZ ;;
esac
mkdir -p "$FZ/logs" || exit 2
# UBSan prints no stack unless asked
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
export UBSAN_OPTIONS

passed=0
failed=0

# the number of files in a folder (none when it does not exist)
count_files() {
    if [ -d "$1" ]; then
        find "$1" -maxdepth 1 -type f | wc -l | tr -d ' '
    else
        echo 0
    fi
}

# the committed inputs of a target, one path a line (dot files such as .gitkeep left out)
committed_inputs() {
    for d in "tests/fuzz/corpus/$1" "tests/fuzz/regress/$1"; do
        [ -d "$d" ] && find "$d" -maxdepth 1 -type f ! -name '.*' | LC_ALL=C sort
    done
}

# execs from a libFuzzer log: the final stats line, else the last "#N" status line
execs_of() {
    n=$(sed -n 's/^stat::number_of_executed_units: *\([0-9][0-9]*\).*/\1/p' "$1" | tail -n 1)
    if [ -z "$n" ]; then
        n=$(sed -n 's/^#\([0-9][0-9]*\).*/\1/p' "$1" | tail -n 1)
    fi
    echo "${n:-0}"
}

# the first sanitizer or libFuzzer error line of a log
first_error() {
    grep -m 1 -E '^(==[0-9a-z]+== ?ERROR|SUMMARY: |.*runtime error:|==[0-9]+==.*(ERROR|WARNING): libFuzzer)' "$1" |
        cut -c 1-200
}

# report T WHAT RC LOG FINDINGS_BEFORE SECONDS
report() {
    t=$1 what=$2 rc=$3 log=$4 before=$5 took=$6
    fdir=$FZ/findings/$t
    after=$(count_files "$fdir")
    new=$((after - before))
    execs=$(execs_of "$log")
    if [ "$rc" -eq 0 ] && [ "$new" -eq 0 ]; then
        echo "PASS fuzz-$t $what execs=$execs time=${took}s"
    else
        # the input libFuzzer saved (a plain run says where), else the newest file of the findings folder
        latest=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        latest=${latest##*/}
        if [ -z "$latest" ]; then
            # shellcheck disable=SC2012 # artifact names are libFuzzer's kind-sha1
            latest=$(ls -t "$fdir" 2>/dev/null | head -n 1)
        fi
        echo "FAIL fuzz-$t $what execs=$execs time=${took}s exit=$rc findings=$new${latest:+ latest=${fdir#"$ROOT"/}/$latest}"
        err=$(first_error "$log")
        if [ -z "$err" ] && [ -n "$latest" ]; then
            # fork mode keeps the children's output to itself: rerun the latest finding for its message
            # shellcheck disable=SC2086
            "$FZ/fuzz-$t" $opts "$fdir/$latest" > "$log.latest" 2>&1
            err=$(first_error "$log.latest")
        fi
        [ -n "$err" ] && echo "    $err"
        echo "    log: ${log#"$ROOT"/}"
    fi
}

# one_target T: the runs of one harness, their PASS/FAIL lines on standard output
one_target() {
    t=$1
    bin=$FZ/fuzz-$t
    if [ ! -x "$bin" ]; then
        echo "FAIL fuzz-$t no harness $bin (make fuzz-build)"
        return
    fi
    fdir=$FZ/findings/$t
    mkdir -p "$fdir"
    dict=""
    [ -f "tests/fuzz/$t.dict" ] && dict="-dict=tests/fuzz/$t.dict"
    seeds=""
    for d in "tests/fuzz/corpus/$t" "tests/fuzz/regress/$t"; do
        [ -d "$d" ] && seeds="$seeds $d"
    done

    if [ "$mode" = ci ]; then
        # (a) the committed inputs, each once
        log=$FZ/logs/$t-regress.log
        before=$(count_files "$fdir")
        n=$(committed_inputs "$t" | wc -l | tr -d ' ')
        t0=$(date +%s)
        if [ "$n" -gt 0 ]; then
            # shellcheck disable=SC2046,SC2086 # options and committed file names have no spaces
            "$bin" $opts -artifact_prefix="$fdir/" $(committed_inputs "$t") > "$log" 2>&1
            rc=$?
        else
            echo "no committed inputs" > "$log"
            rc=0
        fi
        took=$(($(date +%s) - t0))
        # a plain run executes each file once: say so rather than parse "Executed" lines
        if [ "$rc" -eq 0 ]; then
            echo "stat::number_of_executed_units: $n" >> "$log"
        fi
        report "$t" "regress inputs=$n" "$rc" "$log" "$before" "$took"

        # (b) fuzzing from a fresh copy of the committed inputs
        work=$FZ/ci-corpus/$t
        rm -rf "$work"
        mkdir -p "$work"
        log=$FZ/logs/$t-ci.log
        before=$(count_files "$fdir")
        t0=$(date +%s)
        # shellcheck disable=SC2086
        "$bin" $opts $dict -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$fdir/" \
            "$work" $seeds > "$log" 2>&1
        rc=$?
        took=$(($(date +%s) - t0))
        report "$t" "fuzz" "$rc" "$log" "$before" "$took"
    else
        work=$FZ/corpus/$t
        mkdir -p "$work"
        log=$FZ/logs/$t-fuzz.log
        before=$(count_files "$fdir")
        t0=$(date +%s)
        # fork mode with one job: a finding is saved and fuzzing goes on
        # shellcheck disable=SC2086
        "$bin" $opts $dict -max_total_time="$secs" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
            -print_final_stats=1 -artifact_prefix="$fdir/" "$work" $seeds > "$log" 2>&1
        rc=$?
        took=$(($(date +%s) - t0))
        report "$t" "fuzz corpus=$(count_files "$work")" "$rc" "$log" "$before" "$took"
    fi
}

JOBS=1
if [ "$mode" = ci ]; then
    JOBS=${FUZZ_JOBS:-2}
    case "$JOBS" in '' | *[!0-9]* | 0) JOBS=1 ;; esac
fi
for t in "$@"; do
    rm -f "$FZ/logs/$t-report.txt"
done
# report_target T: one_target's lines into FZ/logs/T-report.txt (also shown as they come when one at a time)
report_target() {
    if [ "$JOBS" -eq 1 ]; then
        one_target "$1" | tee "$FZ/logs/$1-report.txt"
    else
        one_target "$1" > "$FZ/logs/$1-report.txt"
    fi
}
claims=$FZ/logs/.claims
rm -rf "$claims"
run_lanes "$JOBS" "$claims" report_target "$@"
rm -rf "$claims"

# the totals from the lines each target printed
for t in "$@"; do
    f=$FZ/logs/$t-report.txt
    if [ ! -f "$f" ]; then
        echo "FAIL fuzz-$t did not run"
        failed=$((failed + 1))
        continue
    fi
    [ "$JOBS" -eq 1 ] || cat "$f"
    passed=$((passed + $(grep -c '^PASS fuzz-' "$f")))
    failed=$((failed + $(grep -c '^FAIL fuzz-' "$f")))
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
