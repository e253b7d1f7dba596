/* report.c: measured-beside-formula tables (see report.h). */
#include <math.h>
#include <stdio.h>
#include "log.h"
#include "parity.h"
#include "report.h"

int report_communication(comm_group *const *groups, int n_groups, int steps,
                         const comm_expectation *expect, int n_expect) {
    int mismatches = 0;
    log0("communication per step (measured | formula):\n");
    log0("  %-14s %-15s %8s %12s %12s | %8s %12s  %-24s\n", "group", "collective", "calls",
         "payload", "wire/rank", "calls", "payload", "formula");
    for (int i = 0; i < n_expect; i++) {
        const comm_expectation *e = &expect[i];
        const collective_stats *s = &e->group->stats[e->kind];
        double calls = (double)s->calls / steps, bytes = s->payload_bytes / steps;
        int ok = fabs(calls - e->calls_per_step) < 1e-9 &&
                 fabs(bytes - e->payload_bytes_per_step) < 0.5;
        if (!ok) mismatches++;
        log0("  %-14s %-15s %8.2f %12s %12s | %8.2f %12s  %-24s %s\n", e->group->name,
             collective_name(e->kind), calls, fmt_bytes(bytes), fmt_bytes(s->wire_bytes / steps),
             e->calls_per_step, fmt_bytes(e->payload_bytes_per_step), e->formula,
             ok ? "" : "MISMATCH");
        if (!ok) parity_fail("a collective's measured calls or bytes differ from the formula (above)");
    }
    /* Anything that moved data but was not predicted is a mismatch too. */
    for (int g = 0; g < n_groups; g++)
        for (int k = 0; k < COLL_NKINDS; k++) {
            if (groups[g]->stats[k].calls == 0 || k == COLL_BARRIER) continue;
            int expected = 0;
            for (int i = 0; i < n_expect; i++)
                if (expect[i].group == groups[g] && expect[i].kind == (collective_kind)k) expected = 1;
            if (expected) continue;
            mismatches++;
            log0("  %-14s %-15s %8.2f %12s %12s | %8s %12s  %-24s MISMATCH\n", groups[g]->name,
                 collective_name(k), (double)groups[g]->stats[k].calls / steps,
                 fmt_bytes(groups[g]->stats[k].payload_bytes / steps),
                 fmt_bytes(groups[g]->stats[k].wire_bytes / steps), "-", "-", "(not predicted)");
            parity_fail("a collective ran that the formulas do not predict (above)");
        }
    return mismatches;
}

int report_memory(const char *title, const memory_row *rows, int n_rows) {
    int mismatches = 0;
    log0("%s (measured | formula):\n", title);
    for (int i = 0; i < n_rows; i++) {
        int ok = fabs(rows[i].measured_bytes - rows[i].formula_bytes) < 0.5;
        if (!ok) mismatches++;
        log0("  %-28s %12s | %12s  %-30s %s\n", rows[i].what, fmt_bytes(rows[i].measured_bytes),
             fmt_bytes(rows[i].formula_bytes), rows[i].formula, ok ? "" : "MISMATCH");
        if (!ok) parity_fail("a measured memory figure differs from its formula (above)");
    }
    return mismatches;
}
