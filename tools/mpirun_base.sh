#!/usr/bin/env bash
# mpirun_base.sh: the mpirun command line the test scripts use when make did not export one.
# Root needs --allow-run-as-root; tests use up to 8 ranks on small machines (--oversubscribe);
# each CPU rank uses one BLAS thread; -q keeps Open MPI's banners out of the one-line errors.
# On a CPU with AVX-512 that OpenBLAS does not recognise, the ranks get its AVX-512 kernels
# (OPENBLAS_CORETYPE, tools/blas.sh coretype).
root=""; [ "$(id -u)" = 0 ] && root="--allow-run-as-root"
core=$("$(dirname "$0")/blas.sh" coretype)
echo "mpirun -q $root --oversubscribe --mca btl_vader_single_copy_mechanism none -x OPENBLAS_NUM_THREADS=1${core:+ -x OPENBLAS_CORETYPE=$core}"
