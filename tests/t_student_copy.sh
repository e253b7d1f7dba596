#!/usr/bin/env bash
# t_student_copy.sh: a student copy holds no answer. For every chapter with exercises, `make
# assignment-NN` writes a copy, and tests/student_copy_leaks.py looks through it for each line
# the copy lost (normalised: comments stripped, whitespace collapsed; short lines and idioms
# skipped), for BEGIN/END ASSIGNMENT and SOLUTION marker lines, for a chapter after NN, hints/
# and docs/instructor/; any hit fails, named file:line. Then it shows it can fail: a line of an
# exercise's answer and a marker planted in a copy are both found.
set -u
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
src=$(pwd)
n=0; bad=0; last=""
for dir in [0-9][0-9]_*/; do
    grep -qs 'BEGIN ASSIGNMENT' "$dir"*.c || continue
    nn=${dir:0:2}; n=$((n+1)); dest=$tmp/student_$nn; last=$nn
    if ! make --no-print-directory assignment-$nn DEST="$dest" >"$tmp/a.txt" 2>&1; then
        echo "FAIL  make assignment-$nn"; cat "$tmp/a.txt"; bad=$((bad+1)); continue
    fi
    if python3 tests/student_copy_leaks.py "$src" "$dest" "$nn" >"$tmp/l.txt" 2>&1; then
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
    python3 tests/student_copy_leaks.py "$src" "$dest" "$last" >"$tmp/p.txt" 2>&1; rc=$?
    if [ $rc -eq 1 ] && grep -q '^common/planted_leak.c:2: repeats the removed line' "$tmp/p.txt" &&
       grep -q "^${dir}planted_marker.h:1: a marker line left" "$tmp/p.txt"; then
        echo "ok    a planted answer line and a planted marker are found (common/planted_leak.c:2, ${dir}planted_marker.h:1)"
    else
        echo "FAIL  the planted leak was not reported (exit $rc):"; sed 's/^/      | /' "$tmp/p.txt"; bad=$((bad+1))
    fi
fi
echo "$((n-bad)) of $n chapters' student copies hold no answer"
[ $bad -eq 0 ] && [ $n -gt 0 ]
