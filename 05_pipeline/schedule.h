/* schedule.h: pipeline schedules, as lists of actions per rank, and a simulator that runs them.
 *
 * Pipeline parallelism cuts the model's layers into pieces and gives each of P ranks its own
 * pieces; the global batch is cut into M microbatches that flow through the pieces one after
 * the other. A SCHEDULE says, for each rank, in which order it runs its work. It is nothing but
 * a list per rank of actions:
 *
 *   F(mb, c)   forward of microbatch mb through chunk c
 *   B(mb, c)   backward of microbatch mb through chunk c (input and weight gradients together)
 *   I(mb, c)   zb-h1 only: the input gradient alone (what the previous chunk waits for)
 *   W(mb, c)   zb-h1 only: the weight gradient alone (what nobody waits for, so it can wait)
 *
 * Chunks. The layers are cut into P*V chunks, c = 0 .. P*V-1 in model order, and chunk c lives
 * on rank c % P (round-robin, as in Megatron-LM and torch.distributed.pipelining). With V = 1
 * rank r holds chunk r; with V = 2 and P = 4:
 *
 *   rank 0: chunks 0, 4     (virtual stages 0, 1 of rank 0: c / P)
 *   rank 1: chunks 1, 5
 *   rank 2: chunks 2, 6
 *   rank 3: chunks 3, 7     (chunk 0 also holds the embedding, chunk 7 the norm, output, loss)
 *
 * Dependencies. F(mb, c) needs F(mb, c-1); B(mb, c) and I(mb, c) need F(mb, c) and the gradient
 * from B/I(mb, c+1); W(mb, c) needs I(mb, c). Every dependency across a chunk boundary is one
 * message: F(mb, c) sends its output to rank (c+1) % P, B/I(mb, c) sends its input gradient to
 * rank (c-1) % P: 2 * M * (P*V - 1) messages per step. A rank posts its receives and its sends
 * in its action order, and MPI and NCCL match the messages between two ranks in posting order,
 * so what rank s sends to rank d must come in the order d's list expects it
 * (pp_check_message_order).
 *
 * Memory. The activations of (mb, c) are held from the start of F(mb, c) to the end of B(mb, c)
 * (of W(mb, c) under zb-h1): (mb, c) is "in flight". A schedule trades this memory for bubble,
 * the time ranks sit idle waiting for each other.
 *
 * The four schedules. Costs: F = 1, B = 2 per chunk; under zb-h1 F = I = W = 1 (pp_unit_costs).
 * Bubble: idle time / (P * step time). Each formula below is checked by tests/test_schedule.c
 * to equal the simulation exactly (bubble as a fraction of integers, peak rank by rank) for every
 * (P, M, V) with P <= 8, M <= 16, V <= 4 that the schedule admits.
 *
 *   gpipe        every F in microbatch order, then every B in microbatch order (as torch's
 *                ScheduleGPipe; Huang et al. 2019, "GPipe").
 *                bubble (P-1) / (M+P-1): bubble time (P-1)(F + B), (P-1)/M of the ideal step
 *                (the work alone; 0.375 at P = 4, M = 8)
 *                peak in flight on rank r: M
 *                admits V = 1, any P, M.
 *   1f1b         rank r runs min(M, P-1-r) warmup forwards, then one F and one B in turn, then
 *                the remaining B's (PipeDream-Flush, Narayanan et al. 2021; Megatron-LM's
 *                default).
 *                bubble (P-1) / (M+P-1), GPipe's
 *                peak in flight on rank r: min(M, P-r)
 *                admits V = 1, any P, M (with M < P, the ranks that cannot fill the pipe run
 *                GPipe's order).
 *   interleaved  V chunks per rank (Narayanan et al. 2021, "Efficient Large-Scale Language Model
 *                Training on GPU Clusters Using Megatron-LM"; torch's ScheduleInterleaved1F1B).
 *                The microbatches go in groups of P, each group through the rank's virtual
 *                stages in turn (the order and warmup: below); then 1F1B.
 *                bubble (P-1) / (V*M + P-1): 1F1B's bubble time divided by V, (1/V)(P-1)/M of
 *                the ideal step (0.1875 at P = 4, M = 8, V = 2)
 *                peak in flight on rank r: the warmup's forwards plus one (mb, chunk) sets,
 *                each 1/V of a 1F1B set
 *                admits V >= 2 and M % P == 0, as Megatron-LM (with V = 1 use 1f1b).
 *   zb-h1        1F1B with each B split into I then W (Qi et al. 2023, "Zero Bubble Pipeline
 *                Parallelism", ZB-H1; torch's ScheduleInterleavedZeroBubble with one stage per
 *                rank). The same warmup as 1F1B, then F and I in turn; rank r runs W(mb) only
 *                after I(mb + r), its last r W's at the end. An I waits for no W, so the
 *                gradients travel back one unit per rank, and the W's kept back fill the time
 *                a rank would wait for the last ones.
 *                bubble (P-1) / (3M + P-1): bubble time (P-1)(F + I - W) = P-1, a third of
 *                1F1B's (P-1)(F + B); (P-1)/(3M) of the ideal step (0.125 at P = 4, M = 8)
 *                peak in flight on rank r: min(M, P), counting a microbatch until its W: the
 *                peak of 1F1B (its rank 0's) on every rank
 *                admits V = 1 and M >= P. With M < P no order reaches the formula: rank 0
 *                runs out of forwards before the first I comes back, 2P-1 units after it
 *                started, so its step is at least 2P-1 + 2M > 3M + P-1.
 *
 * Every schedule admits P = 1 (one rank, no bubble). pp_schedule_build refuses the rest with one
 * line naming --pp, --microbatches or --virtual-stages and what is valid.
 */
