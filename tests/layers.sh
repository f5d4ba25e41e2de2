#!/bin/sh
# layers.sh -- the library's layering, checked on its object files: who may call whom.  The geometry model
# (labgeom) is used by the format readers and writers (cbf, cbfbin, nxmx, expt, io's SMV/PGM/floats) and calls none
# of them; the format registry (imagefile: sniff, read, write) sits above the formats, which never call it; the
# image model (model) is used by the forward (simulate), and what renders to judge (floor) sits above both.  One PASS/FAIL line per rule, then "N passed, N failed".
#   sh tests/layers.sh BUILD_DIR
B=${1:-build}
pass=0
fail=0
# rule FROM "TO ..." WHY: FROM.o must reference no symbol that TO.o defines
rule() {
    from=$1
    tos=$2
    why=$3
    f="$B/src/$from.o"
    if [ ! -f "$f" ]; then
        echo "FAIL layers-$from $f is missing"
        fail=$((fail + 1))
        return
    fi
    used=$(nm -u "$f" | awk '{ print $NF }' | sort -u)
    bad=""
    for to in $tos; do
        t="$B/src/$to.o"
        [ -f "$t" ] || continue
        defs=$(nm -g --defined-only "$t" | awk 'NF == 3 { print $3 }' | sort -u)
        hit=$(printf '%s\n' "$used" | grep -x -F "$defs" | tr '\n' ' ')
        [ -n "$hit" ] && bad="$bad $to.o ($hit)"
    done
    if [ -z "$bad" ]; then
        echo "PASS layers-$from $from.o calls nothing of: $tos ($why)"
        pass=$((pass + 1))
    else
        echo "FAIL layers-$from $from.o calls$bad ($why)"
        fail=$((fail + 1))
    fi
}
rule labgeom "cbf cbfbin nxmx expt imagefile io" "the geometry model: the formats use it, not it them"
rule cbf "imagefile expt nxmx" "a format reads and writes its files alone"
rule nxmx "imagefile cbf cbfbin expt" "a format reads and writes its files alone"
rule expt "imagefile cbf cbfbin nxmx" "a format reads and writes its files alone"
rule cbfbin "imagefile expt nxmx" "a format reads and writes its files alone"
rule io "imagefile cbf cbfbin nxmx expt" "a format reads and writes its files alone"
rule model "simulate floor" "the image model's arithmetic: the forward applies it"
rule simulate "floor" "the forward: the floor check renders through it"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
