/* ranks: 1 4 */
/* test_checkpoint.c: chapter 08's sharded checkpoints (08_full_trainer/checkpoint.h).
 *
 * On 2 or 4 ranks, mesh A is FSDP (dp_shard 2) x Megatron TP (chapter 04's plan on chapter 01's);
 * on 1 rank, the single device. A trains two AdamW steps on synthetic batches and saves after
 * each; rank 0 keeps what param_gather(_block) gives of every tensor's parameters, m and v (the
 * reference). Then:
 *   - the directory: step_00000001 and step_00000002, latest naming the second, no temporary
 *     names left; the index lists every tensor; the rank files hold each element exactly once
 *     (their bytes add up to 3 x the model's);
 *   - resharding: models on other meshes, from another seed, load the checkpoint and must hold
 *     the reference bit for bit: gathered by param_gather_block (params, m, v of every tensor),
 *     and on every rank its stored part (replicas and a shard's zero padding included) against
 *     the reference broadcast from rank 0. Meshes: tp 4 (world), FSDP over the world, pp 2 x tp,
 *     HSDP dp_replicate 2 x dp_shard with ZeRO-1 (values whole, m and v sharded), FSDP over
 *     dp_shard 2 x cp (chapter 08's shards spanning the cp ranks), and a single-device model on
 *     every rank; on 1 rank, FSDP over a 1-rank mesh;
 *   - DIR naming a step directory loads that step; a model that loads step 1 and trains step 2
 *     on mesh A ends bit for bit where the uninterrupted run did (AdamW's step count is right);
 *   - a checkpoint saved from the pipeline mesh (each stage its own tensors) loads back the same;
 *   - the export: one safetensors file with the baseline's names and shapes and the reference's
 *     values, byte-identical whether exported from mesh A or from the single-device model;
 *   - refusals, the same on every rank: no checkpoint (1), a model of another ffn_dim (-1, the
 *     line names ffn_dim), latest naming a missing step, a truncated rank file (-1); a save of a
 *     state holding NaN (-2, nothing written). The index's crc32 and sizes match the files.
 *     (The corruption suite, through the trainer: tests/t_checkpoint_corrupt.sh.)
 *
 * Modes for tests/t_checkpoint_crash.sh:  --save DIR STEPS  (train STEPS steps on mesh A, save),
 * --verify DIR STEP  (load DIR on another mesh; must hold step STEP of mesh A's run),
 * --export DIR PATH  (load DIR on another mesh, export it, print the next batch's loss).
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm.h"
#include "data.h"
#include "device.h"
#include "mesh.h"
#include "model.h"
#include "params.h"
#include "safetensors.h"
#include "test_util.h"
#include "../01_transformer_tp/tp.h"
#include "../04_fsdp/data_parallel.h"
#include "../05_pipeline/pipeline.h"
#include "../06_context_parallel/context_parallel.h"
#include "../08_full_trainer/checkpoint.h"

#define BATCH 4
#define SEED 1234
#define DATA_SEED 77
#define NB 3

static llama_config config(void) {
    llama_config c = llama_config_default();
    c.dim = 32;          /* 8 heads of 8 (4 kv heads): tp 4 splits whole heads                   */
    c.n_layers = 2;      /* two pipeline stages                                                  */
    c.n_heads = 8;
    c.n_kv_heads = 4;
    c.ffn_dim = 52;      /* 13 units per rank at tp 4: FSDP shards of 4, 4, 4, 1 (+ 3 padding)  */
    c.vocab_size = 66;   /* uneven FSDP shards of the ends too: 17, 17, 17, 15                   */
    c.seq_len = 8;
    return c;
}

typedef enum { K_SINGLE, K_TP, K_FSDP, K_FSDP_TP, K_PP_TP, K_HSDP_ZERO1, K_FSDP_CP } layout_kind;
static const char *const kind_name[] = {"single device", "tp", "fsdp", "fsdp x tp", "pp 2 x tp", "hsdp zero1",
                                        "fsdp over dp_shard x cp"};

