#!/usr/bin/env bash
# plot.sh BINARY OUTDIR: activation memory saved per layer per rank, in every mode, at tp = 1, 2
# and 4 (make plot-03). Each run measures, with the allocator, the six ways a layer can be saved
# at its tp (tp or tp+sp, times --ac none, selective, full) and writes them beside the formula to
# OUTDIR/activation_memory_tp<N>.csv; this script puts the three files together into
# OUTDIR/activation_memory.csv (mode,tp,measured_bytes,formula_bytes), which plot.gp draws.
set -eu
bin=$1; out=$2
mpirun=${MPIRUN:-mpirun}
mkdir -p "$out"
for np in 1 2 4; do
    $mpirun -np $np "$bin" --check --steps 1 --out "$out" >/dev/null
done
{
    echo "mode,tp,measured_bytes,formula_bytes"
    for np in 1 2 4; do tail -n +2 "$out/activation_memory_tp$np.csv"; done
} > "$out/activation_memory.csv"
gnuplot -e "outdir='$out'" "$(dirname "$0")/plot.gp"
# --async-tp's ring steps in layer 0's forward of the last step (rank 0), at a size where a
# chunk's GEMMs outlast its transfer (the bench's): OUTDIR/async_tp_timeline.csv, drawn by
# plot_async_tp.gp into OUTDIR/async_tp_timeline.png
$mpirun -np 2 "$bin" --async-tp --dim 256 --n-layers 4 --seq-len 512 --batch 2 --steps 2 --out "$out" >/dev/null
gnuplot -e "outdir='$out'" "$(dirname "$0")/plot_async_tp.gp"
