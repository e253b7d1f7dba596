# bench_lib.sh: what the benchmarks (make bench-NN, make bench-baseline) share; sourced, not run.
#   median [X ...]      the median of the numbers given, or of those read from standard input
#                       (separated by spaces or newlines): the middle one, or the mean of the
#                       middle two
#   steady_step_ms      reads a chapter run's output and prints the mean time of its steps after
#                       the first, from the per-step lines ("step   2 | loss ... | 1861.0 ms"), or
#                       step 1's alone when the run had one step. Step 1 is a warm-up (OpenBLAS's
#                       buffers, the allocator's first blocks, MPI's connections); the benchmarks
#                       leave it out of both sides, as tests/bench_baseline.py does for PyTorch.
median() {
    if [ $# -gt 0 ]; then printf '%s\n' "$@"; else cat; fi | tr -s ' \t' '\n' | grep . | sort -g |
        awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'
}
steady_step_ms() {
    awk '/^step +[0-9]+ \|.* ms$/ { if ($2 == 1) first = $(NF-1); else { sum += $(NF-1); n++ } }
         END { if (n) printf "%.1f\n", sum / n; else if (first != "") print first; else exit 1 }'
}