typedef struct {
    layout_kind kind;
    llama_plan plan;
    llama_model *m;
    bool dp, pp;
} setup;

static device_mesh *meshes[32];   /* kept (reachable) until exit: meshes are never freed */
static int n_meshes;

/* (on the heap: the model keeps a pointer to its plan) */
static setup *make(layout_kind kind, const llama_config *c, uint64_t seed) {
    int W = comm_world()->size;
    setup *sp = malloc(sizeof *sp), s = {kind, plan_single_device(), NULL, false, false};
    mesh_shape shape = {.tp = 1};
    if (kind == K_TP) shape = (mesh_shape){.tp = W};
    if (kind == K_FSDP) shape = (mesh_shape){.dp_shard = W};
    if (kind == K_FSDP_TP) shape = (mesh_shape){.dp_shard = 2, .tp = W / 2};
    if (kind == K_PP_TP) shape = (mesh_shape){.pp = 2, .tp = W / 2};
    if (kind == K_HSDP_ZERO1) shape = (mesh_shape){.dp_replicate = 2, .dp_shard = W / 2};
    if (kind == K_FSDP_CP) shape = (mesh_shape){.dp_shard = 2, .cp = W / 2};
    int B = BATCH;
    if (kind != K_SINGLE) {
        device_mesh *mesh = meshes[n_meshes++] = mesh_create(shape, NULL);
        s.plan = tensor_parallel_or_single(mesh, c);
        if (kind == K_FSDP_CP) {   /* chapter 08's FSDP over dp_shard x cp needs 06 applied first */
            cp_options o = {.method = CP_RING, .balance = CP_ZIGZAG};
            context_parallel_apply(&s.plan, mesh, c, &o);
        }
        if (kind == K_FSDP || kind == K_FSDP_TP || kind == K_HSDP_ZERO1 || kind == K_FSDP_CP) {
            dp_options o = {.mode = kind == K_HSDP_ZERO1 ? DP_ZERO1 : DP_FSDP, .reshard_after_forward = true, .prefetch = true,
                            .bucket_floats = 64 * 256, .gather = NULL, .shard_over_cp = kind == K_FSDP_CP};
            data_parallel_apply(&s.plan, mesh, c, &o);
            s.dp = true;
            B /= s.plan.groups.batch->size;
        }
        if (kind == K_PP_TP) {
            pp_options o = {.schedule = PP_1F1B, .microbatches = 2, .virtual_stages = 1, .p2p = PP_P2P_LINKS};
            pipeline_validate(2, &o);
            pipeline_apply(&s.plan, mesh, c, &o);
            s.pp = true;
            B /= 2;
        }
        s.plan.groups.mesh = mesh;   /* (tp 1: the single-device plan, placed on the mesh all the same) */
    }
    *sp = s;
    sp->m = llama_create(c, &sp->plan, B, seed);
    return sp;
}

static void drop(setup *s) {
    llama_free(s->m);
    plan_free(&s->plan);
    free(s);
}

/* One AdamW step of the uninterrupted run on the synthetic batch of `step` (every rank its rows). */
static void train_step(setup *s, const llama_config *c, int step) {
    int N = BATCH * c->seq_len, tokens[BATCH * 64], targets[BATCH * 64];
    synthetic_batch(tokens, targets, BATCH, c->seq_len, c->vocab_size, DATA_SEED, step);
    float scale = 1.0f / (float)count_valid_targets(targets, N);
    int *dt = device_alloc_ints(N, MEM_BUFFERS), *dg = device_alloc_ints(N, MEM_BUFFERS);
    device_copy_to_device(dt, tokens, N * sizeof(int));
    device_copy_to_device(dg, targets, N * sizeof(int));
    llama_model *m = s->m;
    size_t off = (size_t)(m->plan->groups.batch ? m->plan->groups.batch->rank : 0) * m->d.B * c->seq_len;
    llama_zero_grad(m);
    llama_forward(m, dt + off, dg + off, scale);
    llama_backward(m);
    adamw_config o = adamw_config_default();
    llama_adamw_step(m, &o, step);
    device_free(dt);
    device_free(dg);
}

