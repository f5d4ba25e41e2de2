# lanes.sh -- sourced by the test runners (tests/run-all.sh, tests/dials/run.sh, tests/fuzz/run.sh): one way to run
# a list of independent jobs a few at a time.
#
#   run_lanes JOBS CLAIMS FN ITEM...
#
# calls FN ITEM for every ITEM and returns when all have ended.  With JOBS <= 1 in list order, in this shell.  With
# JOBS > 1, JOBS lanes run in background subshells: each goes down the list and takes the next ITEM not yet taken (a
# mkdir of CLAIMS/<the item's base name> claims it, so each runs once), so the list's order is the order in which
# they start; FN's variables do not come back from a lane, so FN leaves what it has to say in files.  CLAIMS is a
# folder of the caller's (made when missing).

run_lanes() {
    _rl_jobs=$1
    _rl_claims=$2
    _rl_fn=$3
    shift 3
    case "$_rl_jobs" in '' | *[!0-9]*) _rl_jobs=1 ;; esac
    if [ "$_rl_jobs" -le 1 ]; then
        for _rl_item in "$@"; do
            "$_rl_fn" "$_rl_item"
        done
        return 0
    fi
    mkdir -p "$_rl_claims" || return 2
    _rl_pids=""
    _rl_j=0
    while [ "$_rl_j" -lt "$_rl_jobs" ]; do
        (
            for _rl_item in "$@"; do
                if mkdir "$_rl_claims/${_rl_item##*/}" 2>/dev/null; then
                    "$_rl_fn" "$_rl_item"
                fi
            done
        ) &
        _rl_pids="$_rl_pids $!"
        _rl_j=$((_rl_j + 1))
    done
    for _rl_p in $_rl_pids; do
        wait "$_rl_p"
    done
    return 0
}
