/* schedule.c: the four pipeline schedules as per-rank action lists, their simulation, the
 * message-order check, the published formulas and the --print-schedule table (schedule.h). */
#include <stdlib.h>
#include <string.h>
#include "schedule.h"

static const char *schedule_names[PP_NSCHEDULES] = {"gpipe", "1f1b", "interleaved", "zb-h1"};
static const char op_letters[] = "FBIW";

const char *pp_schedule_name(pp_schedule_kind k) { return schedule_names[k]; }

int pp_schedule_parse(const char *s, pp_schedule_kind *k) {
    for (int i = 0; i < PP_NSCHEDULES; i++) {
        if (strcmp(s, schedule_names[i]) == 0) {
            *k = (pp_schedule_kind)i;
            return 0;
        }
    }
    return -1;
}

static int min_int(int a, int b) { return a < b ? a : b; }
static long max_long(long a, long b) { return a > b ? a : b; }

// ----------------------------------------------------------------------------------------------
// building the lists

/* Appends action (op, mb, chunk) to rank r's list (sized for every action it can have). */
static void push(pp_schedule *s, int r, pp_op op, int mb, int chunk) {
    s->a[r][s->n[r]++] = (pp_action){op, mb, chunk};
}

/* GPipe: all forwards, then all backwards, both in microbatch order. */
static void build_gpipe(pp_schedule *s, int r) {
    for (int mb = 0; mb < s->M; mb++) push(s, r, PP_F, mb, r);
    for (int mb = 0; mb < s->M; mb++) push(s, r, PP_B, mb, r);
}

/* 1F1B: P-1-r forwards fill the pipeline below rank r; from then on each forward is followed by
 * the oldest backward, so at most P-r microbatches are in flight on rank r. */
static void build_1f1b(pp_schedule *s, int r) {
    /* BEGIN ASSIGNMENT: rank r's 1F1B list: min(M, P-1-r) warmup forwards, then one forward and the oldest backward in turn, then the remaining backwards (push(s, r, op, mb, r)) */
    int M = s->M, warmup = min_int(M, s->P - 1 - r);
    for (int mb = 0; mb < warmup; mb++) push(s, r, PP_F, mb, r);
    for (int j = 0; j < M - warmup; j++) {
        push(s, r, PP_F, warmup + j, r);
        push(s, r, PP_B, j, r);
    }
    for (int mb = M - warmup; mb < M; mb++) push(s, r, PP_B, mb, r);
    /* END ASSIGNMENT */
}

/* Appends rank r's k-th forward (backward = 1: its k-th backward) in the interleaved order.
 * Rank r holds chunks r, P + r, ..., (V-1) P + r (virtual stages 0 .. V-1). */
/* BEGIN SOLUTION 05: the interleaved order */
/* The microbatches go in groups of P, and each group runs through the rank's virtual stages 0, 1,
 * ..., V-1 in turn (backwards V-1, ..., 0), all P microbatches of the group in each. */
/* END SOLUTION */
static void push_interleaved(pp_schedule *s, int r, int k, int backward) {
    /* BEGIN ASSIGNMENT: the interleaved order: rank r's k-th forward (or backward) as a (microbatch, chunk) pair, push(s, r, op, mb, chunk) */
    int P = s->P, V = s->V;
    int group = k / (P * V), in_group = k % (P * V);
    int v = in_group / P;
    if (backward) v = V - 1 - v;
    push(s, r, backward ? PP_B : PP_F, group * P + in_group % P, v * P + r);
    /* END ASSIGNMENT */
}

/* Interleaved 1F1B (Megatron-LM): 1F1B over the rank's M*V (mb, chunk) pairs in the order of
 * push_interleaved, after a warmup of forwards that keeps every rank busy. */
/* BEGIN SOLUTION 05: the interleaved warmup */
/* The warmup is Megatron's: (V-1)*P forwards take the first group through all but the rank's last
 * virtual stage, and 2 more per rank after r cover the time the group's last-stage forward takes
 * to reach the last rank and its backward to come back, one forward per rank each way. */
