#!/usr/bin/env bash
# run_tests.sh BACKEND HAVE_NVCC: the whole test suite. Each line it prints is one test case:
#   - the CUDA build (`make cuda`), when nvcc is present
#   - every unit test tests/test_*.c on each rank count its first line names (/* ranks: 1 2 4 */)
#   - every chapter's standard layouts (NN_*/checks.txt), under MPI and again under the NCCL
#     emulation (COMM=nccl-sim: what would deadlock under NCCL's ordering rules fails here; its
#     pass and script layouts: the deliberate bugs and the chapters' unit tests test the parity
#     check and the arithmetic, which run once, under MPI), and the unit tests of the collectives
#     (SIM_UNIT_TESTS) under it too
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

# 3. and 4. the chapter checks (under the default collectives, then in the CPU build under the NCCL
#    emulation) and every scripted test tests/t_*.sh (bad input, dumps checked by PyTorch, ...),
#    as jobs run TEST_JOBS at a time (default 3). Most of them wait more than they compute (mpirun's
#    start-up and clean-up, a rank stopped on purpose, a guard's timeout): side by side they fill
#    the second core, and a third job fills the waits (on 2 cores: 17m08s against 18m50s with 2).
#    The longest start first; each job's lines are printed whole when it ends.
#    The scripted tests never write into the tree (t_assignment tries its untracked file in a copy).
jobs_max=${TEST_JOBS:-3}
case $jobs_max in ''|*[!0-9]*|0) echo "TEST_JOBS=$jobs_max: expected a whole number of at least 1"; exit 2;; esac

# chapter_checks DIR: every chapter's layouts (or TEST_CHAPTER's) under $COMM; lines on stdout,
# "passed failed" in DIR/count
chapter_checks() {
    local dir=$1 checks nn p f np=0 nf=0
    for checks in [0-9][0-9]_*/checks.txt; do
        [ -f "$checks" ] || continue
        nn=$(basename "$(dirname "$checks")" | cut -c1-2)
        [ -z "$only" ] || [ "$nn" = "$only" ] || continue
        ./tests/run_checks.sh "$backend" "$nn" "$root" >"$dir/c.txt" 2>&1
        grep -v "^check-$nn:" "$dir/c.txt"
        p=$(sed -n "s/^check-$nn: \([0-9]*\) passed, \([0-9]*\) failed.*/\1/p" "$dir/c.txt")
        f=$(sed -n "s/^check-$nn: \([0-9]*\) passed, \([0-9]*\) failed.*/\2/p" "$dir/c.txt")
        if [ -z "$p" ]; then
            printf 'FAIL  %s\n' "check-$nn${COMM:+ (COMM=$COMM)} did not run"; sed 's/^/      | /' "$dir/c.txt" | tail -30
            nf=$((nf+1)); continue
        fi
        np=$((np+p)); nf=$((nf+f))
    done
    echo "$np $nf" >"$dir/count"
}
# scripted_test DIR T: one tests/t_*.sh, one line on stdout; "1 0" or "0 1" in DIR/count
scripted_test() {
    local dir=$1 t=$2 t0 rc secs
    t0=$(date +%s)
    timeout 600 bash "$t" >"$dir/s.txt" 2>&1; rc=$?
    secs=$(( $(date +%s) - t0 ))
    if [ $rc -eq 0 ]; then printf 'ok    %s\n' "$(basename "$t" .sh): $(tail -1 "$dir/s.txt") ($secs s)"; echo "1 0" >"$dir/count"
    else printf 'FAIL  %s\n' "$(basename "$t" .sh) ($secs s)"; sed 's/^/      | /' "$dir/s.txt" | tail -30; echo "0 1" >"$dir/count"; fi
}

# the jobs, longest first (the order of the last measured run on 2 cores; a new test goes last)
joblist=()
[ -z "$only" ] && [ -f tests/t_mutations.sh ] && joblist+=("tests/t_mutations.sh")
joblist+=("checks")
[ "$backend" = cpu ] && joblist+=("checks-nccl-sim")
if [ -z "$only" ]; then
    for t in t_dump_torch t_bad_input t_grade t_rank_failures t_readme t_assignment t_sanitize; do
        [ -f "tests/$t.sh" ] && joblist+=("tests/$t.sh")
    done
    for t in tests/t_*.sh; do
        [ -f "$t" ] || continue
        case " ${joblist[*]} " in *" $t "*) ;; *) joblist+=("$t");; esac
    done
else
    echo "skip  the scripted tests (tests/t_*.sh): make test runs them"
fi
run_job() {   # run_job N JOB: in the background; DIR/done once its lines and count are written
    local dir=$tmp/job$1; mkdir -p "$dir"
    (
        case $2 in
            # (make test: the chapters' unit lines are the unit tests part 2 ran, on the same ranks)
            checks) if [ -z "$only" ]; then CHECKS_KINDS="pass fail script" chapter_checks "$dir"
                    else chapter_checks "$dir"; fi ;;
            checks-nccl-sim) COMM=nccl-sim CHECKS_KINDS="pass script" chapter_checks "$dir" ;;
            *) scripted_test "$dir" "$2" ;;
        esac >"$dir/lines.txt"
        : >"$dir/done"
    ) &
}
next=0; running=(); t_jobs=$(date +%s)
while [ $next -lt ${#joblist[@]} ] || [ ${#running[@]} -gt 0 ]; do
    while [ $next -lt ${#joblist[@]} ] && [ ${#running[@]} -lt "$jobs_max" ]; do
        run_job $next "${joblist[$next]}"; running+=($next); next=$((next+1))
    done
    still=()
    for j in "${running[@]}"; do
        if [ -e "$tmp/job$j/done" ]; then
            cat "$tmp/job$j/lines.txt"
            read -r p f <"$tmp/job$j/count" || { p=0; f=1; echo "FAIL  ${joblist[$j]}: no result"; }
            passed=$((passed+p)); failed=$((failed+f))
            rm -rf "$tmp/job$j"
        else still+=("$j"); fi
    done
    running=("${still[@]}")
    [ ${#running[@]} -gt 0 ] && sleep 0.2
done
wait
part "chapter checks and scripted tests, $jobs_max at a time"

echo "($(( $(date +%s) - t_start )) s${parts})"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
