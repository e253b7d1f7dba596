#!/usr/bin/env bash
# bench_baseline.sh BINARY: make bench-baseline. The single-device step of the C model (chapter
# 01's binary on one rank: forward, backward, AdamW) beside the same model in PyTorch (float32,
# tests/bench_baseline.py), at chapter 01's bench size (dim 512, 4 layers, 8 heads, ffn 1408,
# vocab 256, seq 256, batch 8), one thread each (OpenBLAS pinned to 1 thread for both), REPS
# (default 3) interleaved runs of STEPS (default 4) steps; prints both medians, the ratio, and
# each one's achieved GFLOP/s against the machine's single-core GEMM rate (a 512^3 probe through
# the same OpenBLAS). A benchmark, not a test: the numbers depend on the machine and its load.
set -eu
bin=$1
mpirun=${MPIRUN_BASE:-$(dirname "$0")/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
D=512 L=4 H=8 F=1408 V=256 T=256 B=8 steps=${STEPS:-4}
args="--dim $D --n-layers $L --n-heads $H --n-kv-heads $H --ffn-dim $F --vocab $V --seq-len $T --batch $B --steps $steps --out /tmp/bench_baseline"
py=/usr/bin/python3
$py -c "import torch" 2>/dev/null || { echo "PyTorch is missing for $py: run make deps"; exit 1; }
core=$("$(dirname "$0")/blas.sh" coretype)   # the same OpenBLAS kernels for both (mpirun_base.sh)
[ -n "$core" ] && echo "OpenBLAS kernels: OPENBLAS_CORETYPE=$core for both programs (this CPU has AVX-512)"
c_ms=(); py_ms=(); probe=()
for rep in $(seq ${REPS:-3}); do
    c_ms+=("$($mpirun -np 1 "$bin" $args | sed -nE 's/^time per step: ([0-9.]+) ms.*/\1/p')")
    out=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ${core:+OPENBLAS_CORETYPE=$core} $py "$(dirname "$0")/bench_baseline.py" $steps $D $L $H $F $V $T $B)
    py_ms+=("$(echo "$out" | sed -nE 's/^pytorch ms per step: ([0-9.]+)/\1/p')")
    probe+=("$(echo "$out" | sed -nE 's/^gemm probe GFLOP\/s: ([0-9.]+)/\1/p')")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
c=$(median "${c_ms[@]}"); p=$(median "${py_ms[@]}"); g=$(median "${probe[@]}")
# model FLOPs of a step: 6 x (parameters outside the embedding) + 6 L T D (causal attention) per
# token, llama_flops_per_token's definition (common/model/llama.h)
flops=$(awk -v D=$D -v L=$L -v F=$F -v V=$V -v T=$T -v B=$B 'BEGIN {
    N = L * (4 * D * D + 3 * D * F + 2 * D) + D + V * D; print (6 * N + 6 * L * T * D) * B * T }')
awk -v c="$c" -v p="$p" -v g="$g" -v f="$flops" -v n="${REPS:-3}" 'BEGIN {
    printf "single-device step, dim 512, 4 layers, seq 256, batch 8, one thread, median of %d runs\n", n
    printf "  %-28s %10.1f ms   %6.1f GFLOP/s  (%4.0f%% of the GEMM probe)\n", "this project (C, OpenBLAS)", c, f / c / 1e6, 100 * f / c / 1e6 / g
    printf "  %-28s %10.1f ms   %6.1f GFLOP/s  (%4.0f%% of the GEMM probe)\n", "PyTorch eager (same BLAS)", p, f / p / 1e6, 100 * f / p / 1e6 / g
    printf "  ratio C / PyTorch: %.2f (goal <= 0.8); GEMM probe %.1f GFLOP/s (512^3, one core)\n", c / p, g }'
