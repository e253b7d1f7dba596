# plot.gp: chapter 01's loss curves, baseline vs tp = 2 and tp = 4 (make plot-01 runs plot.sh).
if (!exists("outdir")) outdir = 'out/01'
set terminal pngcairo size 800,500 font ",11"
set output outdir.'/loss.png'
set datafile separator ','
set title 'Chapter 01: Llama loss, single device vs Megatron tensor parallelism'
set xlabel 'step'
set ylabel 'cross-entropy (nats)'
set grid
set key top right
plot outdir.'/loss_tp2.csv' using 1:2 with lines lw 4 lc rgb '#999999' title 'baseline (1 device)', \
     outdir.'/loss_tp2.csv' using 1:3 with linespoints lw 2 pt 7 ps 0.8 title 'tp = 2', \
     outdir.'/loss_tp4.csv' using 1:3 with linespoints lw 2 pt 6 ps 1.2 dt 2 title 'tp = 4'
