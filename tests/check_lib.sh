# check_lib.sh: what the scripted checks share (not itself a test: run_tests.sh runs tests/t_*.sh) (sourced by tests/t_deps.sh, t_gpu_check.sh,
# t_gpu_setup.sh): the counters, a temporary folder removed at exit, and check.
n=0; bad=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
check() {   # check "what" command...: the command must succeed; if not, its first lines are shown
    local what=$1; shift
    n=$((n+1))
    if ! "$@" >"$tmp/out.txt" 2>&1; then
        echo "FAIL: $what"; sed 's/^/  | /' "$tmp/out.txt" | head -8; bad=$((bad+1))
    fi
}
