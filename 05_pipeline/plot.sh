#!/usr/bin/env bash
# plot.sh BINARY OUTDIR: make plot-05. One figure per schedule, from real runs on 2 ranks:
#   pipeline_<schedule>.png   the Gantt chart of the last of 3 steps, twice: with Open MPI's
#                             defaults (as make run-05 runs) and with make bench-05's run-time
#                             setting (messages of up to 32 KiB sent eagerly). One row per rank, a box per action (F, B, I, W) from
#                             its start to its end, labelled with its microbatch ("3.1":
#                             microbatch 3 on the rank's chunk 1); each panel's title has the
#                             bubble the run measured beside the theory.
# Size: dim 256, 8 layers, ffn 704, 4 sequences of 30 tokens in M = 4 microbatches (each message
# 30 KiB), without --check (no baseline on rank 0). The CSV files stay in OUTDIR/defaults and
# OUTDIR/tuned.
set -eu
bin=$1; out=$2
mpirun=${MPIRUN:-mpirun}
here=$(dirname "$0")
mkdir -p "$out/defaults" "$out/tuned"
P=2; M=4
size="--dim 256 --n-layers 8 --ffn-dim 704 --seq-len 30 --batch 4 --microbatches $M --steps 3"
tuned="--mca btl_vader_eager_limit 32768"   # make bench-05's (05_pipeline/bench.sh)

# the run's bubble line, "... measured idle share X% (mean over its 2 ranks) | theory Y% = F   (timing ...)",
# as "measured idle share X% (mean of the ranks) | theory Y% = F"
bubble() { sed -nE 's/^bubble of the last step, one pipeline: measured idle share ([0-9.]+%).*\| theory (.*[^ ]) +\(timing.*/measured idle share \1 (mean of the ranks) | theory \2/p'; }

for sched in gpipe 1f1b interleaved zb-h1; do
    V=1; [ $sched = interleaved ] && V=2
    zb=0; [ $sched = zb-h1 ] && zb=1
    csv=pipeline_${sched}_p${P}_m${M}_v${V}.csv
    b1=$($mpirun -np $P "$bin" $size --schedule $sched --virtual-stages $V --out "$out/defaults" | bubble)
    b2=$($mpirun $tuned -np $P "$bin" $size --schedule $sched --virtual-stages $V --out "$out/tuned" | bubble)
    gnuplot -e "csv1='$out/defaults/$csv'; csv2='$out/tuned/$csv'; png='$out/pipeline_${sched}.png'" \
            -e "P=$P; V=$V; zb=$zb" \
            -e "head='Chapter 05: $sched, P = $P ranks, M = $M microbatches, V = $V chunk(s) per rank, the last of 3 steps'" \
            -e "sub1='Open MPI defaults: $b1'" \
            -e "sub2='messages of up to 32 KiB sent eagerly: $b2'" "$here/plot.gp"
done