/* END SOLUTION */
static void build_interleaved(pp_schedule *s, int r) {
    int total = s->M * s->V, warmup = 0;
    /* BEGIN ASSIGNMENT: the interleaved warmup: how many forwards rank r runs before its first backward (at most total) */
    warmup = min_int((s->V - 1) * s->P + 2 * (s->P - 1 - r), total);
    /* END ASSIGNMENT */
    for (int k = 0; k < warmup; k++) push_interleaved(s, r, k, 0);
    for (int j = 0; j < total - warmup; j++) {
        push_interleaved(s, r, warmup + j, 0);
        push_interleaved(s, r, j, 1);
    }
    for (int k = total - warmup; k < total; k++) push_interleaved(s, r, k, 1);
}

/* ZB-H1: 1F1B with each B split into I then W, and the W's of rank r run r microbatches late
 * (W(mb) after I(mb + r)), the last r at the end (torch's ScheduleInterleavedZeroBubble with
 * one stage per rank). The I's need no W, so the last microbatch's I passes each rank in one
 * unit: rank r gets it r units before the last rank ends, and runs its r kept-back W's then. */
static void build_zb_h1(pp_schedule *s, int r) {
    /* BEGIN ASSIGNMENT: exercise 2a, rank r's ZB-H1 list: as the comment above says, with push(s, r, op, mb, r) */
    int M = s->M, warmup = min_int(M, s->P - 1 - r), next_w = 0;
    for (int mb = 0; mb < warmup; mb++) push(s, r, PP_F, mb, r);
    for (int j = 0; j < M; j++) {
        if (warmup + j < M) push(s, r, PP_F, warmup + j, r);
        push(s, r, PP_I, j, r);
        if (j - next_w >= r) push(s, r, PP_W, next_w++, r);
    }
    while (next_w < M) push(s, r, PP_W, next_w++, r);
    /* END ASSIGNMENT */
}

pp_schedule *pp_schedule_build(pp_schedule_kind k, int P, int M, int V, char *why, size_t len) {
    const char *name = pp_schedule_name(k);
    if (P < 1) { snprintf(why, len, "--pp %d is not valid: use 1 or more pipeline stages", P); return NULL; }
    if (M < 1) { snprintf(why, len, "--microbatches %d is not valid: use 1 or more", M); return NULL; }
    if (V < 1) { snprintf(why, len, "--virtual-stages %d is not valid: use 1 or more", V); return NULL; }
    if ((long)P * M * V > (1L << 22)) {
        snprintf(why, len, "--pp %d x --microbatches %d x --virtual-stages %d is too large: at most %ld (mb, chunk) pairs",
                 P, M, V, 1L << 22);
        return NULL;
    }
    if (k == PP_INTERLEAVED && V < 2) {
        snprintf(why, len, "--virtual-stages %d: interleaved needs 2 or more chunks per rank; with one, use 1f1b", V);
        return NULL;
    }
    if (k != PP_INTERLEAVED && V != 1) {
        snprintf(why, len, "--virtual-stages %d: %s runs one chunk per rank (--virtual-stages 1); "
                 "for more, use interleaved", V, name);
        return NULL;
    }
    if (k == PP_INTERLEAVED && M % P != 0) {
        snprintf(why, len, "--microbatches %d: interleaved runs the microbatches in groups of --pp %d "
                 "(as Megatron-LM); use a multiple of %d", M, P, P);
        return NULL;
    }
    if (k == PP_ZB_H1 && M < P) {
        snprintf(why, len, "--microbatches %d: zb-h1 needs --microbatches >= --pp (%d): with fewer, "
                 "rank 0 runs out of forwards and idles more than P-1 units before the first gradient comes back", M, P);
        return NULL;
    }
    pp_schedule *s = calloc(1, sizeof *s);
    s->kind = k; s->P = P; s->M = M; s->V = V;
    s->n = calloc((size_t)P, sizeof *s->n);
    s->a = calloc((size_t)P, sizeof *s->a);
    for (int r = 0; r < P; r++) {
        s->a[r] = malloc((size_t)3 * M * V * sizeof **s->a);   /* F, I, W of each (mb, chunk) at most */
        switch (k) {
        case PP_GPIPE:       build_gpipe(s, r); break;
        case PP_1F1B:        build_1f1b(s, r); break;
        case PP_INTERLEAVED: build_interleaved(s, r); break;
        default:             build_zb_h1(s, r); break;
        }
    }
    return s;
}

