/* comm_mpi_types.h: MPI's element type and reduction for a dtype (internal to common/backend:
 * comm_mpi.c defines them, the emulation comm_nccl_sim.c shares them).
 *
 * fp32 is MPI_FLOAT with MPI_SUM / MPI_MAX. MPI has no bf16: a bf16 element travels as a 16-bit
 * integer, and its SUM and MAX are user-defined operations that widen both operands to fp32,
 * combine them and round the result once to bf16 (what NCCL's ncclBfloat16 does per step of its
 * ring; the order of the ranks' additions is MPI's, as for fp32). */
#pragma once
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "dtype.h"

MPI_Datatype comm_mpi_type(dtype t);
MPI_Op comm_mpi_op(comm_op op, dtype t);

/* MPI_Alltoallv's int counts and displacements (elements) from the size_t counts of comm.h's
 * all-to-all with counts, each chunk right after the one before. Returns the total; a count
 * beyond MPI's int is a programming error (the chapters' messages are far smaller). */
static inline size_t comm_mpi_counts(const size_t *counts, int n, int *c, int *d) {
    size_t total = 0;
    for (int p = 0; p < n; p++) {
        if (counts[p] > INT_MAX || total > INT_MAX) {
            fprintf(stderr, "comm: an all-to-all chunk of %zu elements at offset %zu exceeds MPI's int\n", counts[p], total);
            exit(1);
        }
        c[p] = (int)counts[p];
        d[p] = (int)total;
        total += counts[p];
    }
    return total;
}
