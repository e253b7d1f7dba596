#!/usr/bin/env bash
# plot.sh BINARY OUTDIR: make plot-09. Two figures from real runs (OUTDIR/expert_load.csv of each):
#   load.png   the experts' imbalance (the most loaded expert's copies over the mean) at every step,
#              8 experts, top-2, ep 2, without the balancing loss (--aux-alpha 0) and with it
#              (--aux-alpha 0.1), 150 steps at lr 3e-3 on the synthetic batches
#   time.png   where an ep 2 step goes on rank 0: its time in the ep group's all-to-alls (dispatch
#              and combine, forward and backward; waiting for the other rank included) and the
#              rest (the experts, attention, the router), at a size where the experts hold most
#              of the FLOPs (dim 256, 8 experts of hidden 1024, seq-len 256, batch 4)
set -eu
bin=$1; out=$2
mpirun=${MPIRUN:-mpirun}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for alpha in 0 0.1; do
    $mpirun -np 2 "$bin" --experts 8 --top-k 2 --aux-alpha "$alpha" --lr 3e-3 --steps 150 --out "$out/alpha_$alpha" \
        > "$out/run_alpha_$alpha.txt"
    cp "$out/alpha_$alpha/expert_load.csv" "$out/load_alpha_$alpha.csv"
done
$mpirun -np 2 "$bin" --dim 256 --n-heads 4 --n-kv-heads 4 --experts 8 --top-k 2 --expert-dim 1024 --seq-len 256 \
    --batch 4 --steps 8 --out "$out/time" > "$out/run_time.txt"
cp "$out/time/expert_load.csv" "$out/load_time.csv"
gnuplot -e "outdir='$out'" "$here/plot.gp"
rm -f "$out"/run_*.txt
