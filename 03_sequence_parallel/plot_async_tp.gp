# plot_async_tp.gp: --async-tp's ring steps in the forward of layer 0 (rank 0 of tp 2, the last
# training step), from async_tp_timeline.csv (ring,kind,step,posted_ms,computed_ms,waited_ms),
# which plot.sh writes. One row per ring step: the chunk's GEMMs (from posting the transfer to
# the GEMMs' end) and the wait for the transfer after them (what the GEMMs did not hide). The
# transfer itself was in flight from the post to the wait's end, behind the GEMMs.
if (!exists("outdir")) outdir = 'out/03'
file = outdir.'/async_tp_timeline.csv'
set datafile separator ','
set terminal pngcairo size 900,420 font ",11"
set output outdir.'/async_tp_timeline.png'
set title "Chapter 03 --async-tp: ring steps of layer 0's forward, rank 0 of tp 2\n(dim 256, T 512, B 2: GEMMs of a chunk vs the wait for the next chunk)"
set xlabel 'ms since the first ring step was posted'
set ytics ("wq wk wv (all-gather)" 0, "wo (reduce-scatter)" 1, "w1 w3 (all-gather)" 2, "w2 (reduce-scatter)" 3)
set yrange [3.6:-0.6]
set grid xtics
set key outside bottom center horizontal
set style fill solid 0.8 border -1
# a ring step's bar at y = ring, offset by step
y(r, k) = r + (k == 0 ? -0.18 : 0.18)
plot file skip 1 using 4:(y($1, $3)):4:5:(y($1, $3) - 0.15):(y($1, $3) + 0.15) with boxxyerror lc rgb '#0077bb' title "chunk GEMMs (transfer in flight)", \
     file skip 1 using 5:(y($1, $3)):5:6:(y($1, $3) - 0.15):(y($1, $3) + 0.15) with boxxyerror lc rgb '#ee3377' title "wait for the transfer"