void pp_schedule_free(pp_schedule *s) {
    if (!s) return;
    for (int r = 0; r < s->P; r++) free(s->a[r]);
    free(s->a);
    free(s->n);
    free(s);
}

// ----------------------------------------------------------------------------------------------
// messages

int pp_recv_rank(const pp_schedule *s, pp_action a) {
    int last = s->P * s->V - 1;
    if (a.op == PP_F && a.chunk > 0) return pp_chunk_rank(s, a.chunk - 1);
    if ((a.op == PP_B || a.op == PP_I) && a.chunk < last) return pp_chunk_rank(s, a.chunk + 1);
    return -1;
}

int pp_send_rank(const pp_schedule *s, pp_action a) {
    int last = s->P * s->V - 1;
    if (a.op == PP_F && a.chunk < last) return pp_chunk_rank(s, a.chunk + 1);
    if ((a.op == PP_B || a.op == PP_I) && a.chunk > 0) return pp_chunk_rank(s, a.chunk - 1);
    return -1;
}

/* A message, named by what it carries: the activations (grad = 0) or the gradient (grad = 1) of
 * microbatch mb across the boundary between chunks above-1 and above. */
typedef struct { int grad, mb, above; } message;

static message sent_by(pp_action a) {
    if (a.op == PP_F) return (message){0, a.mb, a.chunk + 1};
    return (message){1, a.mb, a.chunk};
}
static message received_by(pp_action a) {
    if (a.op == PP_F) return (message){0, a.mb, a.chunk};
    return (message){1, a.mb, a.chunk + 1};
}
static int same_message(message x, message y) { return x.grad == y.grad && x.mb == y.mb && x.above == y.above; }

static void message_label(message m, char *buf, size_t len) {
    snprintf(buf, len, "the %s of microbatch %d between chunks %d and %d",
             m.grad ? "gradient" : "activations", m.mb, m.above - 1, m.above);
}

/* The index of rank r's next action, from *pos on, that sends to rank peer (receive = 0) or
 * receives from it (receive = 1), with *pos moved past it; -1 when none is left. */
static int next_message(const pp_schedule *s, int r, int peer, int receive, int *pos) {
    for (; *pos < s->n[r]; (*pos)++) {
        pp_action a = s->a[r][*pos];
        if ((receive ? pp_recv_rank(s, a) : pp_send_rank(s, a)) == peer) return (*pos)++;
    }
    return -1;
}

int pp_check_message_order(const pp_schedule *s, char *why, size_t len) {
    char sent[128], expected[128];
    for (int src = 0; src < s->P; src++) {
        for (int dst = 0; dst < s->P; dst++) {
            /* walk src's sends to dst and dst's receives from src side by side */
            int send_pos = 0, recv_pos = 0;
            for (int count = 0;; count++) {
                int ks = next_message(s, src, dst, 0, &send_pos);
                int kr = next_message(s, dst, src, 1, &recv_pos);
                if (ks < 0 && kr < 0) break;
                if (ks >= 0) message_label(sent_by(s->a[src][ks]), sent, sizeof sent);
                if (kr >= 0) message_label(received_by(s->a[dst][kr]), expected, sizeof expected);
                if (ks < 0) {
                    snprintf(why, len, "rank %d sends rank %d %d messages, but rank %d then expects %s",
                             src, dst, count, dst, expected);
                    return -1;
                }
                if (kr < 0) {
                    snprintf(why, len, "message %d from rank %d to rank %d: rank %d sends %s, which rank %d never expects",
                             count, src, dst, src, sent, dst);
                    return -1;
                }
                if (!same_message(sent_by(s->a[src][ks]), received_by(s->a[dst][kr]))) {
                    snprintf(why, len, "message %d from rank %d to rank %d: rank %d sends %s, but rank %d expects %s",
                             count, src, dst, src, sent, dst, expected);
                    return -1;
                }
            }
        }
    }
    return 0;
}

long pp_count_rank_messages(const pp_schedule *s, int r) {
    long count = 0;
    for (int k = 0; k < s->n[r]; k++) count += pp_send_rank(s, s->a[r][k]) >= 0;
    return count;
}

