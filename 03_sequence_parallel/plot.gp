# plot.gp: chapter 03's activation memory, per layer and per rank, for tensor parallelism alone
# (tp) and with sequence parallelism (tp+sp), each with --ac none, selective and full, at
# tp = 1, 2, 4. Bars: measured by the allocator; crosses: the README's formula. make plot-03 runs
# plot.sh, which writes activation_memory.csv (mode,tp,measured_bytes,formula_bytes).
if (!exists("outdir")) outdir = 'out/03'
file = outdir.'/activation_memory.csv'
KiB = 1024.0
set datafile separator ','
# the cluster of a mode, and the place of a tp inside it
mode_x(s) = (s eq 'tp/none') ? 0 : (s eq 'tp/selective') ? 1 : (s eq 'tp/full') ? 2 : \
            (s eq 'tp+sp/none') ? 3.4 : (s eq 'tp+sp/selective') ? 4.4 : (s eq 'tp+sp/full') ? 5.4 : NaN
tp_dx(t) = (t == 1 ? -0.27 : t == 2 ? 0 : 0.27)
x(s, t) = mode_x(s) + tp_dx(t)
set terminal pngcairo size 900,520 font ",11"
set output outdir.'/activation_memory.png'
set title "Chapter 03: activations saved for backward, per layer per rank\n(default model: B 4, T 32, D 64, 4 heads, 4 kv heads, ffn 128)"
set ylabel 'bytes per layer per rank (KiB)'
set xtics ("tp\nnone" 0, "tp\nselective" 1, "tp\nfull" 2, "tp+sp\nnone" 3.4, "tp+sp\nselective" 4.4, "tp+sp\nfull" 5.4) scale 0
set xrange [-0.6:6.0]
set bmargin 4
set yrange [0:*]
set grid ytics
set key top right
set style fill solid 0.75 border -1
set boxwidth 0.25
plot for [t in "1 2 4"] file skip 1 using (x(strcol(1), $2)):($2 == t+0 ? $3 / KiB : 1/0) \
         with boxes lc rgb (t eq "1" ? '#bbbbbb' : t eq "2" ? '#0077bb' : '#ee7733') title 'tp = '.t.' (measured)', \
     file skip 1 using (x(strcol(1), $2)):($4 / KiB) with points pt 2 ps 1.4 lw 2 lc rgb 'black' title 'formula'
