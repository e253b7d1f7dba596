# plot.gp: chapter 04's figures (make plot-04 runs plot.sh, which makes the CSV files).
if (!exists("outdir")) outdir = 'out/04'
set datafile separator ','
set terminal pngcairo size 1000,560 font ",10"

# ---- timeline: rank r's compute lane at y = 2r + 1, its communication lane at y = 2r + 0.4 ----
set output outdir.'/timeline.png'
set multiplot layout 2,1 title "Chapter 04: one step of FSDP on 2 ranks (compute: layers' forward/backward; comm: issue to end of wait)"
set xlabel 'ms since the step began'
set ytics ("rank 0 comm" 0.4, "rank 0 compute" 1, "rank 1 comm" 2.4, "rank 1 compute" 3)
set yrange [0:3.6]
set grid x
set key off
lane(r) = 2*r + (strcol(1) eq "compute" ? 1 : 0.4)
do for [run in "prefetch no_prefetch"] {
    set title (run eq "prefetch" ? "with prefetch: the next layer's all-gather is issued before this layer computes" : "--no-prefetch: each layer's all-gather is issued when it is needed")
    plot for [r=0:1] outdir.'/'.run.'/timeline_fsdp_rank'.r.'.csv' skip 1 \
         using (($3+$4)/2):(lane(r)):(($4-$3)/2):(0.25):(strcol(1) eq "compute" ? 0x4477aa : 0xcc6677) \
         with boxxyerror fs solid 0.8 lc rgb variable
}
unset multiplot

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
