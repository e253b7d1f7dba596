/* ranks: 1 */
/* test_schedule.c: chapter 05's pipeline schedules (05_pipeline/schedule.h), simulated; no rank
 * sends anything.
 *
 * For every schedule and every P in 1..8, M in 1..16, V in 1..4, pp_schedule_build either
 * refuses, exactly where refused_flag (the rules of schedule.h, restated) says and naming that
 * flag, or its lists pass these checks, made here from the simulated times and not from the
 * simulator's own tallies:
 *   - each action the schedule needs (F and B, or F, I and W, of every (mb, chunk)) appears
 *     exactly once, on the rank of its chunk;
 *   - at unit costs and at other costs, each action starts as soon as its rank is free and its
 *     dependencies have ended, and lasts its cost;
 *   - what each rank sends each other rank comes in the order the receiver expects;
 *   - the bubble is the published formula exactly, each rank's peak in flight its closed form,
 *     and the messages 2 M (P V - 1).
 * Then: the published figures of P = 4, M = 8 (../shared/ALGORITHMS.md), broken lists the
 * simulator and the message check must refuse, the names, and one printed table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "test_util.h"
#include "../05_pipeline/schedule.h"

/* The rules of schedule.h: the flag a refusal of (k, P, M, V) must name, NULL where k admits it. */
static const char *refused_flag(pp_schedule_kind k, int P, int M, int V) {
    if (k == PP_INTERLEAVED && V < 2) return "--virtual-stages";        /* one chunk: that is 1f1b  */
    if (k != PP_INTERLEAVED && V != 1) return "--virtual-stages";       /* one chunk per rank       */
    if (k == PP_INTERLEAVED && M % P != 0) return "--microbatches";     /* groups of P, as Megatron */
    if (k == PP_ZB_H1 && M < P) return "--microbatches";                /* M >= P for its bubble    */
    return NULL;
}

static int max_int(int a, int b) { return a > b ? a : b; }
static long max_long(long a, long b) { return a > b ? a : b; }

/* Index of (op, mb, chunk) in a [4][M][P*V] table. */
static size_t slot(const pp_schedule *s, pp_op op, int mb, int chunk) {
    return ((size_t)op * s->M + mb) * ((size_t)s->P * s->V) + chunk;
}

static int cost_of(pp_costs c, pp_op op) {
    return op == PP_F ? c.f : op == PP_B ? c.b : op == PP_I ? c.i : c.w;
}

/* Each needed action once, on its chunk's rank, and nothing else; returns 1 when so. */
static int each_action_once(const pp_schedule *s, const char *what) {
    int C = s->P * s->V, split = s->kind == PP_ZB_H1, ok = 1;
    int *count = calloc((size_t)4 * s->M * C, sizeof *count);
    for (int r = 0; r < s->P; r++) {
        for (int k = 0; k < s->n[r]; k++) {
            pp_action a = s->a[r][k];
            CHECK(a.chunk % s->P == r, "%s: rank %d runs chunk %d", what, r, a.chunk);
            count[slot(s, a.op, a.mb, a.chunk)]++;
        }
    }
    for (int op = PP_F; op <= PP_W; op++) {
        int needed = op == PP_F || (split ? op != PP_B : op == PP_B);
        for (int mb = 0; mb < s->M; mb++)
            for (int c = 0; c < C; c++)
                if (count[slot(s, op, mb, c)] != needed) {
                    CHECK(0, "%s: op %d of microbatch %d, chunk %d appears %d times", what, op, mb, c,
                          count[slot(s, op, mb, c)]);
                    ok = 0;
                }
    }
    free(count);
    return ok;
}

/* Every action starts at max(its rank's previous end, its dependencies' ends), the rule of the
 * simulation, and lasts its cost; makespan and busy agree with the times. */
