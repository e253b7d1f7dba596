/* pipeline.c: the pipeline plan and its executor (pipeline.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "log.h"
#include "model.h"
#include "pipeline.h"

/* One weight gradient that zb-h1's I left for its W: dW += dy^T x of one linear. */
typedef struct {
    linear_site site;
    float *dW, *dy, *x_copy;      /* dy (and x, when it lives in a shared buffer) copied at I */
    const float *x, *W;
    int N, in, out;
} deferred_wgrad;

typedef struct {
    deferred_wgrad *items;
    int n, cap;
} wgrad_list;

/* A message in flight: the receive posted for action k, or a send not yet known to be done. */
typedef struct {
    comm_request req;
    float *buf;
} pp_message;

typedef struct {
    pp_schedule *sched;
    comm_group *pp;
    comm_links *links;                      /* a group per neighbour and direction (comm.h)        */
    int P, M, V, rank, L, chunk_layers;     /* chunk_layers = L / (P V)                          */
    linear_ops below_linear;                /* the plan's linear operator before the pipeline's   */
    /* the step in progress */
    llama_model *m;
    const int *tokens, *targets;            /* [M * Bm, T] this rank's rows                        */
    float loss_scale, loss;
    llama_saved *sets;                      /* [M * P V]: (mb, chunk) -> its activation set        */
    wgrad_list *deferred;                   /* [M * P V]: zb-h1's weight gradients awaiting W       */
    wgrad_list *collecting;                 /* the list an I is filling, NULL outside I            */
    float **mailbox;                        /* [2 * M * P V]: a tensor handed between chunks of the
                                             * same rank, (dir, mb, receiving chunk)                */
    pp_message *recv;                       /* [actions]: the receive posted for action k          */
    bool *posted;                           /* [actions]                                            */
    pp_message *sends;                      /* the step's sends, waited for at its end             */
    int n_sends, cap_sends;
    float *dh0;                             /* [M * Bm * Ts * D] d loss / d h0, written by chunk 0's
                                             * rank (zeros elsewhere: gathered from stage 0)         */
    size_t live_bytes;
    int live_sets;
    bool drop_last_microbatch;              /* --fault drop-last-microbatch-grad                   */
    /* measured */
    pp_event *events;
    device_mark *marks;                     /* [2 actions]: each action's start and end, this step */
    int n_events;
    pp_measured meas;
    size_t *chunk_set_bytes;             /* [P V] one set's bytes of each chunk (meas's)          */
} pp_state;


/* ---- placement ------------------------------------------------------------------------------- */

static int chunk_of_layer(const pp_state *s, int layer) { return layer / s->chunk_layers; }

static bool pp_holds_layer(void *state, const llama_plan *p, int layer) {
    const pp_state *s = state;
    return pp_chunk_rank(s->sched, chunk_of_layer(s, layer)) == s->rank;
}

/* ---- the linear operator (zb-h1 only): dW left for later ------------------------------------- */
/* (The messages in flight move between the GEMMs by themselves: comm_progress_in_flight, which
 * every GEMM calls. Open MPI moves a message above its eager size only inside MPI calls of the
 * sender and the receiver, so a send posted at the end of an action would otherwise wait for the
 * next action's receive.) */

static void pipeline_linear_forward(void *state, const llama_plan *p, linear_site site, float *y, const float *x,
                                    const float *W, int N, int in, int out) {
    pp_state *s = state;
    s->below_linear.forward(s->below_linear.state, p, site, y, x, W, N, in, out);
}

/* backward with the plan's own operator; during zb-h1's I action only dx now, and dW += dy^T x put
 * on the (microbatch, chunk)'s list for its W. dy lives in a buffer the next layer reuses, so it
 * is copied; x is a saved activation of the set, kept until W, unless the plan splits the sequence
 * (then the linear's input is the shared whole-sequence buffer: copied too). */
