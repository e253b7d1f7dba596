#!/usr/bin/env bash
# plot.sh BINARY OUTDIR: make plot-06. One figure from real runs:
#   work.png  attention work per rank at cp 4, contiguous against zigzag: the score elements each
#             rank computed per sequence and head in one layer's forward, as the run prints them
#             ("attention work per rank"), beside their formulas (cp_work_formula)
#   ring.png  the ring's timeline at cp 4 (cp 2 on fewer than 4 cores), contiguous above zigzag: each rank's C steps in the last
#             layer's forward of the last step (--ring-timeline), computing on the K/V block of rank
#             r - t, then waiting for the next block (the exchange the compute did not hide)
set -eu
bin=$1; out=$2
mpirun=${MPIRUN:-mpirun}
mkdir -p "$out"
csv="$out/attention_work.csv"
echo "rank,contiguous,contiguous_formula,zigzag,zigzag_formula" > "$csv.tmp"
for balance in contiguous zigzag; do
    # the lines "  rank q (cp c):   measured |   formula  ..." of the run's table
    $mpirun -np 4 "$bin" --cp-balance "$balance" --steps 1 --out "$out" > "$out/run_$balance.txt"
    sed -nE 's/^  rank ([0-9]+) \(cp [0-9]+\): +([0-9.]+) \| +([0-9.]+) .*/\1,\2,\3/p' "$out/run_$balance.txt" > "$out/work_$balance.txt"
    [ "$(wc -l < "$out/work_$balance.txt")" -eq 4 ] || { echo "plot-06: no work table in the $balance run" >&2; exit 1; }
done
join -t, "$out/work_contiguous.txt" "$out/work_zigzag.txt" >> "$csv.tmp"
mv "$csv.tmp" "$csv"
tc=$(sed -nE 's/.*Tc = T \/ 2C = ([0-9]+)\):.*/\1/p' "$out/run_zigzag.txt")
seq=$(sed -nE 's/.*batch [0-9]+ x ([0-9]+) tokens.*/\1/p' "$out/run_zigzag.txt")
rm -f "$out"/work_*.txt "$out"/run_*.txt
# the ring's timeline, on a sequence long enough for the blocks' compute to show; at cp 4 when the
# machine has 4 cores for the 4 ranks (a waiting MPI rank spins, and would take a computing rank's
# core), else at cp 2
ring=4; [ "$(nproc)" -ge 4 ] || ring=2
for balance in contiguous zigzag; do
    $mpirun -np $ring "$bin" --cp-balance "$balance" --seq-len 512 --dim 128 --steps 2 --ring-timeline --out "$out" > /dev/null
    mv "$out/ring_timeline.csv" "$out/ring_timeline_$balance.csv"
done
gnuplot -e "outdir='$out'; tc=$tc; seqlen=$seq; C=$ring" "$(dirname "$0")/plot.gp"
