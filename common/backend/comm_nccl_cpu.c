/* comm_nccl_cpu.c: the CPU build has no NCCL (its twin, comm_nccl.cu, is the CUDA build's
 * COMM=nccl). comm.c asks, and refuses COMM=nccl with one line. */
#include "comm_backend.h"

const comm_backend *comm_nccl_backend(void) { return NULL; }

