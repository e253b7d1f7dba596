/* cli.h: flag values checked the same way in every chapter. A bad value ends every rank with
 * one line from rank 0 naming the flag, the value and what is valid, and exit status 2. */
#pragma once
#include <stdint.h>
#include "cdefs.h"

C_BEGIN

/* An integer in [min, max]. */
int cli_int(const char *flag, const char *value, int min, int max);
/* A finite float in [min, max]. */
float cli_float(const char *flag, const char *value, float min, float max);
uint64_t cli_u64(const char *flag, const char *value);
/* One of the NULL-terminated `choices`; returns its index. */
int cli_choice(const char *flag, const char *value, const char *const *choices);
/* The flag getopt_long could not parse (unknown, or missing its value): exit 2. */
void cli_unknown(int argc, char **argv, int optind_after) __attribute__((noreturn));
/* "n is not divisible by d" with the nearest valid values named, exit 2. */
void cli_require_divisible(const char *what, int n, const char *by_what, int d);

C_END
