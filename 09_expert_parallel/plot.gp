# plot.gp: chapter 09's figures (make plot-09 runs plot.sh, which makes load_alpha_0.csv,
# load_alpha_0.1.csv and load_time.csv: step,expert_0..expert_7,dropped,imbalance,all_to_all_ms,step_ms).
if (!exists("outdir")) outdir = 'out/09'
set datafile separator ','
set terminal pngcairo size 900,480 font ",10"

# ---- the load's imbalance over the steps, without and with the balancing loss ----
set output outdir.'/load.png'
set title "Chapter 09: the experts' load over training (8 experts, top-2, ep 2)\nthe most loaded expert's copies over the mean, every layer and rank of the step"
set xlabel 'step'
set ylabel 'imbalance: max / mean (1 = balanced)'
set grid
set key top right
set yrange [1:*]
plot outdir.'/load_alpha_0.csv' skip 1 using 1:11 with lines lw 2 lc rgb 0xcc6677 title 'no balancing loss (--aux-alpha 0)', \
     outdir.'/load_alpha_0.1.csv' skip 1 using 1:11 with lines lw 2 lc rgb 0x4477aa title 'balancing loss, alpha 0.1'

# ---- where an ep 2 step goes ----
reset
set datafile separator ','
set terminal pngcairo size 900,480 font ",10"
set output outdir.'/time.png'
set title "Chapter 09: rank 0's step at ep 2 (dim 256, 8 experts of hidden 1024, top-2)\nthe all-to-alls (waiting for the other rank included) and everything else"
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.7
set xlabel 'step'
set ylabel 'ms'
set yrange [0:*]
set grid y
set key below
plot outdir.'/load_time.csv' skip 1 using ($13 - $12):xtic(1) title 'compute: experts, attention, router' lc rgb 0x4477aa, \
     '' skip 1 using 12 title 'all-to-alls: dispatch and combine, forward and backward' lc rgb 0xcc6677
