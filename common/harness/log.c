/* log.c: rank-0 printing, CSV, timing, byte formatting. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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

int make_dirs(const char *path) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

FILE *csv_open(const char *path, const char *header) {
    if (my_rank != 0) return NULL;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) { *slash = 0; make_dirs(dir); }
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
