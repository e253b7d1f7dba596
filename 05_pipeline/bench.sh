#!/usr/bin/env bash
# bench.sh BINARY: make bench-05. The bubble of each schedule at P = 2 (one rank per core), measured
# against the published formula, with Open MPI's defaults and with two settings of the CPU
# run-time that remove what the formula leaves out (README, "The bubble on this machine"):
#   defaults   as `make run-05` runs
#   tuned      --mca btl_vader_eager_limit 32768: a message of up to 32 KiB is copied out whole by
#              MPI_Isend, so it arrives without the sender calling MPI again (each message here
#              is 1 x 30 x 256 x 4 = 30 KiB). (An activation set allocated at F reuses the memory
#              of one freed at B: the allocator keeps freed blocks, common/backend/memory.c.)
# Size: dim 256, 8 layers, ffn 704, 8 sequences of 30 tokens in M = 8 microbatches (a forward of
# one microbatch through 4 layers takes milliseconds, a message microseconds). Each case runs REPS
# times (default 3), interleaved, without --check; medians are printed:
#   theory     the formula at unit costs (F = 1, B = 2, I = W = 1), as the run prints it
#   measured   the run's "measured idle share": the mean over the ranks of 1 - busy / the longest
#              rank's step time; judged: PASS when within 5 points of theory
#   common     1 - all busy time / (P x the pipeline's step), from the timeline CSV: the formula's
#              own definition (the ranks start their steps together, after the last step's loss sum)
#   replay     the same lists replayed with each action's measured duration and messages that take
#              no time: what this step's compute alone explains
#   costs      the same replay with every action lasting the mean of its kind over both ranks:
#              uniform stages at this machine's cost ratios (gpipe, 1f1b, interleaved: exactly
#              the theory, whatever B / F is; zb-h1: the theory at the measured F, I, W)
#   r0/r1      rank 0's compute time over rank 1's: 1.00 when the two stages run equally fast
#   balanced   the median of `measured` over the runs whose r0/r1 lies within 5% of 1 (how many of
#              the runs): the schedule's bubble where the machine gave both stages the same speed.
#              On a virtual machine one core is at times 20-30% slower than the other; the idle
#              time that adds is the machine's, not the schedule's. The verdict judges this column
#              (n/a when no run was balanced); `measured` is the median over every run.
#   F B I W    mean duration of each action, ms (one microbatch, one chunk)
# A benchmark, not a test: the numbers depend on the machine and its load.
set -eu
bin=$1
mpirun=${MPIRUN_BASE:-$(dirname "$0")/../tools/mpirun_base.sh}
[ -x "$mpirun" ] && mpirun=$($mpirun)
reps=${REPS:-3}; M=${M:-8}
size="--dim 256 --n-layers 8 --ffn-dim 704 --seq-len 30 --batch 8 --microbatches $M --steps 3"
tuned="--mca btl_vader_eager_limit 32768"
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
scheds=(gpipe 1f1b interleaved zb-h1)
configs=(defaults tuned)

# One timeline CSV -> "common replay F B I W" (replay: each rank runs its list in order, an action
# starts when its rank is free and its input's action has ended; W needs only its own rank's I).
analyse() {
    awk -F, '
    NR > 1 {
        r = $1; k = cnt[r]++; op[r, k] = $2; mb[r, k] = $3; ch[r, k] = $4; dur[r, k] = $6 - $5
        busy += $6 - $5; rbusy[r] += $6 - $5; if ($6 > span) span = $6
        if (r + 1 > P) P = r + 1; if ($4 + 1 > C) C = $4 + 1
        sum[$2] += $6 - $5; num[$2]++
    }
    # the lists replayed with messages that take no time; each action lasts its own measured time
    # (uniform = 0) or the mean of its kind over every rank (uniform = 1); returns the step
    function replay(uniform,    r, k, o, t, dep, left, moved, end, nxt, free_at, done) {
        for (r = 0; r < P; r++) { left += cnt[r]; nxt[r] = 0; free_at[r] = 0 }
        while (left > 0) {
            moved = 0
            for (r = 0; r < P; r++)
                while (nxt[r] < cnt[r]) {
                    k = nxt[r]; o = op[r, k]; t = free_at[r]; dep = ""
                    if (o == "F" && ch[r, k] > 0) dep = "F" SUBSEP mb[r, k] SUBSEP ch[r, k] - 1
                    if ((o == "B" || o == "I") && ch[r, k] < C - 1) dep = o SUBSEP mb[r, k] SUBSEP ch[r, k] + 1
                    if (dep != "") { if (!(dep in done)) break; if (done[dep] > t) t = done[dep] }
                    free_at[r] = t + (uniform ? sum[o] / num[o] : dur[r, k]); done[o, mb[r, k], ch[r, k]] = free_at[r]
                    if (free_at[r] > end) end = free_at[r]
                    nxt[r]++; left--; moved++
                }
            if (!moved) return -1
        }
        return end
    }
    END {
        a = replay(0); u = replay(1)
        if (a <= 0 || u <= 0) { print "nan nan nan nan - - - -"; exit }
        printf "%.1f %.1f %.1f %.2f", 100 * (1 - busy / (P * span)), 100 * (1 - busy / (P * a)), 100 * (1 - busy / (P * u)), rbusy[0] / rbusy[P - 1]
        split("F B I W", ops, " ")
        for (i = 1; i <= 4; i++) printf " %s", num[ops[i]] ? sprintf("%.2f", sum[ops[i]] / num[ops[i]]) : "-"
        printf "\n"
    }' "$1"
}
. "$(dirname "$0")/../tools/bench_lib.sh"   # median

