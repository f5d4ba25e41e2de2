#!/bin/sh
# run-all.sh -- runs every test program and totals their results.
#
#   sh tests/run-all.sh [BUILD_DIR]      (make test runs it as: sh tests/run-all.sh build)
#
# Runs each BUILD_DIR/tests/test-* program from the repository root and reads its last "N passed, M failed[, K
# skipped]" line.  A program that exits non-zero, dies of a signal, or prints no such line counts as a failure,
# reported by name.  The last line is the total, "N passed, M failed" (", K skipped" when any); the exit status is
# 0 only when nothing failed.
#
# $NBG_TEST_JOBS programs (default 2) run at once (tests/lanes.sh), each lane taking the next program not yet taken,
# test-golden first (the longest) and the others in name order; a program's output is shown whole when it
# ends (one lane at a time), so that what each printed stays together.  NBG_TEST_JOBS=1 runs them one after
# another, test-golden last, each shown as it comes.  The totals do not depend on the order.

B=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd) || exit 2
cd "$ROOT" || exit 2
# the program the CLI tests run: this build's, unless the caller names one
if [ -z "${NBG_BIN:-}" ] && [ -x "$B/nbgrad" ]; then
    case "$B" in /*) NBG_BIN=$B/nbgrad ;; *) NBG_BIN=$ROOT/$B/nbgrad ;; esac
    export NBG_BIN
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/nbg-run-all.XXXXXX") || { echo "run-all: cannot make a temporary directory"; exit 2; }
trap 'rm -rf "$TMP"' EXIT
trap 'rm -rf "$TMP"; exit 130' INT TERM

. "$ROOT/tests/lanes.sh"
JOBS=${NBG_TEST_JOBS:-2}
case "$JOBS" in '' | *[!0-9]* | 0) JOBS=1 ;; esac

# the programs: in name order, test-golden last when one at a time, first when several (the longest)
progs=""
golden=""
for p in "$B"/tests/test-*; do
    if [ ! -f "$p" ] || [ ! -x "$p" ]; then continue; fi
    case "$p" in
        *.o | *.d | *.c | *.h | *.sh) continue ;;
        */test-golden) golden=$p ;;
        *) progs="$progs $p" ;;
    esac
done
if [ "$JOBS" -gt 1 ]; then
    progs="$golden $progs"
else
    progs="$progs $golden"
fi

# run_one PROGRAM: its output into $TMP/NAME.out, its exit status into $TMP/NAME.rc; streamed when one at a time
run_one() {
    name=$(basename "$1")
    case "$1" in
        /*) run=$1 ;;
        *) run=./$1 ;;
    esac
    if [ "$JOBS" -eq 1 ]; then
        echo "== $name"
        # the exit status goes through a file (a pipeline loses it)
        { "$run" 2>&1; echo $? > "$TMP/$name.rc"; } | tee "$TMP/$name.out"
    else
        "$run" > "$TMP/$name.out" 2>&1
        echo $? > "$TMP/$name.rc"
        while ! mkdir "$TMP/.print" 2>/dev/null; do sleep 0.1; done
        echo "== $name"
        cat "$TMP/$name.out"
        rmdir "$TMP/.print"
    fi
}

# shellcheck disable=SC2086 # the programs' paths have no spaces
run_lanes "$JOBS" "$TMP/.claims" run_one $progs

total_pass=0
total_fail=0
total_skip=0
bad=""
count=0

for p in $progs; do
    name=$(basename "$p")
    count=$((count + 1))
    rc=$(cat "$TMP/$name.rc" 2>/dev/null)
    [ -n "$rc" ] || rc=255
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$' "$TMP/$name.out" 2>/dev/null | tail -n 1)
    if [ -z "$line" ]; then
        if [ "$rc" -gt 128 ]; then
            why="crashed (signal $((rc - 128))) without a summary line"
        else
            why="printed no summary line (exit status $rc)"
        fi
        echo "FAIL $name $why"
        total_fail=$((total_fail + 1))
        bad="$bad
  $name: $why"
        continue
    fi
    np=${line%% passed*}
    rest=${line#*passed, }
    nf=${rest%% failed*}
    case "$line" in
        *skipped) rest=${line##*failed, }; ns=${rest%% skipped} ;;
        *) ns=0 ;;
    esac
    total_pass=$((total_pass + np))
    total_fail=$((total_fail + nf))
    total_skip=$((total_skip + ns))
    if [ "$rc" -ne 0 ]; then
        if [ "$rc" -gt 128 ]; then
            why="crashed (signal $((rc - 128)))"
        else
            why="exited with status $rc"
        fi
        if [ "$nf" -gt 0 ]; then
            bad="$bad
  $name: $nf failed ($why)"
        else
            # a failure the program did not count itself
            echo "FAIL $name $why after reporting no failure"
            total_fail=$((total_fail + 1))
            bad="$bad
  $name: $why after reporting no failure"
        fi
    elif [ "$nf" -gt 0 ]; then
        echo "FAIL $name reported $nf failures but exited with status 0"
        bad="$bad
  $name: $nf failed (yet exit status 0)"
    fi
done

if [ "$count" -eq 0 ]; then
    echo "FAIL run-all no test programs in $B/tests (run make first)"
    total_fail=$((total_fail + 1))
    bad="$bad
  no test programs in $B/tests"
fi

echo "=="
if [ -n "$bad" ]; then
    echo "programs with failures:$bad"
fi
summary="$total_pass passed, $total_fail failed"
[ "$total_skip" -gt 0 ] && summary="$summary, $total_skip skipped"
echo "$summary"
if [ "$total_fail" -eq 0 ]; then
    exit 0
fi
exit 1
