/* log.h: rank-0 printing, timing and byte formatting, for every layer. It sits in backend, the
 * bottom layer, because the collectives set the rank it prints on (comm_init) and time every
 * call; the files a run writes (CSV, outputs) are the harness's (files.h). */
#pragma once
#include "cdefs.h"

C_BEGIN

/* This process's world rank, set once by comm_init; log0 prints only on rank 0. */
void log_set_rank(int rank);
int log_rank(void);
/* printf on rank 0 only, flushed. */
void log0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Seconds on a monotonic clock (CLOCK_MONOTONIC): differences are durations. */
double wall_seconds(void);
/* Human-readable bytes ("1.50 MiB") into a static rotating buffer. */
const char *fmt_bytes(double bytes);

C_END