static void pipeline_linear_backward(void *state, const llama_plan *p, linear_site site, float *dx, dx_write how,
                                     float *dW, const float *dy, const float *x, const float *W, int N,
                                     int in, int out) {
    pp_state *s = state;
    const linear_ops *below = &s->below_linear;
    if (!s->collecting) {
        below->backward(below->state, p, site, dx, how, dW, dy, x, W, N, in, out);
        return;
    }
    below->backward(below->state, p, site, dx, how, NULL, dy, x, W, N, in, out);   /* the input gradient only */
    wgrad_list *l = s->collecting;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->items = realloc(l->items, (size_t)l->cap * sizeof *l->items);
    }
    deferred_wgrad *d = &l->items[l->n++];
    *d = (deferred_wgrad){site, dW, device_alloc_floats((size_t)N * out, MEM_BUFFERS), NULL, x, W, N, in, out};
    device_copy(d->dy, dy, (size_t)N * out * sizeof(float));
    if (p->sequence.shards > 1) {
        d->x_copy = device_alloc_floats((size_t)N * in, MEM_BUFFERS);
        device_copy(d->x_copy, x, (size_t)N * in * sizeof(float));
        d->x = d->x_copy;
    }
}

/* W(mb, c)'s work: every weight gradient its I deferred, in the order I met them. */
static void run_deferred(pp_state *s, wgrad_list *l) {
    const llama_plan *p = s->m->plan;
    for (int k = 0; k < l->n; k++) {
        deferred_wgrad *d = &l->items[k];
        /* BEGIN ASSIGNMENT: W's work: the weight gradient dW += dy^T x of the deferred linear d, with the plan's own linear operator (no input gradient), then free d's copies */
        s->below_linear.backward(s->below_linear.state, p, d->site, NULL, DX_SET, d->dW, d->dy, d->x, d->W, d->N, d->in, d->out);
        device_free(d->dy);
        device_free(d->x_copy);
        /* END ASSIGNMENT */
    }
    l->n = 0;
}

/* ---- messages between chunks ----------------------------------------------------------------- */

static size_t act_floats(const pp_state *s) { return (size_t)s->m->d.Ns * s->m->d.D; }
static int slot(const pp_state *s, int mb, int chunk) { return mb * s->P * s->V + chunk; }
static float **mailbox(pp_state *s, bool backward, int mb, int chunk) {
    return &s->mailbox[(backward ? s->M * s->P * s->V : 0) + slot(s, mb, chunk)];
}

/* The input action k needs from another chunk: h for F(mb, c > 0) from chunk c-1, dh for B or
 * I(mb, c < last) from chunk c+1. Returns false when it needs none (its input is computed here). */
static bool input_source(const pp_state *s, const pp_action *a, int *from_chunk) {
    int last = s->P * s->V - 1;
    if (a->op == PP_F && a->chunk > 0) { *from_chunk = a->chunk - 1; return true; }
    if ((a->op == PP_B || a->op == PP_I) && a->chunk < last) { *from_chunk = a->chunk + 1; return true; }
    return false;
}

/* Posts the receive of action k's input (once): MPI_Irecv / ncclRecv into a buffer of its own,
 * over the link from the sending rank. Posted one action early, so it arrives while this rank
 * computes; on a link of its own it holds up nothing else (under NCCL a receive blocks its
 * group's queue until the data comes: on the one pp group, this rank's next send would wait
 * behind it, and the peer waiting for that send would never send this: --p2p shared). */
static void post_receive(pp_state *s, int k) {
    if (k >= s->sched->n[s->rank] || s->posted[k]) return;
    s->posted[k] = true;
    const pp_action *a = &s->sched->a[s->rank][k];
    int from;
    if (!input_source(s, a, &from)) return;
    int peer = pp_chunk_rank(s->sched, from);
    if (peer == s->rank) return;                        /* handed over in place: see mailbox */
    s->recv[k].buf = device_alloc_floats(act_floats(s), MEM_BUFFERS);
    s->recv[k].req = comm_link_irecv(s->links, s->recv[k].buf, act_floats(s), peer);
}

/* Action k's input once it has arrived (waiting for it is idle time, not the action's), in a
 * buffer the action owns from now on; NULL when the action computes its own input. */
