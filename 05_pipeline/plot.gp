# plot.gp: one schedule's pipeline Gantt charts (make plot-05 runs plot.sh, which makes the CSV files
# and calls this once per schedule). Two panels, the same step under two run-time settings, on one
# time axis. Variables, given with gnuplot -e:
#   csv1, csv2   the chapter's pipeline_<schedule>_p<P>_m<M>_v<V>.csv of each run
#                (rank,action,microbatch,chunk,start_ms,end_ms)
#   sub1, sub2   each panel's title (the setting, and the bubble the run measured beside the theory)
#   png          the figure to write
#   head         the figure's title
#   P, V         pipeline ranks, chunks per rank (a box's virtual stage is chunk / P)
#   zb           1 when the backward is split into I and W (zb-h1)
if (!exists("csv1")) csv1 = 'out/05/defaults/pipeline_1f1b_p2_m4_v1.csv'
if (!exists("csv2")) csv2 = 'out/05/tuned/pipeline_1f1b_p2_m4_v1.csv'
if (!exists("sub1")) sub1 = ''
if (!exists("sub2")) sub2 = ''
if (!exists("png")) png = 'out/05/pipeline_1f1b.png'
if (!exists("head")) head = 'Chapter 05: one pipeline step'
if (!exists("P")) P = 2
if (!exists("V")) V = 1
if (!exists("zb")) zb = 0

set datafile separator ','
stats csv1 skip 1 using 6 nooutput name "A"
stats csv2 skip 1 using 6 nooutput name "B"
xmax = A_max > B_max ? A_max : B_max

set terminal pngcairo size 1200,2*(120+55*P)+60 font ",10"
set output png
set xrange [0:xmax]
set xlabel 'ms since the step began on each rank'
set ytics out nomirror ("" -10)   # explicit tics only: one per rank
set for [r=0:P-1] ytics add (sprintf("rank %d", r) P-1-r)
set yrange [-0.6:P-0.4]
set grid x
set key below horizontal samplen 1.5

# rank 0 on top, as in --print-schedule
row(r) = P - 1 - r
# F blue, B red, I orange, W green; a rank's later chunks (virtual stage 1, ...) in a lighter shade
vs(c) = int(c) / P
shade(rgb, v) = v == 0 ? rgb : ((int(rgb/65536) + 255)/2)*65536 + ((int(rgb/256)%256 + 255)/2)*256 + (rgb%256 + 255)/2
base(a) = a eq "F" ? 0x4477aa : a eq "B" ? 0xcc3344 : a eq "I" ? 0xee7733 : 0x228833
color(a, c) = shade(base(a), vs(c))
name(a) = a eq "F" ? "F forward" : a eq "B" ? "B backward" : a eq "I" ? "I input gradient" : "W weight gradient"
ops = zb ? "FIW" : "FB"
label(mb, c) = V > 1 ? sprintf("%d.%d", int(mb), vs(c)) : sprintf("%d", int(mb))
set style fill solid 0.9 border rgb "white"

set multiplot layout 2,1 title head
do for [panel=1:2] {
    csv = panel == 1 ? csv1 : csv2
    set title (panel == 1 ? sub1 : sub2)
    if (panel == 1) { unset key } else { set key below horizontal samplen 1.5 spacing 1 height 1; set bmargin 5 }
    plot csv skip 1 using (($5+$6)/2):(row($1)):(($6-$5)/2):(0.32):(color(strcol(2), $4)) \
             with boxxyerror lc rgb variable notitle, \
         csv skip 1 using (($5+$6)/2):(row($1)):(label($3, $4)) with labels font ",8" tc rgb "white" notitle, \
         for [k=1:strlen(ops)] keyentry with boxes fs solid 0.9 lc rgb base(ops[k:k]) title name(ops[k:k]), \
         for [k=1:(V > 1 ? 1 : 0)] keyentry with boxes fs solid 0.9 lc rgb shade(base("F"), 1) title "lighter: the rank's later chunk"
}
unset multiplot
