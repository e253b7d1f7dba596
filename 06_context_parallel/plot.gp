# plot.gp: chapter 06's figures (make plot-06 runs plot.sh, which makes attention_work.csv and
# ring_timeline_<balance>.csv: rank,step,owner,what,start_ms,end_ms).
if (!exists("outdir")) outdir = 'out/06'
if (!exists("tc")) tc = 8
if (!exists("seqlen")) seqlen = 64
set datafile separator ','
set terminal pngcairo size 900,520 font ",10"

# ---- attention work per rank at cp 4, contiguous against zigzag ----
set output outdir.'/work.png'
set title sprintf("Chapter 06: attention work per rank at cp 4 (seq-len %d, Tc = T / 2C = %d rows per chunk)\nscore elements per sequence and head in one layer's forward, as each rank counted them", seqlen, tc)
set style data histograms
set style histogram clustered gap 1.5
set style fill solid 0.8 border -1
set boxwidth 0.9
set ylabel sprintf('score elements (Tc^2 = %d per chunk pair)', tc*tc)
set xlabel 'cp rank'
set yrange [0:*]
set grid y
set key top left
plot outdir.'/attention_work.csv' skip 1 using 2:xtic(1) title 'contiguous: rank r holds chunks 2r, 2r+1' lc rgb 0xcc6677, \
     '' skip 1 using 4 title 'zigzag: rank r holds chunks r, 2C-1-r' lc rgb 0x4477aa, \
     '' skip 1 using ($0 - 0.18):2:(sprintf("%d", $2)) with labels offset 0,0.7 notitle, \
     '' skip 1 using ($0 + 0.18):4:(sprintf("%d", $4)) with labels offset 0,0.7 notitle

# ---- the ring's timeline at cp C: contiguous above zigzag ----
reset
set datafile separator ','
stats outdir.'/ring_timeline_contiguous.csv' skip 1 using 6 nooutput name "A"
stats outdir.'/ring_timeline_zigzag.csv' skip 1 using 6 nooutput name "Z"
if (!exists("C")) C = 4
set terminal pngcairo size 1200,2*(120+55*C)+60 font ",10"
set output outdir.'/ring.png'
row(r) = C - 1 - r
set ytics out nomirror ("" -10)
set for [r=0:C-1] ytics add (sprintf("rank %d", r) C-1-r)
set yrange [-0.6:C-0.4]
set xlabel 'ms since the first rank began the layer'
set grid x
set style fill solid 0.9 border rgb "white"
color(w) = w eq "wait" ? 0xbbbbbb : 0x4477aa
set xrange [0:(A_max > Z_max ? A_max : Z_max)]   # one time axis for both panels
set key below horizontal samplen 1.5
set multiplot layout 2,1 title sprintf("Chapter 06: the ring's C steps in the last layer's forward (cp %d, seq-len 512, dim 128): compute on the K/V block of rank r - t\n(its owner written in the box), then wait for the next block", C)
do for [b in "contiguous zigzag"] {
    csv = outdir.'/ring_timeline_'.b.'.csv'
    set title b.(b eq "contiguous" ? ": rank r holds chunks 2r, 2r+1; later ranks have more blocks to compute, the early ones wait" : ": rank r holds chunks r, 2C-1-r; every rank the same work")
    plot csv skip 1 using (($5+$6)/2):(row($1)):(($6-$5)/2):(0.32):(color(strcol(4))) with boxxyerror lc rgb variable notitle, \
         csv skip 1 using (($5+$6)/2):(row($1)):(strcol(4) eq "compute" ? sprintf("kv %d", $3) : "") with labels font ",8" tc rgb "white" notitle, \
         keyentry with boxes fs solid 0.9 lc rgb 0x4477aa title "compute on the block in hand", \
         keyentry with boxes fs solid 0.9 lc rgb 0xbbbbbb title "wait for the next block"
}
unset multiplot
