#!/usr/bin/env bash
# t_grade.sh: grading by exercise. (1) Every chapter's exercises.txt is well formed against its
# checks.txt (every check matches a layout, every unit is one), gives full marks when every
# layout behaves, and names every TODO its student copy holds (and, those answered, leaves no
# exercise unfinished: a removed passage's placeholder is not unfinished work). (1c) On synthetic
# results: a failing layout blamed on the exercise at fault (06, 08), a deliberate bug's layout
# reads caught / not caught, points to 2 decimals; every hints/ numbered as exercises.txt orders
# the exercises. (2) Three sample submissions of
# chapter 03, made by make assignment-03 (its exercise selective-recompute has layouts of its
# own): one complete (the answers written between their ANSWER
# lines), one partial (exercise selective-recompute left as its TODO), one that writes nothing,
# deletes the TODOs, edits common/harness/parity.c to report every run as OK and links a grader
# away; graded by `make grade` in its sandboxes: the complete one has full marks in grade.json and
# the CSV, the partial one loses exactly that exercise's points, the cheat's edits are listed as
# ignored, and its sandbox is file for file that of the same copy without them (graded with JOBS=2:
# the CSV's rows in the folder's order).
set -u
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
src=$(pwd); bad=0
# checks.txt as the results of a run in which every layout gave RES (ok or FAIL)
results() {
    local n=0 l np ex res=$2
    while IFS= read -r l; do
        n=$((n+1)); set -- $l
        case "${1:-}" in ''|'#'*) continue;; esac
        np=$1; ex=$2; shift 2
        printf '%s\t%s\t%s\t%s\t%s\t-\n' $n $np $ex "$*" "$res"
    done < "$1"
}
for dir in [0-9][0-9]_*/; do
    [ -f "$dir/exercises.txt" ] || continue
    nn=${dir:0:2}
    results "$dir/checks.txt" ok > "$tmp/ok.tsv"
    if python3 tools/grade.py "$nn" "$tmp/ok.tsv" --json "$tmp/g.json" >"$tmp/o.txt" 2>&1 &&
       python3 -c 'import json,sys; g=json.load(open(sys.argv[1])); sys.exit(0 if g["points"] == g["possible"] > 0 else 1)' "$tmp/g.json"; then
        echo "ok    exercises.txt of $nn: $(tail -2 "$tmp/o.txt" | head -1)"
    else
        echo "FAIL  exercises.txt of $nn:"; sed 's/^/      | /' "$tmp/o.txt"; bad=$((bad+1))
    fi
    # in the student copy, every TODO belongs to an exercise, and with every layout failing each is unfinished
    if make --no-print-directory assignment-$nn DEST="$tmp/c$nn" >/dev/null 2>&1; then
        results "$dir/checks.txt" FAIL > "$tmp/fail.tsv"
        (cd "$tmp/c$nn" && python3 tools/grade.py "$nn" "$tmp/fail.tsv") >"$tmp/o.txt" 2>&1
        if grep -q 'TODO left that no exercise names' "$tmp/o.txt" || ! grep -q " 0 of " "$tmp/o.txt" ||
           [ "$(grep -c ' unfinished: TODO at ' "$tmp/o.txt")" -ne "$(grep -vc '^ *\(#\|$\)' "$dir/exercises.txt")" ]; then
            echo "FAIL  the student copy of $nn: a TODO no exercise names, or an exercise with no TODO:"; sed 's/^/      | /' "$tmp/o.txt"; bad=$((bad+1))
        fi
        # ... and with its TODO (assignment) lines answered (here: a line of code for each), none is
        # unfinished: a "TODO (removed from the student copy ...)" placeholder is no exercise's
        # unfinished work
        sed -i 's|/\* TODO (assignment): .*|answered();|' "$tmp/c$nn/$dir"*.c
        (cd "$tmp/c$nn" && python3 tools/grade.py "$nn" "$tmp/fail.tsv") >"$tmp/o.txt" 2>&1
        if grep -q ' unfinished' "$tmp/o.txt"; then
            echo "FAIL  the student copy of $nn, its TODOs answered: an exercise still unfinished:"; sed 's/^/      | /' "$tmp/o.txt"; bad=$((bad+1))
        fi
        rm -rf "$tmp/c$nn"
    else
        echo "FAIL  make assignment-$nn"; bad=$((bad+1))
    fi
done

