/* dump.c: --dump DIR, the files an outside check reads (docs/dump-format.md).
 *
 * Everything is plain safetensors or plain text, so a reader needs nothing from this repository:
 *   DIR/init.safetensors, DIR/grads_1.safetensors   every parameter (or its gradient), F32, with
 *                                                   the model and optimizer settings as metadata
 *   DIR/batch_K.safetensors                         the step's "tokens" and "targets", I32 [B, T]
 *   DIR/losses.txt                                  "step loss" per line, %.9g
 * and the chapter's own settings, when it gives some, as the JSON string "run_options" among the
 * metadata (dump_set_run_options).
 * %.9g prints any float exactly (9 significant digits identify an fp32 value), so a reader
 * recovers the bits the run used.
 *
 * The caller (rank 0) passes full host tensors; these functions only format and write them.
 * Every failure returns -1 and leaves its one-line reason for dump_error().
 *
 * A dump started with dump_begin(DIR) is written into DIR.tmp.<pid>.<random> and renamed into place by
 * dump_commit() (see dump.h), so DIR never holds half a dump.
 */
#include "dump.h"
#include <math.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"
#include "guard.h"
#include "safetensors.h"

/* Tokens are written as I32 straight from int buffers. */
_Static_assert(sizeof(int) == 4, "dump_batch writes int buffers as I32");

static char *last_error;      /* dump_error() */
static char *final_dir;       /* dump_begin's DIR (trailing '/' removed), NULL when none */
static char *tmp_dir;         /* where the writes go meanwhile: DIR.tmp.<pid>.<random>           */
static char *run_options;     /* dump_set_run_options: the "run_options" metadata, or NULL */
static int attention_blocks;  /* dump_set_attention_blocks: 0, or cp's blocks under bf16      */

const char *dump_error(void) { return last_error ? last_error : ""; }

/* Records the reason of a failure; returns -1. */
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    free(last_error);
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&last_error, fmt, ap) < 0) last_error = NULL;
    va_end(ap);
    return -1;
}

/* The files a dump writes: init.safetensors, grads_1.safetensors, batch_<K>.safetensors,
 * losses.txt (and the writer's "<name>.tmp" while it writes one). */
static int is_dump_file(const char *name) {
    if (strcmp(name, ".lock") == 0) return 1;   /* the run that writes the dump holds it (outputs.h) */
    size_t n = name_without_temp(name);
    if ((n == 16 && strncmp(name, "init.safetensors", n) == 0) ||
        (n == 19 && strncmp(name, "grads_1.safetensors", n) == 0) ||
        (n == 10 && strncmp(name, "losses.txt", n) == 0))
        return 1;
    if (n <= 18 || strncmp(name, "batch_", 6) != 0 || strncmp(name + n - 12, ".safetensors", 12) != 0)
        return 0;
    for (size_t i = 6; i < n - 12; i++)
        if (name[i] < '0' || name[i] > '9') return 0;
    return 1;
}

static bool is_dump_file_bool(const char *name) { return is_dump_file(name) != 0; }

/* A directory that holds nothing but dump files? 1 yes, 0 no (*other = a name that is not,
 * to free), -1 it cannot be read. */
static int holds_only_dump_files(const char *dir, char **other) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int only = 1;
    struct dirent *e;
    while (only && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (!is_dump_file(e->d_name)) { only = 0; if (other) *other = strdup(e->d_name); }
    }
    closedir(d);
    return only;
}

/* Removes a directory holding dump files only: never anything else (a directory with other
 * files stays, and -1 is returned with errno ENOTEMPTY from rmdir), never through a link
 * (files.h: remove_owned_dir). */
static int remove_dump_dir(const char *dir) {
    return remove_owned_dir(dir, is_dump_file_bool);
}

/* A stop signal while the dump is written (guard_on_stop): the unfinished DIR.tmp.<pid>.<random>
 * removed, so an interrupted run leaves DIR as it was and nothing half-made beside it. The handler
 * reads only these two, set before it can need them. */
static volatile sig_atomic_t stop_fd = -1;   /* the unfinished directory, open; -1: none */
static char stop_path[4096];
static void remove_unfinished_on_stop(void) {
    int fd = stop_fd;
    stop_fd = -1;
    if (fd >= 0) remove_own_dir_in_handler(fd, stop_path);
}

static void end_dump(void) {
    int fd = stop_fd;
    stop_fd = -1;   /* (first: a stop from here on leaves what end_dump's caller decided) */
    if (fd >= 0) close(fd);
    free(final_dir);
    free(tmp_dir);
    final_dir = tmp_dir = NULL;
}

