#!/usr/bin/env bash
# bench_grade.sh [NN] [N] [JOBS]: `make bench-grade`. How long `make grade` takes for a class:
# N submissions of chapter NN (default 30 of chapter 08), each a student copy with the tutorial's
# own answers written in (tools/fill_answers.py), graded with JOBS at once (default 2). Prints the
# time beside issue 39's goal (30 chapter-08 submissions in under 30 minutes on 2 cores) and checks
# that every submission earned full marks (a faster grader that grades wrongly is no speed-up).
# A benchmark, never part of make test (about 12 to 25 minutes on 2 cores).
set -u
nn=${1:-08}; count=${2:-30}; jobs=${3:-2}
case "$count" in ''|*[!0-9]*|0) echo "make bench-grade: N=$count is not a number of submissions (1 or more)" >&2; exit 2;; esac
case "$jobs" in ''|*[!0-9]*|0) echo "make bench-grade: JOBS=$jobs is not a number of submissions to grade at once (1 or more)" >&2; exit 2;; esac
src=$(cd "$(dirname "$0")/.." && pwd); cd "$src"
dir=$(ls -d "${nn}"_*/ 2>/dev/null | head -1)
[ -n "$dir" ] && [ -f "${dir}exercises.txt" ] || { echo "make bench-grade: chapter $nn has no exercises (NN=00 to 09)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
make --no-print-directory assignment-$nn DEST="$tmp/base" >/dev/null || { echo "make bench-grade: make assignment-$nn failed" >&2; exit 1; }
python3 tools/fill_answers.py "$dir" "$tmp/base" || exit 1
mkdir -p "$tmp/class"
for i in $(seq -w 1 "$count"); do cp -a "$tmp/base" "$tmp/class/student$i"; done
echo "grading $count submissions of chapter $nn (the reference answers), JOBS=$jobs, on $(nproc) cores ($(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1))"
t0=$(date +%s)
make --no-print-directory grade DIR="$tmp/class" CSV="$tmp/grades.csv" JOBS="$jobs" >"$tmp/grade.out" 2>&1; rc=$?
secs=$(( $(date +%s) - t0 ))
[ $rc -eq 0 ] || { echo "make bench-grade: make grade failed (exit $rc):"; tail -5 "$tmp/grade.out"; exit 1; }
# every row at full marks: total == possible
short=$(python3 -c '
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(sum(1 for r in rows if r["total"] != r["possible"]), len(rows), rows[0]["possible"] if rows else "?")' "$tmp/grades.csv")
set -- $short
per=$(awk -v s=$secs -v n=$count 'BEGIN { printf "%.1f", s / n }')
goal=$(( count * 60 ))   # the goal's rate: 30 submissions in 30 minutes, a minute each
verdict=PASS; [ $secs -le $goal ] || verdict=FAIL
echo "graded $2 submissions in $secs s ($per s each, JOBS=$jobs); goal: at most $goal s (30 in 30 minutes, issue 39): $verdict"
echo "full marks ($3 points): $(( $2 - $1 )) of $2"
[ "$1" -eq 0 ] && [ "$2" -eq "$count" ] || { echo "FAIL  $1 submission(s) short of full marks:"; head -5 "$tmp/grades.csv"; exit 1; }
[ $verdict = PASS ]