static float *block_of(const param_table *t, int b) { return b == 0 ? t->params : b == 1 ? t->adam_m : t->adam_v; }
static const char *const block_label[NB] = {"params", "adam_m", "adam_v"};

/* Every block of every tensor, full, on rank 0 (every rank for a single-device model). */
typedef struct { int n; float **t; } snapshot;   /* t[b * n + i] */

static snapshot gather_all(const llama_model *m) {
    const param_table *t = m->params;
    bool here = comm_world()->rank == 0 || !t->mesh;
    snapshot s = {t->n, calloc((size_t)NB * t->n, sizeof(float *))};
    for (int b = 0; b < NB; b++)
        for (int i = 0; i < t->n; i++) {
            size_t n = (size_t)t->t[i].spec.rows * t->t[i].spec.cols;
            float *full = here ? malloc(n * sizeof(float)) : NULL;
            param_gather_block(t, block_of(t, b), i, full);
            s.t[b * t->n + i] = full;
        }
    return s;
}

static void snapshot_free(snapshot *s) {
    for (int k = 0; k < NB * s->n; k++) free(s->t[k]);
    free(s->t);
}

/* The model holds the reference bit for bit: (1) gathered to rank 0; (2) on every rank, the
 * part it stores (param_stored_slice) and a shard's padding zero. Returns the mismatches. */
static int compare(const llama_model *m, const snapshot *ref, const char *what) {
    comm_group *w = comm_world();
    const param_table *t = m->params;
    int bad = 0;
    snapshot got = gather_all(m);
    for (int k = 0; k < NB * t->n && w->rank == 0; k++) {
        const param_spec *s = &t->t[k % t->n].spec;
        size_t n = (size_t)s->rows * s->cols, diff = 0;
        for (size_t e = 0; e < n; e++) diff += memcmp(&got.t[k][e], &ref->t[k][e], sizeof(float)) != 0;
        CHECK(diff == 0, "%s: gathered %s of %s: %zu of %zu elements differ from the saved run", what,
              block_label[k / t->n], s->name, diff, n);
        bad += diff != 0;
    }
    snapshot_free(&got);
    /* (2) every rank, every copy: the reference from rank 0 */
    for (int k = 0; k < NB * t->n; k++) {
        int i = k % t->n, b = k / t->n;
        const param_spec *s = &t->t[i].spec;
        size_t n = (size_t)s->rows * s->cols;
        float *full = malloc(n * sizeof(float)), *dev = device_alloc_floats(n, MEM_BUFFERS);
        if (w->rank == 0) device_copy_to_device(dev, ref->t[k], n * sizeof(float));
        comm_broadcast(w, dev, n, 0);
        device_copy_to_host(full, dev, n * sizeof(float));
        device_free(dev);
        int r0, nr, c0, nc;
        size_t off;
        if (param_stored_slice(t, block_of(t, b), i, &r0, &nr, &c0, &nc, &off)) {
            size_t stored = param_stored_numel(t, block_of(t, b), i), diff = 0;
            float *mine = malloc(stored * sizeof(float) + 1);
            device_copy_to_host(mine, block_of(t, b) + off, stored * sizeof(float));
            for (size_t e = 0; e < stored; e++) {
                float want = e < (size_t)nr * nc ? full[(size_t)(r0 + e / nc) * s->cols + c0 + e % nc] : 0.0f;
                diff += memcmp(&mine[e], &want, sizeof(float)) != 0;
            }
            CHECK(diff == 0, "%s: rank %d stores %zu of %zu elements of %s of %s unlike the saved run", what, w->rank,
                  diff, stored, block_label[b], s->name);
            bad += diff != 0;
            free(mine);
        }
        free(full);
    }
    return (int)comm_host_max(w, bad);
}

