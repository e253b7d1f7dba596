#!/usr/bin/env bash
# bench.sh BINARY: make bench-03. Sequence parallelism's blocking collectives against --async-tp's
# rings, side by side at tp 2 (and tp 4 with NP4=1), on a size where a chunk's GEMMs take longer
# than the chunk's transfer: dim 256, 4 layers, seq-len 512, batch 2. A chunk is 2 x 256 rows of
# 256 floats (512 KiB at tp 2); its GEMMs in the ring of wq wk wv are 2 x 256 x 256 x 768 x 2 =
# 200 MFLOP, about 1 ms on one core here (make plot-03's timeline), against about 0.1 ms to copy
# 512 KiB between processes of one machine.
# Per case: rank 0's time per step, its time inside communication calls (blocking collectives'
# wall time, and the rings' waits: what the overlap did not hide), the rings' own account (their
# GEMMs, their waits), and the bytes sent over tp per step (the same for both: the traffic table's
# wire bytes). Each case runs REPS times (default 3) interleaved, STEPS steps each (default 3);
# medians printed. A benchmark, not a test: the numbers depend on the machine and its load.
set -eu
bin=$1
mpirun=${MPIRUN_BASE:-$(dirname "$0")/../tools/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
reps=${REPS:-3}
args="--dim 256 --n-layers 4 --seq-len 512 --batch 2 --steps ${STEPS:-3} --out /tmp/bench03"
nps="2"; [ -n "${NP4:-}" ] && nps="2 4"
cases=()
for np in $nps; do cases+=("$np|" "$np|--async-tp"); done
declare -A step comm gemm waited sent
for rep in $(seq "$reps"); do
    for k in "${!cases[@]}"; do
        np=${cases[$k]%%|*}; flags=${cases[$k]#*|}
        out=$($mpirun -np "$np" "$bin" $args $flags)
        step[$k]+="$(echo "$out" | sed -nE 's/^time per step: ([0-9.]+) ms.*/\1/p') "
        comm[$k]+="$(echo "$out" | sed -nE 's/^time per step: .*communication ([0-9.]+) ms.*/\1/p') "
        gemm[$k]+="$(echo "$out" | sed -nE 's/^async TP .*their GEMMs ([0-9.]+) ms.*/\1/p') "
        waited[$k]+="$(echo "$out" | sed -nE 's/^async TP .*waited for transfers ([0-9.]+) ms.*/\1/p') "
        # the wire/rank column of the tp rows, in MiB (the same on every run)
        sent[$k]=$(echo "$out" | awk '$1 == "tp" && NF >= 7 && $2 != "collective" { u = $7; x = $6; f = (u == "KiB") ? 1 / 1024 : (u == "MiB") ? 1 : (u == "GiB") ? 1024 : 1 / 1048576; s += x * f } END { printf "%.2f", s }')
    done
done
. "$(dirname "$0")/../tools/bench_lib.sh"   # median
printf '%-30s %13s %13s %15s %15s %12s\n' "$reps runs each" "step" "comm" "ring GEMMs" "ring waits" "sent over tp"
for k in "${!cases[@]}"; do
    np=${cases[$k]%%|*}; flags=${cases[$k]#*|}
    label="tp $np: ${flags:-blocking (SP)}"
    g="-"; w="-"
    [ -n "$flags" ] && g=$(printf '%.1f ms' "$(echo ${gemm[$k]} | median)") && w=$(printf '%.1f ms' "$(echo ${waited[$k]} | median)")
    printf '%-30s %10.1f ms %10.1f ms %15s %15s %8s MiB\n' "$label" "$(echo ${step[$k]} | median)" \
        "$(echo ${comm[$k]} | median)" "$g" "$w" "${sent[$k]}"
done
echo "comm: rank 0's time inside communication calls per step (medians): the blocking all-gathers and"
echo "reduce-scatters' wall time; for --async-tp the ones left blocking plus the rings' waits, the"
echo "communication the chunks' GEMMs did not hide. On the CPU backend Open MPI moves a message only"
echo "inside MPI calls: the rings call comm_progress between the GEMMs of a chunk's sequences, so a"
echo "transfer moves in those gaps; the ranks also share the machine's cores with whatever else runs."
echo "On GPUs NCCL moves the chunk on the link's stream while the compute stream runs the GEMMs."
