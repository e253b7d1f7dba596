#!/usr/bin/env bash
# grade_many.sh DIR CSV [BACKEND]: `make grade DIR=submissions/`. Every folder of DIR that is a
# student copy (its .student-copy file names the chapter, as make assignment-NN wrote it) is
# graded as `make check-NN` grades it, and one CSV gathers the results: a row per student
# (the folder's name), a column per exercise (the points earned), the total and what it was out
# of, and a note (did not build, ...). Each student's grade.json and the check's output
# (grade.log) are left in the student's folder.
# Each submission is graded in a sandbox (tools/grade_sandbox.py): a fresh student copy of this
# tutorial (make assignment-NN, made once per chapter and built once) into which only the
# student's answers are put, the lines between each exercise's two ANSWER lines. What the student
# changed anywhere else (common/, the tests, the scripts, the graders, the rest of the chapter) is
# not used and is listed in grade.json as "ignored"; an answer whose ANSWER lines were removed
# cannot be taken, and grade.json lists it under "markers_missing".
set -u
dir=${1:-}; csv=${2:-}; backend=${3:-cpu}
[ -n "$dir" ] && [ -d "$dir" ] || { echo "make grade: DIR=$dir is not a folder of student copies (make grade DIR=submissions/)" >&2; exit 2; }
[ -n "$csv" ] || csv=$dir/grades.csv
# The CSV, checked before anything is graded: a new file beside it, written at the end and renamed
# into place (a failure leaves the previous CSV, or none, and says so in one line).
[ -d "$csv" ] && { echo "make grade: CSV=$csv is a directory: give a file name" >&2; exit 2; }
[ -L "$csv" ] && { echo "make grade: CSV=$csv is a symbolic link: the CSV is written aside and renamed into its place, which would replace the link; give the file itself" >&2; exit 2; }
csv_tmp=$(mktemp "$csv.tmp.$$.XXXXXXXX" 2>/dev/null) || {
    echo "make grade: CSV=$csv cannot be written: cannot create a file in $(dirname "$csv") ($( (: >"$csv.probe.$$") 2>&1 | sed 's/.*: //' | head -1))" >&2
    rm -f "$csv.probe.$$"; exit 2; }
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; rm -f "$csv_tmp"' EXIT
shopt -s nullglob   # an empty DIR: no folder, no false "skip *" line
# JOBS=N (make grade DIR=... JOBS=N): N submissions graded at once, each in its own sandbox and
# build; the CSV's rows and the lines printed are in DIR's order whatever finishes first, and the
# grades are those of one at a time (JOBS=1, the default). Each sandbox's build then runs with
# make -j(cores / N), at least 1.
jobs=${JOBS:-1}
case "$jobs" in ''|*[!0-9]*|0) echo "make grade: JOBS=$jobs is not a number of submissions to grade at once (1 or more)" >&2; exit 2;; esac
cores=$(nproc 2>/dev/null || echo 2)
build_jobs=$(( cores / jobs > 0 ? cores / jobs : 1 ))
# the submissions, in DIR's order, and the reference copy of each chapter they need, made and
# built once before any is graded: every sandbox starts from it, and make rebuilds there only what
# the answers touch
subs=(); nns=(); chapters=()
for sub in "$dir"/*/; do
    sub=${sub%/}; student=$(basename "$sub")
    [ -f "$sub/.student-copy" ] || { echo "skip  $student: not a student copy (no .student-copy)"; continue; }
    nn=$(tr -dc 0-9 < "$sub/.student-copy" | head -c 2)
    chapter=$(cd "$src" && ls -d "${nn}"_*/ 2>/dev/null | head -1)
    [ -n "$chapter" ] || { echo "skip  $student: chapter $nn is not in this tutorial"; continue; }
    subs+=("$sub"); nns+=("$nn"); chapters+=("$chapter")
    ref=$tmp/ref_$nn
    if [ ! -d "$ref" ]; then
        "$src/tools/make_assignment.sh" "$nn" "$ref" >"$tmp/ref_$nn.log" 2>&1 || {
            echo "make grade: could not make the reference copy of chapter $nn: $(tail -1 "$tmp/ref_$nn.log")" >&2; exit 2; }
        make --no-print-directory -C "$ref" -j"$cores" BACKEND="$backend" "build-$nn" >"$tmp/ref_$nn.build" 2>&1 || true
    fi