static float *receive_input(pp_state *s, int k) {
    const pp_action *a = &s->sched->a[s->rank][k];
    int from;
    if (!input_source(s, a, &from)) return NULL;
    if (pp_chunk_rank(s->sched, from) == s->rank) {      /* handed over by this rank's own chunk */
        float **box = mailbox(s, a->op != PP_F, a->mb, a->chunk);
        float *buf = *box;
        *box = NULL;
        return buf;
    }
    comm_wait(&s->recv[k].req);
    float *buf = s->recv[k].buf;
    s->recv[k].buf = NULL;
    return buf;
}

/* Sends `buf` (owned by the send from now on) to the chunk `to_chunk` of microbatch mb: a
 * non-blocking send, or into the mailbox when that chunk lives on this rank. */
static void send_output(pp_state *s, float *buf, bool backward, int mb, int to_chunk) {
    int peer = pp_chunk_rank(s->sched, to_chunk);
    if (peer == s->rank) { *mailbox(s, backward, mb, to_chunk) = buf; return; }
    if (s->n_sends == s->cap_sends) {
        s->cap_sends = s->cap_sends ? 2 * s->cap_sends : 32;
        s->sends = realloc(s->sends, (size_t)s->cap_sends * sizeof *s->sends);
    }
    s->sends[s->n_sends++] = (pp_message){comm_link_isend(s->links, buf, act_floats(s), peer), buf};
}

/* ---- the actions ----------------------------------------------------------------------------- */

static void set_alloc(pp_state *s, int mb, int chunk) {
    int i = slot(s, mb, chunk), l0 = chunk * s->chunk_layers;
    llama_saved_alloc(s->m, &s->sets[i], l0, l0 + s->chunk_layers);
    s->live_sets++;
    s->live_bytes += s->sets[i].layer_bytes;
    if (s->live_sets > s->meas.peak_sets) { s->meas.peak_sets = s->live_sets; s->meas.peak_set_bytes = s->live_bytes; }
    s->meas.set_bytes = s->sets[i].layer_bytes;
    s->chunk_set_bytes[chunk] = s->sets[i].layer_bytes;
}

static void set_free(pp_state *s, int mb, int chunk) {
    int i = slot(s, mb, chunk);
    s->live_sets--;
    s->live_bytes -= s->sets[i].layer_bytes;
    llama_saved_free(s->m, &s->sets[i]);
}

/* F(mb, c): h_in [Bm, Ts, D] (NULL for chunk 0: the embedding makes it) through the chunk's
 * layers, out to the next chunk or into the loss. */
static void forward_action(pp_state *s, float *h_in, int mb, int c) {
    llama_model *m = s->m;
    int l0 = c * s->chunk_layers, l1 = l0 + s->chunk_layers, L = s->L;
    size_t rows = (size_t)m->d.B * m->d.T;              /* this microbatch's tokens */
    set_alloc(s, mb, c);
    llama_saved *set = &s->sets[slot(s, mb, c)];
    m->saved = set;
    set->loss_scale = s->loss_scale;   /* (a layer's auxiliary loss scales by it: chapter 09's) */
    m->aux_loss = 0;
    if (c == 0) {
        llama_embed_forward(m, s->tokens + mb * rows);   /* h0 = set->layers[0].h_in */
    } else {
        device_copy(set->layers[l0].h_in, h_in, act_floats(s) * sizeof(float));
        device_free(h_in);
    }
    float *out = l1 < L ? device_alloc_floats(act_floats(s), MEM_BUFFERS) : set->h_final;
    for (int l = l0; l < l1; l++) llama_layer_forward(m, l, l + 1 < l1 ? set->layers[l + 1].h_in : out);
    if (m->aux_loss != 0) s->loss += m->aux_loss;   /* the chunk's layers' auxiliary losses (09) */
    if (l1 == L) s->loss += llama_head_forward(m, s->targets + mb * rows, s->loss_scale);
    else send_output(s, out, false, mb, c + 1);
}

/* B(mb, c) or I(mb, c): dh [Bm, Ts, D] = d loss / d (the chunk's output) (NULL for the last
 * chunk: the loss makes it) back through the chunk's layers, out to the previous chunk or into the
 * embedding. Under I the linears leave their dW on the set's list for W. */
