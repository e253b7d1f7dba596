#!/usr/bin/env bash
# sanitize.sh [quick]: the CPU backend built with AddressSanitizer, UndefinedBehaviorSanitizer
# and LeakSanitizer (into $BUILD_ROOT/sanitize/cpu, default build/sanitize/cpu), then run under
# mpirun with the sanitizers' options exported to every rank:
#   - every unit test tests/test_*.c, on each rank count its first line names;
#   - two layouts per chapter (with --check): the first `pass` line of NN_*/checks.txt, and the
#     first `pass` line on more than one rank, so that the parallel code runs too.
# quick (tests/t_sanitize.sh, part of make test): each unit test on its smallest rank count,
# and chapter 00's two layouts only.
# A case fails on a non-zero exit or on any sanitizer report (a memory error, undefined
# behaviour, a leak). Open MPI's and OpenBLAS's own leaks are suppressed (tests/lsan.supp).
# One line per case; the last line is "sanitize: N passed, N failed"; exit 0 when none failed.
set -u
cd "$(dirname "$0")/.."
quick=${1:-}
root=${BUILD_ROOT:-build}
san_root=$root/sanitize
bin=$san_root/cpu
mpirun_base=${MPIRUN_BASE:-$(tools/mpirun_base.sh)}
passed=0; failed=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# -fno-sanitize-recover: undefined behaviour stops the program (and so fails the case) instead
# of printing and going on; -O1 keeps the sanitized build fast enough while keeping the stacks
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
if ! CFLAGS="-O1 -g $san" LDFLAGS="$san" make --no-print-directory -j"$(nproc 2>/dev/null || echo 2)" \
        BUILD_ROOT="$san_root" BACKEND=cpu all >"$tmp/build.txt" 2>&1; then
    echo "FAIL  sanitize: the build with $san"
    grep -E "error|Error" "$tmp/build.txt" | head -20 | sed 's/^/      | /'
    echo "sanitize: 0 passed, 1 failed"
    exit 1
fi

# fast_unwind_on_malloc=0: full allocation stacks, so that lsan.supp recognises Open MPI's frames
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:halt_on_error=1:detect_stack_use_after_return=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
san_env="-x ASAN_OPTIONS -x LSAN_OPTIONS -x UBSAN_OPTIONS"

# check NAME NP COMMAND...: one case
check() {
    local name=$1 np=$2; shift 2
    timeout 600 $mpirun_base $san_env -np "$np" "$@" </dev/null >"$tmp/log.txt" 2>&1
    local rc=$?
    if grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:|SUMMARY: (Address|UndefinedBehavior|Leak)Sanitizer" \
            "$tmp/log.txt"; then
        printf 'FAIL  sanitize %s (NP=%s): sanitizer report\n' "$name" "$np"
        grep -E -A25 "ERROR: (Address|Leak)Sanitizer|runtime error:" "$tmp/log.txt" | head -60 | sed 's/^/      | /'
        failed=$((failed+1))
    elif [ $rc -ne 0 ]; then
        printf 'FAIL  sanitize %s (NP=%s): exit %d\n' "$name" "$np" $rc
        tail -15 "$tmp/log.txt" | sed 's/^/      | /'
        failed=$((failed+1))
    else
        printf 'ok    sanitize %s (NP=%s)\n' "$name" "$np"
        passed=$((passed+1))
    fi
}

for src in tests/test_*.c; do
    name=$(basename "$src" .c)
    ranks=$(head -1 "$src" | sed -n 's#.*ranks:\([0-9 ]*\).*#\1#p')
    ranks=${ranks:-1}
    [ -n "$quick" ] && ranks=$(echo $ranks | tr ' ' '\n' | sort -n | head -1)
    for np in $ranks; do check "$name" "$np" "$bin/tests/$name"; done
done

for checks in [0-9][0-9]_*/checks.txt; do
    [ -f "$checks" ] || continue
    nn=$(basename "$(dirname "$checks")" | cut -c1-2)
    [ -n "$quick" ] && [ "$nn" != 00 ] && continue
    # the first `pass` layout, and the first one on more than one rank (the parallel code)
    first=$(awk '$1 ~ /^[0-9]+$/ && $2 == "pass" { print; exit }' "$checks")
    multi=$(awk '$1 ~ /^[0-9]+$/ && $1 > 1 && $2 == "pass" { print; exit }' "$checks")
    [ "$multi" = "$first" ] && multi=""
    for line in "$first" "$multi"; do
        [ -n "$line" ] || continue
        read -r np _ flags <<<"$line"
        # shellcheck disable=SC2086
        check "chapter $nn ${flags:-(defaults)}" "$np" "$bin/$nn" --check --out "$tmp/out" $flags
    done
done

echo "sanitize: $passed passed, $failed failed"
[ $failed -eq 0 ]
