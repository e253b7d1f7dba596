/* expert_parallel.c: expert parallelism as a plan (expert_parallel.h). The dispatch and the
 * combine are the MoE block's (moe.c), which reads the plan's ep group; this file places the
 * tensors, splits the batch, sums the balancing loss's counts over cp and reduces the gradients.
 * Applied over the single device's plan or chapter 01's tensor parallelism (the dense parts split
 * over tp; each tp rank routes and runs the experts of its ep group alike), with chapter 06's
 * context parallelism and chapter 05's pipeline applied before it or not. */
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "expert_parallel.h"
#include "model.h"

typedef struct {
    grad_reduce_ops below;           /* the reduction of an earlier technique (06's over cp), run first */
    expert_exchange_ops exchange;    /* the faults' wrappers call the exchange they wrap           */
    comm_group *ep;                  /* the ranks the experts are split over                       */
    float *counts_dev;               /* [2E] the counts' all-to-all, sent and received (kept)     */
    comm_group *batch, *replicate;   /* every data rank; the ranks that hold the same experts */
    comm_group *dense;               /* the ranks a dense tensor's gradient is summed over: the
                                      * data ranks, and the cp ranks too when the ep group spans cp */
    bool over_cp;                    /* the ep group is dp_shard x cp (--ep-over-cp)               */
    float *shares_dev;               /* [shares_cap] the sequences' counts summed over cp (kept)   */
    size_t shares_cap;
    bool skip_expert_reduce;         /* the fault: experts' gradients not reduced over dp_replicate */
    bool experts_as_dense;           /* the fault: experts' gradients summed over the dense group   */
    unsigned block_faults;           /* the MoE block's (EP_FAULT_*)                               */
    int E;                           /* the load's tally: copies this rank sent to each expert,    */
    double *load_now, *load_last;    /* [E] over the forwards of the step running, and of the last */
    double dropped_now, dropped_last; /* (every layer and microbatch; rotated by reduce_grads)     */
} ep_state;

static void free_state(void *state) {
    ep_state *s = state;
    device_free(s->counts_dev);
    device_free(s->shares_dev);
    free(s->load_now);
    free(s->load_last);
    free(s);
}
const plan_technique expert_parallel_technique = {"expert parallel", free_state};

/* After the backward: each tensor's gradient summed over the ranks that hold the same slice of it
 * and saw different tokens (expert_parallel.h's table). One all-reduce per tensor; under chapter
 * 04's FSDP (applied after this: it set groups.shard, and runs this after its own reduction) the
 * gradients of what it shards are its, reduce-scattered into their shards (the dense tensors, and
 * the experts when ep is narrower than its shard group), and only experts held whole are summed
 * here. */
static void reduce_grads(void *state, const llama_plan *p, llama_model *m) {
    ep_state *s = state;
    param_table *t = m->params;
    bool fsdp = p->groups.shard != NULL;   /* chapter 04 reduces what it shards */
    /* the step's forwards are done: their load becomes the last step's */
    for (int e = 0; e < s->E; e++) s->load_last[e] = s->load_now[e], s->load_now[e] = 0;
    s->dropped_last = s->dropped_now, s->dropped_now = 0;
    if (s->below.reduce) s->below.reduce(s->below.state, p, m);
    for (int i = 0; i < t->n; i++) {
        if (!t->t[i].here) continue;   /* another pipeline stage's (chapter 05) */
        bool expert = param_kind_is_expert(t->t[i].spec.kind);
        comm_group *g = expert && !s->experts_as_dense ? s->replicate : s->dense;
        if ((expert && s->skip_expert_reduce) || (fsdp && param_sharded_here(&t->t[i]))) continue;
        if (g->size > 1) comm_all_reduce(g, param_in(t, t->grads, i), param_stored_numel(t, t->grads, i), COMM_SUM);
    }
}

/* ---- the token exchange (plan.h's expert_exchange_ops) ---- */

/* recv[q*El + e] = rank q's count for this rank's expert e: one all-to-all of El counts a peer
 * (exact integers in floats). */
