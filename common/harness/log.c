/* log.c: rank-0 printing, CSV, timing, byte formatting. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "log.h"

static int my_rank = 0;
void log_set_rank(int rank) { my_rank = rank; }
int log_rank(void) { return my_rank; }

void log0(const char *fmt, ...) {
    if (my_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* mkdir -p. The path is copied whole (no fixed buffer to truncate it into); an empty path, or
 * one longer than PATH_MAX, is refused with errno ENOENT or ENAMETOOLONG. A path that exists but
 * is not a directory fails with ENOTDIR. On failure the directories this call created are
 * removed again, so a refused path leaves nothing behind. */
int make_dirs(const char *path) {
    size_t n = path ? strlen(path) : 0;
    if (n == 0) { errno = ENOENT; return -1; }
    if (n >= PATH_MAX) { errno = ENAMETOOLONG; return -1; }
    char *buf = malloc(n + 1);
    if (!buf) { errno = ENOMEM; return -1; }
    memcpy(buf, path, n + 1);
    /* created[] holds the offsets where each directory this call made ends (buf[k] = 0 there) */
    size_t *created = malloc((n + 1) * sizeof *created);
    int n_created = 0, rc = 0, err = 0;
    if (!created) { free(buf); errno = ENOMEM; return -1; }
    for (size_t k = 1; k <= n && rc == 0; k++) {
        if (k < n && buf[k] != '/') continue;
        if (buf[k - 1] == '/') continue;   /* "a//b" or a trailing '/' */
        char saved = buf[k];
        buf[k] = 0;
        if (mkdir(buf, 0755) == 0) created[n_created++] = k;
        else if (errno != EEXIST) { rc = -1; err = errno; }
        buf[k] = saved;
    }
    struct stat st;
    if (rc == 0 && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))) { rc = -1; err = ENOTDIR; }
    if (rc != 0)
        for (int i = n_created - 1; i >= 0; i--) {   /* undo, deepest first */
            buf[created[i]] = 0;
            rmdir(buf);
        }
    free(created);
    free(buf);
    errno = err;
    return rc;
}

FILE *csv_open(const char *path, const char *header) {
    if (my_rank != 0) return NULL;
    char *dir = strdup(path);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    if (slash && slash != dir) { *slash = 0; make_dirs(dir); }
    free(dir);
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "warning: cannot write %s: %s\n", path, strerror(errno)); return NULL; }
    fprintf(f, "%s\n", header);
    return f;
}

void csv_row(FILE *f, const char *fmt, ...) {
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
}

void csv_close(FILE *f) { if (f) fclose(f); }

double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

const char *fmt_bytes(double bytes) {
    static char bufs[8][32];
    static int next = 0;
    char *b = bufs[next++ % 8];
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) { bytes /= 1024.0; u++; }
    snprintf(b, 32, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
    return b;
}

int read_file(const char *path, unsigned char **buf, size_t *size, char *err, size_t errlen) {
    *buf = NULL;
    *size = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) { snprintf(err, errlen, "cannot open: %s", strerror(errno)); return -1; }
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0) {
        snprintf(err, errlen, "cannot stat: %s", strerror(errno));
        fclose(fp);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "not a regular file");
        fclose(fp);
        return -1;
    }
    size_t n = (size_t)sb.st_size;
    unsigned char *b = malloc(n + 1);
    if (!b) {
        snprintf(err, errlen, "out of memory reading %zu bytes", n);
        fclose(fp);
        return -1;
    }
    size_t got = fread(b, 1, n, fp);
    int read_error = ferror(fp);
    fclose(fp);
    if (got != n) {
        snprintf(err, errlen, "read %zu of %zu bytes%s", got, n, read_error ? " (I/O error)" : " (file changed while reading?)");
        free(b);
        return -1;
    }
    b[n] = 0;
    *buf = b;
    *size = n;
    return 0;
}
