#!/usr/bin/env bash
# t_student_copy.sh: a student copy holds no answer. For every chapter with exercises, `make
# assignment-NN` writes a copy, and tools/student_copy_leaks.py looks through it for each line
# the copy lost (normalised: comments stripped, whitespace collapsed; short lines and idioms
# skipped), for BEGIN/END ASSIGNMENT and SOLUTION marker lines, for a chapter after NN, hints/
# and docs/instructor/; any hit fails, named file:line. The removed lines' string literals count
# too: a formula the solved program prints, shown in a README's output block, gives the exercise
# away (make_assignment.sh scrubs them from the copy's markdown). Then it shows it can fail: a line
# of an exercise's answer, a marker and a printed formula planted in a copy are all found.
set -u
. tests/check_lib.sh   # n, bad, $tmp, tracked_copy
src=$(pwd); last=""
for dir in [0-9][0-9]_*/; do
    grep -qs 'BEGIN ASSIGNMENT' "$dir"*.c || continue
    nn=${dir:0:2}; n=$((n+1)); dest=$tmp/student_$nn; last=$nn
    if ! make --no-print-directory assignment-$nn DEST="$dest" >"$tmp/a.txt" 2>&1; then
        echo "FAIL  make assignment-$nn"; cat "$tmp/a.txt"; bad=$((bad+1)); continue
    fi
    # the scrub replaced printed formulas only: never a command a student runs or a README's check runs
    if grep -rn --include='*.md' -E "(make |mpirun|<!-- output).*an exercise's answer: removed" "$dest" > "$tmp/s.txt"; then
        echo "FAIL  the scrub of copy $nn rewrote commands:"; sed 's/^/      | /' "$tmp/s.txt" | head -5; bad=$((bad+1))
    fi
    if python3 tools/student_copy_leaks.py "$src" "$dest" "$nn" >"$tmp/l.txt" 2>&1; then
        echo "ok    $(tail -1 "$tmp/l.txt")"
    else
        echo "FAIL  student copy $nn gives answers away:"; sed 's/^/      | /' "$tmp/l.txt"; bad=$((bad+1))
    fi
    # every chapter after NN left out, and the copy's Makefile still knows the chapters it has
    for d in [0-9][0-9]_*/; do
        if [ "${d:0:2}" \> "$nn" ] && [ -e "$dest/$d" ]; then echo "FAIL  the copy for $nn holds $d"; bad=$((bad+1)); fi
    done