static void exchange_counts(void *state, const llama_plan *p, size_t *recv, const size_t *send, int E) {
    const ep_state *s = state;
    float *dev = s->counts_dev, *host = calloc((size_t)E + 1, sizeof(float));
    for (int e = 0; e < E; e++) host[e] = (float)send[e];
    device_copy_to_device(dev, host, (size_t)E * sizeof(float));
    comm_all_to_all(s->ep, dev, dev + E, (size_t)E / s->ep->size);
    device_copy_to_host(host, dev + E, (size_t)E * sizeof(float));
    for (int e = 0; e < E; e++) recv[e] = (size_t)host[e];
    free(host);
}

/* The rows, send_rows[q] of `width` floats to rank q, recv_rows[q] from it: one all-to-all with
 * counts (in floats) over the ep group. */
static void exchange_rows(void *state, const llama_plan *p, float *recv, const size_t *recv_rows, const float *send,
                          const size_t *send_rows, int width) {
    /* BEGIN ASSIGNMENT: the rows' all-to-all with counts over the ep group (comm_all_to_all_v, comm.h; the technique's state holds the group, ((const ep_state *)state)->ep): send_rows[q] rows of `width` floats go to rank q, recv_rows[q] come from it */
    const ep_state *s = state;
    size_t P = (size_t)s->ep->size, sent[P], got[P];
    for (size_t q = 0; q < P; q++) sent[q] = send_rows[q] * (size_t)width, got[q] = recv_rows[q] * (size_t)width;
    comm_all_to_all_v(s->ep, send, sent, recv, got);
    /* END ASSIGNMENT */
}

/* The balancing loss's per-sequence counts x [n] (host) summed over the cp group, whose ranks hold
 * the other rows of the same sequences: one all-reduce of n floats (exact integers), through a
 * device buffer kept from one call to the next (n = B E, a microbatch's sequences). */
static void sequence_sum(void *state, const llama_plan *p, float *x, size_t n) {
    ep_state *s = state;
    comm_group *cp = p->groups.cp;
    if (!cp || cp->size == 1 || !n) return;
    if (n > s->shares_cap) {
        device_free(s->shares_dev);
        s->shares_dev = device_alloc_floats(n, MEM_BUFFERS);
        s->shares_cap = n;
    }
    device_copy_to_device(s->shares_dev, x, n * sizeof(float));
    comm_all_reduce(cp, s->shares_dev, n, COMM_SUM);
    device_copy_to_host(x, s->shares_dev, n * sizeof(float));
}

void expert_parallel_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, bool over_cp) {
    ep_state *s = calloc(1, sizeof *s);
    plan_push(plan, &expert_parallel_technique, s, 0);
    int dims[2] = {MESH_DP_REPLICATE, MESH_DP_SHARD};
    s->batch = s->dense = mesh_group_over(mesh, dims, 2, "dp");
    s->replicate = mesh->group[MESH_DP_REPLICATE];
    s->over_cp = over_cp = over_cp && mesh->shape.cp > 1;
    if (over_cp && !plan->groups.cp) {   /* (a programming error: the chapter applies cp first) */
        fprintf(stderr, "expert_parallel_apply: the ep group over dp_shard x cp needs context parallelism applied first\n");
        exit(1);
    }
    plan->groups.mesh = mesh;
    plan->groups.batch = s->batch;
    if (plan->checkpoint.keep != ACT_KEEP_ALL)
        comm_exit_usage("expert parallelism: the MoE block keeps every activation; apply it to a plan without "
                        "activation checkpointing");
    s->counts_dev = device_alloc_floats(2 * (size_t)c->moe.experts, MEM_BUFFERS);
    s->E = c->moe.experts;
    s->load_now = calloc((size_t)s->E, sizeof *s->load_now);
    s->load_last = calloc((size_t)s->E, sizeof *s->load_last);
    if (over_cp) {   /* torchtitan's: the ep group carved out of dp_shard x cp; the experts split
                      * over it, every dense tensor's gradient summed over the data and cp ranks
                      * here, which chapter 06's own sum over cp then leaves to this one */
        int ep_dims[2] = {MESH_DP_SHARD, MESH_CP}, dense_dims[3] = {MESH_DP_REPLICATE, MESH_DP_SHARD, MESH_CP};
        plan->groups.ep = s->ep = mesh_group_over(mesh, ep_dims, 2, "ep (dp_shard x cp)");
        plan->groups.expert_dims = MESH_BIT(MESH_DP_SHARD) | MESH_BIT(MESH_CP);
        s->dense = mesh_group_over(mesh, dense_dims, 3, "dp x cp");
        plan->groups.grads_summed_dims |= MESH_BIT(MESH_DP_REPLICATE) | MESH_BIT(MESH_DP_SHARD) | MESH_BIT(MESH_CP);
    } else {
        plan->groups.ep = s->ep = mesh->group[MESH_DP_SHARD];
        plan->groups.expert_dims = MESH_BIT(MESH_DP_SHARD);
    }
    if (plan->groups.cp && plan->groups.cp->size > 1 && c->moe.capacity_factor > 0)
        comm_exit_usage("--capacity-factor with --cp %d: a capacity takes a sequence's copies in token order, and "
                        "context parallelism splits each sequence over the cp ranks (each would decide for its rows "
                        "alone); use dropless routing (no --capacity-factor) with --cp", plan->groups.cp->size);
    plan->experts = (expert_exchange_ops){s, exchange_counts, exchange_rows, sequence_sum};
    plan_wrap(plan->reduce_grads, s->below, ((grad_reduce_ops){s, reduce_grads}));
}

