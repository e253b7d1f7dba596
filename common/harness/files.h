/* files.h: the files a run writes (CSV for gnuplot, per-rank outputs), each written aside and
 * renamed into place; mkdir -p; reading a whole file. Printing and timing are log.h's (backend). */
#pragma once
#include <stdbool.h>
#include <stdio.h>
#include "cdefs.h"

C_BEGIN

/* CSV written by rank 0 only (other ranks get NULL and the calls do nothing). Creates the
 * parent directory. header: "step,loss_baseline,loss_parallel". The file is written under a
 * temporary name beside it (PATH.tmp.<pid>.<random>, files.h: temp_name) and renamed into place by csv_close, so PATH is
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

/* ---- file operations that never go through a symbolic link ----
 * Inside the directories a run owns (--out, --dump, --ckpt-dir) a link is foreign: nothing is
 * deleted or replaced through one.
 * path_is_link: whether `path` itself (not what it points to) is a symbolic link (lstat).
 * temp_name: a name beside `path` unique to this run and this call, "PATH.tmp.<pid>.<8 hex>"
 *   (the pid, and a random part so that a name left by a crashed run with the same pid, or
 *   planted, is never taken for this run's own); a copy to free. Create it with O_EXCL (or
 *   mkdir, which never replaces anything).
 * remove_owned_dir: unlinks the entries of the directory `path` that owned(name) accepts, then
 *   the directory if it is empty; never through a link: when `path` is a link, nothing is
 *   touched and it returns -1 with errno ELOOP, and an entry that is a link is unlinked itself,
 *   never what it points to. 0, or -1 with errno. */
bool path_is_link(const char *path);
char *temp_name(const char *path);
/* The random part of temp_name alone, for a name several ranks share (rank 0 draws it and tells
 * the others); temp_name_of: PATH.tmp.<pid>.<r as 8 hex> with the given pid and r. */
unsigned int temp_random(void);
char *temp_name_of(const char *path, long pid, unsigned int r);
/* The length of `name` without the temporary suffix temp_name gives it (".tmp.<pid>.<8 hex>"),
 * or without a plain ".tmp": what a directory's owner checks names against. */
size_t name_without_temp(const char *name);
/* Opens a new file `path` for writing (O_CREAT | O_EXCL | O_NOFOLLOW): never an existing file,
 * never through a link. NULL with errno on failure. */
FILE *create_new_file(const char *path, const char *mode);
int remove_owned_dir(const char *path, bool (*owned)(const char *name));
/* For a stop signal's handler (guard_on_stop), where only system calls are safe: unlinks every
 * entry of the open directory `dir_fd` (files and links themselves, never what a link points to;
 * a subdirectory stays), then rmdir(path) if it is empty. For a directory this run made under a
 * name of its own (a dump being written), whose half is worth nothing. */
void remove_own_dir_in_handler(int dir_fd, const char *path);

/* `path` as a message shows it: whole up to 300 bytes, else its first and last 120 bytes around
 * "...", with its length, so that a line naming a very long path still ends with the reason.
 * Written into buf[len]; returns buf. */
const char *path_for_message(const char *path, char *buf, size_t len);

/* mkdir -p; 0 on success, -1 with errno set (ENOENT for an empty path, ENOTDIR when it exists
 * but is not a directory); on failure it removes the directories it created. */
int make_dirs(const char *path);
/* The whole of the regular file `path` in a fresh malloc'd buffer (*buf, the caller frees it) of
 * *size bytes, followed by one NUL byte so that a text file reads as a C string. Returns 0, or -1
 * with one line in err saying what failed ("cannot open: ...", "not a regular file", ...; the
 * caller names the path). */
int read_file(const char *path, unsigned char **buf, size_t *size, char *err, size_t errlen);

C_END