static void backward_action(pp_state *s, float *dh, int mb, int c, bool input_grad_only) {
    llama_model *m = s->m;
    int l0 = c * s->chunk_layers, l1 = l0 + s->chunk_layers, L = s->L;
    m->saved = &s->sets[slot(s, mb, c)];
    if (input_grad_only) s->collecting = &s->deferred[slot(s, mb, c)];
    if (l1 == L) {
        dh = device_alloc_floats(act_floats(s), MEM_BUFFERS);
        llama_head_backward(m, dh);                     /* dh = d loss / d h_final */
        if (s->drop_last_microbatch && mb == s->M - 1) device_zero(dh, act_floats(s) * sizeof(float));
    }
    for (int l = l1 - 1; l >= l0; l--) llama_layer_backward(m, l, dh);
    if (c == 0) {
        llama_embed_backward(m, dh);                    /* dh is d loss / d h0 */
        device_copy(s->dh0 + (size_t)mb * act_floats(s), dh, act_floats(s) * sizeof(float));
        device_free(dh);
    } else {
        send_output(s, dh, true, mb, c - 1);
    }
    s->collecting = NULL;
    if (!input_grad_only) set_free(s, mb, c);
}

/* W(mb, c): the deferred weight gradients, then the set is released. */
static void weight_action(pp_state *s, int mb, int c) {
    s->m->saved = &s->sets[slot(s, mb, c)];
    run_deferred(s, &s->deferred[slot(s, mb, c)]);
    set_free(s, mb, c);
}

/* ---- the executor: this rank's list of actions, in order ------------------------------------- */

static float pipeline_forward_backward(void *state, const llama_plan *p, llama_model *m, const int *tokens,
                                       const int *targets, float loss_scale, const float **dh0) {
    pp_state *s = state;
    int n = s->sched->n[s->rank];
    s->m = m;
    s->tokens = tokens;
    s->targets = targets;
    s->loss_scale = loss_scale;
    s->loss = 0;
    s->n_sends = 0;
    s->n_events = 0;
    s->meas.peak_sets = 0;
    s->meas.peak_set_bytes = 0;
    s->meas.busy_seconds = 0;
    memset(s->posted, 0, (size_t)n * sizeof *s->posted);
    if (!s->dh0) s->dh0 = device_alloc_floats((size_t)s->M * act_floats(s), MEM_BUFFERS);
    /* The Gantt chart's times are marks of the compute stream (device.h), read once the step is
     * done: on the GPU the host queues action after action without waiting, and a mark placed
     * after an action's input has arrived (its wait joins the compute stream to the transfer) and
     * after its kernels is when the GPU did the action, however far ahead the host ran. */
    device_synchronize();
    device_mark step_start = device_mark_now();
    for (int k = 0; k < n; k++) {
        const pp_action *a = &s->sched->a[s->rank][k];
        post_receive(s, k);         /* this action's input, if not posted yet ...              */
        post_receive(s, k + 1);     /* ... and the next one's, so it arrives while this computes */
        float *input = receive_input(s, k);
        s->marks[2 * k] = device_mark_now();
        m->when.microbatch = a->mb;   /* (run_when: operators keeping state per microbatch read it) */
        if (a->op == PP_F) forward_action(s, input, a->mb, a->chunk);
        else if (a->op == PP_W) weight_action(s, a->mb, a->chunk);
        else backward_action(s, input, a->mb, a->chunk, a->op == PP_I);
        s->marks[2 * k + 1] = device_mark_now();
    }
    m->when.microbatch = 0;
    for (int i = 0; i < s->n_sends; i++) {   /* every send done before its buffer goes */
        comm_wait(&s->sends[i].req);
        device_free(s->sends[i].buf);
    }
    if (p->reduce_grads.reduce && !m->accumulating) p->reduce_grads.reduce(p->reduce_grads.state, p, m);
    device_mark step_end = device_mark_now();
    double t_step = device_mark_seconds(&step_start);
    for (int k = 0; k < n; k++) {
        double t0 = device_mark_seconds(&s->marks[2 * k]), t1 = device_mark_seconds(&s->marks[2 * k + 1]);
        s->events[s->n_events++] = (pp_event){s->sched->a[s->rank][k], t0 - t_step, t1 - t_step};
        s->meas.busy_seconds += t1 - t0;
        device_mark_release(&s->marks[2 * k]);
        device_mark_release(&s->marks[2 * k + 1]);
    }
    s->meas.step_seconds = device_mark_seconds(&step_end) - t_step;
    device_mark_release(&step_start);
    device_mark_release(&step_end);
    *dh0 = s->dh0;
    /* the loss lives on the last chunk's rank (a layer's auxiliary loss on its chunk's): the sum over
     * the pipeline gives it to every stage */
    return (float)comm_host_sum(s->pp, s->loss);
}

