# lib.sh -- the harness the CLI tests share (sourced, never run by ctest: it is no test_*.sh):
# a temporary folder removed at exit, pass / fail / skip counters, check NAME EXPECTED ACTUAL,
# and finish, which prints the final "N passed, N failed[, N skipped]" line that ctest's
# log shows and returns non-zero on any failure.
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
n_pass=0
n_fail=0
n_skip=0

pass() { n_pass=$((n_pass + 1)); echo "ok   $1"; }
fail() { # fail NAME [DETAIL LINE ...]
    n_fail=$((n_fail + 1))
    echo "FAIL $1"
    shift
    for line in "$@"; do echo "  $line"; done
}
skip() { n_skip=$((n_skip + 1)); echo "skip $1"; }
check() { # check NAME EXPECTED ACTUAL
    if [ "$2" == "$3" ]; then
        pass "$1"
    else
        fail "$1" "expected: $2" "actual:   $3"
    fi
}
finish() {
    if [ "$n_skip" -gt 0 ]; then
        echo "$n_pass passed, $n_fail failed, $n_skip skipped"
    else
        echo "$n_pass passed, $n_fail failed"
    fi
    [ "$n_fail" -eq 0 ]
}
