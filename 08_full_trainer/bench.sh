#!/usr/bin/env bash
# bench.sh BINARY: make bench-08. Tokens per second and MFU of the trainer on a few meshes of 8
# ranks and on one rank, STEPS steps each (default 12) without evaluation; the medians of the
# steps after the first 2 are printed. The model is larger than the trainer's default (dim 256,
# 4 layers, 4 heads, 2 kv heads, ffn 704, 16 sequences of 128 bytes a step, make bench's size):
# at 8 ranks a rank's share of a step, 2 sequences, took about 51 ms on one rank alone (at the
# default dim 96 and 64 tokens, about 6 ms: the meshes then measured their collectives' latency
# more than their parallelism; 08_full_trainer/README.md, "Throughput").
# MFU is against the peak a GEMM probe measures at the start of each run (all ranks at once);
# speed-up is the tokens/s over the one-rank row's. Open MPI's single-copy CMA where it works
# (tools/bench_lib.sh, with_single_copy). make bench runs the same meshes interleaved. A benchmark, not a test: on a 2-core machine 8 ranks share the cores, and the
# numbers depend on the machine and its load.
set -eu
bin=$1
mpirun=${MPIRUN_BASE:-$(dirname "$0")/../tools/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
steps=${STEPS:-12}
size="--dim 256 --n-layers 4 --n-heads 4 --n-kv-heads 2 --ffn-dim 704 --seq-len 128 --batch 16"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../tools/bench_lib.sh"   # median, with_single_copy
mpirun=$(with_single_copy "$mpirun" "$bin")
cases=("1|--dp-shard 1" "8|--dp-shard 8" "8|--dp-shard 4 --tp 2" "8|--pp 2 --dp-shard 2 --tp 2"
       "8|--dp-shard 2 --cp 2 --tp 2" "8|--pp 2 --cp 2 --tp 2" "8|--dp-replicate 2 --dp-shard 2 --tp 2")
printf '%-5s %-42s %12s %9s %10s %8s %12s\n' ranks mesh "tokens/s" speed-up "step" MFU "peak memory"
one=
for c in "${cases[@]}"; do
    np=${c%%|*}; mesh=${c#*|}
    $mpirun -np "$np" "$bin" $size $mesh --steps "$steps" --eval-every 0 --out "$tmp/o" >"$tmp/run.txt" 2>&1 ||
        { echo "$mesh: the run failed"; tail -3 "$tmp/run.txt"; continue; }
    rows=$(tail -n +4 "$tmp/o/metrics.csv")   # header + the first 2 steps left out
    tps=$(echo "$rows" | cut -d, -f6 | median); [ -n "$one" ] || one=$tps
    printf '%-5s %-42s %12.0f %8.2fx %7.1f ms %7.1f%% %9.2f MiB\n' "$np" "$mesh" "$tps" \
        "$(awk -v a="$tps" -v b="$one" 'BEGIN { print a / b }')" "$(echo "$rows" | cut -d, -f7 | median)" \
        "$(echo "$rows" | cut -d, -f8 | median | awk '{print 100 * $1}')" \
        "$(echo "$rows" | cut -d, -f9 | median | awk '{print $1 / 1048576}')"
done
echo "tokens/s = global batch tokens / step time; MFU = (6 N + 6 L T D) FLOPs per token x tokens/s / the probed peak"
