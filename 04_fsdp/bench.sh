#!/usr/bin/env bash
# bench.sh BINARY: make bench-04. Step time and exposed communication (time waited on
# collectives, slowest rank) of ddp and fsdp, fsdp with and without prefetch, on 2 ranks at a
# size where compute dominates (dim 512, 4 layers, ffn 1408, seq 256, batch 8). Each case runs
# REPS times (default 3) interleaved; the medians are printed. A benchmark, not a test: the
# numbers depend on the machine and its load.
set -eu
bin=$1
mpirun=${MPIRUN_BASE:-$(dirname "$0")/../tests/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
args="--dim 512 --n-layers 4 --n-heads 8 --ffn-dim 1408 --seq-len 256 --batch 8 --steps ${STEPS:-4} --out /tmp/bench04"
cases=("--dp-mode ddp" "--dp-mode fsdp" "--dp-mode fsdp --no-prefetch" "--dp-mode zero2")
declare -A step exposed
for rep in $(seq ${REPS:-3}); do
    for k in "${!cases[@]}"; do
        out=$($mpirun -np 2 "$bin" $args ${cases[$k]})
        step[$k]+="$(echo "$out" | sed -nE 's/^time per step: ([0-9.]+) ms.*/\1/p') "
        exposed[$k]+="$(echo "$out" | sed -nE 's/^exposed communication.*: ([0-9.]+) ms per step.*/\1/p') "
    done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf '%-32s %14s %22s\n' "2 ranks, ${REPS:-3} runs each" "step (median)" "exposed comm (median)"
for k in "${!cases[@]}"; do
    printf '%-32s %11.1f ms %19.2f ms\n' "${cases[$k]}" "$(echo ${step[$k]} | median)" "$(echo ${exposed[$k]} | median)"
done
echo "On the CPU backend Open MPI moves a non-blocking collective's data only inside MPI calls:"
echo "the plan calls comm_progress after every GEMM so the prefetched all-gathers (and DDP's"
echo "buckets) move while the layer computes. The exposed time also includes the ranks' skew."
echo "On GPUs NCCL runs them on a second stream by itself."