static void check_times(const pp_schedule *s, const pp_sim *sim, pp_costs cost, const char *what) {
    int C = s->P * s->V;
    long *end_of = malloc((size_t)4 * s->M * C * sizeof *end_of);
    for (int r = 0; r < s->P; r++)
        for (int k = 0; k < s->n[r]; k++) {
            pp_action a = s->a[r][k];
            end_of[slot(s, a.op, a.mb, a.chunk)] = sim->end[r][k];
        }
    long makespan = 0;
    for (int r = 0; r < s->P; r++) {
        long busy = 0;
        for (int k = 0; k < s->n[r]; k++) {
            pp_action a = s->a[r][k];
            long ready = k > 0 ? sim->end[r][k - 1] : 0;
            if (a.op == PP_F && a.chunk > 0) ready = max_long(ready, end_of[slot(s, PP_F, a.mb, a.chunk - 1)]);
            if (a.op == PP_B || a.op == PP_I) {
                ready = max_long(ready, end_of[slot(s, PP_F, a.mb, a.chunk)]);
                if (a.chunk < C - 1) ready = max_long(ready, end_of[slot(s, a.op, a.mb, a.chunk + 1)]);
            }
            if (a.op == PP_W) ready = max_long(ready, end_of[slot(s, PP_I, a.mb, a.chunk)]);
            CHECK(sim->start[r][k] == ready && sim->end[r][k] - sim->start[r][k] == cost_of(cost, a.op),
                  "%s: rank %d action %d runs [%ld, %ld), ready at %ld", what, r, k, sim->start[r][k],
                  sim->end[r][k], ready);
            busy += sim->end[r][k] - sim->start[r][k];
            makespan = max_long(makespan, sim->end[r][k]);
        }
        CHECK(sim->busy[r] == busy, "%s: rank %d busy %ld, the times say %ld", what, r, sim->busy[r], busy);
    }
    CHECK(sim->makespan == makespan, "%s: makespan %ld, the times say %ld", what, sim->makespan, makespan);
    free(end_of);
}

/* Peak in flight from the times: the most (mb, chunk) whose [start of F, end of B or W) hold one
 * time unit. */
static int peak_from_times(const pp_schedule *s, const pp_sim *sim, int r) {
    int C = s->P * s->V;
    pp_op release = s->kind == PP_ZB_H1 ? PP_W : PP_B;
    long *from = malloc((size_t)s->M * C * sizeof *from), *to = malloc((size_t)s->M * C * sizeof *to);
    for (int k = 0; k < s->n[r]; k++) {
        pp_action a = s->a[r][k];
        if (a.op == PP_F) from[(size_t)a.mb * C + a.chunk] = sim->start[r][k];
        if (a.op == release) to[(size_t)a.mb * C + a.chunk] = sim->end[r][k];
    }
    int peak = 0;
    for (long t = 0; t < sim->makespan; t++) {
        int held = 0;
        for (int mb = 0; mb < s->M; mb++)
            for (int c = r; c < C; c += s->P) held += from[(size_t)mb * C + c] <= t && t < to[(size_t)mb * C + c];
        peak = max_int(peak, held);
    }
    free(from);
    free(to);
    return peak;
}

/* Everything the header promises of one admitted (k, P, M, V). */
static void check_schedule(const pp_schedule *s) {
    char what[64], why[512];
    int P = s->P, M = s->M, V = s->V;
    snprintf(what, sizeof what, "%s P=%d M=%d V=%d", pp_schedule_name(s->kind), P, M, V);
    if (!each_action_once(s, what)) return;

    pp_costs other = {.f = 3, .b = 5, .i = 2, .w = 4};   /* any costs: the same rule of the run */
    pp_sim sim;
    int rc = pp_simulate(s, other, &sim, why, sizeof why);
    CHECK(rc == 0, "%s at costs 3/5/2/4: %s", what, why);
    if (rc == 0) {
        check_times(s, &sim, other, what);
        pp_sim_free(&sim);
    }

    rc = pp_simulate(s, pp_unit_costs(s->kind), &sim, why, sizeof why);
    CHECK(rc == 0, "%s: %s", what, why);
    if (rc != 0) return;
    check_times(s, &sim, pp_unit_costs(s->kind), what);
    CHECK(pp_check_message_order(s, why, sizeof why) == 0, "%s: %s", what, why);

    /* bubble = idle / (P * makespan), against the formula's num / den, as exact integers */
    long idle = 0, num, den;
    for (int r = 0; r < P; r++) idle += sim.makespan - sim.busy[r];
    pp_bubble_formula(s->kind, P, M, V, &num, &den);
    CHECK(idle * den == num * P * sim.makespan, "%s: bubble %ld/%ld, formula %ld/%ld", what, idle,
          P * sim.makespan, num, den);

    for (int r = 0; r < P; r++) {
        int peak = peak_from_times(s, &sim, r), formula = pp_peak_in_flight_formula(s->kind, P, M, V, r);
        CHECK(sim.peak_in_flight[r] == peak && peak == formula,
              "%s: rank %d peak in flight %d (from the times %d), formula %d", what, r, sim.peak_in_flight[r],
              peak, formula);
    }

    long messages = 0;   /* F of every chunk but the last, B or I of every chunk but the first */
    for (int r = 0; r < P; r++)
        for (int k = 0; k < s->n[r]; k++) {
            pp_action a = s->a[r][k];
            messages += (a.op == PP_F && a.chunk < P * V - 1) || ((a.op == PP_B || a.op == PP_I) && a.chunk > 0);
        }
    CHECK(messages == pp_messages_per_step(P, M, V) && pp_count_messages(s) == messages,
          "%s: %ld messages, pp_count_messages %ld, formula %ld", what, messages, pp_count_messages(s),
          pp_messages_per_step(P, M, V));
    pp_sim_free(&sim);
}

