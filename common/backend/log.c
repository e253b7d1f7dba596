/* log.c: rank-0 printing, timing, byte formatting (log.h). */
#include <stdarg.h>
#include <stdio.h>
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
