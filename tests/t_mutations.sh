#!/usr/bin/env bash
# t_mutations.sh: every exercise proves its grader (tests/mutations.py): each chapter's wrong
# answers (docs/instructor/mutations/NN.txt, two at least per exercise) are planted one at a time
# in a sandbox of the solution, and each must cost its exercise points with a report line that
# names the mistake.
set -u
backend=${BACKEND:-cpu}
[ "$backend" = cpu ] || { echo "the wrong answers are tried on the CPU build only"; exit 0; }
[ -x "${BUILD_ROOT:-build}/cpu/00" ] || { echo "no ${BUILD_ROOT:-build}/cpu: build first (make)"; exit 1; }
python3 tests/mutations.py