/* ---- the load's tally ---- */

void expert_parallel_count_load(const llama_plan *p, const size_t *per_expert, size_t dropped) {
    ep_state *s = plan_state(p, &expert_parallel_technique);
    if (!s) return;   /* (the baseline's plan) */
    for (int e = 0; e < s->E; e++) s->load_now[e] += (double)per_expert[e];
    s->dropped_now += (double)dropped;
}

comm_group *expert_parallel_dense_group(const llama_plan *p) {
    const ep_state *s = plan_state(p, &expert_parallel_technique);
    return s->dense;
}

bool expert_parallel_over_cp(const llama_plan *p) {
    const ep_state *s = plan_state(p, &expert_parallel_technique);
    return s->over_cp;
}

void expert_parallel_last_load(const llama_plan *p, double *load, double *dropped) {
    const ep_state *s = plan_state(p, &expert_parallel_technique);
    for (int e = 0; e < s->E; e++) load[e] = s->load_last[e];
    *dropped = s->dropped_last;
}

/* ---- the mesh's rule ---- */

const char *ep_data_ranks_text(int pp, int cp) {
    static const char *const text[2][2] = {{"NP / tp", "NP / (tp cp)"}, {"NP / (tp pp)", "NP / (tp pp cp)"}};
    return text[pp > 1][cp > 1];
}

int ep_shard_degree(int world, int tp, int pp, int cp, int ep, bool over_cp) {
    if (world % tp) comm_exit_usage("--tp %d does not divide the %d ranks (NP)", tp, world);
    if ((world / tp) % (pp * cp)) {
        char given[64];   /* the degrees given, as given */
        if (pp > 1 && cp > 1) snprintf(given, sizeof given, "--pp %d x --cp %d", pp, cp);
        else snprintf(given, sizeof given, cp > 1 ? "--cp %d" : "--pp %d", cp > 1 ? cp : pp);
        comm_exit_usage("%s does not divide the %d ranks (NP / tp): NP = pp x dp_replicate x dp_shard x cp x tp", given,
                        world / tp);
    }
    int data = world / (tp * pp * cp), shard = ep ? ep : data;
    if (over_cp && ep) {   /* --ep names the whole ep group, dp_shard x cp */
        if (ep % cp)
            comm_exit_usage("--ep %d with --ep-over-cp: the ep group is dp_shard x cp, a multiple of --cp %d", ep, cp);
        shard = ep / cp;
    }
    if (data % shard) {
        if (over_cp)
            comm_exit_usage("--ep %d / --cp %d = %d does not divide the %d data ranks (%s)", ep, cp, shard, data,
                            ep_data_ranks_text(pp, cp));
        comm_exit_usage("--ep %d does not divide the %d data ranks (%s): NP = %sdp_replicate x ep x %stp", shard, data,
                        ep_data_ranks_text(pp, cp), pp > 1 ? "pp x " : "", cp > 1 ? "cp x " : "");
    }
    return shard;
}

