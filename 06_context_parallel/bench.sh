#!/usr/bin/env bash
# bench.sh BINARY: make bench-06. Ring against all-gather and all-to-all (Ulysses) attention at cp 2 on a size where the
# attention's compute matters (dim 256, 4 layers, 4 heads of 64, seq-len 512, batch 2: each rank
# holds 256 rows of each sequence), the ring with the contiguous split beside the zigzag one, and
# the same model on one rank (--cp 1, the whole sequence) for scale.
# Rank 0's time per step and its time inside communication calls (waiting for the other rank
# included), and the bytes each rank sent over cp per step (from the run's traffic table). Each
# case runs REPS times (default 3) interleaved, STEPS steps each (default 4); medians printed.
# A benchmark, not a test: the numbers depend on the machine and its load.
set -eu
bin=$1
mpirun=${MPIRUN_BASE:-$(dirname "$0")/../tools/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
. "$(dirname "$0")/../tools/bench_lib.sh"   # median, steady_step_ms, with_single_copy
mpirun=$(with_single_copy "$mpirun" "$bin")   # Open MPI's single-copy CMA where it works
reps=${REPS:-3}
args="--dim 256 --n-layers 4 --seq-len 512 --batch 2 --steps ${STEPS:-4} --out /tmp/bench06"
cases=("--cp-method ring --cp-balance zigzag" "--cp-method allgather --cp-balance zigzag"
       "--cp-method alltoall --cp-balance zigzag" "--cp-method ring --cp-balance contiguous" "--cp 1")
declare -A step comm sent
for rep in $(seq "$reps"); do
    for k in "${!cases[@]}"; do
        np=2; [ "${cases[$k]}" = "--cp 1" ] && np=1
        out=$($mpirun -np $np "$bin" $args ${cases[$k]})
        step[$k]+="$(echo "$out" | sed -nE 's/^time per step: ([0-9.]+) ms.*/\1/p') "
        comm[$k]+="$(echo "$out" | sed -nE 's/^time per step: .*communication ([0-9.]+) ms.*/\1/p') "
        # the wire/rank column of the cp rows, in MiB (the same on every run)
        sent[$k]=$(echo "$out" | awk '$1 == "cp" { u = $7; x = $6; f = (u == "KiB") ? 1 / 1024 : (u == "MiB") ? 1 : (u == "GiB") ? 1024 : 1 / 1048576; s += x * f } END { printf "%.2f", s }')
    done
done
printf '%-48s %14s %14s %16s\n' "$reps runs each" "step (median)" "comm (median)" "sent over cp"
for k in "${!cases[@]}"; do
    label="cp 2: ${cases[$k]}"; [ "${cases[$k]}" = "--cp 1" ] && label="cp 1: one rank, the whole sequence"
    printf '%-48s %11.1f ms %11.1f ms %12s MiB\n' "$label" "$(echo ${step[$k]} | median)" "$(echo ${comm[$k]} | median)" "${sent[$k]}"
done
echo "comm: rank 0's time inside communication calls per step, waiting for the other rank included."
echo "On the CPU backend Open MPI moves a message only inside MPI calls: the ring's non-blocking"
echo "exchange of the next K/V block, posted before the block's compute, moves during it because the"
echo "compute calls comm_progress between its pieces; the two ranks also share the machine's cores"
echo "with whatever else runs. On GPUs NCCL moves it on a second stream during the compute."
