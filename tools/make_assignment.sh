#!/usr/bin/env bash
# make_assignment.sh NN DEST: write a student copy of the tutorial into DEST in which the lines
# of chapter NN between "BEGIN ASSIGNMENT: <task>" and "END ASSIGNMENT" are replaced by a TODO
# naming the task. `make check-NN` run inside DEST grades the student's work: every layout of
# checks.txt must pass and every deliberate bug must still be caught.
#
# The copy holds chapters 00 to NN and no later one: the earlier chapters are the course so far
# (their solutions stay, their BEGIN/END ASSIGNMENT marker lines are dropped), a later chapter
# would hold answers (its code reuses this chapter's technique, solved). With the later chapters
# go the unit tests of their code (their chapter.mk's TESTS_MM, or a test that includes their
# headers) and the scripted tests (tests/t_*.sh) that name them or those unit tests; `make
# check-NN` and `make test` then run on what is there.
#
# The copy leaves out what would hand the student the answers:
#   - every chapter's hints/ (graded hints per exercise, for the instructor to hand out);
#   - docs/instructor/ (the answer key of the written questions) and tools/student_copy_allow.txt
#     (the lines a copy may repeat: it quotes them);
#   - solution passages, wherever the text repeats an exercise's answer, between markers that
#     stand alone on their lines:
#       markdown:      <!-- BEGIN SOLUTION [NN][: note] -->  ...  <!-- END SOLUTION -->
#       C, CUDA:       /* BEGIN SOLUTION [NN][: note] */     ...  /* END SOLUTION */
#                      (or // BEGIN SOLUTION ... and // END SOLUTION)
#     A markdown passage becomes one line saying it was removed; a C passage becomes a TODO
#     comment, so the file still compiles (wrap whole statements, or a function's body: the test
#     then skips that check, or fails it). NN names the chapter whose exercise the passage
#     answers: it is removed from that chapter's copy and from every earlier chapter's (where a
#     shared file, tests/ or the root README, holds a later chapter's answer); in a later
#     chapter's copy only its marker lines go. Without NN, a passage is removed from the copy of
#     the chapter whose folder holds the file, and from every copy when the file lies outside the
#     chapter folders (tests/, docs/, the root README).
# No BEGIN/END ASSIGNMENT or SOLUTION marker line is left in the copy's sources and markdown.
# Each region becomes three lines: "ANSWER BEGIN (assignment): <task>", the TODO, and "ANSWER END
# (assignment): <task>". The student writes the answer between the two ANSWER lines and keeps
# them: make grade takes exactly those lines from a submission, and everything else from a fresh
# copy of this tutorial (tools/grade_sandbox.py).
# The copy's .student-copy file names the chapter: `make check-NN` there prints the grade per
# exercise (NN_*/exercises.txt, tools/grade.py) and writes grade.json.
set -eu
nn=$1; dest=$2
src=$(cd "$(dirname "$0")/.." && pwd)
dir=$(cd "$src" && ls -d "${nn}"_*/ 2>/dev/null | head -1) || true
[ -n "$dir" ] || { echo "make assignment-$nn: no chapter $nn" >&2; exit 2; }
# outside the repository: a student copy inside it would sit next to the solutions (and git)
abs=$(realpath -m "$dest")
case "$abs/" in "$src"/*)
    echo "make assignment-$nn: DEST=$dest is inside the repository ($src), next to the solutions; pick a directory outside it (the default is $(dirname "$src")/student-$nn)" >&2
    exit 2;;
esac
[ -e "$dest" ] && { echo "make assignment-$nn: $dest exists; remove it or pick another DEST=" >&2; exit 2; }
# The copy is made in a folder of its own beside DEST and renamed into place once whole: a failure
# (a full disk, a malformed marker) leaves nothing behind, says what in one line (the tools'
# own messages go to a log whose first line the one line quotes), and a retry starts afresh.
final=$dest
parent=$(dirname "$abs")
mkdir -p "$parent" 2>/dev/null || { echo "make assignment-$nn: cannot create $(dirname "$dest")" >&2; exit 2; }
dest=$(mktemp -d "$abs.tmp.$$.XXXXXXXX" 2>/dev/null) ||
    { echo "make assignment-$nn: cannot create a folder in $(dirname "$final") for the copy" >&2; exit 2; }
errlog=$(mktemp 2>/dev/null) || errlog=/dev/null
exec 3>&2 2>>"$errlog"
fail() {
    # the log's first line (grep -m1 stops by itself: `grep | head -1` left grep writing into a
    # closed pipe, and with SIGPIPE ignored and pipefail on, its status 2 ended the script under
    # set -e here, before the one line: the exit 2 without a message t_full_disk once saw)
    local first; first=$(grep -m1 . "$errlog" 2>/dev/null | sed 's/^tar: //' | cut -c1-200) || first=""
    echo "make assignment-$nn: $1${first:+ ($first)}; nothing written (DEST=$final is left as it was)" >&3
    exit 2
}
trap 'rm -rf "$dest"; [ "$errlog" = /dev/null ] || rm -f "$errlog"' EXIT
trap 'fail "could not write the copy into $final"' ERR
set -o pipefail
# A reader that stops early (a full disk ends tar xf) must not kill a writer of this script with
# SIGPIPE (exit 141, no line): with the signal ignored the write fails, the pipeline's status says
# so, and the ERR trap above gives the one line. (make test ran t_full_disk beside another test
# once and got exit 141 with no message.)
trap '' PIPE
# every file of the tutorial but builds, outputs and earlier student copies
# and the instructors' hints (they are handed out, not shipped)
# and the chapters after NN (see the top)
later=(); later_nn=()
for d in "$src"/[0-9][0-9]_*/; do
    d=$(basename "$d"); [ "${d:0:2}" \> "$nn" ] || continue
    later+=("--exclude=./$d"); later_nn+=("${d:0:2}")