# (1b) docs/course.md's points table names each chapter's exercises with exercises.txt's points and total
if out=$(python3 - <<'PY' 2>&1
import glob, re
rows = {}
for line in open('docs/course.md'):
    m = re.match(r'\| (\d\d) \| (.*) \| (\d+) \| \d+ \|$', line.strip())
    if m: rows[m.group(1)] = (dict((n, int(p)) for n, p in re.findall(r'([a-z0-9][a-z0-9-]*[a-z0-9]) \((\d+)', m.group(2))), int(m.group(3)))
bad = 0
for f in sorted(glob.glob('[0-9][0-9]_*/exercises.txt')):
    nn = f[:2]
    want = {}
    for line in open(f):
        if line.strip() and not line.startswith('#'):
            name, pts = [x.strip() for x in line.split('|')[:2]]
            want[name] = int(pts)
    got = rows.get(nn)
    if got is None: print(f'docs/course.md has no row for chapter {nn}'); bad += 1
    elif got != (want, sum(want.values())): print(f'docs/course.md, chapter {nn}: {got} but exercises.txt says {want}, total {sum(want.values())}'); bad += 1
exit(1 if bad else 0)
PY
); then echo "ok    docs/course.md's points table agrees with every exercises.txt"
else echo "FAIL  docs/course.md's points table:"; echo "$out" | sed 's/^/      | /'; bad=$((bad+1)); fi

# (1c) blame, wording and rounding, on synthetic results of chapter 06's layouts (LINES failing,
# with DETAIL): a wrong ring fails the ring's layouts, which lse-merge and attention-work grade
# too; they pass the all-gather's, so the ring alone loses them
results_failing() {   # results_failing CHECKS REGEX DETAIL: the layouts matching REGEX fail
    python3 - "$@" <<'PY'
import re, sys
checks, pat, detail = sys.argv[1:]
for n, line in enumerate(open(checks), 1):
    if not line.strip() or line.startswith("#"): continue
    np_, ex, *fl = line.split()
    bad = re.search(pat, " ".join([np_, ex] + fl)) is not None
    print(f"{n}\t{np_}\t{ex}\t{' '.join(fl)}\t{'FAIL' if bad else 'ok'}\t{detail if bad else '-'}")
PY
}
blame_case() {   # blame_case NN WHAT REGEX DETAIL 'name=points ...'
    results_failing "$(ls -d "$1"_*/)checks.txt" "$3" "$4" > "$tmp/b.tsv"
    python3 tools/grade.py "$1" "$tmp/b.tsv" --json "$tmp/b.json" > "$tmp/b.txt" 2>&1
    if python3 - "$tmp/b.json" "$5" <<'PY'
import json, sys
g = json.load(open(sys.argv[1])); want = dict(kv.split("=") for kv in sys.argv[2].split())
got = {e["name"]: e["points"] for e in g["exercises"]}
sys.exit(0 if all(abs(got[k] - float(v)) < 1e-9 for k, v in want.items()) else 1)
PY
    then echo "ok    blame, $1 $2: $5"
    else echo "FAIL  blame, $1 $2: want $5"; sed 's/^/      | /' "$tmp/b.txt"; bad=$((bad+1)); fi
}
blame_case 06 "a wrong ring" 'pass (?!.*--cp-method (allgather|alltoall))' - "lse-merge=4 ring=0 ulysses=4 attention-work=6"
blame_case 06 "a wrong merge (the ring's layouts fail with it: nothing clears the ring)" 'pass (?!.*alltoall)' - "lse-merge=0 ring=0 attention-work=0 ulysses=4"
blame_case 08 "a wrong composed traffic (its layouts fail on a formula)" 'pass (?!.*--ac full).*--(pp|cp) 2' formulas-only "fsdp-on-the-mesh=3 state-per-gpu=6 composed-traffic=0"
blame_case 08 "a wrong state per GPU (every pass layout fails on a formula, and its unit test)" '^\d+ pass|test_plan_calculator' formulas-only "fsdp-on-the-mesh=3 composed-traffic=6 state-per-gpu=0"
# a deliberate bug's layout reads caught or not caught, never pass or fail; points to 2 decimals
results_failing 06_context_parallel/checks.txt '^4 pass .*allgather|^4 fail' matched-baseline > "$tmp/w.tsv"
python3 tools/grade.py 06 "$tmp/w.tsv" --json "$tmp/w.json" > "$tmp/w.txt" 2>&1
if out=$(python3 - "$tmp/w.json" "$tmp/w.txt" <<'PY'
import json, re, sys
g = json.load(open(sys.argv[1])); bad = []
for lay in g["layouts"]:
    ok = {"fail": ("caught", "not caught")}.get(lay["expect"], ("pass", "fail"))
    if lay["result"] not in ok: bad.append(f"line {lay['line']} ({lay['expect']}): {lay['result']}")
if not {"caught", "not caught"} <= {l["result"] for l in g["layouts"]}: bad.append("want one caught and one not caught")
nums = [g["points"], g["possible"]] + [e[k] for e in g["exercises"] for k in ("points", "possible")]
bad += [f"{x!r} is not rounded to 2 decimals" for x in nums if round(x, 2) != x]
bad += [f"table: {t}" for t in re.findall(r"\d+\.\d{3,}", open(sys.argv[2]).read())]
print("; ".join(bad)); sys.exit(1 if bad else 0)
PY
); then echo "ok    grade.json: a deliberate bug's layout reads caught / not caught; points and totals to 2 decimals"
else echo "FAIL  grade.json's wording or rounding: $out"; bad=$((bad+1)); fi
# every chapter's hints/ numbered as its exercises.txt orders the exercises (hint K: exercise K)
if out=$(python3 - <<'PY'
import glob, os, re
bad = []
for d in sorted(glob.glob("[0-9][0-9]_*/")):
    if not os.path.exists(d + "exercises.txt") or not os.path.isdir(d + "hints"): continue
    n = sum(1 for l in open(d + "exercises.txt") if l.strip() and not l.lstrip().startswith("#"))
    files = sorted(os.listdir(d + "hints"))
    nums = sorted(int(f.split("-")[0]) for f in files if re.match(r"\d+-.*\.md$", f))
    if nums != list(range(1, n + 1)): bad.append(f"{d}hints: {files}, want 1-... to {n}-...")
    for f in files:
        m = re.match(r"(\d+)-", f); head = open(d + "hints/" + f).readline()
        h = re.match(r"# Exercise (\d+)", head)
        if m and (not h or h.group(1) != m.group(1)): bad.append(f"{d}hints/{f}: heading '{head.strip()}'")
print("; ".join(bad)); exit(1 if bad else 0)
PY
); then echo "ok    every chapter's hints/ numbered 1 to N in exercises.txt's order, each headed by its number"
else echo "FAIL  hints numbering: $out"; bad=$((bad+1)); fi