/* ---- files (rank 0) ---- */

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }
static void rm_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int count_tmp_names(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) n += strstr(e->d_name, ".tmp") != NULL;
    if (d) closedir(d);
    return n;
}

/* The layout on disk after the two saves, and "each element stored once". */
static void check_directory(const char *dir, const llama_config *c) {
    char p[1024];
    snprintf(p, sizeof p, "%s/step_00000001/index.json", dir);
    CHECK(exists(p), "%s missing after the first save", p);
    snprintf(p, sizeof p, "%s/step_00000002/index.json", dir);
    CHECK(exists(p), "%s missing after the second save", p);
    snprintf(p, sizeof p, "%s/latest", dir);
    const char *latest = read_text(p);
    CHECK(latest && strcmp(latest, "step_00000002\n") == 0, "latest holds '%s', want step_00000002", latest ? latest : "(none)");
    CHECK(count_tmp_names(dir) == 0, "%d temporary names left in %s", count_tmp_names(dir), dir);

    snprintf(p, sizeof p, "%s/step_00000002/index.json", dir);
    const char *text = read_text(p);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK(root != NULL, "%s is not JSON", p);
    if (!root) return;
    const cJSON *tensors = cJSON_GetObjectItem(root, "tensors"), *files = cJSON_GetObjectItem(root, "files");
    const cJSON *step = cJSON_GetObjectItem(root, "step"), *mesh = cJSON_GetObjectItem(root, "mesh");
    CHECK(cJSON_IsNumber(step) && step->valueint == 2, "index step is not 2");
    CHECK(cJSON_GetObjectItem(mesh, "tp") && cJSON_GetObjectItem(mesh, "tp")->valueint ==
          (comm_world()->size > 1 ? comm_world()->size / 2 : 1), "index mesh tp degree");
    int n = llama_num_params(c);
    double model_bytes = 0;
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(c, i);
        model_bytes += 4.0 * s.rows * s.cols;
        CHECK(cJSON_GetObjectItem(tensors, s.name) != NULL, "the index lacks %s", s.name);
    }
    double bytes = 0;
    int nfiles = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        char fp[1024], hex[16];
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(f, "file"));
        const char *crc = cJSON_GetStringValue(cJSON_GetObjectItem(f, "crc32"));
        const cJSON *size = cJSON_GetObjectItem(f, "bytes");
        CHECK(name && crc && cJSON_IsNumber(size), "files[%d] lacks its file, crc32 or bytes", nfiles);
        if (!name || !crc || !cJSON_IsNumber(size)) continue;
        snprintf(fp, sizeof fp, "%s/step_00000002/%s", dir, name);
        st_file sf;
        char err[512];
        if (st_read(fp, &sf, err, sizeof err) != 0) { CHECK(0, "%s", err); continue; }
        snprintf(hex, sizeof hex, "%08x", (unsigned)checkpoint_crc32(sf.blob, sf.blob_size));
        CHECK(strcmp(hex, crc) == 0 && size->valuedouble == (double)sf.blob_size,
              "%s: crc32 %s and %zu bytes, the index says %s and %.0f", name, hex, sf.blob_size, crc, size->valuedouble);
        CHECK(st_meta(&sf, "step") && strcmp(st_meta(&sf, "step"), "2") == 0, "%s: the metadata's step is not 2", name);
        for (int k = 0; k < sf.n_tensors; k++) {
            bytes += (double)sf.tensors[k].nbytes;
            CHECK(st_meta(&sf, sf.tensors[k].name) != NULL, "%s: no place recorded for %s", name, sf.tensors[k].name);
        }
        st_free(&sf);
        nfiles++;
    }
    CHECK(nfiles == comm_world()->size, "%d rank files, want one per rank (%d)", nfiles, comm_world()->size);
    CHECK(bytes == 3 * model_bytes, "the rank files hold %.0f bytes of tensors, want 3 x %.0f (each element once)",
          bytes, model_bytes);
    cJSON_Delete(root);
}

