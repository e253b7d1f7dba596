#!/usr/bin/env bash
# plot.sh BINARY OUTDIR: the loss curves of the baseline and of tp = 2 and tp = 4 over 40 steps
# (make plot-01). Each run trains the baseline beside it, so the PNG shows three curves that
# lie on top of each other.
set -eu
bin=$1; out=$2
mpirun=${MPIRUN:-mpirun}
for np in 2 4; do
    $mpirun -np $np "$bin" --check --steps 40 --lr 3e-3 --n-kv-heads 4 --out "$out" >/dev/null
done
gnuplot -e "outdir='$out'" "$(dirname "$0")/plot.gp"
