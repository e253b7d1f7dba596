/* report.h: the tables every chapter ends with, measured beside the formula.
 *
 * Communication: per group and collective, calls and payload bytes per step as counted by
 * comm.c, next to what the chapter's README predicts. Memory: bytes per category as counted
 * by the allocator, next to the formula. A row whose measurement differs from its formula is
 * marked MISMATCH and recorded as a parity failure (parity_fail): the numbers are deterministic.
 */
#pragma once
#include "cdefs.h"
#include "comm.h"
#include "device.h"

C_BEGIN

typedef struct {
    comm_group *group;
    collective_kind kind;
    double calls_per_step;          /* what the README predicts */
    double payload_bytes_per_step;
    const char *formula;            /* e.g. "2 x B*D*4" */
} comm_expectation;

/* Prints one row per expectation, plus any (group, collective) that was used but not expected.
 * `steps` divides the accumulated counts. Rank 0 prints; returns the number of mismatches. */
int report_communication(comm_group *const *groups, int n_groups, int steps,
                         const comm_expectation *expect, int n_expect);

typedef struct {
    const char *what;               /* "parameters", "logits buffer", ... */
    double measured_bytes;
    double formula_bytes;
    const char *formula;
} memory_row;

/* Prints the rows; returns the number of rows whose measurement differs from the formula. */
int report_memory(const char *title, const memory_row *rows, int n_rows);

C_END