done
# grade_one I: grade submission I (in a subshell); its CSV row goes to $tmp/row.I (none when it is
# skipped), what it prints to $tmp/say.I
grade_one() {
    local i=$1 sub=${subs[$1]} nn=${nns[$1]} chapter=${chapters[$1]}
    local student; student=$(basename "$sub")
    local ref=$tmp/ref_$nn work=$tmp/subs/$student note="" counts
    exec >"$tmp/say.$i" 2>&1
    rm -f "$sub/grade.json"   # (a grade.json the student left would otherwise be counted if this one fails)
    if ! python3 "$src/tools/grade_sandbox.py" "$ref" "$sub" "$work" 2>"$tmp/sandbox.err.$i"; then
        echo "skip  $student: no sandbox could be made ($(tail -1 "$tmp/sandbox.err.$i"))"; rm -rf "$work"; return
    fi
    if ! make --no-print-directory -C "$work" -j"$build_jobs" BACKEND="$backend" "build-$nn" >"$work/build.log" 2>&1; then
        note="did not build"; cp "$work/build.log" "$sub/grade.log"
    else
        make --no-print-directory -C "$work" BACKEND="$backend" "check-$nn" >"$sub/grade.log" 2>&1
        [ -f "$work/grade.json" ] || note="no grade.json (see grade.log)"
    fi
    if [ -f "$work/grade.json" ]; then   # with what the sandbox took and what it ignored
        python3 - "$work/grade.json" "$work/.sandbox.json" "$sub/grade.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1])); box = json.load(open(sys.argv[2]))
g["ignored"] = box["ignored"]; g["markers_missing"] = box["markers_missing"]
json.dump(g, open(sys.argv[3], "w"), indent=1)
PY
    else rm -f "$sub/grade.json"; fi
    counts=$(python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); print(len(b["ignored"]), len(b["markers_missing"]))' "$work/.sandbox.json")
    [ "${counts%% *}" != 0 ] && note="${note:+$note; }${counts%% *} file(s) changed outside the answers, ignored (grade.json)"
    [ "${counts##* }" != 0 ] && note="${note:+$note; }${counts##* } answer(s) without their ANSWER lines, not taken"
    rm -rf "$work"
    python3 - "$student" "$nn" "$sub/grade.json" "$note" "$src/${chapter}exercises.txt" >"$tmp/row.$i" <<'PY'
import json, os, re, sys
student, nn, path, note, exfile = sys.argv[1:]
if os.path.exists(path):
    g = json.load(open(path))
    ex = [(e["name"], e["points"], e["possible"]) for e in g["exercises"]]
else:   # nothing graded: every exercise of the chapter at 0
    ex = []
    for line in open(exfile):
        if line.strip() and not line.lstrip().startswith("#"):
            f = [x.strip() for x in re.split(r"(?<=\s)\|(?=\s|$)", line)]
            ex.append((f[0], 0.0, float(f[1])))
print(json.dumps({"student": student, "chapter": nn, "exercises": ex, "note": note}))
PY
    python3 - "$tmp/row.$i" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
num = lambda x: ("%.2f" % x).rstrip("0").rstrip(".")   # to 2 decimals: 24.999999 -> 25, 2.50 -> 2.5
print(f"graded {r['student']} (chapter {r['chapter']}): {num(sum(e[1] for e in r['exercises']))} of "
      f"{num(sum(e[2] for e in r['exercises']))} points" + (f" ({r['note']})" if r["note"] else ""))
PY
}
mkdir -p "$tmp/subs"
# JOBS at a time; each one's lines printed in DIR's order, as soon as those before it are done
total=${#subs[@]}; next=0; shown=0; running=0
show() { while [ $shown -lt $total ] && [ -f "$tmp/done.$shown" ]; do cat "$tmp/say.$shown"; shown=$((shown+1)); done; }
while [ $next -lt $total ] || [ $running -gt 0 ]; do
    while [ $next -lt $total ] && [ $running -lt $jobs ]; do
        ( grade_one $next; : > "$tmp/done.$next" ) &
        next=$((next+1)); running=$((running+1))
    done
    wait -n; running=$((running-1))
    show
done
show
rows=$tmp/rows.jsonl; : > "$rows"; n=0
for ((i = 0; i < total; i++)); do
    [ -s "$tmp/row.$i" ] && { cat "$tmp/row.$i" >> "$rows"; n=$((n+1)); }
done
[ $n -gt 0 ] || { echo "make grade: no student copy in $dir (a folder with a .student-copy file, as make assignment-NN writes it)" >&2; exit 2; }
python3 - "$rows" "$csv_tmp" <<'PY'
import csv, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
num = lambda x: ("%.2f" % x).rstrip("0").rstrip(".")   # points to 2 decimals: 24.999999 -> 25
cols = []
for r in rows:
    for name, _, _ in r["exercises"]:
        c = f"{r['chapter']}:{name}"
        if c not in cols:
            cols.append(c)
with open(sys.argv[2], "w", newline="") as f:   # (the temporary beside the CSV)
    w = csv.writer(f)
    w.writerow(["student", "chapter"] + cols + ["total", "possible", "note"])
    for r in rows:
        pts = {f"{r['chapter']}:{n}": p for n, p, _ in r["exercises"]}
        w.writerow([r["student"], r["chapter"]] + [num(pts[c]) if c in pts else "" for c in cols]
                   + [num(sum(p for _, p, _ in r["exercises"])), num(sum(q for _, _, q in r["exercises"])), r["note"]])
PY
[ $? -eq 0 ] && mv -f "$csv_tmp" "$csv" || { echo "make grade: could not write $csv; the previous file, if any, is as it was" >&2; exit 2; }
echo "wrote $csv: $n student(s)"