long pp_count_messages(const pp_schedule *s) {
    long count = 0;
    for (int r = 0; r < s->P; r++) count += pp_count_rank_messages(s, r);
    return count;
}

long pp_messages_per_step(int P, int M, int V) { return 2L * M * ((long)P * V - 1); }

// ----------------------------------------------------------------------------------------------
// simulation

/* B = I + W: both halves of a backward cost a forward, so every schedule does the same work. */
pp_costs pp_unit_costs(pp_schedule_kind k) { return (pp_costs){.f = 1, .b = 2, .i = 1, .w = 1}; }

static int action_cost(pp_costs cost, pp_op op) {
    return op == PP_F ? cost.f : op == PP_B ? cost.b : op == PP_I ? cost.i : cost.w;
}

void pp_action_label(const pp_schedule *s, pp_action a, char *buf, size_t len) {
    if (s->V > 1) snprintf(buf, len, "%c%d.%d", op_letters[a.op], a.mb, a.chunk / s->P);
    else snprintf(buf, len, "%c%d", op_letters[a.op], a.mb);
}

/* The actions a waits for, written to deps; returns how many (0 to 2). */
static int action_deps(const pp_schedule *s, pp_action a, pp_action deps[2]) {
    int n = 0, last = s->P * s->V - 1;
    switch (a.op) {
    case PP_F:
        if (a.chunk > 0) deps[n++] = (pp_action){PP_F, a.mb, a.chunk - 1};
        break;
    case PP_B:
    case PP_I:
        deps[n++] = (pp_action){PP_F, a.mb, a.chunk};
        if (a.chunk < last) deps[n++] = (pp_action){a.op, a.mb, a.chunk + 1};
        break;
    case PP_W:
        deps[n++] = (pp_action){PP_I, a.mb, a.chunk};
        break;
    }
    return n;
}

/* Index of (op, mb, chunk) in the simulator's [4][M][P*V] tables. */
static size_t slot(const pp_schedule *s, pp_action a) {
    return ((size_t)a.op * s->M + a.mb) * ((size_t)s->P * s->V) + a.chunk;
}

/* Checks that every rank's list holds each of its actions exactly once, in a valid order for
 * W; 0 or -1 with why. seen is a zeroed [4][M][P*V] table. */
static int check_lists(const pp_schedule *s, int *seen, char *why, size_t len) {
    int split = s->kind == PP_ZB_H1, C = s->P * s->V;
    char label[32];
    for (int r = 0; r < s->P; r++) {
        for (int k = 0; k < s->n[r]; k++) {
            pp_action a = s->a[r][k];
            if (a.mb < 0 || a.mb >= s->M || a.chunk < 0 || a.chunk >= C || (int)a.op < 0 || a.op > PP_W) {
                snprintf(why, len, "rank %d, action %d: microbatch %d, chunk %d or op %d out of range",
                         r, k, a.mb, a.chunk, (int)a.op);
                return -1;
            }
            pp_action_label(s, a, label, sizeof label);
            if (pp_chunk_rank(s, a.chunk) != r) {
                snprintf(why, len, "rank %d, action %d: %s is of chunk %d, which lives on rank %d",
                         r, k, label, a.chunk, pp_chunk_rank(s, a.chunk));
                return -1;
            }
            int split_op = a.op == PP_I || a.op == PP_W;
            if (a.op != PP_F && split_op != split) {
                snprintf(why, len, "rank %d, action %d: %s, but %s backwards are %s",
                         r, k, label, pp_schedule_name(s->kind), split ? "I and W" : "B");
                return -1;
            }
            if (seen[slot(s, a)]++) {
                snprintf(why, len, "rank %d: %s of chunk %d appears twice", r, label, a.chunk);
                return -1;
            }
            if (a.op == PP_W && !seen[slot(s, (pp_action){PP_I, a.mb, a.chunk})]) {
                snprintf(why, len, "rank %d, action %d: %s of chunk %d comes before its I", r, k, label, a.chunk);
                return -1;
            }
        }
    }
    pp_op needed[3] = {PP_F, split ? PP_I : PP_B, PP_W};
    for (int i = 0; i < (split ? 3 : 2); i++) {
        for (int mb = 0; mb < s->M; mb++) {
            for (int c = 0; c < C; c++) {
                pp_action a = {needed[i], mb, c};
                if (!seen[slot(s, a)]) {
                    pp_action_label(s, a, label, sizeof label);
                    snprintf(why, len, "rank %d never runs %s of chunk %d", pp_chunk_rank(s, c), label, c);
                    return -1;
                }
            }
        }
    }
    return 0;
}

