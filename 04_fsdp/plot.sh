#!/usr/bin/env bash
# plot.sh BINARY OUTDIR: make plot-04. Two figures from real runs:
#   timeline.png  one step of fsdp on 2 ranks, with and without prefetch: per rank a compute
#                 lane (each layer's forward and backward) and a communication lane (each
#                 collective from its issue to the end of its wait)
#   memory.png    memory per rank of every mode on 4 data ranks, by category, beside 16 Psi
set -eu
bin=$1; out=$2
mpirun=${MPIRUN:-mpirun}
mkdir -p "$out"
rm -f "$out/memory_modes.csv"
size="--dim 256 --n-layers 4 --ffn-dim 704 --seq-len 64 --batch 8 --steps 3"
$mpirun -np 2 "$bin" $size --dp-mode fsdp --out "$out/prefetch" >/dev/null
$mpirun -np 2 "$bin" $size --dp-mode fsdp --no-prefetch --out "$out/no_prefetch" >/dev/null
for mode in ddp zero1 zero2 fsdp; do
    $mpirun -np 4 "$bin" $size --dp-mode $mode --out "$out" >/dev/null
done
gnuplot -e "outdir='$out'" "$(dirname "$0")/plot.gp"
