#!/bin/sh
# python/tests/run.sh [BUILD_DIR] -- builds the Python package into BUILD_DIR/py/lib and runs its tests (pytest).
#
# make test runs it through BUILD_DIR/tests/test-python, like the C test programs: it prints their summary line,
# "N passed, M failed[, K skipped]" (pytest's errors count as failures; no test collected is a failure), and exits
# non-zero on any failure.  PYTHON names the interpreter (python3); numpy and pytest are installed when missing.

B=${1:-build}
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd) || exit 2
cd "$ROOT" || exit 2

fail() {
    echo "FAIL test-python: $1"
    echo "0 passed, 1 failed"
    exit 1
}

if ! $PY -c 'import numpy, pytest' >/dev/null 2>&1; then
    echo "installing numpy and pytest for $PY"
    $PY -m pip install -q numpy pytest || fail "could not install numpy and pytest"
fi
# BUILD_DIR relative to the repository, or absolute
case $B in
/*) BD=$B ;;
*) BD=$ROOT/$B ;;
esac
LIB=$BD/py/lib
(cd python && NBGRAD_BUILD=$B/py $PY setup.py -q build_py -d "$LIB" build_ext -b "$LIB" -t "$BD/py/tmp") ||
    fail "the package did not build"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/nbg-pytest.XXXXXX") || fail "no temporary directory"
trap 'rm -rf "$TMP"' EXIT
# the program the tests compare with: the one make built in this build directory unless NBG_BIN says otherwise;
# the exit status goes through a file (a pipeline loses it)
{ NBG_BIN=${NBG_BIN:-$BD/nbgrad} PYTHONPATH=$LIB${PYTHONPATH:+:$PYTHONPATH} \
    $PY -m pytest -q -rs -p no:cacheprovider python/tests 2>&1; echo $? > "$TMP/rc"; } | tee "$TMP/out"
rc=$(cat "$TMP/rc" 2>/dev/null)
[ -n "$rc" ] || rc=255
line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|errors?)|no tests ran' "$TMP/out" | tail -n 1)
count() { echo "$line" | grep -o -E "[0-9]+ $1" | grep -o -E '^[0-9]+' || echo 0; }
np=$(count passed)
nf=$(( $(count failed) + $(count 'errors?') ))
ns=$(count skipped)
if [ "$rc" -ne 0 ] && [ "$nf" -eq 0 ]; then
    # pytest failed without counting a failure: no test collected (exit status 5), a usage error, a crash
    nf=1
    echo "FAIL test-python: pytest exited with status $rc"
fi
summary="$np passed, $nf failed"
[ "$ns" -gt 0 ] && summary="$summary, $ns skipped"
echo "$summary"
[ "$nf" -eq 0 ]