/* bubble time / ideal time (the ranks' compute) at unit costs, as idle * q == busy * p for p / q */
static void check_published(pp_schedule_kind k, int P, int M, int V, long p, long q) {
    char why[512];
    pp_schedule *s = pp_schedule_build(k, P, M, V, why, sizeof why);
    CHECK(s != NULL, "%s: %s", pp_schedule_name(k), why);
    if (!s) return;
    pp_sim sim;
    if (pp_simulate(s, pp_unit_costs(k), &sim, why, sizeof why) == 0) {
        long idle = 0, busy = 0;
        for (int r = 0; r < P; r++) {
            idle += sim.makespan - sim.busy[r];
            busy += sim.busy[r];
        }
        CHECK(idle * q == busy * p, "%s P=%d M=%d V=%d: bubble/ideal %ld/%ld, published %ld/%ld",
              pp_schedule_name(k), P, M, V, idle, busy, p, q);
        pp_sim_free(&sim);
    }
    pp_schedule_free(s);
}

/* A schedule whose list `break_it` spoils must be refused by the simulator (sim = 1) or the
 * message check (sim = 0), with a why that contains `says`. */
static void check_broken(pp_schedule_kind k, int P, int M, void (*break_it)(pp_schedule *), int sim,
                         const char *says, const char *what) {
    char why[512] = "";
    pp_schedule *s = pp_schedule_build(k, P, M, 1, why, sizeof why);
    break_it(s);
    pp_sim out;
    int rc = sim ? pp_simulate(s, pp_unit_costs(k), &out, why, sizeof why) : pp_check_message_order(s, why, sizeof why);
    CHECK(rc == -1 && strstr(why, says), "%s: got %d, \"%s\"", what, rc, why);
    if (rc == 0 && sim) pp_sim_free(&out);
    pp_schedule_free(s);
}

static void swap(pp_schedule *s, int r, int i, int j) {
    pp_action t = s->a[r][i];
    s->a[r][i] = s->a[r][j];
    s->a[r][j] = t;
}
/* 1f1b P=4: rank 1 runs F1 before F0, but rank 0 sends F0's output first */
static void swap_first_forwards(pp_schedule *s) { swap(s, 1, 0, 1); }
/* gpipe P=2 M=2: rank 0 runs F0 B0 F1 B1; B0 waits for rank 1's B0, behind its F1, behind ours */
static void backward_too_early(pp_schedule *s) { swap(s, 0, 1, 2); }
static void drop_last(pp_schedule *s) { s->n[1]--; }
static void duplicate_first(pp_schedule *s) { s->a[0][1] = s->a[0][0]; }
static void wrong_rank(pp_schedule *s) { s->a[0][0].chunk = 1; }
/* zb-h1 P=2 rank 1: F0 I0 F1 I1 W0 ...: W0 moved ahead of I0 */
static void w_before_i(pp_schedule *s) { swap(s, 1, 1, 4); }
static void b_in_zb(pp_schedule *s) { s->a[0][s->n[0] - 1].op = PP_B; }

/* What 1F1B-family schedules are for: bounding the activations a rank holds. With at least 2P
 * microbatches, every rank of 1F1B, interleaved 1F1B and ZB-H1 runs its first backward before its
 * last forward; a schedule that runs all its forwards first (GPipe's order, which keeps every
 * activation set) fails this, even where its bubble and its parity are right. */
