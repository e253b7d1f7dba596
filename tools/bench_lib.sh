# bench_lib.sh: what the benchmarks (make bench-NN, make bench-baseline) share; sourced, not run.
#   median [X ...]      the median of the numbers given, or of those read from standard input
#                       (separated by spaces or newlines): the middle one, or the mean of the
#                       middle two
#   with_single_copy MPIRUN BINARY
#                       prints MPIRUN with Open MPI's single-copy mechanism CMA instead of none when
#                       a one-step run of BINARY on 2 ranks works with it (and SINGLE_COPY is not
#                       none), else MPIRUN; says which on standard error. The shared-memory
#                       transport without single copy moves a large message through shared
#                       buffers a piece at a time, only while both processes are inside MPI calls;
#                       with CMA (process_vm_readv) the receiver reads the sender's buffer itself.
#                       The tests run without it (some containers forbid it); the benchmarks use it
#                       where it works.
#   steady_step_ms      reads a chapter run's output and prints the mean time of its steps after
#                       the first, from the per-step lines ("step   2 | loss ... | 1861.0 ms"), or
#                       step 1's alone when the run had one step. Step 1 is a warm-up (OpenBLAS's
#                       buffers, the allocator's first blocks, MPI's connections); the benchmarks
#                       leave it out of both sides, as tools/bench_baseline.py does for PyTorch.
median() {
    if [ $# -gt 0 ]; then printf '%s\n' "$@"; else cat; fi | tr -s ' \t' '\n' | grep . | sort -g |
        awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'
}
steady_step_ms() {
    awk '/^step +[0-9]+ \|.* ms$/ { if ($2 == 1) first = $(NF-1); else { sum += $(NF-1); n++ } }
         END { if (n) printf "%.1f\n", sum / n; else if (first != "") print first; else exit 1 }'
}
with_single_copy() {
    local cma=${1/single_copy_mechanism none/single_copy_mechanism cma}
    if [ "${SINGLE_COPY:-cma}" = cma ] && $cma -np 2 "$2" --dim 64 --n-layers 1 --steps 1 --out /tmp/bench_probe >/dev/null 2>&1; then
        echo "Open MPI's shared-memory transport with single-copy CMA (SINGLE_COPY=none for the tests' setting)" >&2
        echo "$cma"
    else
        echo "Open MPI's shared-memory transport without single copy (CMA unavailable or SINGLE_COPY=none)" >&2
        echo "$1"
    fi
}