/* ---- validation and set-up ------------------------------------------------------------------- */

void pipeline_validate(int pp, const pp_options *o) {
    /* (whole layers in every chunk and equal microbatches: pipeline_layers_rule and
     * pipeline_microbatches_rule, which mesh_create runs) */
    char why[256];
    pp_schedule *s = pp_schedule_build(o->schedule, pp, o->microbatches, o->virtual_stages, why, sizeof why);
    if (!s) comm_exit_usage("%s", why);
    /* the lists themselves, before any rank runs them: every action once and no deadlock (a list
     * written by hand, an exercise's, may have neither; run, it would wait forever or crash) */
    pp_sim sim;
    int bad = pp_simulate(s, pp_unit_costs(s->kind), &sim, why, sizeof why);
    if (!bad) pp_sim_free(&sim);
    if (!bad) bad = pp_check_message_order(s, why, sizeof why);
    pp_schedule_free(s);
    if (bad) comm_exit_usage("--schedule %s: its action lists cannot run: %s", pp_schedule_name(o->schedule), why);
}

static void pipeline_free_state(void *state) {
    pp_state *s = state;
    int sets = s->M * s->P * s->V;
    for (int i = 0; i < sets; i++) free(s->deferred[i].items);
    device_free(s->dh0);
    pp_schedule_free(s->sched);
    comm_links_free(s->links);
    free(s->sets); free(s->deferred); free(s->mailbox); free(s->chunk_set_bytes);
    free(s->recv); free(s->posted); free(s->events); free(s->marks); free(s->sends);
    free(s);
}
const plan_technique pipeline_technique = {"pipeline", pipeline_free_state};
static pp_state *state_of(const llama_plan *p) { return plan_state(p, &pipeline_technique); }

void pipeline_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const pp_options *o) {
    /* The pipeline schedules the layers of the plan below it; a technique that wraps the weight
     * access or the optimizer (chapter 04's data parallelism) reduces the gradients after the whole
     * schedule, so it must be applied on top of the pipeline, not under it. */
    if (plan_slot_installed(plan, "weights") || plan_slot_installed(plan, "optimizer"))
        comm_exit_usage("pipeline_apply: apply the pipeline before data parallelism: FSDP's weight access and "
                        "gradient reduction wrap the whole schedule");
    pp_state *s = plan_push(plan, &pipeline_technique, calloc(1, sizeof(pp_state)), 0);
    s->pp = mesh->group[MESH_PP];
    s->links = o->p2p == PP_P2P_SHARED ? comm_shared_links(s->pp)
             : o->p2p == PP_P2P_LAZY ? comm_lazy_ring_links(s->pp) : comm_ring_links(s->pp);
    s->P = s->pp->size;
    s->M = o->microbatches;
    s->V = o->virtual_stages;
    s->rank = s->pp->rank;
    s->L = c->n_layers;
    s->chunk_layers = c->n_layers / (s->P * s->V);
    char why[256];
    s->sched = pp_schedule_build(o->schedule, s->P, s->M, s->V, why, sizeof why);   /* validated */
    int sets = s->M * s->P * s->V, n = s->sched->n[s->rank];
    s->sets = calloc((size_t)sets, sizeof *s->sets);
    s->chunk_set_bytes = calloc((size_t)s->P * s->V, sizeof *s->chunk_set_bytes);
    s->meas.chunk_set_bytes = s->chunk_set_bytes;
    s->deferred = calloc((size_t)sets, sizeof *s->deferred);
    s->mailbox = calloc(2 * (size_t)sets, sizeof *s->mailbox);
    s->recv = calloc((size_t)n, sizeof *s->recv);
    s->posted = calloc((size_t)n, sizeof *s->posted);
    s->events = calloc((size_t)n, sizeof *s->events);
    s->marks = calloc(2 * (size_t)n, sizeof *s->marks);

    plan->groups.mesh = mesh;
    plan->schedule = (schedule_ops){s, s->M, pp_holds_layer, pipeline_forward_backward};
    /* zb-h1 splits each linear's backward: its linear operator defers dW to the W actions */
    if (o->schedule == PP_ZB_H1)
        plan_wrap(plan->linear, s->below_linear, ((linear_ops){s, pipeline_linear_forward, pipeline_linear_backward}));
}

