/* comm_mpi_types.h: MPI's element type and reduction for a dtype (internal to common/backend:
 * comm_mpi.c defines them, the emulation comm_nccl_sim.c shares them).
 *
 * fp32 is MPI_FLOAT with MPI_SUM / MPI_MAX. MPI has no bf16: a bf16 element travels as a 16-bit
 * integer, and its SUM and MAX are user-defined operations that widen both operands to fp32,
 * combine them and round the result once to bf16 (what NCCL's ncclBfloat16 does per step of its
 * ring; the order of the ranks' additions is MPI's, as for fp32). */
#pragma once
#include <mpi.h>
#include "comm.h"
#include "dtype.h"

MPI_Datatype comm_mpi_type(dtype t);
MPI_Op comm_mpi_op(comm_op op, dtype t);