/* The export: the baseline's names and shapes, the reference's parameters. */
static void check_export(const char *path, const llama_config *c, const snapshot *ref) {
    st_file sf;
    char err[512];
    if (st_read(path, &sf, err, sizeof err) != 0) { CHECK(0, "export: %s", err); return; }
    int n = llama_num_params(c);
    CHECK(sf.n_tensors == n, "export holds %d tensors, want %d", sf.n_tensors, n);
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(c, i);
        const st_tensor *x = st_find(&sf, s.name);
        bool shape_ok = x && strcmp(x->dtype, "F32") == 0 &&
                        (s.is_vector ? x->ndim == 1 && x->shape[0] == s.cols
                                     : x->ndim == 2 && x->shape[0] == s.rows && x->shape[1] == s.cols);
        CHECK(shape_ok, "export: %s missing or not F32 of the baseline's shape", s.name);
        if (shape_ok)
            CHECK(memcmp(x->data, ref->t[i], (size_t)s.rows * s.cols * sizeof(float)) == 0,
                  "export: %s differs from the gathered parameters", s.name);
    }
    CHECK(st_meta(&sf, "dim") && atoi(st_meta(&sf, "dim")) == c->dim, "export: no dim metadata");
    st_free(&sf);
}

/* ---- the whole test ---- */

static layout_kind layout_a(void) { return comm_world()->size > 1 ? K_FSDP_TP : K_SINGLE; }

