# check_lib.sh: what the scripted checks share (not itself a test: run_tests.sh runs tests/t_*.sh) (sourced by tests/t_deps.sh, t_gpu_check.sh,
# t_gpu_setup.sh, t_assignment.sh, t_student_copy.sh; tests/mutations.py calls tracked_copy): the
# counters, a temporary folder removed at exit, check and tracked_copy.
n=0; bad=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
check() {   # check "what" command...: the command must succeed; if not, its first lines are shown
    local what=$1; shift
    n=$((n+1))
    if ! "$@" >"$tmp/out.txt" 2>&1; then
        echo "FAIL: $what"; sed 's/^/  | /' "$tmp/out.txt" | head -8; bad=$((bad+1))
    fi
}
# tracked_copy DEST: the tutorial's files as git tracks them (outside a git checkout: the tree less
# its builds, outputs and student copies) copied into DEST, with a git index of its own. A tree in
# which a test may plant a stray or leaking file, or a wrong answer, never this one: make test runs
# the scripted tests side by side, and another test's `make assignment` reads this tree.
tracked_copy() {
    mkdir -p "$1" || return 1
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files -z --cached | xargs -0 -r cp -a --parents -t "$1" 2>/dev/null
    else
        tar cf - --exclude=./build --exclude=./out --exclude=./student . | (cd "$1" && tar xf -) || return 1
    fi
    (cd "$1" && git init -q && git add -A) >/dev/null 2>&1
    return 0
}
