#!/usr/bin/env bash
# run_tests.sh BACKEND HAVE_NVCC: the whole test suite. Each line it prints is one test case:
#   - the CUDA build (`make cuda`), when nvcc is present
#   - every unit test tests/test_*.c on each rank count its first line names (/* ranks: 1 2 4 */)
#   - every chapter's standard layouts (NN_*/checks.txt), under MPI and again under the NCCL
#     emulation (COMM=nccl-sim: what would deadlock under NCCL's ordering rules fails here), and
#     the unit tests of the collectives (SIM_UNIT_TESTS) under it too
#   - every scripted test tests/t_*.sh (bad input, dumps checked by PyTorch, ...)
# The line before the last gives the seconds of each part (the budget: 20 minutes on 2 cores), the
# last line is "N passed, N failed".
# TEST_CHAPTER=NN (make test-NN): that chapter only: the unit tests UNIT_TESTS names (its
# TESTS_NN) and its layouts under both collectives; no CUDA build, no scripted tests.
set -u
backend=$1; have_nvcc=${2:-}
root=${BUILD_ROOT:-build}
export BUILD_ROOT=$root BACKEND=$backend
passed=0; failed=0
pass() { printf 'ok    %s\n' "$1"; passed=$((passed+1)); }
fail() { printf 'FAIL  %s\n' "$1"; [ -n "${2:-}" ] && sed 's/^/      | /' "$2" | tail -30; failed=$((failed+1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mpirun_base=${MPIRUN_BASE:-$(tools/mpirun_base.sh)}
t_start=$(date +%s); t_part=$t_start; parts=""
# part NAME: the seconds since the last part ended, for the summary line
part() { local now; now=$(date +%s); parts="$parts, $1 $((now - t_part))"; t_part=$now; }

# 1. the CUDA build: every .cu through nvcc (sm_75, sm_80, sm_90 + compute_90 PTX, warnings as
#    errors), every binary linked
if [ -n "${TEST_CHAPTER:-}" ]; then
    :   # one chapter: its own tests only
elif [ -n "$have_nvcc" ]; then
    if make --no-print-directory -j"$(nproc 2>/dev/null || echo 1)" cuda >"$tmp/cuda.txt" 2>&1; then pass "make cuda (nvcc, sm_75 + sm_80 + sm_90 + PTX, -Werror, linked)"
    else fail "make cuda" "$tmp/cuda.txt"; fi
else
    echo "skip  make cuda: nvcc not found"
fi
part "make cuda"

# 2. unit tests
only=${TEST_CHAPTER:-}
for src in tests/test_*.c; do
    name=$(basename "$src" .c)
    if [ -n "$only" ]; then case " ${UNIT_TESTS:-} " in *" $name "*) ;; *) continue;; esac; fi
    ranks=$(head -1 "$src" | sed -n 's#.*ranks:\([0-9 ]*\).*#\1#p')
    for np in ${ranks:-1}; do
        if timeout 300 $mpirun_base -np "$np" "$root/$backend/tests/$name" >"$tmp/u.txt" 2>&1; then
            pass "$name (NP=$np)"
        else fail "$name (NP=$np)" "$tmp/u.txt"; fi
    done
done
# the collectives' own tests once more under the NCCL emulation (the CPU build's)
if [ "$backend" = cpu ]; then
    for name in ${SIM_UNIT_TESTS:-test_comm}; do
        [ -z "$only" ] || [ -n "${SIM_UNIT_TESTS:-}" ] || break
        ranks=$(head -1 "tests/$name.c" | sed -n 's#.*ranks:\([0-9 ]*\).*#\1#p')
        for np in ${ranks:-1}; do
            if COMM=nccl-sim timeout 300 $mpirun_base -np "$np" "$root/$backend/tests/$name" >"$tmp/u.txt" 2>&1; then
                pass "$name (NP=$np, COMM=nccl-sim)"
            else fail "$name (NP=$np, COMM=nccl-sim)" "$tmp/u.txt"; fi
        done
    done
fi
part "unit tests"

# 3. chapter checks: under the default collectives, then (CPU build) under the NCCL emulation
chapter_checks() {
    local checks nn p f
    for checks in [0-9][0-9]_*/checks.txt; do
        [ -f "$checks" ] || continue
        nn=$(basename "$(dirname "$checks")" | cut -c1-2)
        [ -z "$only" ] || [ "$nn" = "$only" ] || continue
        ./tests/run_checks.sh "$backend" "$nn" "$root" >"$tmp/c.txt" 2>&1
        grep -v "^check-$nn:" "$tmp/c.txt"
        p=$(sed -n "s/^check-$nn: \([0-9]*\) passed, \([0-9]*\) failed.*/\1/p" "$tmp/c.txt")
        f=$(sed -n "s/^check-$nn: \([0-9]*\) passed, \([0-9]*\) failed.*/\2/p" "$tmp/c.txt")
        if [ -z "$p" ]; then fail "check-$nn${COMM:+ (COMM=$COMM)} did not run" "$tmp/c.txt"; continue; fi
        passed=$((passed+p)); failed=$((failed+f))
    done
}
chapter_checks
part "chapter checks"
if [ "$backend" = cpu ]; then
    COMM=nccl-sim chapter_checks
    part "chapter checks (COMM=nccl-sim)"
fi

# 4. scripted tests
for t in tests/t_*.sh; do
    [ -f "$t" ] || continue
    [ -z "$only" ] || { echo "skip  the scripted tests (tests/t_*.sh): make test runs them"; break; }
    t0=$(date +%s)
    timeout 600 bash "$t" >"$tmp/s.txt" 2>&1; rc=$?
    secs=$(( $(date +%s) - t0 ))
    if [ $rc -eq 0 ]; then pass "$(basename "$t" .sh): $(tail -1 "$tmp/s.txt") ($secs s)"
    else fail "$(basename "$t" .sh) ($secs s)" "$tmp/s.txt"; fi
done
part "scripted tests"

echo "($(( $(date +%s) - t_start )) s${parts})"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
