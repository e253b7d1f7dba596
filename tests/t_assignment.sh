#!/usr/bin/env bash
# t_assignment.sh: every chapter with exercises (BEGIN ASSIGNMENT regions) can be handed out and
# graded: `make assignment-NN` writes a student copy with the regions removed, the copy builds,
# and its `make check-NN` fails until the student writes the missing lines (the full tutorial's
# check-NN, run by the rest of the suite, passes). The copy's check stops at its first failing
# layout: failing once is what is asked of it here.
set -u
. tests/check_lib.sh   # n, bad, $tmp, tracked_copy
for dir in [0-9][0-9]_*/; do
    grep -qs 'BEGIN ASSIGNMENT' "$dir"*.c || continue
    nn=${dir:0:2}; n=$((n+1)); dest=$tmp/student_$nn
    if ! make --no-print-directory assignment-$nn DEST="$dest" >"$tmp/a.txt" 2>&1; then
        echo "make assignment-$nn failed"; cat "$tmp/a.txt"; bad=$((bad+1)); continue
    fi
    if grep -rqs --include='*.c' --include='*.h' 'BEGIN ASSIGNMENT' "$dest/$dir"; then echo "assignment-$nn left a region in place"; bad=$((bad+1)); fi
    # (-O1 gives the same bits as the default -O3, Makefile, and compiles faster: a copy is only built and failed here;
    # the tutorial's own objects are the start, as tests/mutations.py's sandbox: the copy keeps its files' times
    # (tar), so make compiles only the files make assignment wrote, and links)
    [ -d "${BUILD_ROOT:-build}/cpu" ] && mkdir -p "$dest/build" && cp -a "${BUILD_ROOT:-build}/cpu" "$dest/build/cpu"
    if ! CFLAGS="-O1 -g -fno-math-errno" make --no-print-directory -C "$dest" -j2 BUILD_ROOT="$dest/build" BACKEND=cpu \
            "$dest/build/cpu/$nn" >"$tmp/b.txt" 2>&1; then
        echo "the student copy of chapter $nn does not build"; tail -20 "$tmp/b.txt"; bad=$((bad+1)); continue
    fi
    if (cd "$dest" && STOP_AT_FIRST_FAILURE=1 ./tests/run_checks.sh cpu "$nn" "$dest/build") >"$tmp/c.txt" 2>&1; then
        echo "check-$nn passes on the student copy with the exercises removed: it grades nothing"; bad=$((bad+1))
    fi
done
# a student copy is refused inside the repository, next to the solutions (and nothing is written)
if make --no-print-directory assignment-00 DEST=student/inside >"$tmp/r.txt" 2>&1 || [ -e student/inside ]; then
    echo "make assignment-00 DEST=student/inside was not refused"; bad=$((bad+1)); rm -rf student/inside
fi
# a copy is made of the files git tracks: an editor's backup in a chapter folder is refused by name
# (one line, exit 2, nothing written), and UNTRACKED=ok leaves it out of the copy. Tried in a
# tracked_copy (check_lib.sh), never in this tree.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    repo=$tmp/repo; tracked_copy "$repo"
    stray=00_naive_tp_mlp/tp_mlp.c~; : >"$repo/$stray"
    make --no-print-directory -C "$repo" assignment-00 DEST="$tmp/stray" >"$tmp/s.out" 2>"$tmp/s.err"; rc=$?
    if [ $rc -ne 2 ] || [ -e "$tmp/stray" ] || ! grep -q "files git does not track: .*tp_mlp.c~" "$tmp/s.err" ||
       [ "$(grep -vc 'Error 2' "$tmp/s.err")" -ne 1 ]; then
        echo "an untracked file in a chapter folder was not refused (exit $rc):"; cat "$tmp/s.out" "$tmp/s.err"; bad=$((bad+1))
    fi
    if ! UNTRACKED=ok make --no-print-directory -C "$repo" assignment-00 DEST="$tmp/stray" >/dev/null 2>&1 || [ -e "$tmp/stray/$stray" ]; then
        echo "UNTRACKED=ok did not make a copy without the untracked file"; bad=$((bad+1))
    fi
fi
echo "$((n-bad)) of $n chapters' exercises are gradable by make check-NN; a copy inside the repository is refused; a copy holds tracked files only"
[ $bad -eq 0 ] && [ $n -gt 0 ]