# (2) three submissions of chapter 03, graded by make grade in its sandboxes
nn=03; dir=$(ls -d ${nn}_*/ | head -1)
partial_ex=selective-recompute; partial_task='recompute what selective AC dropped'
lost=$(awk -F'|' -v t=$partial_ex '$1 ~ "^"t" " {gsub(/ /, "", $2); print $2}' "$dir/exercises.txt")
base=$tmp/base
make --no-print-directory assignment-$nn DEST="$base" >/dev/null || { echo "FAIL  make assignment-$nn"; exit 1; }
mkdir -p "$tmp/subs"
for s in complete partial cheat; do cp -a "$base" "$tmp/subs/$s"; done
# answer SUB [TASK_LEFT]: every region of the chapter's solution written between its ANSWER lines
# in SUB's copy (the TODO replaced), except TASK_LEFT's, whose TODO stays
answer() { python3 tools/fill_answers.py "$dir" "$1" "${2:-}"; }
answer "$tmp/subs/complete"; answer "$tmp/subs/partial" "$partial_task"
# the cheat: no answer written, the TODOs deleted, and parity always reported OK by an edit of
# common/ (which the old grader, restoring only its own files, let through with full marks)
# (and a grader replaced by a link that leads nowhere: listed, not followed, not fatal); "empty" is
# the same copy with only the TODOs deleted, not graded: its sandbox must be the cheat's, file for file
cp -a "$base" "$tmp/empty"
sed -i '/TODO (assignment)/d' "$tmp/subs/cheat/$dir"*.c "$tmp/empty/$dir"*.c
sed -i 's/return failures ? 1 : 0;/return 0;/; s/if (failures == 0)/if (1)/' "$tmp/subs/cheat/common/harness/parity.c"
grep -q 'return 0;' "$tmp/subs/cheat/common/harness/parity.c" || echo "FAIL  the cheat's edit of parity.c did not apply"
rm "$tmp/subs/cheat/tools/grade.py" && ln -s /nonexistent/grade.py "$tmp/subs/cheat/tools/grade.py"
python3 tools/grade_sandbox.py "$base" "$tmp/subs/cheat" "$tmp/box_cheat" && python3 tools/grade_sandbox.py "$base" "$tmp/empty" "$tmp/box_empty" &&
    diff -r -x .sandbox.json "$tmp/box_cheat" "$tmp/box_empty" >"$tmp/box.diff" 2>&1
if [ $? -eq 0 ]; then echo "ok    the sandbox of a copy that edits common/ and links a grader away is the same copy's without those edits, file for file"
else echo "FAIL  the sandboxes of the cheat and of the same copy without its edits differ:"; head -20 "$tmp/box.diff" | sed 's/^/      | /'; bad=$((bad+1)); fi
# (graded two at a time: JOBS=2; the CSV's rows in the folder's order all the same)
# (-O1: the same bits as the default -O3, Makefile, compiled faster; the grading is what is tested)
if ! CFLAGS="-O1 -g -fno-math-errno" make --no-print-directory grade DIR="$tmp/subs" JOBS=2 >"$tmp/grade.txt" 2>&1; then
    echo "FAIL  make grade DIR=... failed:"; sed 's/^/      | /' "$tmp/grade.txt"; exit 1
