#!/usr/bin/env bash
# run_checks.sh BACKEND NN [BUILD_ROOT]: run chapter NN's standard layouts from NN_*/checks.txt.
# Each line of checks.txt:   <ranks> <pass|fail> <flags...>
#   pass: the parity check must succeed (exit 0); fail: it must detect the deliberate bug
#   (exit 1, not 2: a refused input is not a detected bug).
# or:                        <ranks> unit <test>
#   a unit test of tests/ that the chapter's lesson rests on (e.g. chapter 07's exhaustive float8
#   codec test), run on <ranks> ranks: it must exit 0.
# or:                        <ranks> script <file> [args...]
#   a chapter's own scripted check (e.g. chapter 08's resume tests), run as
#   `bash NN_*/<file> BINARY RANKS [args...]` with MPIRUN_BASE set: it must exit 0; its last
#   line is printed.
# Prints one line per layout and exits non-zero when any layout does not behave.
# With STOP_AT_FIRST_FAILURE=1 it stops after the first layout that does not behave (t_assignment:
# a student copy only has to fail, and each failing layout costs mpirun's seconds of clean-up).
# With MAX_NP=N it skips the layouts of more than N ranks and says how many in its last line
# (make gpu-check: MAX_NP=4, the ranks sharing one GPU). With CHECKS_DEADLINE=T (seconds since
# the epoch, date +%s) it starts no layout after T, cuts every run's timeout to end by T, and says
# how many it did not run (make gpu-check's time budget). With CHECKS_LINES="L1 L2 ..." it runs
# only the layouts on those lines of checks.txt (make gpu-check takes the chapters' layouts in
# turns, one line at a time, so that a budget that runs out leaves no chapter untried). With
# CHECKS_KINDS="pass script" (any of pass fail unit script) it runs only the layouts of those kinds
# and says how many others it skipped (make test's second run, under the NCCL emulation: the
# deliberate bugs and the unit tests test the parity check and the arithmetic, which the
# collectives' backend does not change, so they run once, under MPI).
# In a student copy (its .student-copy file, written by make assignment-NN), or with GRADE=1, a
# chapter with an exercises.txt is then graded per exercise (tools/grade.py): a table of points
# after the layouts, and grade.json (GRADE_JSON=FILE to put it elsewhere). With CHECKS_RESULTS=FILE
# the layouts' results (grade.py's input, one line per layout run) are copied into FILE
# (tests/mutations.py grades a wrong answer from them).
set -u
backend=$1; nn=$2; root=${3:-build}
dir=$(ls -d "${nn}"_*/ 2>/dev/null | head -1)
[ -n "$dir" ] && [ -f "$dir/checks.txt" ] || { echo "chapter $nn has no checks.txt"; exit 2; }
bin=$root/$backend/$nn
tag=$nn${COMM:+ [COMM=$COMM]}   # the layout lines say which collectives ran them (README "Running on GPUs")
mpirun_base=${MPIRUN_BASE:-$(tools/mpirun_base.sh)}
passed=0; failed=0; stopped=""; skipped=0; late=0; other_kinds=0
# cut by CHECKS_DEADLINE (timeout's status 124 once it has passed): not run, not failed
cut_short() { [ "$1" -eq 124 ] && [ -n "${CHECKS_DEADLINE:-}" ] && [ "$(date +%s)" -ge "$CHECKS_DEADLINE" ]; }
# a run's timeout: N seconds, or until CHECKS_DEADLINE when that comes first
limit() { local n=$1; [ -n "${CHECKS_DEADLINE:-}" ] && n=$(( CHECKS_DEADLINE - $(date +%s) < n ? CHECKS_DEADLINE - $(date +%s) : n )); echo $(( n > 1 ? n : 1 )); }
log=$(mktemp -d)
results=$log/results.tsv; : > "$results"; lineno=0   # one line per layout run, for tools/grade.py
# What a failing run shows (at most about 40 lines): the error lines, the first step whose loss
# differs from the baseline's, step 1's gradient table
# rows that failed (the only step whose gradients are judged) with the first mismatching tensor
# named, the verdict, and the run's last lines.
explain() {
    local out=$1
    {
        grep -m5 -E '^(error|FAIL)' "$out"
        grep -m1 -E '^  step [0-9]+: loss .* differs from the baseline' "$out"   # the first step whose loss is off
        if grep -q 'gradients, parallel (gathered) vs baseline' "$out"; then
            local first; first=$(awk '/gradients, parallel \(gathered\) vs baseline/ {t=1; next} t && /^step/ {exit} t && /FAIL$/ {print $1; exit}' "$out")
            [ -n "$first" ] && echo "first mismatching tensor at step 1: $first"
            awk '/gradients, parallel \(gathered\) vs baseline/ {t=1; print; next} t && /^step/ {exit} t && /FAIL$/' "$out" | head -12
        fi
        grep -m3 -E 'MISMATCH|^PARITY (OK|FAILED)' "$out"
        echo "... the run's last lines:"
        tail -8 "$out"
    } | head -40 | sed 's/^/      | /'
}
while read -r np expect flags; do
    lineno=$((lineno+1))
    case "$np" in ''|'#'*) continue;; esac
    [ -n "${CHECKS_LINES:-}" ] && [[ " $CHECKS_LINES " != *" $lineno "* ]] && continue
    [ -n "${CHECKS_KINDS:-}" ] && [[ " $CHECKS_KINDS " != *" $expect "* ]] && { other_kinds=$((other_kinds+1)); continue; }
    [ -n "${MAX_NP:-}" ] && [ "$np" -gt "$MAX_NP" ] 2>/dev/null && { skipped=$((skipped+1)); continue; }
    [ "${STOP_AT_FIRST_FAILURE:-0}" = 1 ] && [ $failed -gt 0 ] && { stopped=", stopped at the first failure"; break; }
    [ -n "${CHECKS_DEADLINE:-}" ] && [ "$(date +%s)" -ge "$CHECKS_DEADLINE" ] && { late=$((late+1)); continue; }
    out=$log/run.txt
    if [ "$expect" = unit ] || [ "$expect" = script ]; then
        if [ "$expect" = unit ]; then
            timeout "$(limit 300)" $mpirun_base -np "$np" "$root/$backend/tests/$flags" </dev/null >"$out" 2>&1
        else
            script=${flags%% *}; args=""
            case "$flags" in *' '*) args=${flags#* };; esac
            MPIRUN_BASE=$mpirun_base timeout "$(limit 600)" bash "$dir/$script" "$bin" "$np" $args </dev/null >"$out" 2>&1
        fi
        rc=$?
        cut_short $rc && { late=$((late+1)); continue; }
        printf '%s\t%s\t%s\t%s\t%s\t-\n' $lineno "$np" "$expect" "$flags" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" >> "$results"
        if [ $rc -eq 0 ]; then
            printf 'ok    check-%s  NP=%-2s %-5s %s\n' "$tag" "$np" "$expect" "$(tail -1 "$out")"; passed=$((passed+1))
        else
            printf 'FAIL  check-%s  NP=%-2s %-5s %s  (exit %d)\n' "$tag" "$np" "$expect" "$flags" $rc
            explain "$out"
            failed=$((failed+1))
        fi
        continue
    fi
    # Every rank of a layout that fails ends by itself (a parity failure, a refused input: each
    # rank returns its status after MPI_Finalize), yet after a non-zero exit Open MPI would wait
    # its odls_base_sigkill_timeout (1 s) before signalling ranks that are already gone: 0 takes a
    # second off each failing run (the deliberate bugs, every wrong answer of tests/mutations.py,
    # the student copies' layouts), as in t_bad_input. A rank that hangs still meets the timeout.
    timeout "$(limit 300)" $mpirun_base --mca odls_base_sigkill_timeout 0 -np "$np" "$bin" --check --out "$log/out" $flags </dev/null >"$out" 2>&1
    rc=$?
    cut_short $rc && { late=$((late+1)); continue; }
    # a "fail" layout must be caught by the parity check itself, not by anything else
    if { [ "$expect" = pass ] && [ $rc -eq 0 ] && grep -q '^PARITY OK' "$out"; } ||
       { [ "$expect" = fail ] && [ $rc -eq 1 ] && grep -q '^PARITY FAILED' "$out"; }; then
        printf 'ok    check-%s  NP=%-2s %-5s %s\n' "$tag" "$np" "$expect" "$flags"; passed=$((passed+1))
        printf '%s\t%s\t%s\t%s\tok\t-\n' $lineno "$np" "$expect" "$flags" >> "$results"
    else
        # a deliberate bug that went through: the run matched the baseline with it in
        detail=-; [ "$expect" = fail ] && [ $rc -eq 0 ] && grep -q '^PARITY OK' "$out" && detail=matched-baseline
        # a run that matched the baseline (no loss, tensor or parameter line failed) and failed only
        # on a measured figure beside its formula (memory, traffic, work): grade.py credits it to an
        # exercise whose code is written when another exercise graded by it, a formula, is not
        if [ "$expect" = pass ] && [ $rc -eq 1 ] && grep -q '^PARITY FAILED' "$out" &&
           grep -q '^  FAIL: ' "$out" && ! grep '^  FAIL: ' "$out" | grep -qv 'formula' &&
           ! grep -qE '^  step [0-9]+: loss .* differs from the baseline|  FAIL$' "$out"; then
            detail=formulas-only
        fi
        printf '%s\t%s\t%s\t%s\tFAIL\t%s\n' $lineno "$np" "$expect" "$flags" $detail >> "$results"
        printf 'FAIL  check-%s  NP=%-2s %-5s %s  (exit %d)\n' "$tag" "$np" "$expect" "$flags" $rc
        explain "$out"
        failed=$((failed+1))
    fi
done < "$dir/checks.txt"
# the grade per exercise: in a student copy, or asked for (GRADE=1); not when stopped early
graded=""
if [ -f "$dir/exercises.txt" ] && { [ -f .student-copy ] || [ "${GRADE:-0}" = 1 ]; } &&
   [ "${STOP_AT_FIRST_FAILURE:-0}" != 1 ] && [ -z "${MAX_NP:-}" ] && [ -z "${CHECKS_KINDS:-}" ]; then
    python3 tools/grade.py "$nn" "$results" --json "${GRADE_JSON:-grade.json}" && graded=yes
fi
[ -n "${CHECKS_RESULTS:-}" ] && cp "$results" "$CHECKS_RESULTS"
rm -rf "$log"
# a student copy without the grade table: where the exercises still wait
todo=$(grep -n 'TODO (assignment)' "$dir"*.c 2>/dev/null)
if [ -n "$todo" ] && [ -z "$graded" ]; then
    echo "unfinished exercises (make assignment-$nn removed these regions):"
    echo "$todo" | sed -E 's/^([^:]*:[0-9]+):[[:space:]]*/  \1  /'
fi
[ $late -gt 0 ] && stopped=", $late not run or cut short: CHECKS_DEADLINE passed$stopped"
[ $skipped -gt 0 ] && stopped=", $skipped skipped: more than MAX_NP=$MAX_NP ranks$stopped"
[ $other_kinds -gt 0 ] && stopped=", $other_kinds not of the kinds CHECKS_KINDS=\"$CHECKS_KINDS\" skipped$stopped"
echo "check-$nn: $passed passed, $failed failed ($passed/$((passed + failed)) layouts$stopped)"
[ $failed -eq 0 ]