done
# the checker can fail: plant one line of the last chapter's first exercise and a marker
if [ -n "$last" ]; then
    dir=$(ls -d "$last"_*/ | head -1); dest=$tmp/student_$last
    line=$(awk '/BEGIN ASSIGNMENT/ {t=1; next} /END ASSIGNMENT/ {t=0} t && length($0) > 30 {print; exit}' "$dir"*.c)
    { echo "/* planted by t_student_copy.sh */"; echo "$line"; } > "$dest/common/planted_leak.c"
    echo "/* BEGIN SOLUTION */" >> "$dest/${dir}planted_marker.h"
    python3 tools/student_copy_leaks.py "$src" "$dest" "$last" >"$tmp/p.txt" 2>&1; rc=$?
    if [ $rc -eq 1 ] && grep -q '^common/planted_leak.c:2: repeats the removed line' "$tmp/p.txt" &&
       grep -q "^${dir}planted_marker.h:1: a marker line left" "$tmp/p.txt"; then
        echo "ok    a planted answer line and a planted marker are found (common/planted_leak.c:2, ${dir}planted_marker.h:1)"
    else
        echo "FAIL  the planted leak was not reported (exit $rc):"; sed 's/^/      | /' "$tmp/p.txt"; bad=$((bad+1))
    fi
    # and a formula the solved program prints (a string literal of a removed passage), planted in
    # a README's output block as a run of the solved program would show it
    lit=$(awk '/BEGIN (SOLUTION|ASSIGNMENT)/ {t=1; next} /END (SOLUTION|ASSIGNMENT)/ {t=0}
               t && match($0, /"[^"%]*[a-zA-Z][^"%]* [^"%]*"/) && RLENGTH > 14 {print substr($0, RSTART + 1, RLENGTH - 2); exit}' "$dir"*.c)
    rm -f "$dest/common/planted_leak.c" "$dest/${dir}planted_marker.h"
    if [ -n "$lit" ]; then
        printf '```\n  rank 0  %s\n```\n' "$lit" >> "$dest/${dir}README.md"
        python3 tools/student_copy_leaks.py "$src" "$dest" "$last" >"$tmp/p.txt" 2>&1; rc=$?
        if [ $rc -eq 1 ] && grep -q "^${dir}README.md:[0-9]*: repeats the removed line" "$tmp/p.txt"; then
            echo "ok    a planted printed formula is found (${dir}README.md: $lit)"
        else
            echo "FAIL  the planted printed formula '$lit' was not reported (exit $rc):"; sed 's/^/      | /' "$tmp/p.txt"; bad=$((bad+1))
        fi
    else
        echo "FAIL  no string literal in chapter $last's removed passages to plant"; bad=$((bad+1))
    fi
fi
# make assignment runs the checker itself: a tracked file that repeats an answer's line gives no
# copy (one line naming it, exit 2, nothing written), and so does a line that matches an answer
# declared in docs/instructor/leaks/NN.txt (a derivation's result written another way). Tried in a
# tracked_copy (check_lib.sh), never in this tree.
if [ -n "$last" ]; then
    dir=$(ls -d "$last"_*/ | head -1); repo=$tmp/repo; tracked_copy "$repo"
    line=$(awk '/BEGIN ASSIGNMENT/ {t=1; next} /END ASSIGNMENT/ {t=0} t && length($0) > 30 {print; exit}' "$dir"*.c)
    cp -p "$repo/docs/course.md" "$tmp/course.md.orig"
    printf '\n    %s\n' "$line" >> "$repo/docs/course.md"
    make --no-print-directory -C "$repo" assignment-$last DEST="$tmp/leaky" >"$tmp/k.out" 2>"$tmp/k.err"; rc=$?
    cp -p "$tmp/course.md.orig" "$repo/docs/course.md"
    if [ $rc -eq 2 ] && [ ! -e "$tmp/leaky" ] && grep -q "would give an answer away: docs/course.md:[0-9]*:" "$tmp/k.err" &&
       [ "$(grep -vc 'Error 2' "$tmp/k.err")" -eq 1 ]; then
        echo "ok    make assignment-$last refuses a tree whose docs/course.md repeats an answer's line (one line, exit 2, nothing written)"
    else
        echo "FAIL  make assignment-$last with an answer's line in docs/course.md: exit $rc"; sed 's/^/      | /' "$tmp/k.out" "$tmp/k.err"; bad=$((bad+1))
    fi
    ex=$(grep -v '^ *\(#\|$\)' "${dir}exercises.txt" | head -1 | cut -d'|' -f1 | tr -d ' ')
    printf '%s | %s | sets at P = \\d+: 1[13], 9 | a planted table of the asked counts\n' "$last" "$ex" >> "$repo/docs/instructor/leaks/$last.txt"
    printf '\nThe peak per rank, sets at P = 4: 11, 9, 7, 5.\n' >> "$repo/${dir}README.md"
    (cd "$repo" && git add -A)   # a chapter's first declared answer is a new file: tracked, or no copy
    make --no-print-directory -C "$repo" assignment-$last DEST="$tmp/leaky" >"$tmp/k.out" 2>"$tmp/k.err"; rc=$?
    if [ $rc -eq 2 ] && [ ! -e "$tmp/leaky" ] && grep -q "would give an answer away: ${dir}README.md:[0-9]*: gives exercise $ex away" "$tmp/k.err"; then
        echo "ok    make assignment-$last refuses a README that matches an answer declared in docs/instructor/leaks/$last.txt"
    else
        echo "FAIL  make assignment-$last with a declared answer in its README: exit $rc"; sed 's/^/      | /' "$tmp/k.out" "$tmp/k.err"; bad=$((bad+1))
    fi
fi
echo "$((n-bad)) of $n chapters' student copies hold no answer"
[ $bad -eq 0 ] && [ $n -gt 0 ]
