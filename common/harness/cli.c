/* cli.c: see cli.h. Every rank parses the same argv, so every rank reaches the same verdict
 * and comm_exit_usage() can end them all together without a hang. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli.h"
#include "comm.h"
#include "log.h"

int cli_int(const char *flag, const char *value, int min, int max) {
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || end == value || *end || v < min || v > max)
        comm_exit_usage("%s '%s' is not valid: expected an integer from %d to %d", flag, value, min, max);
    return (int)v;
}

float cli_float(const char *flag, const char *value, float min, float max) {
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || end == value || *end || !isfinite(v) || v < min || v > max)
        comm_exit_usage("%s '%s' is not valid: expected a number from %g to %g", flag, value, min, max);
    return (float)v;
}

uint64_t cli_u64(const char *flag, const char *value) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno || end == value || *end || value[0] == '-')
        comm_exit_usage("%s '%s' is not valid: expected a non-negative integer", flag, value);
    return (uint64_t)v;
}

int cli_choice(const char *flag, const char *value, const char *const *choices) {
    char list[256] = "";
    for (int i = 0; choices[i]; i++) {
        if (strcmp(value, choices[i]) == 0) return i;
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, choices[i], sizeof list - strlen(list) - 1);
    }
    comm_exit_usage("%s '%s' is not valid: expected one of %s", flag, value, list);
}

void cli_unknown(int argc, char **argv, int optind_after) {
    const char *arg = optind_after - 1 < argc ? argv[optind_after - 1] : "?";
    comm_exit_usage("%s: unknown flag or missing value; run with --help for the list of flags", arg);
}

void cli_require_divisible(const char *what, int n, const char *by_what, int d) {
    if (d > 0 && n % d == 0) return;
    int lower = (n / d) * d, upper = lower + d;
    if (lower > 0)
        comm_exit_usage("%s %d is not divisible by %s %d: use a multiple of %d such as %d or %d",
                        what, n, by_what, d, d, lower, upper);
    comm_exit_usage("%s %d is not divisible by %s %d: use a multiple of %d such as %d",
                    what, n, by_what, d, d, upper);
}

/* The first directory of `path` that does not exist yet (a copy to free), or NULL when the whole
 * path exists: what make_dirs will create, hence what to remove if the directory then turns out
 * to be unusable. */
static char *first_missing(const char *path) {
    char *p = strdup(path), *top = NULL;
    struct stat st;
    while (p && stat(p, &st) != 0) {
        free(top);
        top = strdup(p);
        char *slash = strrchr(p, '/');
        while (slash && slash > p && slash[1] == 0) { *slash = 0; slash = strrchr(p, '/'); }
        if (!slash || slash == p) break;
        *slash = 0;
    }
    free(p);
    return top;
}

/* Removes the empty directories from `path` up to and including `top` (what make_dirs made). */
static void remove_created(const char *path, const char *top) {
    char *p = strdup(path);
    size_t top_len = strlen(top);
    while (p && strlen(p) >= top_len) {
        rmdir(p);
        char *slash = strrchr(p, '/');
        if (!slash || slash == p) break;
        *slash = 0;
    }
    free(p);
}

/* Rank 0's verdict on an output directory: NULL if usable (and then it exists), else why not. */
static const char *output_dir_problem(const char *path, char *why, size_t len) {
    if (!path || !*path) return "the path is empty: expected a directory";
    size_t n = strlen(path);
    if (n > CLI_MAX_DIR_PATH) {
        snprintf(why, len, "the path is %zu bytes long: at most %d, to leave room for the names "
                 "of the files written there", n, CLI_MAX_DIR_PATH);
        return why;
    }
    for (const char *c = path; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) return "the path holds a control character";
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode)) return "it exists and is not a directory";

    char *top = first_missing(path);
    errno = 0;
    if (make_dirs(path) != 0) {
        snprintf(why, len, "cannot create that directory (%s)", strerror(errno ? errno : EIO));
        free(top);
        return why;
    }
    /* writable means a file can be created there: access(W_OK) says yes to root on a read-only
     * mount, and nothing about a full disk's directory table */
    char *probe = NULL;
    int fd = -1, err = 0;
    if (asprintf(&probe, "%s/.write_test.%ld", path, (long)getpid()) < 0) probe = NULL;
    if (probe) fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) err = probe ? errno : ENOMEM;
    else { close(fd); unlink(probe); }
    free(probe);
    if (fd < 0) {
        if (top) remove_created(path, top);
        free(top);
        snprintf(why, len, "cannot write in that directory (%s)", strerror(err));
        return why;
    }
    free(top);
    return NULL;
}

/* The path as the message shows it, in quotes: control characters as \xNN (the message stays
 * one line), and a path over CLI_MAX_DIR_PATH bytes cut, saying so. */
static void show_path(char *out, size_t len, const char *path) {
    size_t n = strlen(path), o = 0, shown = n > CLI_MAX_DIR_PATH ? 60 : n;
    o += (size_t)snprintf(out + o, len - o, "'");
    for (size_t i = 0; i < shown && o + 8 < len; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(out + o, len - o, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    out[o] = 0;
    if (shown < n) snprintf(out + o, len - o, "...' (%zu bytes, shown shortened)", n);
    else snprintf(out + o, len - o, "'");
}

void cli_require_output_dir(const char *flag, const char *path) {
    char why[160], shown[4 * CLI_MAX_DIR_PATH + 80] = "";
    const char *problem = NULL;
    if (comm_world()->rank == 0) {
        problem = output_dir_problem(path, why, sizeof why);
        show_path(shown, sizeof shown, path ? path : "");
    }
    comm_require_all(problem == NULL, "%s %s is not valid: %s", flag, shown, problem);
}
