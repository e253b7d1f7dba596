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
#include "outputs.h"

/* A number as the user wrote it starts with a digit (or, where negatives are valid, a minus):
 * strtol and its kin would skip leading spaces and take a sign, so that ' -1' read as an unsigned
 * number became 2^64 - 1. */
static int starts_as_number(const char *value, int sign_ok) {
    return (value[0] >= '0' && value[0] <= '9') || (sign_ok && value[0] == '-' && value[1] >= '0' && value[1] <= '9') ||
           (sign_ok && value[0] == '-' && value[1] == '.') || value[0] == '.';
}

int cli_int(const char *flag, const char *value, int min, int max) {
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || end == value || *end || !starts_as_number(value, min < 0) || v < min || v > max)
        comm_exit_usage("%s '%s' is not valid: expected an integer from %d to %d", flag, value, min, max);
    return (int)v;
}

float cli_float(const char *flag, const char *value, float min, float max) {
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || end == value || *end || !starts_as_number(value, min < 0) || !isfinite(v) || v < min || v > max)
        comm_exit_usage("%s '%s' is not valid: expected a number from %g to %g", flag, value, min, max);
    return (float)v;
}

uint64_t cli_u64(const char *flag, const char *value) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno || end == value || *end || !starts_as_number(value, 0))
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

dtype cli_dtype(const char *flag, const char *value) {
    const char *names[DTYPE_NTYPES + 1] = {NULL};
    for (int t = 0; t < DTYPE_NTYPES; t++) names[t] = dtype_name((dtype)t);
    return (dtype)cli_choice(flag, value, names);
}

void cli_unknown(int argc, char **argv, int optind_after) {
    const char *arg = optind_after - 1 < argc ? argv[optind_after - 1] : "?";
    comm_exit_usage("%s: unknown flag or missing value; run with --help for the list of flags", arg);
}

void cli_require_output_dir(const char *flag, const char *path) {
    run_path p = {flag, path ? path : "", RUN_PATH_OUTPUT_DIR, NULL, true, false};
    run_paths_check(&p, 1);
    run_paths_create(&p, 1);
}