done
# From a git checkout: the files git tracks, and nothing else (no build output, editor backups,
# a stray build-cuda/ or patch leftovers); a file git does not track and does not ignore is
# refused, named, unless UNTRACKED=ok leaves it out knowingly. From an exported tree (no git):
# every file, less the build, outputs and the usual backups.
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    untracked=$(set +o pipefail; cd "$src" && git ls-files --others --exclude-standard | { grep -vE '^(student|build|out)/' || true; } | head -6)
    if [ -n "$untracked" ] && [ "${UNTRACKED:-}" != ok ]; then
        echo "make assignment-$nn: the tree has files git does not track: $(echo "$untracked" | head -5 | paste -sd' ')$([ "$(echo "$untracked" | wc -l)" -gt 5 ] && echo ' ...'); a copy is made of tracked files only: commit or remove them, or run with UNTRACKED=ok to leave them out; nothing written" >&3
        exit 2
    fi
    later_re=""; for d in "${later[@]}"; do later_re="$later_re|^${d#--exclude=./}/"; done
    (cd "$src" && git ls-files -z --cached |
        grep -zvE "^[0-9][0-9]_[^/]*/hints/|^docs/instructor/|^tools/student_copy_allow\.txt\$|^grade\.json\$|^local\.mk\$$later_re" |
        while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done |
        tar cf - --null --no-recursion -T -) | (cd "$dest" && tar xf -)
else
    (cd "$src" && tar cf - --exclude=./build --exclude=./out --exclude=./student --exclude=./.git \
        --exclude='./[0-9][0-9]_*/hints' --exclude=./docs/instructor --exclude=./tools/student_copy_allow.txt --exclude=./grade.json \
        --exclude=./local.mk --exclude='*~' --exclude='*.orig' --exclude='*.rej' --exclude='*.bak' --exclude='./build-*' \
        "${later[@]}" .) | (cd "$dest" && tar xf -)
