/* files.h: the files a run writes (CSV for gnuplot, per-rank outputs), each written aside and
 * renamed into place; mkdir -p; reading a whole file. Printing and timing are log.h's (backend). */
#pragma once
#include <stdbool.h>
#include <stdio.h>
#include "cdefs.h"

C_BEGIN

/* CSV written by rank 0 only (other ranks get NULL and the calls do nothing). Creates the
 * parent directory. header: "step,loss_baseline,loss_parallel". The file is written under a
 * temporary name beside it (PATH.tmp.<pid>) and renamed into place by csv_close, so PATH is
 * always a whole file: the previous one until the new one is complete. Every write is checked
 * (csv_row flushes each row): the first failure is kept, as "cannot write PATH: <strerror>",
 * for file_write_error, and csv_close then leaves the previous file as it was.
 * csv_open_append: the same, the file's rows so far copied first (the header only when new). */
FILE *csv_open(const char *path, const char *header);
FILE *csv_open_append(const char *path, const char *header);
/* On any rank (a file per rank). append: as csv_open_append. */
FILE *out_open(const char *path, const char *header, bool append);
void csv_row(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 0, or -1 (the temporary file removed, the previous file kept, file_write_error says why). */
int csv_close(FILE *f);
/* Closes every file still open and removes its temporary (a run ending early). */
void csv_abort_all(void);
/* The first failed write of this process ("cannot write PATH: No space left on device"), or NULL.
 * The harness turns it into one line and exit 2 on every rank (run.h: run_require_written). */
const char *file_write_error(void);

/* mkdir -p; 0 on success, -1 with errno set (ENOENT for an empty path, ENOTDIR when it exists
 * but is not a directory); on failure it removes the directories it created. */
int make_dirs(const char *path);
/* The whole of the regular file `path` in a fresh malloc'd buffer (*buf, the caller frees it) of
 * *size bytes, followed by one NUL byte so that a text file reads as a C string. Returns 0, or -1
 * with one line in err saying what failed ("cannot open: ...", "not a regular file", ...; the
 * caller names the path). */
int read_file(const char *path, unsigned char **buf, size_t *size, char *err, size_t errlen);

C_END