fi
python3 - "$tmp/subs" "$lost" "$nn" "$partial_ex" >"$tmp/v.txt" 2>&1 <<'PY'
import csv, json, sys
subs, lost, nn, left = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
bad = 0
c = json.load(open(f"{subs}/complete/grade.json")); p = json.load(open(f"{subs}/partial/grade.json"))
def ex(g, name): return next(e for e in g["exercises"] if e["name"] == name)
if not (c["points"] == c["possible"] > 0): print(f"complete: {c['points']} of {c['possible']}"); bad += 1
if abs(p["points"] - (p["possible"] - lost)) > 1e-6: print(f"partial: {p['points']} of {p['possible']}, want {p['possible'] - lost}"); bad += 1
e = ex(p, left)
if e["points"] != 0 or e["status"] != "unfinished" or not e["todo"]: print(f"partial's {left}: {e}"); bad += 1
if any(e["points"] != e["possible"] for e in p["exercises"] if e["name"] != left): print("partial lost points elsewhere"); bad += 1
rows = {r["student"]: r for r in csv.DictReader(open(f"{subs}/grades.csv"))}
if list(rows) != ["cheat", "complete", "partial"]: print(f"CSV rows not in the folder's order: {list(rows)}"); bad += 1
if float(rows["complete"]["total"]) != c["possible"] or float(rows["partial"]["total"]) != p["possible"] - lost: print(f"CSV totals: {rows}"); bad += 1
if float(rows["partial"][f"{nn}:{left}"]) != 0 or float(rows["complete"][f"{nn}:{left}"]) != lost: print("CSV's exercise column"); bad += 1
x = json.load(open(f"{subs}/cheat/grade.json"))
if x["points"] >= x["possible"]: print(f"cheat: {x['points']} of {x['possible']}"); bad += 1
if any(e["status"] not in ("unfinished", "done") for e in x["exercises"]):   # its answers are empty
    print(f"cheat: an empty answer not unfinished: {[(e['name'], e['status']) for e in x['exercises']]}"); bad += 1
if "common/harness/parity.c (changed)" not in x.get("ignored", []) or not any(i.startswith("tools/grade.py (not a plain file") for i in x.get("ignored", [])):
    print(f"cheat: ignored = {x.get('ignored')}"); bad += 1
if c.get("ignored") or p.get("ignored"): print(f"complete/partial changed nothing else, yet ignored: {c.get('ignored')} {p.get('ignored')}"); bad += 1
print(f"complete {c['points']:g}/{c['possible']:g}, partial {p['points']:g}/{p['possible']:g} ({left}: 0 of {lost:g}), "
      f"no answer but an edit of common/ {x['points']:g}/{x['possible']:g} (ignored: {len(x['ignored'])} files)")
sys.exit(1 if bad else 0)
PY
if [ $? -eq 0 ]; then echo "ok    make grade on three submissions of $nn: $(tail -1 "$tmp/v.txt")"
else echo "FAIL  make grade on three submissions of $nn:"; sed 's/^/      | /' "$tmp/v.txt" "$tmp/grade.txt" "$tmp/subs/partial/grade.log" | tail -60; bad=$((bad+1)); fi
# make grade's refusals: one line on stderr, exit 2, nothing else (issue: an empty DIR printed a
# false "skip *" line; CSV=/proc/x.csv a Python traceback, then "wrote", exit 0)
mkdir -p "$tmp/empty_subs"
grade_refusal() {   # grade_refusal WHAT DIR CSV 'TEXT'
    make --no-print-directory grade DIR="$2" ${3:+CSV="$3"} >"$tmp/gr.out" 2>"$tmp/gr.err"; local rc=$?
    if [ $rc -eq 2 ] && [ ! -s "$tmp/gr.out" ] && [ "$(grep -v 'Error 2' "$tmp/gr.err" | grep -c .)" -eq 1 ] &&
       grep -q -- "$4" "$tmp/gr.err" && ! grep -q Traceback "$tmp/gr.err"; then echo "ok    make grade $1: one line, exit 2"
    else echo "FAIL  make grade $1: exit $rc, want one line with: $4"; sed 's/^/      | /' "$tmp/gr.out" "$tmp/gr.err"; bad=$((bad+1)); fi
}
grade_refusal "DIR=<empty folder>" "$tmp/empty_subs" "" "make grade: no student copy in"
grade_refusal "CSV=/proc/x.csv" "$tmp/empty_subs" /proc/x.csv "make grade: CSV=/proc/x.csv cannot be written"
grade_refusal "CSV=<a directory>" "$tmp/empty_subs" "$tmp" "is a directory: give a file name"
echo "grading by exercise: $bad failure(s)"
[ $bad -eq 0 ]
