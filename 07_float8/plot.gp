# plot.gp: chapter 07's figures (make plot-07 runs plot.sh, which makes loss_curves.csv,
# cast_sample.csv and e4m3_grid.txt).
if (!exists("outdir")) outdir = 'out/07'
set datafile separator ','
set terminal pngcairo size 1000,760 font ",10"

# ---- the loss of fp32 and of each recipe, and their differences ----
set output outdir.'/loss.png'
set multiplot layout 2,1 title "Chapter 07: training loss, fp32 against the float8 recipes (one rank, the same batches)"
set xlabel 'step'
set ylabel 'loss'
set grid
set key top right
plot outdir.'/loss_curves.csv' skip 1 using 1:2 with lines lw 2 lc rgb 0x000000 title 'fp32 (--fp8 off)', \
     '' skip 1 using 1:3 with lines lc rgb 0x4477aa title 'tensorwise', \
     '' skip 1 using 1:4 with lines lc rgb 0x228833 title 'rowwise', \
     '' skip 1 using 1:5 with lines lc rgb 0xcc6677 title 'delayed (history 16)'
set ylabel 'loss - fp32 loss'
set key top left
plot outdir.'/loss_curves.csv' skip 1 using 1:($3-$2) with lines lc rgb 0x4477aa title 'tensorwise', \
     '' skip 1 using 1:($4-$2) with lines lc rgb 0x228833 title 'rowwise', \
     '' skip 1 using 1:($5-$2) with lines lc rgb 0xcc6677 title 'delayed', \
     0 with lines lc rgb 0x000000 notitle
unset multiplot

# ---- one tensor before and after its cast, on the E4M3 grid ----
reset
set datafile separator ','
set terminal pngcairo size 1000,520 font ",10"
set output outdir.'/cast.png'
set title "Chapter 07: layer 0's w1 weight scaled into E4M3 (tensorwise, s = 448 / amax), before and after the cast\nthe grey lines: every positive E4M3 value (8 per binade above 2^{-6})"
set xlabel 'log2 |x s|'
set ylabel 'elements'
set xrange [-7:9.5]
set style fill solid 0.6 noborder
bin(v, w) = w * floor(v / w) + w / 2
set boxwidth 0.02
set yrange [0:*]
set y2range [0:1]          # the grid's lines run the full height, on the second axis
unset y2tics
plot outdir.'/e4m3_grid.txt' using 1:(1) axes x1y2 with impulses lc rgb 0xdddddd notitle, \
     outdir.'/cast_sample.csv' skip 1 using (bin(log(abs($2))/log(2), 0.02)):(1) smooth frequency with boxes lc rgb 0x4477aa title 'before: x s (fp32)', \
     '' skip 1 using (bin(log(abs($3))/log(2), 0.02)):(1) smooth frequency with impulses lw 2 lc rgb 0xcc3344 title 'after: the E4M3 value'
