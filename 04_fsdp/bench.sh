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
mpirun=${MPIRUN_BASE:-$(dirname "$0")/../tests/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
# Open MPI's shared-memory transport copies a large message through shared buffers, a piece at a
# time, only while both processes are inside MPI calls: a prefetched all-gather then moves only
# at the progress calls, and the peer's compute stalls it. With the single-copy mechanism CMA
# (process_vm_readv) the receiving rank reads the sender's buffer itself. The tests run without
# it (some containers forbid it); the bench uses it where a probe run shows it works.
if [ "${SINGLE_COPY:-cma}" = cma ] && $(echo "$mpirun" | sed 's/single_copy_mechanism none/single_copy_mechanism cma/') \
        -np 2 "$bin" --dim 64 --n-layers 1 --steps 1 --out /tmp/bench04 >/dev/null 2>&1; then
    mpirun=$(echo "$mpirun" | sed 's/single_copy_mechanism none/single_copy_mechanism cma/')
    echo "Open MPI's shared-memory transport with single-copy CMA (SINGLE_COPY=none for the tests' setting)"
else
    echo "Open MPI's shared-memory transport without single copy (CMA unavailable or SINGLE_COPY=none)"
fi
args="--dim 512 --n-layers 4 --n-heads 8 --ffn-dim 1408 --seq-len 256 --batch 8 --steps ${STEPS:-4} --out /tmp/bench04"
cases=("--dp-mode ddp" "--dp-mode fsdp" "--dp-mode fsdp --no-prefetch" "--dp-mode zero2")
declare -A step exposed data peer gather
for rep in $(seq ${REPS:-3}); do
    for k in "${!cases[@]}"; do
        out=$($mpirun -np 2 "$bin" $args ${cases[$k]})
        step[$k]+="$(echo "$out" | sed -nE 's/^time per step: ([0-9.]+) ms.*/\1/p') "
        exposed[$k]+="$(echo "$out" | sed -nE 's/^exposed communication.*: ([0-9.]+) ms per step.*/\1/p') "
        data[$k]+="$(echo "$out" | sed -nE 's/^  of which waiting for the data[^:]*: ([0-9.]+) ms.*/\1/p') "
        peer[$k]+="$(echo "$out" | sed -nE 's/^  of which .*for a late rank: ([0-9.]+) ms.*/\1/p') "
        gather[$k]+="$(echo "$out" | sed -nE 's/^  of which .*\(all-gathers ([0-9.]+) ms\).*/\1/p') "
    done
done
. "$(dirname "$0")/../tests/bench_lib.sh"   # median
printf '%-30s %12s %13s %13s %13s %16s\n' "2 ranks, ${REPS:-3} runs each, medians" "step" "exposed comm" "= data wait" "+ late rank" "(gathers' data)"
for k in "${!cases[@]}"; do
    printf '%-30s %9.1f ms %10.2f ms %10.2f ms %10.2f ms %13.2f ms\n' "${cases[$k]}" "$(echo ${step[$k]} | median)" \
        "$(echo ${exposed[$k]} | median)" "$(echo ${data[$k]} | median)" "$(echo ${peer[$k]} | median)" \
        "$(echo ${gather[$k]} | median)"
done
with=$(echo ${gather[1]} | median); without=$(echo ${gather[2]} | median)
awk -v a="$with" -v b="$without" 'BEGIN {
    printf "prefetch: fsdp waits for the data of its all-gathers %.2f ms per step with, %.2f ms without: %s\n", a, b,
           (a < b) ? "lower with prefetch (PASS)" : "not lower with prefetch (FAIL)" }'
echo "(data wait: blocked after the group's last rank had issued the collective; late rank: blocked"
echo " before, the ranks' skew; gathers' data: the data wait of the all-gathers alone, what prefetch"
echo " hides. All of the rank that waited longest. The plan calls comm_progress after every GEMM so"
echo " that Open MPI moves the prefetched all-gathers and DDP's buckets while a layer computes.)"
