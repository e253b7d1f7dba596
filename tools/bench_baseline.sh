#!/usr/bin/env bash
# bench_baseline.sh BINARY: make bench-baseline. The single-device step of the C model (chapter
# 01's binary on one rank: forward, backward, AdamW) beside the same model in PyTorch (float32,
# tools/bench_baseline.py), at chapter 01's bench size (dim 512, 4 layers, 8 heads, ffn 1408,
# vocab 256, seq 256, batch 8), one thread each (OpenBLAS pinned to 1 thread for both), REPS
# (default 3) interleaved runs of STEPS (default 4) steps, each timed by the mean of its steps after
# the first (a warm-up on both sides: steady_step_ms in tools/bench_lib.sh); prints the medians, the ratio, and
# each one's achieved GFLOP/s against the machine's single-core GEMM rate (a 512^3 probe through
# the same OpenBLAS). PyTorch runs twice a repetition: as a user starts it, and with glibc's
# malloc told to keep freed memory in the process (MALLOC_MMAP_THRESHOLD_ at its 32 MiB maximum,
# MALLOC_TRIM_THRESHOLD_ 4 GiB). By default glibc hands every freed block over its mmap threshold
# back to the kernel, and the next step's tensors take page faults on fresh memory; this project's
# allocator keeps its blocks (common/backend/memory.c), so the second row compares the two
# programs' arithmetic alone. Last, tools/bench_projections.c times a layer's projections of one
# input (wq, wk, wv; w1, w3) as separate GEMMs and as one GEMM on the stacked weights, at the same
# size and through the same gemm.h. Mixed precision (issue 37): the same step with --dtype bf16 (every
# linear's GEMM operands in bf16, fp32 accumulation) beside PyTorch's under torch.autocast("cpu",
# torch.bfloat16), same threads (PyTorch with malloc keeping its memory, its faster setting). The
# goals (issue 37) depend on the CPU: with AVX512-BF16 (avx512_bf16 in /proc/cpuinfo), the C bf16
# step at most 0.6x the C fp32 step and faster than PyTorch's bf16 step; without it (oneDNN
# emulating bf16 on AVX-512, or without AVX-512 fp32 sgemms on operands rounded to bf16: gemm.h's
# gemm_bf16_operand_type), the bf16 step at most 1.1x the fp32 one. A benchmark, not a test: the
# numbers depend on the machine and its load.
set -eu
bin=$1
. "$(dirname "$0")/bench_lib.sh"   # median, steady_step_ms
mpirun=${MPIRUN_BASE:-$(dirname "$0")/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
D=512 L=4 H=8 F=1408 V=256 T=256 B=8 steps=${STEPS:-4}
args="--dim $D --n-layers $L --n-heads $H --n-kv-heads $H --ffn-dim $F --vocab $V --seq-len $T --batch $B --steps $steps --out /tmp/bench_baseline"
py=/usr/bin/python3
$py -c "import torch" 2>/dev/null || { echo "PyTorch is missing for $py: run make deps"; exit 1; }
core=$("$(dirname "$0")/blas.sh" coretype)   # the same OpenBLAS kernels for both (mpirun_base.sh)
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
    echo "OpenBLAS kernels: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE (set in your environment) for both programs"
elif [ -n "$core" ]; then
    echo "OpenBLAS kernels: OPENBLAS_CORETYPE=$core for both programs (this CPU has AVX-512)"
fi
keep_memory="MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296"
pytorch() {   # pytorch [ENV=VALUE ...]: one run of bench_baseline.py; prints its output
    env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ${core:+OPENBLAS_CORETYPE=$core} "$@" \
        $py "$(dirname "$0")/bench_baseline.py" $steps $D $L $H $F $V $T $B ${BF16:-}
}
# the CPU's bf16: AVX512-BF16 instructions (the goals' line); else oneDNN 2.x's bf16 needs AVX-512
# (avx512bw: emulated, more slowly), and without it the products are sgemms (gemm_bf16_operand_type)
bf16_cpu=0; grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null && bf16_cpu=1
onednn=0; grep -qw avx512bw /proc/cpuinfo 2>/dev/null && onednn=1
c_ms=(); py_ms=(); pk_ms=(); probe=(); cb_ms=(); pb_ms=()
for rep in $(seq ${REPS:-3}); do
    c_ms+=("$($mpirun -np 1 "$bin" $args | steady_step_ms)")
    cb_ms+=("$($mpirun -np 1 "$bin" $args --dtype bf16 | steady_step_ms)")
    # (without AVX512-BF16 PyTorch's bf16 step takes minutes, and no goal compares with it: once)
    if [ "$bf16_cpu" = 1 ] || [ "$rep" = 1 ]; then
        pb_ms+=("$(BF16=bf16 pytorch $keep_memory | sed -nE 's/^pytorch ms per step: ([0-9.]+)/\1/p')")
    fi
    out=$(pytorch)
    py_ms+=("$(echo "$out" | sed -nE 's/^pytorch ms per step: ([0-9.]+)/\1/p')")
    probe+=("$(echo "$out" | sed -nE 's/^gemm probe GFLOP\/s: ([0-9.]+)/\1/p')")
    pk_ms+=("$(pytorch $keep_memory | sed -nE 's/^pytorch ms per step: ([0-9.]+)/\1/p')")
done
c=$(median "${c_ms[@]}"); p=$(median "${py_ms[@]}"); k=$(median "${pk_ms[@]}"); g=$(median "${probe[@]}")
cb=$(median "${cb_ms[@]}"); pb=$(median "${pb_ms[@]}")
# model FLOPs of a step: 6 x (parameters outside the embedding) + 6 L T D (causal attention) per
# token, llama_flops_per_token's definition (common/model/llama.h)
flops=$(awk -v D=$D -v L=$L -v F=$F -v V=$V -v T=$T -v B=$B 'BEGIN {
    N = L * (4 * D * D + 3 * D * F + 2 * D) + D + V * D; print (6 * N + 6 * L * T * D) * B * T }')
awk -v c="$c" -v p="$p" -v k="$k" -v g="$g" -v f="$flops" -v n="${REPS:-3}" -v cb="$cb" -v pb="$pb" -v bf16_cpu=$bf16_cpu -v onednn=$onednn 'BEGIN {
    printf "single-device step, dim 512, 4 layers, seq 256, batch 8, one thread, median of %d runs\n", n
    row = "  %-36s %8.1f ms  %6.1f GFLOP/s  (%3.0f%% of the GEMM probe)\n"
    printf row, "this project (C, OpenBLAS)", c, f / c / 1e6, 100 * f / c / 1e6 / g
    printf row, "PyTorch eager (same BLAS)", p, f / p / 1e6, 100 * f / p / 1e6 / g
    printf row, "PyTorch eager, malloc keeps memory", k, f / k / 1e6, 100 * f / k / 1e6 / g
    printf "  ratio C / PyTorch: %.2f (goal <= 0.8); C / PyTorch keeping its memory: %.2f\n", c / p, c / k
    printf "  GEMM probe %.1f GFLOP/s (512^3, one core); model FLOPs 6 N + 6 L T D a token\n", g
    printf "mixed precision, the same step (bf16 GEMM operands, fp32 accumulation; GFLOP/s, not against the fp32 probe):\n"
    row16 = "  %-36s %8.1f ms  %6.1f GFLOP/s\n"
    printf row16, (onednn ? "this project, --dtype bf16 (oneDNN)" : "this project, --dtype bf16 (sgemm)"), cb, f / cb / 1e6
    printf row16, (bf16_cpu ? "PyTorch eager, autocast bf16, keeps memory" : "PyTorch autocast bf16 (one run)"), pb, f / pb / 1e6
    if (bf16_cpu)
        printf "  ratio C bf16 / C fp32: %.2f (goal <= 0.6: this CPU has AVX512-BF16); C bf16 / PyTorch bf16: %.2f (goal < 1)\n", cb / c, cb / pb
    else
        printf "  ratio C bf16 / C fp32: %.2f (goal <= 1.1: this CPU has no AVX512-BF16%s); C bf16 / PyTorch bf16: %.2f\n", cb / c,
               (onednn ? ", oneDNN emulates bf16" : ", the products are fp32 sgemms"), cb / pb }'
# QKV and W1/W3 as single GEMMs, measured on the same BLAS (tools/bench_projections.c)
$mpirun -np 1 "$(dirname "$bin")/tools/bench_projections" $((B * T)) $D $D $D $F ${REPS:-3}
# a linear's GEMMs in fp32 and with bf16 operands (tools/bench_gemm_bf16.c; mixed precision, issue 37)
$mpirun -np 1 "$(dirname "$bin")/tools/bench_gemm_bf16" $((B * T)) $D $F ${REPS:-3}