static void check_memory_bound(const pp_schedule *s) {
    if (s->kind == PP_GPIPE || s->M < 2 * s->P) return;
    for (int r = 0; r < s->P; r++) {
        int first_back = -1, last_fwd = -1;
        for (int k = 0; k < s->n[r]; k++) {
            if (s->a[r][k].op == PP_F) last_fwd = k;
            else if (first_back < 0) first_back = k;
        }
        CHECK(first_back >= 0 && first_back < last_fwd, "%s P=%d M=%d V=%d rank %d: its first backward (action %d) "
              "comes after its last forward (action %d): every forward first holds every activation set, which 1F1B "
              "exists to avoid", pp_schedule_name(s->kind), s->P, s->M, s->V, r, first_back, last_fwd);
    }
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    char why[512];

    /* every (k, P, M, V): refused by the rule, or every promise kept */
    int admitted[PP_NSCHEDULES] = {0}, refused[PP_NSCHEDULES] = {0};
    for (int k = 0; k < PP_NSCHEDULES; k++) {
        for (int P = 1; P <= 8; P++)
            for (int M = 1; M <= 16; M++)
                for (int V = 1; V <= 4; V++) {
                    why[0] = '\0';
                    pp_schedule *s = pp_schedule_build((pp_schedule_kind)k, P, M, V, why, sizeof why);
                    const char *flag = refused_flag((pp_schedule_kind)k, P, M, V);
                    if (!s) {
                        refused[k]++;
                        CHECK(flag && strstr(why, flag) && !strchr(why, '\n'),
                              "%s P=%d M=%d V=%d refused: \"%s\"; the rule: %s", pp_schedule_name(k), P, M, V,
                              why, flag ? flag : "admitted");
                        continue;
                    }
                    admitted[k]++;
                    CHECK(!flag, "%s P=%d M=%d V=%d admitted; the rule refuses it (%s)", pp_schedule_name(k), P,
                          M, V, flag);
                    check_schedule(s);
                    check_memory_bound(s);
                    pp_schedule_free(s);
                }
        /* the rule admits what each schedule must take: P = 1, and M = 1 for gpipe and 1f1b */
        CHECK(admitted[k] > 0, "%s admits nothing", pp_schedule_name(k));
    }
    CHECK(admitted[PP_GPIPE] == 8 * 16 && admitted[PP_1F1B] == 8 * 16, "gpipe %d, 1f1b %d admitted, want every M, P",
          admitted[PP_GPIPE], admitted[PP_1F1B]);
    CHECK(refused[PP_INTERLEAVED] + admitted[PP_INTERLEAVED] == 8 * 16 * 4, "interleaved: %d + %d cases",
          refused[PP_INTERLEAVED], admitted[PP_INTERLEAVED]);

    /* P = 4, M = 8: 1F1B 0.375 = 3/8, interleaved V = 2 0.1875 = 3/16, ZB-H1 0.125 = 1/8 */
    check_published(PP_GPIPE, 4, 8, 1, 3, 8);
    check_published(PP_1F1B, 4, 8, 1, 3, 8);
    check_published(PP_INTERLEAVED, 4, 8, 2, 3, 16);
    check_published(PP_ZB_H1, 4, 8, 1, 1, 8);

    /* broken lists */
    check_broken(PP_1F1B, 4, 8, swap_first_forwards, 0, "rank 1 expects the activations of microbatch 1",
                 "F1 before F0 on rank 1");
    check_broken(PP_GPIPE, 2, 2, backward_too_early, 1, "deadlock", "B0 before F1 on rank 0");
    check_broken(PP_1F1B, 4, 8, drop_last, 1, "never runs", "rank 1's last B missing");
    check_broken(PP_1F1B, 4, 8, duplicate_first, 1, "twice", "F0 twice on rank 0");
    check_broken(PP_GPIPE, 2, 2, wrong_rank, 1, "lives on rank 1", "chunk 1 on rank 0");
    check_broken(PP_ZB_H1, 2, 4, w_before_i, 1, "before its I", "W0 before I0");
    check_broken(PP_ZB_H1, 2, 4, b_in_zb, 1, "backwards are I and W", "a B in zb-h1");

    /* names */
    for (int k = 0; k < PP_NSCHEDULES; k++) {
        pp_schedule_kind parsed = PP_NSCHEDULES;
        CHECK(pp_schedule_parse(pp_schedule_name(k), &parsed) == 0 && parsed == (pp_schedule_kind)k,
              "%s does not parse back", pp_schedule_name(k));
    }
    pp_schedule_kind parsed;
    CHECK(pp_schedule_parse("1F1B", &parsed) == -1 && pp_schedule_parse("zb", &parsed) == -1, "unknown names parse");

    /* the table of 1f1b P=2 M=3: a B takes two columns, idle ones are dots, ending at 3 (M+P-1) */
    pp_schedule *s = pp_schedule_build(PP_1F1B, 2, 3, 1, why, sizeof why);
    pp_sim sim;
    CHECK(pp_simulate(s, pp_unit_costs(PP_1F1B), &sim, why, sizeof why) == 0, "%s", why);
    char *text = NULL;
    size_t text_len = 0;
    FILE *mem = open_memstream(&text, &text_len);
    pp_schedule_print(s, &sim, mem);
    fclose(mem);
    const char *want =
        "time    0                             10\n"
        "rank 0  F0 F1 .  .  B0 B0 F2 B1 B1 .  B2 B2\n"
        "rank 1  .  F0 B0 B0 F1 B1 B1 F2 B2 B2 .  .\n";
    CHECK(strcmp(text, want) == 0, "printed:\n%swant:\n%s", text, want);
    free(text);
    pp_sim_free(&sim);
    pp_schedule_free(s);

    int rc = tu_finish("test_schedule");
    comm_finalize();
    return rc;
}
