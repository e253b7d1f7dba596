#!/usr/bin/env bash
# bench.sh BINARY: make bench-04. Step time and exposed communication (time waited on
# collectives, slowest rank) of ddp and fsdp, fsdp with and without prefetch, and zero2, on 2 ranks
# at a size where compute dominates (dim 512, 4 layers, ffn 1408, seq 256, batch 8). The exposed
# time is split where each collective's last rank issued it (comm_wait_split): the wait for the
# data after that moment, which prefetching is meant to remove, and the wait for a late rank
# before it (the ranks' skew), which no overlap can remove. Each case runs REPS times (default 3)
# interleaved; the medians are printed. A benchmark, not a test: the numbers depend on the machine
# and its load.
set -eu
bin=$1
mpirun=${MPIRUN_BASE:-$(dirname "$0")/../tools/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
# Open MPI's single-copy mechanism where it works (with_single_copy in tools/bench_lib.sh): without
# it a prefetched all-gather moves only at the progress calls, and the peer's compute stalls it.
. "$(dirname "$0")/../tools/bench_lib.sh"   # median, with_single_copy
mpirun=$(with_single_copy "$mpirun" "$bin")   # says which on standard error
args="--dim 512 --n-layers 4 --n-heads 8 --ffn-dim 1408 --seq-len 256 --batch 8 --steps ${STEPS:-4} --out /tmp/bench04"
# the first case is the same model on one rank (no data parallelism): the speed-ups' reference
cases=("--dp-mode ddp" "--dp-mode ddp" "--dp-mode fsdp" "--dp-mode fsdp --no-prefetch" "--dp-mode zero2")
declare -A step exposed data peer gather
for rep in $(seq ${REPS:-3}); do
    for k in "${!cases[@]}"; do
        np=2; [ "$k" = 0 ] && np=1
        out=$($mpirun -np $np "$bin" $args ${cases[$k]})
        step[$k]+="$(echo "$out" | sed -nE 's/^time per step: ([0-9.]+) ms.*/\1/p') "
        exposed[$k]+="$(echo "$out" | sed -nE 's/^exposed communication.*: ([0-9.]+) ms per step.*/\1/p') "
        data[$k]+="$(echo "$out" | sed -nE 's/^  of which waiting for the data[^:]*: ([0-9.]+) ms.*/\1/p') "
        peer[$k]+="$(echo "$out" | sed -nE 's/^  of which .*for a late rank: ([0-9.]+) ms.*/\1/p') "
        gather[$k]+="$(echo "$out" | sed -nE 's/^  of which .*\(all-gathers ([0-9.]+) ms\).*/\1/p') "
    done
done
printf '%-30s %12s %9s %13s %13s %13s %16s\n' "2 ranks, ${REPS:-3} runs each, medians" "step" speed-up "exposed comm" "= data wait" "+ late rank" "(gathers' data)"
one=$(echo ${step[0]} | median)
for k in "${!cases[@]}"; do
    label="${cases[$k]}"; [ "$k" = 0 ] && label="one rank"
    printf '%-30s %9.1f ms %8.2fx %10.2f ms %10.2f ms %10.2f ms %13.2f ms\n' "$label" "$(echo ${step[$k]} | median)" \
        "$(awk -v a="$one" -v b="$(echo ${step[$k]} | median)" 'BEGIN { print a / b }')" \
        "$(echo ${exposed[$k]} | median)" "$(echo ${data[$k]} | median)" "$(echo ${peer[$k]} | median)" \
        "$(echo ${gather[$k]} | median)"
done
with=$(echo ${gather[2]} | median); without=$(echo ${gather[3]} | median)
awk -v a="$with" -v b="$without" 'BEGIN {
    printf "prefetch: fsdp waits for the data of its all-gathers %.2f ms per step with, %.2f ms without: %s\n", a, b,
           (a < b) ? "lower with prefetch (PASS)" : "not lower with prefetch (FAIL)" }'
echo "(data wait: blocked after the group's last rank had issued the collective; late rank: blocked"
echo " before, the ranks' skew; gathers' data: the data wait of the all-gathers alone, what prefetch"
echo " hides. All of the rank that waited longest. The plan calls comm_progress after every GEMM so"
echo " that Open MPI moves the prefetched all-gathers and DDP's buckets while a layer computes.)"
