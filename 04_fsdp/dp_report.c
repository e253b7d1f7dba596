/* dp_report.c: see dp_report.h. Psi is the count of parameters a rank's tp slice holds, Psi_S
 * the floats of its dp shard (ceil-padded): S x Psi_S >= Psi, the difference the padding. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "comm.h"
#include "files.h"
#include "log.h"
#include "mesh.h"
#include "report.h"
#include "dp_report.h"

/* The sizes the formulas use, read off the model's table. */
typedef struct { double psi, psi_s, n, layer_pad, ends_pad, layer_whole; int S, R, L; } dp_sizes;
static dp_sizes sizes_of(const llama_plan *plan, const llama_model *m) {
    const param_table *t = m->params;
    dp_sizes z = {0};
    z.S = plan->groups.mesh->shape.degree[MESH_DP_SHARD];
    z.R = plan->groups.mesh->shape.degree[MESH_DP_REPLICATE];
    z.L = m->c.n_layers;
    z.psi = (double)t->whole_numel;
    z.psi_s = (double)t->shard_numel;
    z.n = t->n;
    for (int u = 0; u <= z.L; u += z.L) {   /* layer 0 (they are all alike) and the ends */
        int idx[PARAM_UNIT_MAX], k = param_unit_tensors(t, u, idx);
        double pad = 0, whole = 0;
        for (int j = 0; j < k; j++) {
            const param_tensor *x = &t->t[idx[j]];
            pad += (double)z.S * x->shard_units * x->width;
            whole += (double)x->units * x->width;
        }
        if (u == z.L) z.ends_pad = pad; else { z.layer_pad = pad; z.layer_whole = whole; }
    }
    return z;
}

int report_data_parallel_traffic(const run_options *o, const llama_plan *plan, const llama_model *m,
                                 const dp_options *dp) {
    dp_sizes z = sizes_of(plan, m);
    device_mesh *mesh = plan->groups.mesh;
    comm_group *groups[4] = {mesh->group[MESH_DP_SHARD]};
    int n_groups = 1, n_expect = 0;
    comm_expectation expect[4];
    /* The collectives of one step over the data ranks, as counts and payload bytes (the padded
     * tensors: Psi_S is ceil-padded, so S x Psi_S >= Psi): ddp's all-reduces of its buckets over
     * the batch group; the other modes' all-gathers and reduce-scatters over dp_shard, and HSDP's
     * all-reduces over dp_replicate. */
    double buckets = 0, bucket_bytes = 0, gathers = 0, gather_bytes = 0, scatters = 0, scatter_bytes = 0;
    double replica_reduces = 0, replica_bytes = 0;
    /* BEGIN ASSIGNMENT: traffic formula: the calls and payload bytes per step of each collective over the data ranks (ddp's buckets; the gathers and reduce-scatters over dp_shard; HSDP's all-reduces) */
    if (dp->mode == DP_DDP) {
        /* ceil(bucket / layer) layers per bucket (at least 1), and the ends on their own */
        double per = fmax(1, ceil((double)dp->bucket_floats / z.layer_whole));
        buckets = ceil(z.L / per) + 1;
        bucket_bytes = 4 * z.psi;
    } else {
        /* one collective per unit: the L layers and the ends */
        double full = 4 * z.S * z.psi_s, units = z.L + 1;   /* every unit's all-gather or reduce-scatter */
        bool twice = dp->mode == DP_FSDP && dp->reshard_after_forward;
        gathers = units * (twice ? 2 : 1);
        gather_bytes = full * (twice ? 2 : 1);
        if (twice && dp->prefetch) {   /* the ends and the last layer stay gathered for backward */
            gathers -= 2;
            gather_bytes -= 4 * (z.ends_pad + z.layer_pad);
        }
        scatters = units;
        scatter_bytes = full;
        if (z.R > 1) { replica_reduces = units; replica_bytes = 4 * z.psi_s; }
    }
    /* END ASSIGNMENT */
    char buckets_formula[64];
    bool ddp = dp->mode == DP_DDP, fsdp = dp->mode == DP_FSDP;
    /* --reduce-dtype bf16: the gradients' collectives move 2 bytes an element where the formulas
     * above count 4 (dp_units.c: the bf16 copies that move) */
    double grad_scale = dtype_size(dp->reduce_type) / 4.0;
    const char *grad_note = dp->reduce_type == DTYPE_F32 ? "" : " x 2/4 (bf16)";
    bucket_bytes *= grad_scale;
    scatter_bytes *= grad_scale;
    replica_bytes *= grad_scale;
    /* --dtype bf16: FSDP gathers tensor by tensor, the linears' weights as bf16, 2 bytes an element
     * less (fsdp.c, the mixed-precision policy) */
    double bf16_elems = 0;
    if (fsdp && m->c.precision == DTYPE_BF16) {
        fsdp_gather_counts(m->params, z.L, dp->reshard_after_forward, dp->prefetch, &gathers, &bf16_elems);
        gather_bytes -= 2 * bf16_elems;
    }
    if (ddp) {
        groups[0] = plan->groups.batch;
        snprintf(buckets_formula, sizeof buckets_formula, "Psi x %zu in %.0f buckets", dtype_size(dp->reduce_type), buckets);
        expect[n_expect++] = (comm_expectation){plan->groups.batch, COLL_ALL_REDUCE, buckets, bucket_bytes, buckets_formula};
    } else {
        /* the formulas in words, printed beside the figures (in the student copy: which exercise) */
        const char *when = "exercise 5", *scattered = "exercise 5", *replicated = "exercise 5";
        /* BEGIN SOLUTION 04: the traffic formula in words */
        when = !fsdp ? "S Psi_S x 4 (after the step)"
             : !dp->reshard_after_forward ? "S Psi_S x 4 (fwd)"
             : dp->prefetch ? "(2 S Psi_S - ends - layer) x 4" : "2 x S Psi_S x 4 (fwd + bwd)";
        scattered = "S Psi_S x 4 (grads)";
        replicated = "Psi_S x 4 (HSDP)";
        /* END SOLUTION */
        char bf16_when[96], bf16_scattered[96], bf16_replicated[96];
        if (bf16_elems > 0) {   /* (the same, the linears' 2 bytes an element: by tensor) */
            snprintf(bf16_when, sizeof bf16_when, "%s - 2 x linears'", when);
            when = bf16_when;
        }
        if (*grad_note) {   /* (the same, the gradients at 2 bytes an element) */
            snprintf(bf16_scattered, sizeof bf16_scattered, "%s%s", scattered, grad_note);
            snprintf(bf16_replicated, sizeof bf16_replicated, "%s%s", replicated, grad_note);
            scattered = bf16_scattered;
            replicated = bf16_replicated;
        }
        expect[n_expect++] = (comm_expectation){mesh->group[MESH_DP_SHARD], COLL_ALL_GATHER, gathers, gather_bytes, when};
        expect[n_expect++] = (comm_expectation){mesh->group[MESH_DP_SHARD], COLL_REDUCE_SCATTER, scatters, scatter_bytes,
                                                scattered};
        if (z.R > 1) {
            groups[n_groups++] = mesh->group[MESH_DP_REPLICATE];
            expect[n_expect++] = (comm_expectation){mesh->group[MESH_DP_REPLICATE], COLL_ALL_REDUCE, replica_reduces,
                                                    replica_bytes, replicated};
        }
    }
    if (plan->groups.tp) {
        double N = (double)m->d.N, D = m->d.D;
        groups[n_groups++] = plan->groups.tp;
        expect[n_expect++] = (comm_expectation){plan->groups.tp, COLL_ALL_REDUCE, 4.0 * z.L, 4.0 * z.L * N * D * 4, "4 x L x (B/dp)*T*D*4"};
    }
    int mismatches = report_communication(groups, n_groups, o->steps, expect, n_expect);
    log0("  Psi = %.0f parameters per rank's tp slice; S x Psi_S = %.0f with the padding of %d shards "
         "(%.0f floats = %s of padding moved per gather)\n", z.psi, z.S * z.psi_s, z.S, z.S * z.psi_s - z.psi,
         fmt_bytes(4 * (z.S * z.psi_s - z.psi)));
    return mismatches;
}