int dump_begin(const char *dir) {
    dump_abort();
    size_t n = dir ? strlen(dir) : 0;
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n == 0) return fail("the dump directory is empty: expected a directory path");
    if (n == 1 && dir[0] == '/') return fail("/ cannot be a dump directory: it would be replaced");
    char *d = strndup(dir, n);
    if (!d) return fail("out of memory");

    struct stat st;
    if (stat(d, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) { fail("%s exists and is not a directory", d); free(d); return -1; }
        char *other = NULL;
        int only = holds_only_dump_files(d, &other);
        if (only <= 0) {
            if (only < 0) fail("cannot read the directory %s: %s", d, strerror(errno));
            else fail("%s holds files a dump does not write (%s); a dump replaces its directory: "
                      "use a new or empty one", d, other ? other : "?");
            free(other);
            free(d);
            return -1;
        }
    } else {
        /* the parent must exist for the sibling DIR.tmp.<pid>.<random> */
        char *parent = strdup(d), *slash = parent ? strrchr(parent, '/') : NULL;
        int rc = 0;
        if (slash && slash != parent) { *slash = 0; rc = make_dirs(parent); }
        if (rc != 0) fail("cannot create the directory %s: %s", parent, strerror(errno));
        free(parent);
        if (rc != 0) { free(d); return -1; }
    }

    if (path_is_link(d)) {   /* the commit replaces DIR: a link would be replaced, not its target */
        fail("%s is a symbolic link: a dump replaces its directory whole when it ends, which would replace "
             "the link; give the directory itself", d);
        free(d);
        return -1;
    }
    char *t = temp_name(d);   /* (this run's own name: mkdir never takes another run's) */
    if (!t) { free(d); return fail("out of memory"); }
    if (mkdir(t, 0755) != 0) {
        fail("cannot create the directory %s: %s", t, strerror(errno));
        free(t);
        free(d);
        return -1;
    }
    final_dir = d;
    tmp_dir = t;
    static bool hooked;
    if (!hooked) { guard_on_stop(remove_unfinished_on_stop); hooked = true; }
    if (strlen(t) < sizeof stop_path) {
        memcpy(stop_path, t, strlen(t) + 1);
        stop_fd = open(t, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    return 0;
}

int dump_commit(void) {
    if (!final_dir) return fail("dump_commit without dump_begin");
    int unfinished_fd = stop_fd;
    stop_fd = -1;   /* from here a stop leaves the directories as they are: the rename may be done */
    if (unfinished_fd >= 0) close(unfinished_fd);
    struct stat st;
    int rc;
    if (path_is_link(final_dir)) {
        fail("%s became a symbolic link while the run wrote the dump: not replaced; the dump is left in %s",
             final_dir, tmp_dir);
        end_dump();   /* (the finished dump kept under its temporary name, as the line says) */
        return -1;
    }
    if (lstat(final_dir, &st) != 0) {
        rc = rename(tmp_dir, final_dir);   /* nothing there: a plain rename */
    } else {
        /* Swap the two directories in one step, then remove the old dump (now under the
         * temporary name). Filesystems without RENAME_EXCHANGE: move the old one aside first. */
        rc = renameat2(AT_FDCWD, tmp_dir, AT_FDCWD, final_dir, RENAME_EXCHANGE);
        if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
            char *old = NULL;
            if (asprintf(&old, "%s.old.%ld", final_dir, (long)getpid()) < 0) old = NULL;
            rc = old ? rename(final_dir, old) : -1;
            if (rc == 0 && (rc = rename(tmp_dir, final_dir)) != 0) {
                int e = errno;
                rename(old, final_dir);   /* put the old dump back */
                errno = e;
            }
            if (rc == 0) remove_dump_dir(old);
            free(old);
        } else if (rc == 0) {
            remove_dump_dir(tmp_dir);   /* the old dump, under the temporary name now */
        }
    }
    if (rc != 0) {
        fail("cannot move the finished dump %s to %s: %s", tmp_dir, final_dir, strerror(errno));
        dump_abort();
        return -1;
    }
    end_dump();
    return 0;
}

void dump_abort(void) {
    if (tmp_dir) remove_dump_dir(tmp_dir);
    end_dump();
}

/* Where a write to dir/file goes: inside the temporary directory when dir is the one being
 * dumped, else dir itself (created, mkdir -p). Returns a path to free, or NULL after fail(). */
static char *dump_path(const char *dir, const char *file) {
    const char *where = dir;
    if (final_dir) {
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') n--;
        if (n == strlen(final_dir) && strncmp(dir, final_dir, n) == 0) where = tmp_dir;
    }
    if (where == dir) {
        errno = 0;
        if (make_dirs(dir) != 0) {
            fail("cannot create the directory %s: %s", dir, errno ? strerror(errno) : "unknown error");
            return NULL;
        }
    }
    char *path = NULL;
    if (asprintf(&path, "%s/%s", where, file) < 0) { fail("out of memory"); return NULL; }
    return path;
}

