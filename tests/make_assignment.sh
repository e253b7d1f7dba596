#!/usr/bin/env bash
# make_assignment.sh NN DEST: write a student copy of the tutorial into DEST in which the lines
# of chapter NN between "BEGIN ASSIGNMENT: <task>" and "END ASSIGNMENT" are replaced by a TODO
# naming the task. `make check-NN` run inside DEST grades the student's work: every layout of
# checks.txt must pass and every deliberate bug must still be caught.
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
mkdir -p "$dest"
# every file of the tutorial but builds, outputs and earlier student copies
(cd "$src" && tar cf - --exclude=./build --exclude=./out --exclude=./student --exclude=./.git .) | (cd "$dest" && tar xf -)
# student code may leave a variable unused until it is written: warnings stay warnings there
echo "WERROR :=" > "$dest/local.mk"
n=0
for f in "$dest/$dir"*.c; do
    grep -q 'BEGIN ASSIGNMENT' "$f" || continue
    awk '
        /BEGIN ASSIGNMENT/ {
            task = $0; sub(/.*BEGIN ASSIGNMENT: */, "", task); sub(/ *\*\/.*/, "", task)
            indent = $0; sub(/[^ ].*/, "", indent)
            print indent "/* TODO (assignment): " task " */"
            skipping = 1; next
        }
        /END ASSIGNMENT/ { skipping = 0; next }
        !skipping { print }
    ' "$f" > "$f.tmp" && mv "$f.tmp" "$f"
    n=$((n + $(grep -c 'TODO (assignment)' "$f")))
done
[ $n -gt 0 ] || { echo "make assignment-$nn: chapter $nn has no assignment regions" >&2; exit 2; }
echo "wrote $dest: $n exercise(s) in $dir, marked TODO (assignment). Grade with: cd $dest && make check-$nn"
