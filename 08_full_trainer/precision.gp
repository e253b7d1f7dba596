# precision.gp: a bf16 run's loss curve against its fp32 baseline (issue 37), from the CSV that
#   mpirun -np 1 build/cpu/08 --check --dtype bf16 --baseline-dtype fp32 --steps 300
# writes (OUT/loss_curves_bf16_fp32.csv: step, the fp32 baseline's loss, the bf16 run's):
#   gnuplot -e "outdir='out/08'" 08_full_trainer/precision.gp   ->  OUT/bf16_vs_fp32.png
# Above, both curves; below, bf16 minus fp32, with the 1% band --check judges the last 10 steps by.
if (!exists("outdir")) outdir = 'out/08'
csv = outdir.'/loss_curves_bf16_fp32.csv'
set datafile separator ','
set terminal pngcairo size 800,640 font ",11"
set output outdir.'/bf16_vs_fp32.png'
set multiplot layout 2,1 title 'Chapter 08 on Tiny Shakespeare: bf16 GEMM operands against fp32'
set grid
set ylabel 'training loss'
set key top right
plot csv using 1:2 every ::1 with lines lw 2 title 'fp32', \
     csv using 1:3 every ::1 with lines lw 1.5 dt 2 title 'bf16 (fp32 master weights and accumulation)'
set xlabel 'step'
set ylabel 'bf16 - fp32'
set key top right
plot csv using 1:($3 - $2) every ::1 with lines lw 1 title 'per step (two trajectories apart after ~30 steps)', \
     csv using 1:(0.01 * $2) every ::1 with lines lw 1 dt 3 lc rgb 'gray40' title '1% of the fp32 loss (judged: the mean of the last 10 steps)', \
     csv using 1:(-0.01 * $2) every ::1 with lines lw 1 dt 3 lc rgb 'gray40' notitle
unset multiplot
