# plot.gp: chapter 02's logits memory per rank against tp, measured by the allocator beside the
# formulas B*T*V*4 (replicated) and B*T*V/tp*4 (loss parallel). make plot-02 runs plot.sh.
# Columns of logits_memory.csv: tp, loss_parallel (0/1), measured_bytes, formula_bytes.
if (!exists("outdir")) outdir = 'out/02'
file = outdir.'/logits_memory.csv'
MiB = 1024.0 * 1024.0
set datafile separator ','
# B*T*V*4, the replicated logits, read from the runs without loss parallel
stats file skip 1 using ($2 == 0 ? $4 / MiB : 1/0) name "full" nooutput
full_logits = full_max
set terminal pngcairo size 800,500 font ",11"
set output outdir.'/logits_memory.png'
set title 'Chapter 02: logits per rank, replicated vs vocabulary-parallel'
set xlabel 'tensor-parallel degree tp'
set ylabel 'logits per rank (MiB)'
set logscale x 2
set xtics (1, 2, 4, 8)
set xrange [0.9:4.6]
set yrange [0:1.45 * full_logits]
set samples 200
set grid
set key top right
plot full_logits with lines lw 2 dt 2 lc rgb '#cc3311' title 'formula B*T*V*4', \
     file skip 1 using 1:($2 == 0 ? $3 / MiB : 1/0) with points pt 7 ps 1.6 lc rgb '#cc3311' title 'measured, replicated (--no-loss-parallel)', \
     full_logits / x with lines lw 2 dt 2 lc rgb '#0077bb' title 'formula B*T*V/tp*4', \
     file skip 1 using 1:($2 == 1 ? $3 / MiB : 1/0) with points pt 5 ps 1.2 lc rgb '#0077bb' title 'measured, loss parallel'
