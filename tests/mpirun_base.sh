#!/usr/bin/env bash
# mpirun_base.sh: the mpirun command line the test scripts use when make did not export one.
# Root needs --allow-run-as-root; tests use up to 8 ranks on small machines (--oversubscribe);
# each CPU rank uses one BLAS thread; -q keeps Open MPI's banners out of the one-line errors.
root=""; [ "$(id -u)" = 0 ] && root="--allow-run-as-root"
echo "mpirun -q $root --oversubscribe --mca btl_vader_single_copy_mechanism none -x OPENBLAS_NUM_THREADS=1"