static int run_all(const char *dir) {
    comm_group *w = comm_world();
    bool root = w->rank == 0;
    llama_config c = config();
    char err[1024], path[1024];
    checkpoint_meta meta = {0, SEED, "{\"batch\": 4, \"lr\": 0.001}"}, got;

    /* ---- mesh A: two steps, a save after each ---- */
    setup *a = make(layout_a(), &c, SEED);
    train_step(a, &c, 1);
    snapshot ref1 = gather_all(a->m);
    meta.step = 1;
    CHECK(checkpoint_save(dir, a->m, &meta, err, sizeof err) == 0, "save step 1: %s", err);
    train_step(a, &c, 2);
    snapshot ref2 = gather_all(a->m);
    meta.step = 2;
    CHECK(checkpoint_save(dir, a->m, &meta, err, sizeof err) == 0, "save step 2: %s", err);
    snprintf(path, sizeof path, "%s/export_a.safetensors", dir);
    CHECK(checkpoint_export(path, a->m, err, sizeof err) == 0, "export from %s: %s", kind_name[a->kind], err);
    if (root) {
        /* the test sees something: AdamW's state is not zero, the steps moved the values */
        int n = ref2.n, moved = 0, m_zero = 0;
        for (int i = 0; i < n; i++) {
            size_t e = (size_t)llama_param_spec(&c, i).rows * llama_param_spec(&c, i).cols, nz = 0;
            for (size_t k = 0; k < e; k++) nz += ref2.t[n + i][k] != 0.0f;
            m_zero += nz == 0;
            moved += memcmp(ref1.t[i], ref2.t[i], e * sizeof(float)) != 0;
        }
        CHECK(m_zero == 0 && moved == n, "%d tensors with adam_m all zero, %d of %d moved by step 2", m_zero, moved, n);
        check_directory(dir, &c);
        check_export(path, &c, &ref2);
    }

    /* ---- resharding: every other layout loads step 2 (from another seed: the load must overwrite) ---- */
    layout_kind others_many[] = {K_TP, K_FSDP, K_PP_TP, K_HSDP_ZERO1, K_FSDP_CP, K_SINGLE}, others_one[] = {K_FSDP, K_SINGLE};
    layout_kind *others = w->size > 1 ? others_many : others_one;
    int n_others = w->size > 1 ? (int)(sizeof others_many / sizeof *others_many) : 2;
    for (int k = 0; k < n_others; k++) {
        setup *b = make(others[k], &c, SEED + 1 + k);
        memset(&got, 0, sizeof got);
        int rc = checkpoint_load(dir, b->m, &got, err, sizeof err);
        CHECK(rc == 0, "load into %s: rc %d: %s", kind_name[b->kind], rc, err);
        CHECK(got.step == 2 && got.seed == SEED && strcmp(got.trainer_json, meta.trainer_json) == 0,
              "load into %s: meta step %d seed %llu trainer '%s'", kind_name[b->kind], got.step,
              (unsigned long long)got.seed, got.trainer_json);
        char what[64];
        snprintf(what, sizeof what, "step 2 into %s", kind_name[b->kind]);
        if (rc == 0) compare(b->m, &ref2, what);
        /* saved from the pipeline (each stage writes its own tensors), and from shards that span
         * cp (each cp rank writes its own shard) back into mesh A, whose shards span dp_shard only */
        if (b->kind == K_PP_TP || b->kind == K_FSDP_CP) {
            char dir2[1024], back[96];
            snprintf(dir2, sizeof dir2, "%s/from_%d", dir, (int)b->kind);
            CHECK(checkpoint_save(dir2, b->m, &got, err, sizeof err) == 0, "save from %s: %s", kind_name[b->kind], err);
            setup *s = make(layout_a(), &c, SEED + 99);
            CHECK(checkpoint_load(dir2, s->m, &got, err, sizeof err) == 0, "load of %s's save: %s", kind_name[b->kind],
                  err);
            snprintf(back, sizeof back, "%s's save into mesh A", kind_name[b->kind]);
            compare(s->m, &ref2, back);
            drop(s);
        }
        if (b->kind == K_SINGLE) {   /* the export of a single-device model: the same bytes */
            snprintf(path, sizeof path, "%s/export_single.safetensors", dir);
            CHECK(checkpoint_export(path, b->m, err, sizeof err) == 0, "export from one device: %s", err);
            if (root) {
                char pa[1024];
                snprintf(pa, sizeof pa, "%s/export_a.safetensors", dir);
                st_file fa, fb;
                bool same = st_read(pa, &fa, err, sizeof err) == 0 && st_read(path, &fb, err, sizeof err) == 0 &&
                            fa.blob_size == fb.blob_size && memcmp(fa.blob, fb.blob, fa.blob_size) == 0;
                CHECK(same, "the exports of mesh A and of the single-device model differ");
                st_free(&fa);
                st_free(&fb);
            }
        }
        drop(b);
    }

    /* ---- DIR naming a step: step 1; resumed on mesh A, step 2 ends where the run did ---- */
    {
        setup *r = make(layout_a(), &c, SEED + 50);
        char step1[1024];
        snprintf(step1, sizeof step1, "%s/step_00000001/", dir);
        int rc = checkpoint_load(step1, r->m, &got, err, sizeof err);
        CHECK(rc == 0 && got.step == 1, "load of %s: rc %d step %d: %s", step1, rc, got.step, err);
        if (rc == 0) compare(r->m, &ref1, "step 1 by its directory");
        train_step(r, &c, got.step + 1);
        if (rc == 0) compare(r->m, &ref2, "resumed at step 1, trained step 2");
        drop(r);
    }

    /* ---- refusals, the same on every rank ---- */
    {
        setup *s = make(K_SINGLE, &c, SEED);
        snprintf(path, sizeof path, "%s/nothing_here", dir);
        CHECK(checkpoint_load(path, s->m, &got, err, sizeof err) == 1, "a missing directory: want 1 (no checkpoint)");
        if (root) mkdir(path, 0755);
        comm_host_max(w, 0);   /* (a barrier: the directory exists for every rank) */
        CHECK(checkpoint_load(path, s->m, &got, err, sizeof err) == 1, "an empty directory: want 1 (no checkpoint)");
        CHECK(!checkpoint_exists(path), "checkpoint_exists: true for an empty directory");
        CHECK(checkpoint_exists(dir), "checkpoint_exists: false for the saved directory");
        drop(s);

        llama_config other = c;
        other.ffn_dim = 48;
        setup *o = make(K_SINGLE, &other, SEED);
        err[0] = 0;
        int rc = checkpoint_load(dir, o->m, &got, err, sizeof err);
        CHECK(rc == -1, "a model with ffn_dim 48: rc %d, want -1", rc);
        if (root) CHECK(strstr(err, "ffn_dim 52") && strstr(err, "ffn_dim 48"), "the mismatch line: '%s'", err);
        drop(o);

        setup *t = make(layout_a(), &c, SEED);
        snprintf(path, sizeof path, "%s/bad_latest", dir);
        if (root) {
            mkdir(path, 0755);
            char lp[1100];
            snprintf(lp, sizeof lp, "%s/latest", path);
            FILE *f = fopen(lp, "w");
            if (f) { fputs("step_00000007\n", f); fclose(f); }
        }
        comm_host_max(w, 0);
        rc = checkpoint_load(path, t->m, &got, err, sizeof err);
        CHECK(rc == -1, "latest naming a missing step: rc %d, want -1", rc);
        if (root) CHECK(strstr(err, "step_00000007") != NULL, "the missing step's line: '%s'", err);

        /* a truncated rank file of step 1 */
        if (root) {
            snprintf(path, sizeof path, "%s/step_00000001/rank_%05d.safetensors", dir, w->size - 1);
            CHECK(truncate(path, 100) == 0, "cannot truncate %s", path);
        }
        comm_host_max(w, 0);
        snprintf(path, sizeof path, "%s/step_00000001", dir);
        rc = checkpoint_load(path, t->m, &got, err, sizeof err);
        CHECK(rc == -1, "a truncated rank file: rc %d, want -1", rc);
        if (root) CHECK(strstr(err, "rank_") != NULL, "the truncated file's line names it: '%s'", err);

        /* a state holding NaN is never saved: -2 on every rank, nothing on disk touched */
        {
            param_table *pt = t->m->params;
            int r0, nr, c0, nc;
            size_t off;
            if (param_held_slice(pt, pt->params, 0, &r0, &nr, &c0, &nc, &off) && (size_t)nr * nc > 0) {
                float nan = NAN;
                device_copy_to_device(pt->params + off, &nan, sizeof nan);
            }
            checkpoint_meta bad_meta = {3, SEED, "{}"};
            err[0] = 0;
            rc = checkpoint_save(dir, t->m, &bad_meta, err, sizeof err);
            CHECK(rc == -2, "a save of a state holding NaN: rc %d, want -2", rc);
            if (root) CHECK(strstr(err, pt->t[0].spec.name) && strstr(err, "nan"), "the NaN save's line: '%s'", err);
            snprintf(path, sizeof path, "%s/step_00000003", dir);
            CHECK(!exists(path), "a save of a state holding NaN left %s", path);
            snprintf(path, sizeof path, "%s/latest", dir);
            const char *latest = read_text(path);
            CHECK(latest && strcmp(latest, "step_00000002\n") == 0, "after the NaN save, latest holds '%s'",
                  latest ? latest : "(none)");
        }
        drop(t);
    }

    snapshot_free(&ref1);
    snapshot_free(&ref2);
    drop(a);
    return 0;
}

