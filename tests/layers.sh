#!/bin/sh
# layers.sh -- checks on the library's object files.  Its layering: who may call whom.  The geometry model
# (labgeom) is used by the format readers and writers (cbf, cbfbin, nxmx, expt, io's SMV/PGM/floats) and calls none
# of them; the format registry (imagefile: sniff, read, write) sits above the formats, which never call it; the
# image model (model) is used by the forward (simulate), and what renders to judge (floor) sits above both.  And, in
# an optimised build (OPT with -O2 or -O3), the CPU kernels' per-sample helpers inlined into their rows: a helper
# left out of line is a call per lane loop, which GCC then does not vectorise, or leaves its loop's state in memory
# (GCC gives up inlining when a unit's growth budget runs out: a fourth row instantiation in forward_cpu.c once left
# nbgi_square_vec out of line, heavy256's double forward 30 % slower).  One PASS/FAIL (or SKIP) line per rule,
# then "N passed, N failed" (", K skipped" when any).
#   sh tests/layers.sh BUILD_DIR [OPT]
B=${1:-build}
OPT=${2:-}
pass=0
fail=0
skip=0
# verdict ID BAD PASSTEXT FAILTEXT: one line and its count, PASS where BAD (what was found wrong) is empty
verdict() {
    if [ -z "$2" ]; then
        echo "PASS $1 $3"
        pass=$((pass + 1))
    else
        echo "FAIL $1 $4"
        fail=$((fail + 1))
    fi
}
# rule FROM "TO ..." WHY: FROM.o must reference no symbol that TO.o defines
rule() {
    from=$1
    tos=$2
    why=$3
    f="$B/src/$from.o"
    if [ ! -f "$f" ]; then
        verdict "layers-$from" missing "" "$f is missing"
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
    verdict "layers-$from" "$bad" "$from.o calls nothing of: $tos ($why)" "$from.o calls$bad ($why)"
}
rule labgeom "cbf cbfbin nxmx expt imagefile io" "the geometry model: the formats use it, not it them"
rule cbf "imagefile expt nxmx" "a format reads and writes its files alone"
rule nxmx "imagefile cbf cbfbin expt" "a format reads and writes its files alone"
rule expt "imagefile cbf cbfbin nxmx" "a format reads and writes its files alone"
rule cbfbin "imagefile expt nxmx" "a format reads and writes its files alone"
rule io "imagefile cbf cbfbin nxmx expt" "a format reads and writes its files alone"
rule model "simulate floor" "the image model's arithmetic: the forward applies it"
rule simulate "floor" "the forward: the floor check renders through it"
# inlined OBJ "NAME ..." WHY: in an optimised build OBJ.o has no function of its own named NAME_<type suffix>
inlined() {
    f="$B/$1.o"
    case " $OPT " in
        *" -O2 "* | *" -O3 "*) ;;
        *)
            echo "SKIP inlined-$1 (OPT '$OPT' is not -O2 or -O3)"
            skip=$((skip + 1))
            return
            ;;
    esac
    if [ ! -f "$f" ]; then
        verdict "inlined-$1" missing "" "$f is missing"
        return
    fi
    defs=$(nm --defined-only "$f" | awk '$2 == "t" || $2 == "T" { print $3 }')
    bad=""
    for n in $2; do
        hit=$(printf '%s\n' "$defs" | grep -E "^${n}_(d|f|dn|fn)([.]|\$)" | tr '\n' ' ')
        [ -n "$hit" ] && bad="$bad $hit"
    done
    verdict "inlined-$1" "$bad" "$1.o has none of the $(echo $2 | wc -w) per-sample helpers out of line ($3)" \
        "$1.o has out of line:$bad($3)"
}
HOT="nbgi_square_lanes nbgi_square_vec nbgi_square_parts nbgi_cos2_lanes nbgi_cheb_steps nbgi_cheb_steps_part
     nbgi_cheb_grad_steps nbgi_cospi_scaled nbgi_cospi_reduced nbgi_cospi2_reduced nbgi_sinpi_poly nbgi_fcell
     nbgi_fcell_grad nbgi_lagrange4 nbgi_lagrange4_grad nbgi_lattice nbgi_sinc3pi_grad nbgi_sincospi
     nbgi_round_grad nbgi_exp nbgi_gauss_r2 nbgi_gauss_tophat nbgi_gauss_grad"
inlined src/forward_cpu "$HOT" "the double forward's rows"
inlined src/forward_cpu_f "$HOT" "the float forward's rows"
inlined grad/adjoint_cpu "$HOT" "the adjoint's and tangents' rows"
if [ "$skip" -gt 0 ]; then
    echo "$pass passed, $fail failed, $skip skipped"
else
    echo "$pass passed, $fail failed"
fi
[ "$fail" -eq 0 ]