fi
# the unit tests of a later chapter's code, and the scripted tests naming a later chapter
dropped=()
for mm in "${later_nn[@]}"; do
    for t in $(sed -n "s/^TESTS_$mm *[:+]*= *//p" "$src/${mm}"_*/chapter.mk 2>/dev/null); do dropped+=("$t"); done
    for f in "$dest"/tests/test_*.c; do
        grep -qE "#include \"\.\./${mm}_" "$f" && dropped+=("$(basename "$f" .c)")
    done
done
for t in "${dropped[@]}"; do rm -f "$dest/tests/$t.c"; done
pat=""
for mm in "${later_nn[@]}"; do pat="$pat|${mm}_[a-z]|chapter $mm|[/-]$mm([^0-9]|\$)"; done
for t in "${dropped[@]}"; do pat="$pat|$t"; done
if [ -n "$pat" ]; then
    for f in "$dest"/tests/t_*.sh; do
        grep -qE "${pat#|}" "$f" && rm -f "$f"
    done
fi
echo "$nn" > "$dest/.student-copy"
# student code may leave a variable unused until it is written: warnings stay warnings there
echo "WERROR :=" > "$dest/local.mk"
# the earlier chapters' exercises stay solved: only their marker lines go
for f in "$dest"/[0-9][0-9]_*/*.c "$dest"/[0-9][0-9]_*/*.h "$dest"/[0-9][0-9]_*/*.cu; do
    [ -f "$f" ] || continue
    case "$f" in "$dest/$dir"*) continue;; esac
    grep -qE '(BEGIN|END) ASSIGNMENT' "$f" || continue
    grep -vE '^[[:space:]]*(/\*|//)[[:space:]]*(BEGIN ASSIGNMENT|END ASSIGNMENT)' "$f" > "$f.tmp" && mv "$f.tmp" "$f"
done
n=0
for f in "$dest/$dir"*.c; do
    grep -q 'BEGIN ASSIGNMENT' "$f" || continue
    awk '
        /BEGIN ASSIGNMENT/ {
            task = $0; sub(/.*BEGIN ASSIGNMENT: */, "", task); sub(/ *\*\/.*/, "", task)
            indent = $0; sub(/[^ ].*/, "", indent)
            print indent "/* ANSWER BEGIN (assignment): " task " */"
            print indent "/* TODO (assignment): " task " */"
            print indent "/* ANSWER END (assignment): " task " */"
            skipping = 1; next
        }
        /END ASSIGNMENT/ { skipping = 0; next }
        !skipping { print }
    ' "$f" > "$f.tmp" && mv "$f.tmp" "$f"
    n=$((n + $(grep -c 'TODO (assignment)' "$f")))
