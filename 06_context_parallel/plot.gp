# plot.gp: chapter 06's figure (make plot-06 runs plot.sh, which makes attention_work.csv).
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
plot outdir.'/attention_work.csv' skip 1 using 2:xtic(1) title 'contiguous: rank r holds chunks 2r, 2r+1   (4r + 3) Tc^2' lc rgb 0xcc6677, \
     '' skip 1 using 4 title 'zigzag: rank r holds chunks r, 2C-1-r   (2C + 1) Tc^2' lc rgb 0x4477aa, \
     '' skip 1 using ($0 - 0.18):2:(sprintf("%d", $2)) with labels offset 0,0.7 notitle, \
     '' skip 1 using ($0 + 0.18):4:(sprintf("%d", $4)) with labels offset 0,0.7 notitle
