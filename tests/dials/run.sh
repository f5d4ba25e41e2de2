#!/bin/sh
# run.sh -- the DIALS tier (make test-dials): the round trip through DIALS (roundtrip.py), the multi-panel
# read-back (multipanel.py), stills from DIALS with their spectra (stills.py), spot regions from DIALS's reflections
# (spots.py), every real image and list of ../shared/data/real read as dxtbx reads them (cbfpanels.py, with
# $NBG_CBFPANELS; the Pilatus 12M and the Timepix quad refused alone and read through dials.import's lists) and
# structure factors from DIALS's MTZ and reflection tables of a real still (hklmtz.py) and a scan-varying crystal's
# images against DIALS's scan-varying predictions (scanvarying.py), a multi-axis goniometer (the SmarGon CBF, a
# kappa) written back by nbgrad and read by dxtbx (goniometer.py), with Debian's python.  Ends with the total of
# their "N passed, M failed" lines; exit status 0 only when all ran and nothing failed.
#
# The scripts are independent (each has its own folder under WORKDIR) and spend most of their time in DIALS's
# single-threaded Python, so $DIALS_JOBS of them (2 by default) run at once (tests/lanes.sh): each lane takes the
# next script not yet taken, longest first; the round trip, the longest, runs as its two parts (roundtrip.py
# --part=cases and --part=crystals).  Each script's output is shown in list order at the end, so that what each
# printed stays together; a line says when each ends.
#
#   sh tests/dials/run.sh NBGRAD_BINARY WORKDIR [roundtrip options]
NB=$1
WORK=$2
shift 2
PY=${DIALS_PY:-/usr/bin/python3}
JOBS=${DIALS_JOBS:-2}
DIR=$(cd "$(dirname "$0")" && pwd) || exit 2
. "$DIR/../lanes.sh"
rm -rf "$WORK" && mkdir -p "$WORK" || exit 2
# longest first (measured on 2 cores: 750, 580, 200, 100, 60, 45, 20, 15, 15 s), so that the lanes end together
SCRIPTS="roundtrip-crystals roundtrip-cases stills scanvarying cbfpanels hklmtz spots multipanel goniometer"

# the round trip's options (no spaces in them)
RT_OPTS="$*"

# one_script NAME: runs it, its output into WORK/NAME.out and its exit status into WORK/NAME.rc; a line when it ends
one_script() {
    t0=$(date +%s)
    name=$1
    case "$name" in
    roundtrip-*)
        # shellcheck disable=SC2086 # the options, word by word
        PATH=/usr/bin:$PATH "$PY" "$DIR/roundtrip.py" "$NB" "$WORK/$name" --part="${name#roundtrip-}" $RT_OPTS \
            > "$WORK/$name.out" 2>&1
        ;;
    *)
        PATH=/usr/bin:$PATH "$PY" "$DIR/$name.py" "$NB" "$WORK/$name" > "$WORK/$name.out" 2>&1
        ;;
    esac
    echo $? > "$WORK/$name.rc"
    echo "== $name: exit status $(cat "$WORK/$name.rc"), $(($(date +%s) - t0)) s" >> "$WORK/$name.out"
    echo "== test-dials: $name done ($(grep -E '^[0-9]+ passed, [0-9]+ failed' "$WORK/$name.out" | tail -n 1))"
}

# shellcheck disable=SC2086 # the scripts' names have no spaces
run_lanes "$JOBS" "$WORK/.claims" one_script $SCRIPTS

pass=0
fail=0
status=0
for s in $SCRIPTS; do
    if [ ! -f "$WORK/$s.out" ]; then
        echo "FAIL test-dials $s did not run"
        fail=$((fail + 1))
        status=1
        continue
    fi
    cat "$WORK/$s.out"
    rc=$(cat "$WORK/$s.rc" 2>/dev/null)
    [ -n "$rc" ] || rc=255
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$WORK/$s.out" | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL test-dials $s printed no summary line (exit status $rc)"
        fail=$((fail + 1))
        status=1
        continue
    fi
    p=${line%% passed*}
    rest=${line#*passed, }
    f=${rest%% failed*}
    pass=$((pass + p))
    fail=$((fail + f))
    [ "$rc" -eq 0 ] || status=1
done
[ "$fail" -eq 0 ] || status=1
echo "$pass passed, $fail failed"
exit $status