static const char *ep_divides(const mesh_rule *r, const mesh_view *v, char *why, size_t len) {
    long long experts = r->size[0], batch = r->size[1];
    bool over_cp = r->size[2] && v->s.cp > 1;
    int dp = v->s.dp_replicate * v->s.dp_shard, ep = v->s.dp_shard * (over_cp ? v->s.cp : 1);
    const char *data = ep_data_ranks_text(v->s.pp, v->s.cp);   /* the data ranks: pp's stages and cp aside */
    char degree[96];
    if (over_cp) snprintf(degree, sizeof degree, "ep = dp_shard x cp = %d x %d = %d", v->s.dp_shard, v->s.cp, ep);
    else if (r->option) snprintf(degree, sizeof degree, "--ep %d", ep);
    else snprintf(degree, sizeof degree, "ep = %s = %d", data, ep);
    if (experts % ep)
        return mesh_refuse(why, len, "%s does not divide --experts %lld: each ep rank holds whole experts, "
                           "%lld / ep of them", degree, experts, experts);
    if (batch % dp)
        return mesh_refuse(why, len, "--batch %lld is not divisible by the %d data-parallel ranks (%s): each "
                           "takes batch / %d sequences", batch, dp, data, dp);
    return NULL;
}
mesh_rule ep_mesh_rule(const llama_config *c, long long batch, bool ep_given, bool over_cp) {
    return (mesh_rule){.check = ep_divides, .size = {c->moe.experts, batch, over_cp}, .option = ep_given};
}

/* ---- faults ---- */
/* Whether chapter 04's FSDP (applied after this) shards the experts, and so reduces their gradients
 * itself: this reduction's bugs would then change nothing. */
static bool experts_sharded_by_fsdp(const llama_plan *p) {
    return p->groups.shard &&
           !param_held_whole(&p->groups.mesh->shape, P_EXPERT_W1, p->groups.shard_dims, p->groups.expert_dims);
}
static const char *skip_expert_reduce(llama_plan *p) {
    ep_state *s = plan_state(p, &expert_parallel_technique);
    if (s && experts_sharded_by_fsdp(p))
        return p->groups.shard_dims & MESH_BIT(MESH_DP_REPLICATE)
                   ? "skip-expert-reduce leaves out this chapter's sum of the experts' gradients, which FSDP makes when "
                     "it shards them (--full-shard: over dp_replicate); run it without --full-shard"
                   : "skip-expert-reduce leaves out this chapter's sum of the experts' gradients, which FSDP makes when "
                     "it shards them (ep below FSDP's shard group: --fsdp --cp 2); run it without --fsdp, or with "
                     "--ep-over-cp";
    if (!s || s->replicate->size == 1)
        return s && s->over_cp ? "skip-expert-reduce leaves out the experts' all-reduce over dp_replicate: it needs "
                                 "--ep below the data ranks times cp, dp_replicate 2 or more"
                               : "skip-expert-reduce leaves out the experts' all-reduce over dp_replicate: it needs "
                                 "--ep below the data ranks (NP / tp, pp and cp aside), dp_replicate 2 or more";
    s->skip_expert_reduce = true;
    return NULL;
}
static const char *experts_as_dense(llama_plan *p) {
    ep_state *s = plan_state(p, &expert_parallel_technique);
    if (experts_sharded_by_fsdp(p))
        return p->groups.shard_dims & MESH_BIT(MESH_DP_REPLICATE)
                   ? "experts-as-dense changes this chapter's sum of the experts' gradients, which FSDP makes when it "
                     "shards them (--full-shard: over dp_replicate); run it without --full-shard"
                   : "experts-as-dense changes this chapter's sum of the experts' gradients, which FSDP makes when it "
                     "shards them (ep below FSDP's shard group: --fsdp --cp 2); run it without --fsdp, or with "
                     "--ep-over-cp";
    if (s->ep->size == 1)
        return "experts-as-dense sums the experts' gradients over every data rank, as a dense tensor's: it needs ep 2 "
               "or more (one ep rank holds every expert, and its data ranks replicate them)";
    s->experts_as_dense = true;
    return NULL;
}
static const char *local_shares(llama_plan *p) {
    ep_state *s = plan_state(p, &expert_parallel_technique);
    if (!p->groups.cp || p->groups.cp->size == 1)
        return "local-shares leaves out the sum of the sequences' counts over cp: it needs --cp 2 or more";
    /* the single device's sequence_sum, which leaves the counts as they are */
    plan_wrap(p->experts, s->exchange,
              ((expert_exchange_ops){s, p->experts.counts, p->experts.rows, expert_exchange_local.sequence_sum}));
    return NULL;
}
unsigned expert_parallel_faults_on(const llama_plan *p) {
    const ep_state *s = plan_state(p, &expert_parallel_technique);
    return s ? s->block_faults : 0;
}
static const char *block_fault(llama_plan *p, unsigned which) {
    ep_state *s = plan_state(p, &expert_parallel_technique);
    s->block_faults |= which;
    return NULL;
}
static const char *no_gates(llama_plan *p) { return block_fault(p, EP_FAULT_NO_GATES); }
static const char *skip_aux_grad(llama_plan *p) { return block_fault(p, EP_FAULT_SKIP_AUX_GRAD); }