int report_data_parallel_memory(const llama_plan *plan, const llama_model *m, const dp_options *dp,
                                const double measured[3], double buffer_bytes, const char *csv_dir) {
    dp_sizes z = sizes_of(plan, m);
    bool shard_values = dp->mode == DP_FSDP, shard_grads = dp->mode == DP_ZERO2 || dp->mode == DP_FSDP;
    bool shard_optim = dp->mode != DP_DDP;
    /* Bytes per rank: the values, gradients and AdamW m and v as stored, and the transient buffers
     * (MEM_BUFFERS) the mode allocates, with the formula that names them. */
    double v = 0, g = 0, a = 0, buffers = 0;
    char buffer_formula[160] = "none";
    /* BEGIN ASSIGNMENT: memory formula: the bytes per rank of the values, gradients, AdamW m and v and the transient buffers of this mode (and buffer_formula, the formula in words) */
    v = 4 * (shard_values ? z.psi_s : z.psi);
    g = 4 * (shard_grads ? z.psi_s : z.psi);
    a = 8 * (shard_optim ? z.psi_s : z.psi);
    /* the transient buffers: gathered layers in flight (fsdp), a unit's full gradients (zero2,
     * fsdp), the collectives' staging (the largest unit by rank, and this rank's 1/S of it) */
    double in_flight = !dp->reshard_after_forward ? z.L : dp->prefetch ? 3 : 2;
    buffers = dp->mode == DP_DDP ? 0 : 4 * fmax(z.ends_pad, z.layer_pad) * (z.S + 1) / z.S;
    if (shard_grads) buffers += 4 * (z.ends_pad + z.layer_pad);
    if (shard_values) buffers += 4 * (z.ends_pad + in_flight * z.layer_pad);
    if (dp->mode != DP_DDP)
        snprintf(buffer_formula, sizeof buffer_formula, "%s%s%s",
                 shard_values ? (in_flight == 3 ? "4(ends + 3 layers) + " : in_flight == 2 ? "4(ends + 2 layers) + "
                                                                            : "4(ends + L layers) + ") : "",
                 shard_grads ? "4(ends + layer) grads + " : "", "4(S+1)/S largest unit");
    /* END ASSIGNMENT */
    if (dp->reduce_type != DTYPE_F32) {   /* --reduce-dtype bf16: the gradients' bf16 copies that move */
        double e = dtype_size(dp->reduce_type), largest = fmax(z.ends_pad, z.layer_pad);
        if (dp->mode == DP_DDP) buffers += e * z.psi;                   /* the whole block's copy */
        else buffers += e * largest + e * largest / z.S;                /* wire_in, wire_out (dp_allocate_stages) */
        size_t at = dp->mode == DP_DDP || strcmp(buffer_formula, "none") == 0 ? 0 : strlen(buffer_formula);
        snprintf(buffer_formula + at, sizeof buffer_formula - at, "%s%s", at ? " + " : "",
                 dp->mode == DP_DDP ? "2 Psi (bf16 grads)" : "bf16 wire_in, wire_out");
    }
    static const char *total[DP_NMODES] = {"16 Psi", "8 Psi + 8 Psi_S", "4 Psi + 12 Psi_S", "16 Psi_S"};
    memory_row rows[] = {
        {"parameters", measured[0], v, shard_values ? "4 Psi_S" : "4 Psi"},
        {"gradients", measured[1], g, shard_grads ? "4 Psi_S" : "4 Psi"},
        {"AdamW m, v", measured[2], a, shard_optim ? "8 Psi_S" : "8 Psi"},
        {"together (ZeRO)", measured[0] + measured[1] + measured[2], v + g + a, total[dp->mode]},
        {"transient buffers", buffer_bytes, buffers, buffer_formula}};
    int mismatches = report_memory("memory per rank (Psi_S = ceil-padded Psi / S)", rows, 5);
    /* one row per run for make plot-04's bars */
    if (comm_world()->rank == 0 && csv_dir) {
        char path[512];
        snprintf(path, sizeof path, "%s/memory_modes.csv", csv_dir);
        FILE *f = out_open(path, "mode,dp_replicate,dp_shard,tp,parameters,gradients,optimizer,buffers", true);
        csv_row(f, "%s,%d,%d,%d,%.0f,%.0f,%.0f,%.0f", dp_mode_name(dp->mode), z.R, z.S,
                plan->groups.tp ? plan->groups.tp->size : 1, measured[0], measured[1], measured[2], buffer_bytes);
        csv_close(f);   /* (a failed write: run_finish ends the run with its line) */
    }
    log0("  replicated (16 Psi) would be %s per rank: this mode keeps %.0f%% of it, plus the buffers\n",
         fmt_bytes(16 * z.psi), 100 * (v + g + a) / (16 * z.psi));
    return mismatches;
}

