# plot.gp: chapter 00's loss curves, baseline vs tensor parallel (make plot-00).
# gnuplot -e "outdir='out/00'" 00_naive_tp_mlp/plot.gp
if (!exists("outdir")) outdir = 'out/00'
set terminal pngcairo size 800,500 font ",11"
set output outdir.'/loss.png'
set datafile separator ','
set title 'Chapter 00: MLP loss, single device vs tensor parallel'
set xlabel 'step'
set ylabel 'MSE loss'
set grid
set key top right
plot outdir.'/loss.csv' using 1:2 with linespoints lw 2 pt 7 ps 1.2 title 'baseline (1 device)', \
     ''                 using 1:3 with linespoints lw 2 pt 6 ps 2.0 dt 2 title 'tensor parallel'