declare -A theory measured common replay costs ratio cost balanced
for rep in $(seq "$reps"); do
    for c in "${configs[@]}"; do
        extra=""; [ "$c" = tuned ] && extra=$tuned
        for s in "${scheds[@]}"; do
            V=1; [ "$s" = interleaved ] && V=2
            log=$($mpirun $extra -np 2 "$bin" $size --schedule "$s" --virtual-stages $V --out "$out")
            line=$(echo "$log" | sed -nE 's/^bubble of the last step.*measured idle share ([0-9.]+)%.*theory ([0-9.]+)%.*/\1 \2/p')
            [ -n "$line" ] || { echo "bench-05: no bubble line from $s ($c)"; echo "$log" | tail -5; exit 1; }
            set -- $line $(analyse "$out/pipeline_${s}_p2_m${M}_v${V}.csv")
            measured[$c,$s]+="$1 "; theory[$c,$s]=$2; common[$c,$s]+="$3 "; replay[$c,$s]+="$4 "
            balanced[$c,$s]+=$(awk -v m="$1" -v r="$6" 'BEGIN { if (r >= 0.95 && r <= 1.05) printf "%s ", m }')
            costs[$c,$s]+="$5 "; ratio[$c,$s]+="$6 "
            for i in 0 1 2 3; do a=$((7 + i)); cost[$c,$s,$i]+="${!a} "; done
        done
    done
done

echo "P = 2 ranks, M = $M microbatches (interleaved: V = 2), $reps runs each, medians; bubble in % of P x step"
printf '%-9s %-12s %7s %9s %14s %6s  %-7s %7s %7s %7s %6s %6s %6s %6s %6s\n' config schedule theory measured balanced diff verdict common replay costs r0/r1 F B I W
for c in "${configs[@]}"; do
    for s in "${scheds[@]}"; do
        t=${theory[$c,$s]}; m=$(echo ${measured[$c,$s]} | median)
        nb=$(echo ${balanced[$c,$s]:-} | wc -w)
        if [ "$nb" -gt 0 ]; then
            b=$(echo ${balanced[$c,$s]} | median)
            bal=$(printf '%5.1f%% (%d/%d)' "$b" "$nb" "$reps")
            d=$(awk -v m="$b" -v t="$t" 'BEGIN {printf "%+.1f", m - t}')
            v=$(awk -v m="$b" -v t="$t" 'BEGIN {print (m - t <= 5 && t - m <= 5) ? "PASS" : "FAIL"}')
        else bal="- (0/$reps)"; d="-"; v="n/a"; fi
        durs=""
        for i in 0 1 2 3; do
            x=${cost[$c,$s,$i]}; case "$x" in -*) durs+=$(printf ' %6s' -);; *) durs+=$(printf ' %6.2f' "$(echo $x | median)");; esac
        done
        printf '%-9s %-12s %6.1f%% %8.1f%% %14s %6s  %-7s %6.1f%% %6.1f%% %6.1f%% %6.2f%s\n' "$c" "$s" "$t" "$m" "$bal" "$d" "$v" \
               "$(echo ${common[$c,$s]} | median)" "$(echo ${replay[$c,$s]} | median)" \
               "$(echo ${costs[$c,$s]} | median)" "$(echo ${ratio[$c,$s]} | median)" "$durs"
    done
done
echo "measured: the run's idle share (over the longest rank's step); common: the same from the CSV;"
echo "replay: the measured durations, messages taking no time; costs: the same at uniform stages."
echo "balanced: measured over the runs with r0/r1 within 5% of 1 (how many); PASS: balanced within 5"
echo "points of theory. A message above Open MPI's eager limit moves only while"
echo "its sender is inside an MPI call: the executor calls comm_progress after every GEMM (common near"
echo "replay); r0/r1 away from 1.00: one core was slower (replay above costs). README, \"The bubble on"
echo "this machine\"."