int report_timeline(const run_options *o, const llama_plan *plan, const dp_options *dp, const run_clock *k) {
    int n;
    const dp_event *e = dp_timeline(plan, &n);
    char path[512];
    snprintf(path, sizeof path, "%s/timeline_%s_rank%d.csv", o->out_dir, dp_mode_name(dp->mode), comm_world()->rank);
    FILE *f = out_open(path, "lane,what,start_ms,end_ms", false);   /* every rank writes its own lane */
    for (int i = 0; f && i < n; i++) csv_row(f, "%s,%s,%.3f,%.3f", e[i].lane, e[i].what, 1e3 * e[i].t0, 1e3 * e[i].t1);
    csv_close(f);
    /* The time blocked in collectives, cut where the group's last rank issued each one: before,
     * waiting for a late rank (skew); after, waiting for the data (what overlap did not hide).
     * Printed for the rank that waited longest. */
    double data, peer, gather_data, gather_peer;
    comm_wait_split(-1, &data, &peer);
    comm_wait_split(COLL_ALL_GATHER, &gather_data, &gather_peer);   /* what prefetch is for */
    comm_group *w = comm_world();
    float mine[4] = {(float)(k->comm_seconds / o->steps), (float)(data / o->steps), (float)(peer / o->steps),
                     (float)(gather_data / o->steps)};
    float *all = w->rank == 0 ? malloc(4 * sizeof(float) * w->size) : NULL;
    comm_host_gather(w, mine, all, 4, 0);
    if (w->rank == 0) {
        int slowest = 0;
        for (int r = 1; r < w->size; r++) if (all[4 * r] > all[4 * slowest]) slowest = r;
        const float *x = all + 4 * slowest;
        log0("exposed communication (time waited on collectives, the slowest rank): %.2f ms per step; "
             "timeline of the last step in %s/timeline_%s_rank*.csv\n", 1e3 * x[0], o->out_dir,
             dp_mode_name(dp->mode));
        log0("  of which waiting for the data after every rank had issued: %.2f ms (all-gathers %.2f ms); "
             "for a late rank: %.2f ms\n", 1e3 * x[1], 1e3 * x[3], 1e3 * x[2]);
    }
    free(all);
    return 0;
}