int pp_simulate(const pp_schedule *s, pp_costs cost, pp_sim *out, char *why, size_t len) {
    int P = s->P;
    size_t slots = (size_t)4 * s->M * P * s->V;
    int *seen = calloc(slots, sizeof *seen);
    int bad = check_lists(s, seen, why, len);
    free(seen);
    if (bad) return -1;

    memset(out, 0, sizeof *out);
    out->busy = calloc((size_t)P, sizeof *out->busy);
    out->start = calloc((size_t)P, sizeof *out->start);
    out->end = calloc((size_t)P, sizeof *out->end);
    out->peak_in_flight = calloc((size_t)P, sizeof *out->peak_in_flight);
    /* one block of times for all ranks; start[r] and end[r] point at rank r's part of it */
    size_t actions = 0;
    for (int r = 0; r < P; r++) actions += (size_t)s->n[r];
    out->start[0] = calloc(actions + 1, sizeof **out->start);
    out->end[0] = calloc(actions + 1, sizeof **out->end);
    for (int r = 1; r < P; r++) {
        out->start[r] = out->start[r - 1] + s->n[r - 1];
        out->end[r] = out->end[r - 1] + s->n[r - 1];
    }

    /* done_at[slot]: when an action ended, -1 while it has not run. Each rank runs its list in
     * order; an action runs once its dependencies have, at max(its rank free, their ends). The
     * order in which ranks are visited changes nothing: every start time is fixed by the ends it
     * waits for. Sweep over the ranks until all lists are done or a sweep moves none (a
     * deadlock). */
    long *done_at = malloc(slots * sizeof *done_at);
    for (size_t i = 0; i < slots; i++) done_at[i] = -1;
    int *next = calloc((size_t)P, sizeof *next);
    long *free_at = calloc((size_t)P, sizeof *free_at);
    int remaining = 0, rc = 0;
    for (int r = 0; r < P; r++) remaining += s->n[r];
    while (remaining > 0) {
        int moved = 0;
        for (int r = 0; r < P; r++) {
            while (next[r] < s->n[r]) {
                pp_action a = s->a[r][next[r]], deps[2];
                int nd = action_deps(s, a, deps), ready = 1;
                long start = free_at[r];
                for (int d = 0; d < nd; d++) {
                    long t = done_at[slot(s, deps[d])];
                    if (t < 0) ready = 0;
                    start = max_long(start, t);
                }
                if (!ready) break;
                free_at[r] = start + action_cost(cost, a.op);
                done_at[slot(s, a)] = free_at[r];
                out->start[r][next[r]] = start;
                out->end[r][next[r]] = free_at[r];
                out->busy[r] += action_cost(cost, a.op);
                out->makespan = max_long(out->makespan, free_at[r]);
                next[r]++; remaining--; moved++;
            }
        }
        if (!moved) {
            /* name the first rank that waits, and what it waits for */
            for (int r = 0; r < P && !rc; r++) {
                if (next[r] == s->n[r]) continue;
                pp_action a = s->a[r][next[r]], deps[2];
                int nd = action_deps(s, a, deps);
                for (int d = 0; d < nd; d++) {
                    if (done_at[slot(s, deps[d])] >= 0) continue;
                    char label[32], dep[32];
                    pp_action_label(s, a, label, sizeof label);
                    pp_action_label(s, deps[d], dep, sizeof dep);
                    snprintf(why, len, "deadlock: rank %d waits at %s of chunk %d for %s of chunk %d "
                             "(rank %d), which never runs", r, label, a.chunk, dep, deps[d].chunk,
                             pp_chunk_rank(s, deps[d].chunk));
                    rc = -1;
                    break;
                }
            }
            break;
        }
    }
    free(done_at);
    free(next);
    free(free_at);
    if (rc) {
        pp_sim_free(out);
        return -1;
    }

    /* In flight: +1 at the start of F, -1 at the end of B (W when split). A rank runs one action
     * at a time, so its count at any moment follows its list. */
    pp_op release = s->kind == PP_ZB_H1 ? PP_W : PP_B;
    for (int r = 0; r < P; r++) {
        int held = 0;
        for (int k = 0; k < s->n[r]; k++) {
            if (s->a[r][k].op == PP_F) held++;
            if (held > out->peak_in_flight[r]) out->peak_in_flight[r] = held;
            if (s->a[r][k].op == release) held--;
        }
    }
    return 0;
}

