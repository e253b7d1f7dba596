#!/usr/bin/env bash
# plot.sh BINARY OUTDIR: logits memory per rank against tp (make plot-02). Runs tp = 1, 2, 4,
# each with and without loss parallelism, at a vocabulary of 4096 so that the logits are the
# step's largest activation; every run appends its allocator-measured logits bytes and the
# formula to OUTDIR/logits_memory.csv, which plot.gp draws.
set -eu
bin=$1; out=$2
mpirun=${MPIRUN:-mpirun}
mkdir -p "$out"
rm -f "$out/logits_memory.csv"
for np in 1 2 4; do
    for mode in --loss-parallel --no-loss-parallel; do
        $mpirun -np $np "$bin" $mode --vocab 4096 --steps 2 --out "$out" >/dev/null
    done
done
gnuplot -e "outdir='$out'" "$(dirname "$0")/plot.gp"