/* The exchange's own bugs wrap the operator: the first non-empty chunk an exchange delivers is
 * zeroed; the counts of each peer are read for this rank's experts in reverse order (the totals
 * per peer unchanged, so the rows' all-to-all still matches its sizes); the sequences' counts are
 * left as each cp rank counted them (local_shares, below). */
static void dropping_rows(void *state, const llama_plan *p, float *recv, const size_t *recv_rows, const float *send,
                          const size_t *send_rows, int width) {
    const ep_state *s = state;
    s->exchange.rows(s->exchange.state, p, recv, recv_rows, send, send_rows, width);
    for (int q = 0, off = 0; q < s->ep->size; off += (int)recv_rows[q], q++)
        if (recv_rows[q]) {
            device_zero(recv + (size_t)off * width, recv_rows[q] * (size_t)width * sizeof(float));
            break;
        }
}
static void reversed_counts(void *state, const llama_plan *p, size_t *recv, const size_t *send, int E) {
    const ep_state *s = state;
    s->exchange.counts(s->exchange.state, p, recv, send, E);
    int El = E / s->ep->size;
    for (int q = 0; q < s->ep->size; q++)
        for (int e = 0; e < El / 2; e++) {
            size_t *a = &recv[q * El + e], *b = &recv[q * El + El - 1 - e], t = *a;
            *a = *b, *b = t;
        }
}
static const char *drop_chunk(llama_plan *p) {
    ep_state *s = plan_state(p, &expert_parallel_technique);
    plan_wrap(p->experts, s->exchange,
              ((expert_exchange_ops){s, p->experts.counts, dropping_rows, p->experts.sequence_sum}));
    return NULL;
}
static const char *wrong_counts(llama_plan *p) {
    ep_state *s = plan_state(p, &expert_parallel_technique);
    plan_wrap(p->experts, s->exchange,
              ((expert_exchange_ops){s, reversed_counts, p->experts.rows, p->experts.sequence_sum}));
    return NULL;
}
const plan_fault expert_parallel_faults[] = {
    {"drop-chunk", "the first chunk of rows each exchange delivers is zeroed", drop_chunk},
    {"no-gates", "the combine adds a token's expert outputs without their gate weights", no_gates},
    {"skip-aux-grad", "the load-balancing loss's gradient is left out of the router's", skip_aux_grad},
    {"wrong-counts", "the received counts are read for the local experts in reverse order", wrong_counts},
    {"skip-expert-reduce", "the experts' gradients are not summed over dp_replicate", skip_expert_reduce},
    {"experts-as-dense", "the experts' gradients are summed over every data rank, as a dense tensor's (the ep ranks "
                         "hold different experts)", experts_as_dense},
    {"local-shares", "the balancing loss counts a sequence's copies on this cp rank's rows only", local_shares},
    {0}};