void pp_sim_free(pp_sim *sim) {
    if (sim->start) free(sim->start[0]);
    if (sim->end) free(sim->end[0]);
    free(sim->start);
    free(sim->end);
    free(sim->busy);
    free(sim->peak_in_flight);
    memset(sim, 0, sizeof *sim);
}

// ----------------------------------------------------------------------------------------------
// the published formulas

void pp_bubble_formula(pp_schedule_kind k, int P, int M, int V, long *num, long *den) {
    /* At unit costs every rank computes 3*M*V units (F + B, or F + I + W, of each (mb, chunk))
     * and idles the bubble time: (P-1)(F+B) = 3(P-1) for gpipe, 1f1b and interleaved (whose
     * chunk units are 1/V of a stage's), (P-1)(F+I-W) = P-1 for zb-h1. The fraction is
     * bubble / (work + bubble). */
    *num = P - 1;
    switch (k) {
    case PP_INTERLEAVED: *den = (long)V * M + P - 1; break;
    case PP_ZB_H1:       *den = 3L * M + P - 1; break;
    default:             *den = (long)M + P - 1; break;
    }
}

int pp_peak_in_flight_formula(pp_schedule_kind k, int P, int M, int V, int r) {
    switch (k) {
    case PP_GPIPE:       return M;
    case PP_1F1B:        return min_int(M, P - r);
    case PP_INTERLEAVED:
        /* BEGIN ASSIGNMENT: the interleaved peak: the sets rank r holds at most, from its warmup */
        return min_int((V - 1) * P + 2 * (P - 1 - r) + 1, M * V);
        /* END ASSIGNMENT */
    default:             return min_int(M, P);
    }
}

// ----------------------------------------------------------------------------------------------
// --print-schedule

/* Prints head, then row[0 .. len) without its trailing spaces. */
static void print_row(FILE *out, const char *head, char *row, size_t len) {
    while (len > 0 && row[len - 1] == ' ') len--;
    fprintf(out, "%s%.*s\n", head, (int)len, row);
}

void pp_schedule_print(const pp_schedule *s, const pp_sim *sim, FILE *out) {
    char label[32], head[32];
    /* every cell as wide as the widest label, plus a space */
    int width = 1;
    for (int r = 0; r < s->P; r++) {
        for (int k = 0; k < s->n[r]; k++) {
            pp_action_label(s, s->a[r][k], label, sizeof label);
            if ((int)strlen(label) > width) width = (int)strlen(label);
        }
    }
    width++;
    size_t row_len = (size_t)sim->makespan * width;
    char *row = malloc(row_len + 1);

    /* the time ruler: a tick every 10 units */
    memset(row, ' ', row_len);
    for (long t = 0; t < sim->makespan; t += 10) {
        int n = snprintf(label, sizeof label, "%ld", t);
        if ((size_t)(t * width + n) <= row_len) memcpy(row + t * width, label, (size_t)n);
    }
    print_row(out, "time    ", row, row_len);

    for (int r = 0; r < s->P; r++) {
        memset(row, ' ', row_len);
        for (long t = 0; t < sim->makespan; t++) row[t * width] = '.';
        for (int k = 0; k < s->n[r]; k++) {
            pp_action_label(s, s->a[r][k], label, sizeof label);
            for (long t = sim->start[r][k]; t < sim->end[r][k]; t++)
                memcpy(row + t * width, label, strlen(label));
        }
        snprintf(head, sizeof head, "rank %-3d", r);
        print_row(out, head, row, row_len);
    }
    free(row);
}
