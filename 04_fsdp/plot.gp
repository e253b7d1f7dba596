# plot.gp: chapter 04's figures (make plot-04 runs plot.sh, which makes the CSV files).
if (!exists("outdir")) outdir = 'out/04'
set datafile separator ','
set terminal pngcairo size 1000,560 font ",10"

# ---- timeline: rank r's compute lane at y = 2r + 1, its all-gathers at 2r + 0.55 and its
# reduce-scatters at 2r + 0.2 (two lanes: a reduce-scatter moves while the next all-gather does) ----
# Each box is labelled: F3 / B3 a layer's forward / backward, AG3 / RS3 its all-gather / reduce-
# scatter ("E": the ends, the embedding, final norm and output layer gathered as one unit); the
# colours tell forward, backward, all-gather and reduce-scatter apart.
set output outdir.'/timeline.png'
set multiplot layout 2,1 title "Chapter 04: one step of FSDP on 2 ranks (F3, B3: layer 3's forward, backward; AG3, RS3: its all-gather, reduce-scatter, issue to end of wait; E: the ends)"
set xlabel 'ms since the step began'
set ytics ("rank 0 reduce-scatters" 0.2, "rank 0 all-gathers" 0.55, "rank 0 compute" 1, \
           "rank 1 reduce-scatters" 2.2, "rank 1 all-gathers" 2.55, "rank 1 compute" 3)
set yrange [0:3.6]
set grid x
set key outside right center vertical font ",9"
kind(w) = w[1:3] eq "fwd" ? 1 : w[1:3] eq "bwd" ? 2 : w[1:3] eq "all" ? 3 : 4
colour(k) = k == 1 ? 0x4477aa : k == 2 ? 0x228833 : k == 3 ? 0xcc6677 : 0xccbb44
unit(w) = (strstrt(w, "ends") ? "E" : word(w, words(w)))
label(w) = (kind(w) == 1 ? "F" : kind(w) == 2 ? "B" : kind(w) == 3 ? "AG" : "RS").unit(w)
lane(r) = 2*r + (strcol(1) eq "compute" ? 1 : kind(strcol(2)) == 3 ? 0.55 : 0.2)
height(x) = strcol(1) eq "compute" ? 0.25 : 0.15
do for [run in "prefetch no_prefetch"] {
    set title (run eq "prefetch" ? "with prefetch: the next layer's all-gather is issued before this layer computes" : "--no-prefetch: each layer's all-gather is issued when it is needed")
    plot for [r=0:1] outdir.'/'.run.'/timeline_fsdp_rank'.r.'.csv' skip 1 \
         using (($3+$4)/2):(lane(r)):(($4-$3)/2):(height(0)):(colour(kind(strcol(2)))) \
         with boxxyerror fs solid 0.8 lc rgb variable notitle, \
         for [r=0:1] outdir.'/'.run.'/timeline_fsdp_rank'.r.'.csv' skip 1 \
         using (($3+$4)/2):(lane(r)):(($4-$3) > 0.6 ? label(strcol(2)) : "") with labels font ",7" notitle, \
         keyentry with boxes fs solid 0.8 lc rgb 0x4477aa title 'forward', \
         keyentry with boxes fs solid 0.8 lc rgb 0x228833 title 'backward', \
         keyentry with boxes fs solid 0.8 lc rgb 0xcc6677 title 'all-gather (values)', \
         keyentry with boxes fs solid 0.8 lc rgb 0xccbb44 title 'reduce-scatter (gradients)'
}
unset multiplot
set key default

# ---- memory per rank by mode, 4 data ranks ----
set output outdir.'/memory.png'
set title "Chapter 04: memory per rank on 4 data ranks, measured by the allocator"
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.6
set ylabel 'KiB per rank'
set xlabel ''
set yrange [0:*]
set ytics auto
set grid y
set key top right
plot outdir.'/memory_modes.csv' skip 1 using ($5/1024):xtic(1) title 'parameters', \
     '' skip 1 using ($6/1024) title 'gradients', \
     '' skip 1 using ($7/1024) title 'AdamW m, v', \
     '' skip 1 using ($8/1024) title 'transient buffers'
