#!/usr/bin/env bash
# bench.sh BINARY: step time of tp = 1 and tp = 2 at a size where compute dominates
# (dim 512, 4 layers, 8 heads, ffn 1408, the default vocabulary of 256, seq 256, batch 8), printed as a speedup (make bench-01).
# A benchmark, not a test: its numbers depend on the machine. Goal on a 2-core CPU: >= 1.6x.
set -eu
bin=$1
mpirun=${MPIRUN_BASE:-$(dirname "$0")/../tests/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
args="--dim 512 --n-layers 4 --n-heads 8 --n-kv-heads 8 --ffn-dim 1408 --seq-len 256 --batch 8 --steps ${STEPS:-4} --out /tmp/bench01"
declare -A ms
for np in 1 2; do
    line=$($mpirun -np $np "$bin" $args | grep '^time per step')
    echo "tp=$np  $line"
    ms[$np]=$(echo "$line" | sed -E 's/time per step: ([0-9.]+) ms.*/\1/')
done
awk -v a="${ms[1]}" -v b="${ms[2]}" 'BEGIN { printf "speedup tp=2 over tp=1: %.2fx (goal on a 2-core CPU: >= 1.6x)\n", a / b }'
