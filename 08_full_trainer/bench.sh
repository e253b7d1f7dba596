#!/usr/bin/env bash
# bench.sh BINARY: make bench-08. Tokens per second and MFU of the trainer (its default model:
# dim 96, 4 layers, 16 sequences of 64 bytes a step) on a few meshes of 8 ranks and on one rank,
# STEPS steps each (default 30) without evaluation; the medians of the steps after the first 5
# are printed. MFU is against the peak a GEMM probe measures at the start of each run (all ranks
# at once). A benchmark, not a test: on a 2-core machine 8 ranks share the cores, and the
# numbers depend on the machine and its load.
set -eu
bin=$1
mpirun=${MPIRUN_BASE:-$(dirname "$0")/../tests/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
steps=${STEPS:-30}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cases=("1|--dp-shard 1" "8|--dp-shard 8" "8|--dp-shard 4 --tp 2" "8|--pp 2 --dp-shard 2 --tp 2"
       "8|--dp-shard 2 --cp 2 --tp 2" "8|--pp 2 --cp 2 --tp 2" "8|--dp-replicate 2 --dp-shard 2 --tp 2")
. "$(dirname "$0")/../tests/bench_lib.sh"   # median
printf '%-5s %-42s %12s %10s %8s %12s\n' ranks mesh "tokens/s" "step" MFU "peak memory"
for c in "${cases[@]}"; do
    np=${c%%|*}; mesh=${c#*|}
    $mpirun -np "$np" "$bin" $mesh --steps "$steps" --eval-every 0 --out "$tmp/o" >"$tmp/run.txt" 2>&1 ||
        { echo "$mesh: the run failed"; tail -3 "$tmp/run.txt"; continue; }
    rows=$(tail -n +7 "$tmp/o/metrics.csv")   # header + the first 5 steps left out
    printf '%-5s %-42s %12.0f %7.1f ms %7.1f%% %9.2f MiB\n' "$np" "$mesh" \
        "$(echo "$rows" | cut -d, -f6 | median)" "$(echo "$rows" | cut -d, -f7 | median)" \
        "$(echo "$rows" | cut -d, -f8 | median | awk '{print 100 * $1}')" \
        "$(echo "$rows" | cut -d, -f9 | median | awk '{print $1 / 1048576}')"
done
echo "tokens/s = global batch tokens / step time; MFU = (6 N + 6 L T D) FLOPs per token x tokens/s / the probed peak"