const pp_schedule *pipeline_schedule(const llama_plan *plan) { return state_of(plan)->sched; }
const pp_event *pipeline_events(const llama_plan *plan, int *n) {
    *n = state_of(plan)->n_events;
    return state_of(plan)->events;
}
pp_measured pipeline_measured(const llama_plan *plan) { return state_of(plan)->meas; }

/* ---- the deliberate bug ---------------------------------------------------------------------- */

static const char *drop_last_microbatch(llama_plan *p) {
    state_of(p)->drop_last_microbatch = true;
    return NULL;
}

const plan_fault pipeline_faults[] = {
    {"drop-last-microbatch-grad", "the last microbatch's gradient is zeroed where its backward starts, so "
     "every layer's gradient misses that microbatch's share", drop_last_microbatch},
    {NULL, NULL, NULL}};

/* ---- the mesh's rules (pipeline.h) ---- */

static const char *layers_fill_chunks(const mesh_rule *r, const mesh_view *v, char *why, size_t len) {
    int L = (int)r->size[0], V = r->size[1] > 0 ? (int)r->size[1] : 1, P = v->s.pp, chunks = P * V;
    bool short_end_chunks = r->option, even = L % chunks == 0;
    bool short_ends = short_end_chunks && chunks >= 2 && (L + 2) % chunks == 0 && (L + 2) / chunks >= 2;
    if (even || short_ends) return NULL;
    if (short_end_chunks)
        return mesh_refuse(why, len, "%d layers cannot be cut into pp %d x %d virtual stages: neither %d nor %d (one "
                           "layer fewer in the first and the last chunk) is a multiple of %d", L, P, V, L, L + 2,
                           chunks);
    return mesh_refuse(why, len, "%s %d cannot be split evenly into %s x %s %d = %d chunks: use a multiple of %d "
                       "layers", mesh_size_name(v, "--n-layers", "n_layers"), L, v->degree[MESH_PP],
                       mesh_size_name(v, "--virtual-stages", "virtual stages"), V, chunks, chunks);
}

static const char *microbatches_fill_shares(const mesh_rule *r, const mesh_view *v, char *why, size_t len) {
    long long batch = r->size[0], size = r->size[2];
    int M = r->size[1] > 0 ? (int)r->size[1] : 1, R = v->s.dp_replicate, S = v->s.dp_shard, dp = R * S;
    long long per_rank = batch / dp;
    const char *name = mesh_size_name(v, "--microbatches", "microbatches");
    if (per_rank % M && dp == 1)
        return mesh_refuse(why, len, "--batch %lld is not divisible by %s %d: each microbatch takes batch / %d "
                           "sequences", batch, name, M, M);
    if (per_rank % M)
        return mesh_refuse(why, len, "--batch %lld over dp_replicate %d x dp_shard %d leaves %lld sequences a data "
                           "rank, not divisible by %s %d: each microbatch takes an equal share", batch, R, S, per_rank,
                           name, M);
    if (size > 0 && per_rank % size)
        return mesh_refuse(why, len, "the global batch of %lld sequences over dp_replicate %d x dp_shard %d leaves "
                           "%lld a data rank: not whole microbatches of %lld sequences", batch, R, S, per_rank, size);
    return NULL;
}

mesh_rule pipeline_layers_rule(int n_layers, int virtual_stages, bool short_end_chunks) {
    return (mesh_rule){.check = layers_fill_chunks, .size = {n_layers, virtual_stages}, .option = short_end_chunks};
}

mesh_rule pipeline_microbatches_rule(long long batch, int microbatches, int microbatch_size) {
    return (mesh_rule){.check = microbatches_fill_shares, .size = {batch, microbatches, microbatch_size}};
}
