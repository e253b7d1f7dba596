# plot.gp: chapter 08's training run (make plot-08, from out/08/metrics.csv of make run-08).
# gnuplot -e "outdir='out/08'" 08_full_trainer/plot.gp
#   loss.png        training loss every step, validation loss at each evaluation, the unigram line
#   throughput.png  tokens per second and MFU per step
#   memory.png      the fullest rank's peak memory
if (!exists("outdir")) outdir = 'out/08'
csv = outdir.'/metrics.csv'
set datafile separator ','
set datafile missing 'nan'
set terminal pngcairo size 800,500 font ",11"
set grid
set xlabel 'step'

set output outdir.'/loss.png'
set title 'Chapter 08: Llama on Tiny Shakespeare (one token per byte)'
set ylabel 'loss (nats per byte)'
set key top right
plot csv using 1:2 every ::1 with lines lw 1.5 title 'training (the step''s batch)', \
     csv using 1:3 every ::1 with linespoints lw 2 pt 7 ps 1.2 title 'validation'

set output outdir.'/throughput.png'
set title 'Chapter 08: throughput'
set ylabel 'tokens per second'
set y2label 'MFU (%)'
set y2tics
set ytics nomirror
set key bottom right
plot csv using 1:6 every ::1 with lines lw 1.5 title 'tokens/s', \
     csv using 1:($8 * 100) every ::1 axes x1y2 with lines lw 1.5 dt 2 title 'MFU'

unset y2label
unset y2tics
set ytics mirror
set output outdir.'/memory.png'
set title 'Chapter 08: peak memory of the fullest rank'
set ylabel 'MiB'
set key bottom right
plot csv using 1:($9 / 1048576) every ::1 with lines lw 2 title 'peak (parameters, gradients, AdamW, activations, buffers)'
