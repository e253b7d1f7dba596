/* dump.c: --dump DIR, the files an outside check reads (DESIGN.md, "Exports for outside checks").
 *
 * Everything is plain safetensors or plain text, so a reader needs nothing from this repository:
 *   DIR/init.safetensors, DIR/grads_1.safetensors   every parameter (or its gradient), F32, with
 *                                                   the model and optimizer settings as metadata
 *   DIR/batch_K.safetensors                         the step's "tokens" and "targets", I32 [B, T]
 *   DIR/losses.txt                                  "step loss" per line, %.9g
 * %.9g prints any float exactly (9 significant digits identify an fp32 value), so a reader
 * recovers the bits the run used.
 *
 * The caller (rank 0) passes full host tensors; these functions only format and write them.
 * Every failure prints one line to stderr and returns -1.
 */
#include "dump.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "safetensors.h"

/* Tokens are written as I32 straight from int buffers. */
_Static_assert(sizeof(int) == 4, "dump_batch writes int buffers as I32");

/* Creates dir (mkdir -p) and writes dir/file into path. Returns 0, or -1 after printing why. */
static int dump_path(char *path, size_t len, const char *dir, const char *file) {
    errno = 0;
    if (make_dirs(dir) != 0) {
        fprintf(stderr, "dump: cannot create directory %s: %s\n", dir,
                errno ? strerror(errno) : "unknown error");
        return -1;
    }
    int n = snprintf(path, len, "%s/%s", dir, file);
    if (n < 0 || (size_t)n >= len) {
        fprintf(stderr, "dump: path %s/%s is too long\n", dir, file);
        return -1;
    }
    return 0;
}

/* Saves the writer to path, printing the writer's one-line error on failure. */
static int dump_save(st_writer *w, const char *path) {
    char err[512];
    if (st_writer_save(w, path, err, sizeof err) != 0) {
        fprintf(stderr, "dump: %s\n", err);
        return -1;
    }
    return 0;
}

/* Adds one metadata entry whose value is an int or a float (printed with %.9g, exact for fp32). */
static void meta_int(st_writer *w, const char *key, int v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%d", v);
    st_writer_meta(w, key, buf);
}
static void meta_float(st_writer *w, const char *key, float v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", (double)v);
    st_writer_meta(w, key, buf);
}

/* Reads: the parameter table of c, params[i] (full host tensor i, rows*cols floats), c and o.
 * Writes: dir/file with every tensor under its torchtitan name (vectors as [cols], matrices as
 * [rows, cols]) and the settings a reader needs to rebuild the model as __metadata__ strings. */
int dump_params(const char *dir, const char *file, const llama_config *c, const adamw_config *o,
                float *const *params) {
    char path[1024];
    if (dump_path(path, sizeof path, dir, file) != 0) return -1;

    st_writer *w = st_writer_new();
    meta_int(w, "dim", c->dim);
    meta_int(w, "n_layers", c->n_layers);
    meta_int(w, "n_heads", c->n_heads);
    meta_int(w, "n_kv_heads", c->n_kv_heads);
    meta_int(w, "ffn_dim", c->ffn_dim);
    meta_int(w, "vocab_size", c->vocab_size);
    meta_int(w, "seq_len", c->seq_len);
    meta_float(w, "norm_eps", c->norm_eps);
    meta_float(w, "rope_theta", c->rope_theta);
    meta_float(w, "lr", o->lr);
    meta_float(w, "beta1", o->beta1);
    meta_float(w, "beta2", o->beta2);
    meta_float(w, "eps", o->eps);
    meta_float(w, "weight_decay", o->weight_decay);

    int n = llama_num_params(c);
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(c, i);
        /* The table keeps vectors as [1, D] so that every tensor has rows and cols; PyTorch's
         * norm weights are 1-D, so the file says [D]. */
        int64_t shape[2] = {s.rows, s.cols};
        if (s.is_vector) st_writer_add(w, s.name, "F32", &shape[1], 1, params[i]);
        else st_writer_add(w, s.name, "F32", shape, 2, params[i]);
    }
    return dump_save(w, path);
}

/* Reads: tokens and targets, B*T ints each (row b holds sequence b).
 * Writes: dir/batch_<step>.safetensors with "tokens" and "targets", I32 [B, T]. */
int dump_batch(const char *dir, int step, const int *tokens, const int *targets, int B, int T) {
    char file[64], path[1024];
    snprintf(file, sizeof file, "batch_%d.safetensors", step);
    if (dump_path(path, sizeof path, dir, file) != 0) return -1;

    int64_t shape[2] = {B, T};
    st_writer *w = st_writer_new();
    st_writer_add(w, "tokens", "I32", shape, 2, tokens);
    st_writer_add(w, "targets", "I32", shape, 2, targets);
    return dump_save(w, path);
}

/* Reads: step, loss. Writes: the line "step loss" to dir/losses.txt; step 1 starts the file
 * afresh so a second run into the same DIR does not append to the first. */
int dump_loss(const char *dir, int step, double loss) {
    char path[1024];
    if (dump_path(path, sizeof path, dir, "losses.txt") != 0) return -1;
    FILE *f = fopen(path, step == 1 ? "w" : "a");
    if (!f) {
        fprintf(stderr, "dump: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    int ok = fprintf(f, "%d %.9g\n", step, loss) > 0;
    if (fclose(f) != 0) ok = 0;
    if (!ok) {
        fprintf(stderr, "dump: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}
