#!/usr/bin/env bash
# bench.sh BINARY: step time of tp = 1 and tp = 2 at a size where compute dominates
# (dim 512, 4 layers, 8 heads, ffn 1408, the default vocabulary of 256, seq 256, batch 8), printed
# as a speedup (make bench-01). REPS (default 3) interleaved pairs of runs of STEPS (default 4)
# steps; each run is timed by the mean of its steps after the first (step 1 warms up:
# steady_step_ms in tools/bench_lib.sh), and the medians are compared. A benchmark, not a test: its numbers
# depend on the machine. Goal on a 2-core CPU: >= 1.8x.
set -eu
bin=$1
here=$(dirname "$0")
mpirun=${MPIRUN_BASE:-$here/../tools/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
. "$(dirname "$0")/../tools/bench_lib.sh"   # median, steady_step_ms, with_single_copy
mpirun=$(with_single_copy "$mpirun" "$bin")   # Open MPI's single-copy CMA where it works
args="--dim 512 --n-layers 4 --n-heads 8 --n-kv-heads 8 --ffn-dim 1408 --seq-len 256 --batch 8 --steps ${STEPS:-4} --out /tmp/bench01"
ms1=(); ms2=(); share=()
for rep in $(seq ${REPS:-3}); do
    ms1+=("$($mpirun -np 1 "$bin" $args | steady_step_ms)")
    out=$($mpirun -np 2 "$bin" $args)
    ms2+=("$(echo "$out" | steady_step_ms)")
    share+=("$(echo "$out" | sed -nE 's/^time per step: .*communication [0-9.]+ ms, ([0-9]+)%\)/\1/p')")
done
a=$(median "${ms1[@]}"); b=$(median "${ms2[@]}"); c=$(median "${share[@]}")
echo "tp=1  ${ms1[*]} ms per step (steps 2.., each run); median $a ms"
echo "tp=2  ${ms2[*]} ms per step (steps 2.., each run); median $b ms, ${c}% of it in communication (all steps)"
awk -v a="$a" -v b="$b" -v n="${REPS:-3}" 'BEGIN { printf "speedup tp=2 over tp=1: %.2fx, median of %d runs each (goal on a 2-core CPU: >= 1.8x)\n", a / b, n }'
