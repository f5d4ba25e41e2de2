#!/bin/sh
# run.sh -- the DIALS tier (make test-dials): the round trip through DIALS (roundtrip.py), the multi-panel
# read-back (multipanel.py), stills from DIALS with their spectra (stills.py), spot regions from DIALS's reflections
# (spots.py), every real image and list of ../shared/data/real read as dxtbx reads them (cbfpanels.py, with
# $NBG_CBFPANELS; the Pilatus 12M and the Timepix quad refused alone and read through dials.import's lists) and
# structure factors from DIALS's MTZ and reflection tables of a real still (hklmtz.py) and a scan-varying crystal's
# images against DIALS's scan-varying predictions (scanvarying.py), a multi-axis goniometer (the SmarGon CBF, a
# kappa) written back by nbgrad and read by dxtbx (goniometer.py), with Debian's python; shows
# their output and ends with the total of their "N passed, M failed" lines.  Exit status 0 only when all ran and
# nothing failed.
#
#   sh tests/dials/run.sh NBGRAD_BINARY WORKDIR [roundtrip options]
NB=$1
WORK=$2
shift 2
PY=${DIALS_PY:-/usr/bin/python3}
DIR=$(cd "$(dirname "$0")" && pwd) || exit 2
rm -rf "$WORK" && mkdir -p "$WORK" || exit 2
pass=0
fail=0
status=0
for s in roundtrip multipanel stills spots cbfpanels hklmtz scanvarying goniometer; do
    if [ "$s" = roundtrip ]; then
        PATH=/usr/bin:$PATH "$PY" "$DIR/roundtrip.py" "$NB" "$WORK/roundtrip" "$@" > "$WORK/$s.out" 2>&1
    else
        PATH=/usr/bin:$PATH "$PY" "$DIR/$s.py" "$NB" "$WORK/$s" > "$WORK/$s.out" 2>&1
    fi
    rc=$?
    cat "$WORK/$s.out"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$WORK/$s.out" | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL test-dials $s.py printed no summary line (exit status $rc)"
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