/* --save DIR STEPS / --verify DIR STEP, for tests/t_checkpoint_crash.sh */
static int run_mode(const char *mode, const char *dir, int steps) {
    llama_config c = config();
    char err[1024];
    setup *a = make(layout_a(), &c, SEED);
    for (int s = 1; s <= steps; s++) train_step(a, &c, s);
    if (strcmp(mode, "--save") == 0) {
        checkpoint_meta meta = {steps, SEED, "{}"};
        int rc = checkpoint_save(dir, a->m, &meta, err, sizeof err);
        CHECK(rc == 0, "save: %s", err);
    } else {
        snapshot ref = gather_all(a->m);
        setup *b = make(comm_world()->size > 1 ? K_TP : K_FSDP, &c, SEED + 7);
        checkpoint_meta got = {0};
        int rc = checkpoint_load(dir, b->m, &got, err, sizeof err);
        CHECK(rc == 0 && got.step == steps, "load of %s: rc %d, step %d, want step %d: %s", dir, rc, got.step, steps, err);
        if (rc == 0) compare(b->m, &ref, "the loaded checkpoint");
        snapshot_free(&ref);
        drop(b);
    }
    drop(a);
    return 0;
}

/* --export DIR PATH, for the PyTorch check of tests/t_checkpoint_crash.sh: DIR loaded on another
 * mesh, the loss of the next step's batch (forward only) printed by rank 0 as "loss %.9g", the
 * model exported to PATH and that batch to PATH.batch ("tokens", "targets", I32 [B, T]). */
