#!/usr/bin/env bash
# steady_step_ms.sh < OUTPUT: the mean time of a chapter run's steps after the first, from its
# per-step lines ("step   2 | loss ... | 1861.0 ms"); step 1's alone when the run had one step.
# Step 1 is a warm-up (OpenBLAS's buffers, the allocator's first blocks, MPI's connections), and
# the benchmarks leave it out of both sides, as tests/bench_baseline.py does for PyTorch.
awk '/^step +[0-9]+ \|.* ms$/ { if ($2 == 1) first = $(NF-1); else { sum += $(NF-1); n++ } }
     END { if (n) printf "%.1f\n", sum / n; else if (first != "") print first; else exit 1 }'