/* Saves the writer to path; the writer's error becomes dump_error() on failure. */
static int dump_save(st_writer *w, const char *path) {
    size_t len = 2 * strlen(path) + 512;   /* the message names the path, maybe twice */
    char *err = malloc(len);
    int rc = st_writer_save(w, path, err, err ? len : 0);
    if (rc != 0) fail("%s", err ? err : "out of memory");
    free(err);
    return rc == 0 ? 0 : -1;
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

void dump_set_attention_blocks(int n) { attention_blocks = n; }

int dump_set_run_options(const char *json) {
    if (json && run_options)   /* one object: a chapter with two settings to record merges them */
        return fail("run_options set twice ('%.40s', then '%.40s'): one JSON object holds a run's settings",
                    run_options, json);
    free(run_options);
    run_options = NULL;
    if (!json) return 0;
    size_t n = strlen(json);
    if (n < 2 || json[0] != '{' || json[n - 1] != '}')
        return fail("run_options must be a JSON object {...}, got '%.40s'", json);
    if (n > 255) return fail("run_options is %zu bytes: a metadata value holds at most 255", n);
    run_options = strdup(json);
    return run_options ? 0 : fail("out of memory");
}

/* Reads: the parameter table of c, params[i] (full host tensor i, rows*cols floats), c and o.
 * Writes: dir/file with every tensor under its torchtitan name (vectors as [cols], matrices as
 * [rows, cols]) and the settings a reader needs to rebuild the model as __metadata__ strings. */
int dump_params(const char *dir, const char *file, const llama_config *c, const adamw_config *o,
                float *const *params) {
    char *path = dump_path(dir, file);
    if (!path) return -1;

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
    if (o->clip_grad_norm > 0) meta_float(w, "clip_grad_norm", o->clip_grad_norm);   /* grads_1 is before clipping */
    /* mixed precision (absent: fp32): the linears' and attention's GEMM operands rounded to bf16 */
    if (c->precision == DTYPE_BF16) st_writer_meta(w, "dtype", dtype_name(c->precision));
    /* ... and attention's blocks under context parallelism (absent: the whole sequence) */
    if (c->precision == DTYPE_BF16 && attention_blocks > 0) meta_int(w, "attention_blocks", attention_blocks);
    /* a mixture of experts (chapter 09; absent: dense): its sizes, routing and balancing loss are
     * docs/dump-format.md's */
    if (c->moe.experts > 0) {
        meta_int(w, "experts", c->moe.experts);
        meta_int(w, "top_k", c->moe.top_k);
        meta_int(w, "expert_dim", c->moe.expert_dim);
        meta_int(w, "shared_expert", c->moe.shared_expert);
        meta_float(w, "aux_alpha", c->moe.aux_alpha);
        if (c->moe.capacity_factor > 0) meta_float(w, "capacity_factor", c->moe.capacity_factor);
        if (c->layer_every > 1) meta_int(w, "moe_every", c->layer_every);   /* absent: every layer */
        if (c->moe.router == MOE_SIGMOID) st_writer_meta(w, "router", "sigmoid");   /* absent: softmax */
    }
    if (run_options) st_writer_meta(w, "run_options", run_options);   /* the chapter's, for the replay */

    int n = llama_num_params(c);
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(c, i);
        /* The table keeps vectors as [1, D] so that every tensor has rows and cols; PyTorch's
         * norm weights are 1-D, so the file says [D]. */
        int64_t shape[2] = {s.rows, s.cols};
        if (s.is_vector) st_writer_add(w, s.name, "F32", &shape[1], 1, params[i]);
        else st_writer_add(w, s.name, "F32", shape, 2, params[i]);
    }
    int rc = dump_save(w, path);
    free(path);
    return rc;
}

/* Reads: tokens and targets, B*T ints each (row b holds sequence b).
 * Writes: dir/batch_<step>.safetensors with "tokens" and "targets", I32 [B, T]. */
int dump_batch(const char *dir, int step, const int *tokens, const int *targets, int B, int T) {
    char file[64];
    snprintf(file, sizeof file, "batch_%d.safetensors", step);
    char *path = dump_path(dir, file);
    if (!path) return -1;

    int64_t shape[2] = {B, T};
    st_writer *w = st_writer_new();
    st_writer_add(w, "tokens", "I32", shape, 2, tokens);
    st_writer_add(w, "targets", "I32", shape, 2, targets);
    int rc = dump_save(w, path);
    free(path);
    return rc;
}

/* Reads: step, loss, the step's learning rate (NAN: not scheduled). Writes: the line "step loss"
 * (or "step loss lr") to dir/losses.txt; step 1 starts the file afresh so a second run into the
 * same DIR does not append to the first. */
int dump_loss(const char *dir, int step, double loss, double lr) {
    char *path = dump_path(dir, "losses.txt");
    if (!path) return -1;
    FILE *f = fopen(path, step == 1 ? "w" : "a");
    int rc = 0;
    if (!f) {
        rc = fail("cannot open %s: %s", path, strerror(errno));
    } else {
        int ok = (isnan(lr) ? fprintf(f, "%d %.9g\n", step, loss) : fprintf(f, "%d %.9g %.9g\n", step, loss, lr)) > 0;
        int e = errno;
        if (fclose(f) != 0 && ok) { ok = 0; e = errno; }
        if (!ok) rc = fail("cannot write %s: %s", path, strerror(e));
    }
    free(path);
    return rc;
}