done
[ $n -gt 0 ] || fail "chapter $nn has no assignment regions"
# solution passages (see the top): markdown anywhere in the copy, C and CUDA sources and headers
stripped=0
while IFS= read -r -d '' f; do
    rel=${f#"$dest"/}
    case "$rel" in
        "$dir"*) where=own;;               # chapter NN's own folder
        [0-9][0-9]_*/*) where=other;;      # another chapter's folder
        *) where=shared;;                  # tests/, docs/, common/, the root files
    esac
    case "$f" in *.md) kind=md;; *) kind=c;; esac
    awk -v nn="$nn" -v where="$where" -v kind="$kind" -v file="$rel" -v countfile="$f.count" '
        function marker(line, word,    t) {      # "=" and the text after the word, or "" if line is not that marker
            t = line
            if (kind == "md") {
                if (t !~ /^[ \t]*<!--[ \t]*/ || t !~ /-->[ \t]*$/) return ""
                sub(/^[ \t]*<!--[ \t]*/, "", t); sub(/[ \t]*-->[ \t]*$/, "", t)
            } else if (t ~ /^[ \t]*\/\*/) {
                if (t !~ /\*\/[ \t]*$/) return ""
                sub(/^[ \t]*\/\*[ \t]*/, "", t); sub(/[ \t]*\*\/[ \t]*$/, "", t)
            } else if (t ~ /^[ \t]*\/\//) {
                sub(/^[ \t]*\/\/[ \t]*/, "", t); sub(/[ \t]*$/, "", t)
            } else return ""
            if (index(t, word) != 1) return ""
            t = substr(t, length(word) + 1)
            if (t != "" && t !~ /^[ \t:]/) return ""   # BEGIN SOLUTIONS... is not a marker
            return "=" t
        }
        {
            b = marker($0, "BEGIN SOLUTION"); e = marker($0, "END SOLUTION")
            if (b != "") {
                if (open) { printf "%s:%d: BEGIN SOLUTION inside another (opened at line %d)\n", file, NR, open_at > "/dev/stderr"; bad = 1; exit 3 }
                rest = substr(b, 2); sub(/^[ \t]*/, "", rest)
                ch = ""; note = ""
                if (rest ~ /^[0-9][0-9]([ \t:]|$)/) { ch = substr(rest, 1, 2); rest = substr(rest, 3); sub(/^[ \t]*/, "", rest) }
                if (rest ~ /^:/) { note = substr(rest, 2); sub(/^[ \t]*/, "", note) }
                open = 1; open_at = NR
                strip = ch != "" ? ch >= nn : where != "other"
                if (!strip) next
                if (kind == "md") print "*(removed from the student copy: it is the answer to an exercise)*"
                else {
                    indent = $0; sub(/[^ \t].*/, "", indent)
                    print indent "/* TODO (removed from the student copy: " (note != "" ? note : "the answer to an exercise") ") */"
                }
                removed++; next
            }
            if (e != "") {
                if (!open) { printf "%s:%d: END SOLUTION without a BEGIN\n", file, NR > "/dev/stderr"; bad = 1; exit 3 }
                open = 0
                strip = 0; next
            }
            if (!strip) print
        }
        END {
            if (bad) exit 3
            if (open) { printf "%s:%d: BEGIN SOLUTION never ends\n", file, open_at > "/dev/stderr"; exit 3 }
            if (removed) print removed > countfile
        }
    ' "$f" > "$f.tmp" || fail "a solution marker in $rel is malformed"
    mv "$f.tmp" "$f"
    [ -s "$f.count" ] && stripped=$((stripped + $(cat "$f.count")))
    rm -f "$f.count"
done < <(grep -rlZ --include='*.md' --include='*.c' --include='*.h' --include='*.cu' -E '(BEGIN|END) SOLUTION' "$dest" || true)
# what the solved program printed from a removed passage (a formula of the exercise, in a README's
# output block) replaced in the copy's markdown (tools/student_copy_leaks.py --scrub)
python3 "$src/tools/student_copy_leaks.py" --scrub "$src" "$dest" "$nn" || fail "could not scrub the copy's READMEs"
# and the copy looked through for what it still gives away, every file of it (the same checker as
# tests/t_student_copy.sh): a leak, an answer's line repeated anywhere or a marker left, and no copy
leaks=$(mktemp) || fail "could not create a temporary file"
if ! python3 "$src/tools/student_copy_leaks.py" "$src" "$dest" "$nn" >"$leaks" 2>&1; then
    first=$(grep -m1 -E '^[^ ].*:[0-9]+: ' "$leaks" || tail -1 "$leaks"); rm -f "$leaks"
    echo "make assignment-$nn: the copy would give an answer away: ${first:-see tools/student_copy_leaks.py}; nothing written (mark the passage as a solution, or allow it in tools/student_copy_allow.txt)" >&3
    exit 2
fi
rm -f "$leaks"
trap - ERR
mv -T "$dest" "$abs" 2>/dev/null || fail "could not rename the finished copy to $final"
trap '[ "$errlog" = /dev/null ] || rm -f "$errlog"' EXIT   # (the copy is in place: kept)
dest=$final
echo "wrote $dest: $n exercise(s) in $dir, marked TODO (assignment); $stripped solution passage(s) removed from the text and the tests. Grade with: cd $dest && make check-$nn"
[ -d "$src/${dir}hints" ] && echo "hints for the instructor: $src/${dir}hints/ (not in the student copy)"
exit 0