static int export_mode(const char *dir, const char *path) {
    llama_config c = config();
    char err[1024];
    setup *b = make(comm_world()->size > 1 ? K_TP : K_FSDP, &c, SEED + 7);
    checkpoint_meta got = {0};
    int rc = checkpoint_load(dir, b->m, &got, err, sizeof err);
    CHECK(rc == 0, "load of %s: rc %d: %s", dir, rc, err);
    int N = BATCH * c.seq_len, tokens[BATCH * 64], targets[BATCH * 64];
    synthetic_batch(tokens, targets, BATCH, c.seq_len, c.vocab_size, DATA_SEED, got.step + 1);
    int *dt = device_alloc_ints(N, MEM_BUFFERS), *dg = device_alloc_ints(N, MEM_BUFFERS);
    device_copy_to_device(dt, tokens, N * sizeof(int));
    device_copy_to_device(dg, targets, N * sizeof(int));
    float loss = llama_forward(b->m, dt, dg, 1.0f / (float)count_valid_targets(targets, N));
    device_free(dt);
    device_free(dg);
    CHECK(checkpoint_export(path, b->m, err, sizeof err) == 0, "export: %s", err);
    if (comm_world()->rank == 0) {
        char bp[1024];
        snprintf(bp, sizeof bp, "%s.batch", path);
        int64_t shape[2] = {BATCH, c.seq_len};
        st_writer *wr = st_writer_new();
        st_writer_add(wr, "tokens", "I32", shape, 2, tokens);
        st_writer_add(wr, "targets", "I32", shape, 2, targets);
        CHECK(st_writer_save(wr, bp, err, sizeof err) == 0, "%s", err);
        printf("loss %.9g\n", (double)loss);
    }
    drop(b);
    return 0;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    comm_group *w = comm_world();
    if (argc == 4 && (strcmp(argv[1], "--save") == 0 || strcmp(argv[1], "--verify") == 0)) {
        run_mode(argv[1], argv[2], atoi(argv[3]));
    } else if (argc == 4 && strcmp(argv[1], "--export") == 0) {
        export_mode(argv[2], argv[3]);
    } else {
        /* a scratch directory named after rank 0's pid, removed at the end */
        long pid = (long)comm_host_max(w, w->rank == 0 ? (double)getpid() : 0);
        const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        char dir[512];
        snprintf(dir, sizeof dir, "%s/test_checkpoint.%ld", base, pid);
        run_all(dir);
        comm_host_max(w, 0);
        if (w->rank == 0) rm_tree(dir);
    }
    int bad = tu_finish("test_checkpoint");
    bad = (int)comm_host_max(w, bad);   /* every rank exits alike */
    comm_finalize();
    return bad;
}
