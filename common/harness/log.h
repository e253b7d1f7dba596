/* log.h: rank-0 printing, CSV files for gnuplot, timing. */
#pragma once
#include <stdio.h>
#include "cdefs.h"

C_BEGIN

void log_set_rank(int rank);
int log_rank(void);
/* printf on rank 0 only, flushed. */
void log0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* CSV written by rank 0 only (other ranks get NULL and the calls do nothing). Creates the
 * parent directory. header: "step,loss_baseline,loss_parallel". */
FILE *csv_open(const char *path, const char *header);
void csv_row(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void csv_close(FILE *f);

double wall_seconds(void);
/* Human-readable bytes ("1.50 MiB") into a static rotating buffer. */
const char *fmt_bytes(double bytes);
/* mkdir -p; 0 on success, -1 with errno set (ENOENT for an empty path, ENOTDIR when it exists
 * but is not a directory); on failure it removes the directories it created. */
int make_dirs(const char *path);
/* The whole of the regular file `path` in a fresh malloc'd buffer (*buf, the caller frees it) of
 * *size bytes, followed by one NUL byte so that a text file reads as a C string. Returns 0, or -1
 * with one line in err saying what failed ("cannot open: ...", "not a regular file", ...; the
 * caller names the path). */
int read_file(const char *path, unsigned char **buf, size_t *size, char *err, size_t errlen);

C_END
