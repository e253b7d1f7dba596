# plot.gp: chapter 08's training run (make plot-08, from out/08/metrics.csv of make run-08).
# gnuplot -e "outdir='out/08'" 08_full_trainer/plot.gp
#   loss.png        training loss every step, validation loss at each evaluation, and the unigram
#                   model's loss (byte frequencies, no context): the line a model must get below
#   throughput.png  tokens per second; MFU is the same curve on the right axis (MFU = tokens/s x
#                   FLOPs per token / peak, a constant factor), so it is one line with two scales
#   memory.png      the fullest rank's peak memory, from 0: the first evaluation's buffers (step 50)
#                   add a few KiB, too little to see at this scale, as it should be
if (!exists("outdir")) outdir = 'out/08'
csv = outdir.'/metrics.csv'
set datafile separator ','
set datafile missing 'nan'
set terminal pngcairo size 800,500 font ",11"
set grid
set xlabel 'step'

stats csv using 10 every ::1 nooutput name 'unigram'
set output outdir.'/loss.png'
set title 'Chapter 08: Llama on Tiny Shakespeare (one token per byte)'
set ylabel 'loss (nats per byte)'
set key top right
plot csv using 1:2 every ::1 with lines lw 1.5 title 'training (the step''s batch)', \
     csv using 1:3 every ::1 with linespoints lw 2 pt 7 ps 1.2 title 'validation', \
     unigram_mean with lines lw 2 dt 2 lc rgb 'gray40' title sprintf('unigram model (byte frequencies): %.2f', unigram_mean)

# MFU / (tokens/s) is the same for every step: the right axis is the left one times that factor
stats csv using ($8 / $6) every ::1 nooutput name 'per_token'
set output outdir.'/throughput.png'
set title 'Chapter 08: throughput (MFU is the same curve on the right axis)'
set ylabel 'tokens per second'
set y2label 'MFU (%)'
set ytics nomirror
set y2tics
set format y2 '%.0f'
set link y2 via y * per_token_mean * 100 inverse y / (per_token_mean * 100)
set key bottom right
plot csv using 1:6 every ::1 with lines lw 1.5 title 'tokens/s (left) = MFU (right)'

unset link y2
unset y2label
unset y2tics
set format y2
set ytics mirror
set output outdir.'/memory.png'
set title 'Chapter 08: peak memory of the fullest rank'
set ylabel 'MiB'
set yrange [0:*]
set key bottom right
plot csv using 1:($9 / 1048576) every ::1 with lines lw 2 title 'peak (parameters, gradients, AdamW, activations, buffers)'
