#!/usr/bin/env bash
# plot.sh BINARY OUTDIR: make plot-07. Two figures from real runs on one rank:
#   loss.png    the training loss of fp32 (--fp8 off) and of each recipe (tensorwise, rowwise,
#               delayed) over 200 steps on the same batches (dim 128, 4 layers, 8 sequences of 64
#               tokens of the synthetic bigram language of common/harness/data.c), and below it
#               each recipe's loss minus fp32's; the gaps are also written to loss_gap.txt
#   cast.png    one tensor before and after its cast: layer 0's w1 weight after training, scaled
#               tensorwise into E4M3, as a histogram over log2 |x s|, with the representable E4M3
#               values drawn (8 per binade, fewer among the subnormals below 2^-6)
set -eu
bin=$1; out=$2
mpirun=${MPIRUN:-mpirun}
here=$(dirname "$0")
mkdir -p "$out"
size="--dim 128 --n-layers 4 --ffn-dim 352 --seq-len 64 --batch 8 --steps 200"
for r in off tensorwise rowwise delayed; do
    extra=""; [ $r = tensorwise ] && extra="--cast-sample"
    $mpirun -np 1 "$bin" $size --fp8 $r $extra --out "$out" > "$out/run_$r.txt"
done
# step, fp32, tensorwise, rowwise, delayed: the "parallel" column (3) of each run's loss CSV
csv() { echo "$out/loss_$1_dp1_tp1.csv"; }
paste -d, <(cut -d, -f1,3 "$(csv off)") <(cut -d, -f3 "$(csv tensorwise)") <(cut -d, -f3 "$(csv rowwise)") \
          <(cut -d, -f3 "$(csv delayed)") | sed '1s/.*/step,fp32,tensorwise,rowwise,delayed/' > "$out/loss_curves.csv"
# the gap to fp32: mean over the last 50 steps, and the largest over all steps
awk -F, 'NR > 1 { n++; for (k = 3; k <= 5; k++) { d = $k - $2; if (d < 0) a = -d; else a = d; if (a > mx[k]) mx[k] = a;
                                                 if (n > 150) { s[k] += d; m[k]++ } } }
         END { split("x,x,tensorwise,rowwise,delayed", name, ",");
               for (k = 3; k <= 5; k++)
                   printf "%-10s loss - fp32 loss: mean over steps 151-200 %+.4f, largest |difference| over 200 steps %.4f\n",
                          name[k], s[k] / m[k], mx[k] }' "$out/loss_curves.csv" > "$out/loss_gap.txt"
awk -F, 'NR > 1 { last = $2 } END { printf "fp32 loss at step 200: %.4f\n", last }' "$out/loss_curves.csv" >> "$out/loss_gap.txt"
cat "$out/loss_gap.txt"
# the E4M3 grid: every non-negative finite value (codes 0x01 .. 0x7E), as log2
awk 'BEGIN { for (c = 1; c <= 126; c++) { e = int(c / 8); m = c % 8;
                                            v = (e == 0) ? m / 8 * 2^-6 : (1 + m / 8) * 2^(e - 7);
                                            printf "%.6f\n", log(v) / log(2) } }' > "$out/e4m3_grid.txt"
gnuplot -e "outdir='$out'" "$here/plot.gp"