/* BEGIN SOLUTION 05: the interleaved order; the interleaved warmup; the interleaved peak */
/* interleaved: rank r's k-th forward is of group k / (P*V), virtual stage (k % (P*V)) / P; its
 * backwards take the same order with the virtual stages reversed. Warmup min((V-1)*P + 2*(P-1-r),
 * M*V) forwards; peak in flight on rank r: min((V-1)*P + 2*(P-1-r) + 1, M*V) (mb, chunk) sets. */
/* END SOLUTION */
#pragma once
#include <stddef.h>
#include <stdio.h>

typedef enum { PP_GPIPE = 0, PP_1F1B, PP_INTERLEAVED, PP_ZB_H1, PP_NSCHEDULES } pp_schedule_kind;
typedef enum { PP_F = 0, PP_B, PP_I, PP_W } pp_op;

typedef struct { pp_op op; int mb, chunk; } pp_action;

/* Rank r runs a[r][0], a[r][1], ..., a[r][n[r] - 1], in this order. */
typedef struct {
    pp_schedule_kind kind;
    int P, M, V;          /* ranks, microbatches, chunks per rank (virtual stages)            */
    int *n;               /* [P] actions of each rank                                          */
    pp_action **a;        /* [P][n[r]] each rank's ordered list                                */
} pp_schedule;

const char *pp_schedule_name(pp_schedule_kind k);               /* "gpipe", "1f1b", "interleaved", "zb-h1" */

/* Parses a schedule name: 0 and *k set, or -1 for an unknown name. */
int pp_schedule_parse(const char *s, pp_schedule_kind *k);

/* The lists of schedule k for P ranks, M microbatches, V chunks per rank; free with
 * pp_schedule_free. NULL when (P, M, V) does not fit the schedule, with one line in why naming
 * the flag (--pp, --microbatches, --virtual-stages) and what is valid. */
pp_schedule *pp_schedule_build(pp_schedule_kind k, int P, int M, int V, char *why, size_t len);
void pp_schedule_free(pp_schedule *s);

/* The rank that holds chunk c (round-robin). */
static inline int pp_chunk_rank(const pp_schedule *s, int chunk) { return chunk % s->P; }

/* The rank action a receives its input from before it runs (F: the activations of chunk c-1,
 * B or I: the gradient of chunk c+1), or -1 when it receives nothing (F of the first chunk,
 * B or I of the last, W). */
int pp_recv_rank(const pp_schedule *s, pp_action a);
/* The rank action a sends its output to after it runs (F: to chunk c+1, B or I: to chunk
 * c-1), or -1 when it sends nothing. */
int pp_send_rank(const pp_schedule *s, pp_action a);

/* Writes the name of action a to buf: "F3" (microbatch 3), or with V > 1 "F3.1" (virtual stage
 * 1 of its rank, chunk / P). */
void pp_action_label(const pp_schedule *s, pp_action a, char *buf, size_t len);

/* Integer time units of one action on one chunk: b is the cost of B, i and w of I and W. */
typedef struct { int f, b, i, w; } pp_costs;
pp_costs pp_unit_costs(pp_schedule_kind k);   /* F=1, B=2 (gpipe, 1f1b, interleaved); F=I=W=1 (zb-h1) */

/* One simulated step. */
typedef struct {
    long makespan;         /* end of the last action                                          */
    long *busy;            /* [P] time each rank computes                                     */
    long **start, **end;   /* [P][n[r]] start and end of rank r's k-th action: start[r][k]    */
                           /* (every rank's in one block from start[0], freed by pp_sim_free)  */
    int *peak_in_flight;   /* [P] most (mb, chunk) activation sets a rank holds at once       */
} pp_sim;

/* Runs the lists with the costs: each action starts as soon as its rank is done with the
 * previous one and its dependencies are done (transfers take no time). 0 and *out filled (free
 * with pp_sim_free); -1 with one line in why when a list is malformed (an action missing,
 * duplicated, on the wrong rank, of the wrong kind, W before its I) or an action waits for one
 * that never comes (deadlock). */
int pp_simulate(const pp_schedule *s, pp_costs cost, pp_sim *out, char *why, size_t len);
void pp_sim_free(pp_sim *sim);

/* For every ordered pair of ranks (src, dst): the messages src sends dst, in src's action
 * order, are the messages dst receives from src, in dst's action order. 0 ok, -1 with the
 * first difference in why. */
int pp_check_message_order(const pp_schedule *s, char *why, size_t len);

/* The messages the lists send (counted from them), and the formula 2 * M * (P*V - 1): one
 * activation and one gradient per microbatch per chunk boundary. With P = 1 they stay on the
 * rank. */
long pp_count_messages(const pp_schedule *s);
long pp_count_rank_messages(const pp_schedule *s, int r);   /* those rank r sends (08's --plan) */
long pp_messages_per_step(int P, int M, int V);

/* The published bubble, idle / (P * step time), as the exact fraction *num / *den, for the
 * schedule's unit costs (pp_unit_costs). */
void pp_bubble_formula(pp_schedule_kind k, int P, int M, int V, long *num, long *den);

/* Peak in-flight (mb, chunk) activation sets on rank r, from the closed forms above. */
int pp_peak_in_flight_formula(pp_schedule_kind k, int P, int M, int V, int r);

/* --print-schedule: the simulated run as a rank x time table, one column per time unit, each
 * cell the action running then ("F3", "B3", "I3", "W3"; "F3.1" with V > 1) or "." idle. */
void pp_schedule_print(const pp_schedule *s, const pp_sim *sim, FILE *out);
