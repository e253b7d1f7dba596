#!/usr/bin/env bash
# t_readme.sh: the READMEs' output blocks still say what the code prints, and every README link and
# file name resolves (tools/readme_outputs.py; README.md, "How the outputs in these READMEs are
# checked"). make test has no time for every block: this runs the quick ones, about a minute here
# (--quick leaves out make check-NN and the 8-rank runs, 2.5 minutes more; make check-readme runs
# them all), four blocks at a time (a refused input spends most of its 2 s waiting for mpirun).
# First, that the check can fail: in a copy of chapter 00's README, one loss changed by 1e-3 and
# one link broken must both be reported, with the README's file:line.
set -u
root=${BUILD_ROOT:-build}
case "$root" in /*) ;; *) root=$PWD/$root ;; esac
py=python3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0

# 1. the negative case: a copy of the repository's top level, chapter 00's folder a real copy
mkdir "$tmp/repo"
for e in *; do
    [ "$e" = 00_naive_tp_mlp ] || [ "$e" = out ] || ln -s "$PWD/$e" "$tmp/repo/$e"
done
cp -r 00_naive_tp_mlp "$tmp/repo/"
readme=$tmp/repo/00_naive_tp_mlp/README.md
line=$(grep -n '^step   1 | loss tp=2 1.720778227  baseline' "$readme" | head -1 | cut -d: -f1)
if [ -z "$line" ]; then
    echo "t_readme: chapter 00's README has no step-1 line of make run-00 to change"; exit 1
fi
sed -i "${line}s/loss tp=2 1.720778227/loss tp=2 1.721778227/" "$readme"
sed -i 's#(hints/)#(hints-gone/)#' "$readme"
timeout 300 $py tools/readme_outputs.py --check --root "$tmp/repo" --chapter 00 --build-root "$root" \
    >"$tmp/neg.txt" 2>&1
rc=$?
if [ $rc -ne 1 ] || ! grep -q "^STALE 00_naive_tp_mlp/README.md:$line " "$tmp/neg.txt" \
        || ! grep -q "^BROKEN 00_naive_tp_mlp/README.md:[0-9]*: hints-gone/" "$tmp/neg.txt"; then
    echo "t_readme: a changed loss (line $line) and a broken link in a copy of chapter 00's README were not both reported (exit $rc):"
    sed 's/^/  | /' "$tmp/neg.txt"
    fail=1
fi

# 2. the READMEs themselves
timeout 600 $py tools/readme_outputs.py --check --quick --jobs 4 --build-root "$root" >"$tmp/out.txt" 2>&1
rc=$?
cat "$tmp/out.txt"
[ $rc -eq 0 ] || fail=1
last=$(tail -1 "$tmp/out.txt")
if [ $fail -eq 0 ]; then
    echo "$last; a changed loss and a broken link in a copy are caught"
else
    echo "t_readme: FAILED: $last"
fi
exit $fail
