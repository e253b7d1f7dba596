/* shard.h: how a matrix is split over the ranks of a group, and how to put it back together.
 *
 *   SHARD_REPLICATED  every rank holds the whole [rows, cols] matrix
 *   SHARD_ROWS        rank r holds rows    [r*rows/p, (r+1)*rows/p)   (column-parallel weights)
 *   SHARD_COLS        rank r holds columns [r*cols/p, (r+1)*cols/p)   (row-parallel weights),
 *                     stored as its own [rows, cols/p] matrix
 *
 * Used for checking and exporting only: gathers go through comm_host_gather and are not
 * counted in the lesson's communication tables.
 */
#pragma once
#include "cdefs.h"
#include "comm.h"

C_BEGIN

typedef enum { SHARD_REPLICATED = 0, SHARD_ROWS, SHARD_COLS } shard_layout;

/* The slice [r0, r0+nr) x [c0, c0+nc) of the full [rows, cols] matrix that `rank` of `size` owns. */
void shard_slice(shard_layout layout, int rows, int cols, int rank, int size,
                 int *r0, int *nr, int *c0, int *nc);

/* Gather the local device shard of every rank of `g` into the full [rows, cols] matrix in host
 * memory on rank 0 of `g` (`full` may be NULL on other ranks). Collective on g. */
void shard_gather_to_host(comm_group *g, shard_layout layout, const float *local_dev,
                          int rows, int cols, float *full);

C_END
