#!/bin/sh
# triage.sh -- groups the saved fuzzing findings by what went wrong and where.
#
#   sh tests/fuzz/triage.sh [FUZZ_DIR [TARGET...]]      (FUZZ_DIR: build/fuzz; TARGET: every findings folder)
#
# Reruns FUZZ_DIR/fuzz-TARGET on each input of FUZZ_DIR/findings/TARGET/ (with the limits `make fuzz` uses, or
# $FUZZ_OPTS) and prints one block per distinct finding: the sanitizer's message (addresses and sizes blanked
# out), the top frames in nbgrad's own code (src/, grad/, tests/fuzz/), how many inputs hit it, and the smallest
# such input.  An input that no longer fails is listed as "fixed".  The full outputs are left in
# FUZZ_DIR/triage/.

FZ=${1:-build/fuzz}
[ $# -gt 0 ] && shift
opts=${FUZZ_OPTS:--rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10}
# UBSan prints no stack unless asked
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
export UBSAN_OPTIONS
ROOT=$(cd "$(dirname "$0")/../.." && pwd) || exit 2
cd "$ROOT" || exit 2
[ -d "$FZ/findings" ] || { echo "triage: no $FZ/findings"; exit 0; }
targets="$*"
[ -n "$targets" ] || targets=$(ls "$FZ/findings")
out=$FZ/triage
mkdir -p "$out"
sigs=$out/signatures.tsv
: > "$sigs"

for t in $targets; do
    bin=$FZ/fuzz-$t
    [ -x "$bin" ] || { echo "triage: no harness $bin"; continue; }
    for f in "$FZ/findings/$t"/*; do
        [ -f "$f" ] || continue
        log=$out/$t-$(basename "$f").log
        # shellcheck disable=SC2086
        "$bin" $opts "$f" > "$log" 2>&1
        rc=$?
        if [ "$rc" -eq 0 ]; then
            msg="fixed (runs cleanly now)"
            frames="-"
        else
            # the first error line (else the summary), with addresses, sizes and values blanked out
            msg=$({ grep -m 1 -E '(ERROR: |runtime error: )' "$log" || grep -m 1 '^SUMMARY: ' "$log"; } |
                sed -e 's/^==[0-9]*== *//' -e 's/^\/[^ ]*\/\(src\|grad\|tests\)\//\1\//' |
                awk '{ i = index($0, "runtime error: ");
                       if (i > 0) { head = substr($0, 1, i + 14); tail = substr($0, i + 15) } else { head = ""; tail = $0 }
                       gsub(/0x[0-9a-f]+/, "ADDR", tail)
                       if (tail !~ /^==fuzz==/) gsub(/[-+]?[0-9][0-9.]*(e[-+]?[0-9]+)?/, "N", tail)
                       print head tail }' | cut -c 1-180)
            [ -n "$msg" ] || msg="exit status $rc, no sanitizer message"
            frames=$(grep -E '^ *#[0-9]+ ' "$log" | grep -E ' (/[^ ]*/)?(src|grad|tests/fuzz)/[^ ]*$' |
                sed -E 's/^ *#[0-9]+ 0x[0-9a-f]+ in ([^ ]+) (.*\/)?((src|grad|tests\/fuzz)\/[^ ]+)$/\1 \3/' |
                awk '!seen[$0]++' | head -n 3 | tr '\n' ';' | sed 's/;$//')
            [ -n "$frames" ] || frames="(no frame in nbgrad's code)"
        fi
        size=$(wc -c < "$f" | tr -d ' ')
        printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$msg" "$frames" "$size" "$f" >> "$sigs"
    done
done

# one block per (target, message, frames): count and smallest input
LC_ALL=C sort -t "$(printf '\t')" -k1,1 -k2,2 -k3,3 -k4,4n "$sigs" | awk -F '\t' '
    { key = $1 "\t" $2 "\t" $3; if (!(key in n)) { order[++k] = key; first[key] = $5; sz[key] = $4 } n[key]++ }
    END {
        for (i = 1; i <= k; ++i) {
            split(order[i], p, "\t")
            printf "fuzz-%s: %s\n    frames: %s\n    inputs: %d, smallest %s (%d bytes)\n", p[1], p[2], p[3], n[order[i]], first[order[i]], sz[order[i]]
        }
        printf "%d distinct finding(s) in %d input(s)\n", k, NR
    }'
