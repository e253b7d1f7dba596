/* checkpoint.c: see checkpoint.h; the layout and the index are described in README.md ("Checkpoints").
 *
 * Save, on every rank:  the pieces this rank holds (param_held_slice) -> rank_<r>.safetensors
 *                       in DIR/step_N.tmp.<pid>.<random>; rank 0 gathers every rank's list of pieces and
 *                       writes index.json; once all have finished, rank 0 renames the directory
 *                       to DIR/step_N and replaces DIR/latest.
 * Load, on every rank:  the index -> for each block and tensor, the rectangle of the global tensor
 *                       this rank stores (param_stored_slice), filled from the pieces that overlap
 *                       it, file by file -> param_scatter into the rank's own layout.
 *
 * Integrity (version 2 of the index): the index holds each rank file's size and zlib crc32; each
 * rank file's metadata holds the step, the crc32 of the trainer's settings and where each of its
 * pieces lies in its tensor. A reader checks every file it reads (size, crc32, step, settings,
 * every piece's place, finite values) and the index itself (its step against the directory's
 * name, every piece of every tensor exactly once), so a corrupt, swapped or edited checkpoint is
 * refused with one line instead of loading wrong values.
 *
 * Only the host touches the files, and the device only through device.h's copies (of each held
 * slice here, and inside param_scatter), so the same code serves both backends.
 */
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "comm.h"
#include "device.h"
#include "files.h"
#include "mesh.h"
#include "params.h"
#include "safetensors.h"

#define CKPT_FORMAT "llama-tutorial-checkpoint"
#define CKPT_VERSION 2   /* 1: before the checksums (refused: checkpoint_load's line says so) */
#define CKPT_NBLOCKS 3
/* The blocks a checkpoint holds, as they are named in the files and the index. */
static const char *const block_name[CKPT_NBLOCKS] = {"value", "adam_m", "adam_v"};
static float *block_of(const param_table *t, int b) { return b == 0 ? t->params : b == 1 ? t->adam_m : t->adam_v; }

uint32_t checkpoint_crc32(const void *data, size_t n) {
    const unsigned char *p = data;
    uLong crc = crc32(0L, Z_NULL, 0);
    while (n > 0) {   /* (zlib takes a uInt length: 1 GiB at a time) */
        uInt part = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = crc32(crc, p, part);
        p += part;
        n -= part;
    }
    return (uint32_t)crc;
}

/* The first of the n floats at data (any alignment: a file's bytes) that is not finite, or n;
 * its value in *v. */
static size_t first_nonfinite(const void *data, size_t n, float *v) {
    const unsigned char *p = data;
    for (size_t k = 0; k < n; k++) {
        memcpy(v, p + k * sizeof(float), sizeof(float));
        if (!isfinite(*v)) return k;
    }
    return n;
}

/* ---------------------------------------------------------------- errors */

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Every rank's verdict, agreed: rc 0 (ok) or -1 (failed, with its reason in err). Returns -1 on
 * every rank when any rank failed; rank 0's err then holds the reason of the lowest failing rank
 * (sent over the host helpers, only on this error path). Collective over the world. */
static int agree(int rc, char *err, size_t errlen) {
    comm_group *w = comm_world();
    int first = (int)-comm_host_max(w, rc != 0 ? -(double)w->rank : -(double)w->size);
    if (first >= w->size) return 0;
    enum { MSG = 512 };
    float mine[MSG] = {0};
    if (w->rank == first && err)
        for (size_t k = 0; k < MSG - 1 && k + 1 < errlen && err[k]; k++) mine[k] = (float)(unsigned char)err[k];
    float *all = w->rank == 0 ? malloc(sizeof(float) * MSG * w->size) : NULL;
    comm_host_gather(w, mine, all, MSG, 0);
    if (w->rank == 0 && first != 0) {
        char msg[MSG];
        for (int k = 0; k < MSG; k++) msg[k] = (char)all[(size_t)first * MSG + k];
        msg[MSG - 1] = 0;
        fail(err, errlen, "(rank %d) %s", first, msg);
    } else if (w->rank != first) {
        fail(err, errlen, "rank %d failed (rank 0 says why)", first);
    }
    free(all);
    return -1;
}

/* ---------------------------------------------------------------- files */

static char *join(const char *a, const char *b) {
    char *p = NULL;
    return asprintf(&p, "%s/%s", a, b) < 0 ? NULL : p;
}

/* The path without trailing slashes (a copy; "/" stays "/"). */
static char *trimmed_dir(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    return strndup(dir, n);
}

/* fsync of a file or a directory: the data, or the names in it, on disk before the next rename
 * publishes them. 0 or -1 (errno). */
static int sync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* Writes text to a new temporary beside path (files.h: temp_name, never an existing file or a
 * link), syncs it, renames it to path. 0, or -1 with err. */
static int write_text_atomic(const char *path, const char *text, char *err, size_t errlen) {
    char *tmp = temp_name(path);
    if (!tmp) return fail(err, errlen, "out of memory");
    if (path_is_link(path)) {
        free(tmp);
        return fail(err, errlen, "%s is a symbolic link: a checkpoint's file is never replaced through a link", path);
    }
    FILE *f = create_new_file(tmp, "w");
    int rc = 0;
    if (!f) rc = fail(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    else {
        bool ok = fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
        int e = errno;
        if (fclose(f) != 0 && ok) { ok = false; e = errno; }
        if (!ok) rc = fail(err, errlen, "cannot write %s: %s", tmp, strerror(e));
        else if (rename(tmp, path) != 0) rc = fail(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        if (rc) unlink(tmp);
    }
    free(tmp);
    return rc;
}

/* The names a checkpoint directory holds: index.json, rank_<r>.safetensors (and the writers'
 * "<name>.tmp" while they write). */
static bool is_checkpoint_file(const char *name) {
    size_t n = name_without_temp(name);
    if (n == 10 && strncmp(name, "index.json", 10) == 0) return true;
    if (n <= 17 || strncmp(name, "rank_", 5) != 0 || strncmp(name + n - 12, ".safetensors", 12) != 0) return false;
    for (size_t k = 5; k < n - 12; k++)
        if (name[k] < '0' || name[k] > '9') return false;
    return true;
}

/* Removes a checkpoint directory: its checkpoint files, then the directory (which stays, with
 * anything else in it, when something else is there). Never through a link (files.h): a link in
 * its place is left alone. */
static void remove_checkpoint_dir(const char *path) { remove_owned_dir(path, is_checkpoint_file); }

static bool is_latest_temp(const char *name) { return strncmp(name, "latest.tmp", 10) == 0; }

/* The leftovers of saves that never finished (a crash before their rename): DIR/step_*.tmp.*
 * directories and DIR/latest.tmp* files. One run writes into a DIR at a time. A link among them
 * is never followed (checkpoint_dir_problem refused the run before its first step if there was
 * one): remove_checkpoint_dir leaves a link alone, and unlinkat on a link removes the link. */
static void remove_leftovers(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *p = NULL;
        if (strncmp(e->d_name, "step_", 5) == 0 && strstr(e->d_name, ".tmp.")) {
            if ((p = join(dir, e->d_name)) && !path_is_link(p)) remove_checkpoint_dir(p);
        } else if (is_latest_temp(e->d_name)) {
            if ((p = join(dir, e->d_name)) && !path_is_link(p)) unlink(p);
        }
        free(p);
    }
    closedir(d);
}

/* "step_" followed by 8 or more digits, the number in *step. */
static bool parse_step_name(const char *s, int *step) {
    if (strncmp(s, "step_", 5) != 0) return false;
    size_t n = strlen(s + 5);
    if (n < 8 || n > 9) return false;
    long v = 0;
    for (size_t k = 0; k < n; k++) {
        if (s[5 + k] < '0' || s[5 + k] > '9') return false;
        v = 10 * v + (s[5 + k] - '0');
    }
    *step = (int)v;
    return true;
}

/* ---------------------------------------------------------------- the index */

/* A piece: rows [r0, r0+nr) x columns [c0, c0+nc) of a tensor's block, in file `file`
 * (the table's coordinates: a vector is row 0 of [1, D]). */
typedef struct { int i, b, r0, nr, c0, nc, file; } piece;
enum { PIECE_FIELDS = 6 };   /* i, b, r0, nr, c0, nc: as floats in the gather */
/* Each rank's file as floats in the gather, before its pieces: its crc32 in two 16-bit halves,
 * its size in three (0: the rank wrote no file). */
enum { FILE_FIELDS = 5 };
static void file_fields_put(float *f, uint32_t crc, uint64_t bytes) {
    f[0] = (float)(crc >> 16); f[1] = (float)(crc & 0xffff);
    f[2] = (float)((bytes >> 32) & 0xffff); f[3] = (float)((bytes >> 16) & 0xffff); f[4] = (float)(bytes & 0xffff);
}
static void file_fields_get(const float *f, uint32_t *crc, uint64_t *bytes) {
    *crc = (uint32_t)f[0] << 16 | (uint32_t)f[1];
    *bytes = (uint64_t)f[2] << 32 | (uint64_t)f[3] << 16 | (uint64_t)f[4];
}

/* A piece's place in its tensor, as the rank file's metadata records it: "r0 nr c0 nc". */
static void placement_text(char *buf, size_t len, int r0, int nr, int c0, int nc) {
    snprintf(buf, len, "%d %d %d %d", r0, nr, c0, nc);
}

static cJSON *json_float(float v) {   /* %.9g: the exact float, read back */
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", (double)v);
    return cJSON_CreateRaw(buf);
}

static cJSON *int_pair(int a, int b, bool vector) {
    cJSON *arr = cJSON_CreateArray();
    if (!vector) cJSON_AddItemToArray(arr, cJSON_CreateNumber(a));
    cJSON_AddItemToArray(arr, cJSON_CreateNumber(b));
    return arr;
}

static const char *storage_name(block_storage s) {
    return s == STORE_SHARD ? "shard" : s == STORE_WHOLE ? "whole" : "whole_shard_valid";
}

/* `item` on one line, as cJSON prints it compactly. */
static void print_compact(FILE *f, const cJSON *item) {
    char *v = cJSON_PrintUnformatted(item);
    fputs(v ? v : "null", f);
    cJSON_free(v);
}

/* An array of objects, one object a line, indented two more than `indent` (the array's own). */
static void print_object_lines(FILE *f, const cJSON *array, const char *indent) {
    fputs("[\n", f);
    for (const cJSON *x = array->child; x; x = x->next) {
        fprintf(f, "%s  ", indent);
        print_compact(f, x);
        fputs(x->next ? ",\n" : "\n", f);
    }
    fprintf(f, "%s]", indent);
}

/* The index as text for a person too: one line per setting, per tensor's shape, per piece. */
static char *format_index(const cJSON *root) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    fputs("{\n", f);
    for (const cJSON *item = root->child; item; item = item->next) {
        fprintf(f, "  \"%s\": ", item->string);
        if (cJSON_IsArray(item) && cJSON_IsObject(item->child)) {   /* "files": one a line */
            print_object_lines(f, item, "  ");
        } else if (strcmp(item->string, "tensors") != 0) {
            print_compact(f, item);
        } else {
            fputs("{\n", f);
            for (const cJSON *x = item->child; x; x = x->next) {
                fprintf(f, "    \"%s\": {\n", x->string);
                for (const cJSON *field = x->child; field; field = field->next) {
                    fprintf(f, "      \"%s\": ", field->string);
                    if (cJSON_IsArray(field) && cJSON_IsObject(field->child))   /* a list of pieces */
                        print_object_lines(f, field, "      ");
                    else
                        print_compact(f, field);
                    fputs(field->next ? ",\n" : "\n", f);
                }
                fprintf(f, "    }%s\n", x->next ? "," : "");
            }
            fputs("  }", f);
        }
        fputs(item->next ? ",\n" : "\n", f);
    }
    fputs("}\n", f);
    if (fclose(f) != 0) { free(text); return NULL; }
    return text;
}

/* The index (rank 0): everything a reader needs without knowing the writer's mesh.
 * all: every rank's file (FILE_FIELDS) then its pieces (`most`, PIECE_FIELDS each), `per` floats a rank. */
static char *index_json(const llama_model *m, const checkpoint_meta *meta, const float *all, int most, size_t per,
                        int world) {
    const param_table *t = m->params;
    const llama_config *c = &m->c;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(root, "version", CKPT_VERSION);
    cJSON_AddNumberToObject(root, "step", meta->step);
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, meta->seed);
    cJSON_AddStringToObject(root, "seed", seed);   /* (a string: a JSON number holds 53 bits) */
    cJSON_AddStringToObject(root, "trainer", meta->trainer_json);

    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddNumberToObject(model, "dim", c->dim);
    cJSON_AddNumberToObject(model, "n_layers", c->n_layers);
    cJSON_AddNumberToObject(model, "n_heads", c->n_heads);
    cJSON_AddNumberToObject(model, "n_kv_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(model, "ffn_dim", c->ffn_dim);
    cJSON_AddNumberToObject(model, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(model, "seq_len", c->seq_len);
    cJSON_AddItemToObject(model, "norm_eps", json_float(c->norm_eps));
    cJSON_AddItemToObject(model, "rope_theta", json_float(c->rope_theta));
    if (c->moe.experts > 0) {   /* a mixture of experts (chapter 09; a dense model's index has none) */
        cJSON_AddNumberToObject(model, "experts", c->moe.experts);
        cJSON_AddNumberToObject(model, "top_k", c->moe.top_k);
        cJSON_AddNumberToObject(model, "expert_dim", c->moe.expert_dim);
        cJSON_AddNumberToObject(model, "shared_expert", c->moe.shared_expert);
        if (c->layer_every > 1) cJSON_AddNumberToObject(model, "moe_every", c->layer_every);   /* absent: 1 */
    }

    /* the writer's mesh and storage: for the reader's information, loading does not need them */
    cJSON_AddNumberToObject(root, "world_size", world);
    cJSON *mesh = cJSON_AddObjectToObject(root, "mesh");
    for (int d = 0; d < MESH_NDIMS; d++)
        cJSON_AddNumberToObject(mesh, mesh_dim_name(d), t->mesh ? t->mesh->shape.degree[d] : 1);
    cJSON *storage = cJSON_AddObjectToObject(root, "storage");
    for (int b = 0; b < CKPT_NBLOCKS; b++)
        cJSON_AddStringToObject(storage, block_name[b], storage_name(param_storage_of(t, block_of(t, b))));

    cJSON *files = cJSON_AddArrayToObject(root, "files");
    for (int q = 0; q < world; q++) {
        uint32_t crc;
        uint64_t bytes;
        file_fields_get(all + (size_t)q * per, &crc, &bytes);
        if (bytes == 0) continue;   /* rank q holds nothing */
        char name[32], hex[16];
        snprintf(name, sizeof name, "rank_%05d.safetensors", q);
        snprintf(hex, sizeof hex, "%08" PRIx32, crc);
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "file", name);
        cJSON_AddNumberToObject(f, "bytes", (double)bytes);
        cJSON_AddStringToObject(f, "crc32", hex);
        cJSON_AddItemToArray(files, f);
    }
    cJSON *tensors = cJSON_AddObjectToObject(root, "tensors");
    for (int i = 0; i < t->n; i++) {
        const param_spec *s = &t->t[i].spec;
        cJSON *x = cJSON_AddObjectToObject(tensors, s->name);
        cJSON_AddItemToObject(x, "shape", int_pair(s->rows, s->cols, s->is_vector));
        for (int b = 0; b < CKPT_NBLOCKS; b++) {
            cJSON *list = cJSON_AddArrayToObject(x, block_name[b]);
            for (int q = 0; q < world; q++)
                for (int k = 0; k < most; k++) {
                    const float *p = all + (size_t)q * per + FILE_FIELDS + (size_t)k * PIECE_FIELDS;
                    if (p[0] < 0) break;
                    if ((int)p[0] != i || (int)p[1] != b) continue;
                    char file[32];
                    snprintf(file, sizeof file, "rank_%05d.safetensors", q);
                    cJSON *pc = cJSON_CreateObject();
                    cJSON_AddStringToObject(pc, "file", file);
                    cJSON_AddItemToObject(pc, "offsets", int_pair((int)p[2], (int)p[4], s->is_vector));
                    cJSON_AddItemToObject(pc, "sizes", int_pair((int)p[3], (int)p[5], s->is_vector));
                    cJSON_AddItemToArray(list, pc);
                }
        }
    }
    char *text = format_index(root);
    cJSON_Delete(root);
    return text;
}

/* ---------------------------------------------------------------- save */

/* Every value this rank would save finite? 0, or -1 with err naming the first that is not. */
static int check_finite(const param_table *t, int step, char *err, size_t errlen) {
    if (!t->mesh && comm_world()->rank != 0) return 0;   /* (rank 0's copy is the one saved) */
    for (int b = 0; b < CKPT_NBLOCKS; b++)
        for (int i = 0; i < t->n; i++) {
            int r0, nr, c0, nc;
            size_t off, count;
            if (!param_held_slice(t, block_of(t, b), i, &r0, &nr, &c0, &nc, &off) || (count = (size_t)nr * nc) == 0)
                continue;
            float *host = malloc(count * sizeof(float));
            if (!host) return fail(err, errlen, "out of memory");
            device_copy_to_host(host, block_of(t, b) + off, count * sizeof(float));
            float v;
            size_t bad = first_nonfinite(host, count, &v);
            free(host);
            if (bad < count)
                return fail(err, errlen, "the state of step %d holds %g in %s/%s (row %zu, column %zu): not saved",
                            step, (double)v, t->t[i].spec.name, block_name[b], r0 + bad / (size_t)nc,
                            c0 + bad % (size_t)nc);
        }
    return 0;
}

/* This rank's file: every slice it holds of the three blocks, with the step, the crc32 of the
 * trainer's settings and each piece's place as metadata. Appends the pieces to *pieces
 * (PIECE_FIELDS floats each) and counts them in *n; the file's crc32 and size in *crc, *bytes
 * (0 bytes: no file). 0, or -1 with err. */
static int write_rank_file(const char *tmp_dir, const param_table *t, const checkpoint_meta *meta, float **pieces,
                           int *n, uint32_t *crc, uint64_t *bytes, char *err, size_t errlen) {
    comm_group *w = comm_world();
    *n = 0;
    *pieces = NULL;
    *crc = 0;
    *bytes = 0;
    if (!t->mesh && w->rank != 0) return 0;   /* a single-device model on every rank: rank 0's copy */
    for (int i = 0; i < t->n; i++) {   /* the gather below moves the pieces' bounds as floats */
        const param_spec *s = &t->t[i].spec;
        if (s->rows >= (1 << 24) || s->cols >= (1 << 24))
            return fail(err, errlen, "checkpoint: %s is [%d, %d]: the index holds dimensions below 2^24", s->name,
                        s->rows, s->cols);
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/rank_%05d.safetensors", tmp_dir, w->rank) >= (int)sizeof path)
        return fail(err, errlen, "checkpoint: the path %s/rank_%05d.safetensors is too long", tmp_dir, w->rank);
    st_writer *wr = NULL;
    int cap = 0;
    for (int b = 0; b < CKPT_NBLOCKS; b++) {
        float *block = block_of(t, b);
        for (int i = 0; i < t->n; i++) {
            int r0, nr, c0, nc;
            size_t off;
            if (!param_held_slice(t, block, i, &r0, &nr, &c0, &nc, &off) || (size_t)nr * nc == 0) continue;
            const param_spec *s = &t->t[i].spec;
            if (!wr) wr = st_writer_new();
            size_t count = (size_t)nr * nc;
            float *host = malloc(count * sizeof(float));
            device_copy_to_host(host, block + off, count * sizeof(float));
            char name[128], place[64];
            snprintf(name, sizeof name, "%s/%s", s->name, block_name[b]);
            int64_t shape[2] = {nr, nc};
            if (s->is_vector) st_writer_add(wr, name, "F32", &shape[1], 1, host);
            else st_writer_add(wr, name, "F32", shape, 2, host);
            placement_text(place, sizeof place, r0, nr, c0, nc);
            st_writer_meta(wr, name, place);
            free(host);
            if (*n == cap) {
                cap = cap ? 2 * cap : 64;
                *pieces = realloc(*pieces, (size_t)cap * PIECE_FIELDS * sizeof(float));
            }
            float *p = *pieces + (size_t)*n * PIECE_FIELDS;
            p[0] = (float)i; p[1] = (float)b; p[2] = (float)r0; p[3] = (float)nr; p[4] = (float)c0; p[5] = (float)nc;
            (*n)++;
        }
    }
    if (!wr) return 0;
    char text[32];
    st_writer_meta(wr, "format", CKPT_FORMAT " shard");
    snprintf(text, sizeof text, "%d", meta->step);
    st_writer_meta(wr, "step", text);
    snprintf(text, sizeof text, "%08" PRIx32, checkpoint_crc32(meta->trainer_json, strlen(meta->trainer_json)));
    st_writer_meta(wr, "trainer_crc32", text);
    int rc = st_writer_save(wr, path, err, errlen);
    if (rc == 0 && sync_path(path) != 0) rc = fail(err, errlen, "cannot sync %s: %s", path, strerror(errno));
    if (rc == 0) {   /* the checksum of the bytes as they are in the file */
        unsigned char *written = NULL;
        size_t size = 0;
        char why[256] = "";
        if (read_file(path, &written, &size, why, sizeof why) != 0) rc = fail(err, errlen, "cannot read back %s: %s", path, why);
        else { *crc = checkpoint_crc32(written, size); *bytes = size; }
        free(written);
    }
    return rc;
}

/* Rank 0: publishes tmp as final (replacing an older final of the same name), then DIR/latest. */
static int commit(const char *dir, const char *tmp, const char *final, const char *name, char *err, size_t errlen) {
    if (sync_path(tmp) != 0) return fail(err, errlen, "cannot sync %s: %s", tmp, strerror(errno));
    if (path_is_link(final))   /* (checkpoint_dir_problem refused one at start: one made since) */
        return fail(err, errlen, "%s is a symbolic link: a checkpoint is never written over a link (it would "
                    "replace, then delete, what the link points to); move it away", final);
    struct stat st;
    int rc;
    if (lstat(final, &st) != 0) {
        rc = rename(tmp, final);
    } else {   /* swap the two in one step, then remove the old one (now under the tmp name) */
        rc = renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE);
        if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {   /* no RENAME_EXCHANGE here */
            char *old = NULL;
            if (asprintf(&old, "%s.old", tmp) < 0) return fail(err, errlen, "out of memory");
            rc = rename(final, old);
            if (rc == 0 && (rc = rename(tmp, final)) != 0) rename(old, final);
            if (rc == 0) remove_checkpoint_dir(old);
            free(old);
        } else if (rc == 0) {
            remove_checkpoint_dir(tmp);
        }
    }
    if (rc != 0) return fail(err, errlen, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    sync_path(dir);
    char *latest = join(dir, "latest"), text[64];
    snprintf(text, sizeof text, "%s\n", name);
    rc = latest ? write_text_atomic(latest, text, err, errlen) : fail(err, errlen, "out of memory");
    free(latest);
    if (rc == 0 && sync_path(dir) != 0) rc = fail(err, errlen, "cannot sync %s: %s", dir, strerror(errno));
    return rc;
}

int checkpoint_save(const char *dir, const llama_model *m, const checkpoint_meta *meta, char *err, size_t errlen) {
    comm_group *w = comm_world();
    const param_table *t = m->params;
    bool root = w->rank == 0;
    if (err && errlen) err[0] = 0;
    if (!dir || !dir[0]) return fail(err, errlen, "checkpoint: the directory is empty: expected a path");
    if (meta->step < 0) return fail(err, errlen, "checkpoint: step %d: expected 0 or more", meta->step);
    /* ---- every rank: nothing non-finite (before anything on disk is touched) ---- */
    int finite = check_finite(t, meta->step, err, errlen);
    if (agree(finite, err, errlen) != 0) return -2;

    /* ---- rank 0 prepares DIR/step_N.tmp.<pid>.<random> (its pid and draw, known to all) ---- */
    long pid = (long)comm_host_max(w, root ? (double)getpid() : 0.0);
    unsigned int r = (unsigned int)comm_host_max(w, root ? (double)temp_random() : 0.0);
    char name[32];
    snprintf(name, sizeof name, "step_%08d", meta->step);
    char *d = trimmed_dir(dir), *final = join(d, name), *tmp = final ? temp_name_of(final, pid, r) : NULL;
    int rc = 0;
    if (!d || !final || !tmp) rc = fail(err, errlen, "out of memory");
    if (rc == 0 && root) {
        errno = 0;
        if (make_dirs(d) != 0) rc = fail(err, errlen, "checkpoint: cannot create the directory %s: %s", d, strerror(errno));
        if (rc == 0) remove_leftovers(d);
        if (rc == 0 && mkdir(tmp, 0755) != 0)
            rc = fail(err, errlen, "checkpoint: cannot create %s: %s", tmp, strerror(errno));
    }
    rc = agree(rc, err, errlen);

    /* ---- every rank: its own file ---- */
    float *mine = NULL;
    int n = 0;
    uint32_t crc = 0;
    uint64_t bytes = 0;
    if (rc == 0) {
        rc = write_rank_file(tmp, t, meta, &mine, &n, &crc, &bytes, err, errlen);
        rc = agree(rc, err, errlen);
    }

    /* ---- rank 0: the index, from every rank's file and list of pieces ---- */
    if (rc == 0) {
        int most = (int)comm_host_max(w, n);
        size_t per = FILE_FIELDS + (size_t)most * PIECE_FIELDS;
        float *send = malloc(per * sizeof(float)), *all = root ? malloc(per * w->size * sizeof(float)) : NULL;
        for (size_t k = 0; k < per; k++) send[k] = -1.0f;
        file_fields_put(send, crc, bytes);
        if (n) memcpy(send + FILE_FIELDS, mine, (size_t)n * PIECE_FIELDS * sizeof(float));
        comm_host_gather(w, send, all, per, 0);
        if (root) {
            char *text = index_json(m, meta, all, most, per, w->size), *path = join(tmp, "index.json");
            rc = text && path ? write_text_atomic(path, text, err, errlen) : fail(err, errlen, "out of memory");
            free(path);
            free(text);
        }
        free(send);
        free(all);
        rc = agree(rc, err, errlen);
    }
    free(mine);

    /* The test hook: everything written, nothing renamed (tests/t_checkpoint_crash.sh). */
    if (rc == 0 && comm_host_max(w, getenv("CKPT_TEST_CRASH_BEFORE_RENAME") ? 1.0 : 0.0) > 0) {
        fflush(NULL);
        exit(3);
    }

    /* ---- rank 0 publishes it: step_N, then latest ---- */
    if (rc == 0) {
        if (root) rc = commit(d, tmp, final, name, err, errlen);
        rc = agree(rc, err, errlen);
    } else if (root && tmp) {
        remove_checkpoint_dir(tmp);   /* (every rank has stopped writing: agree came first) */
    }
    free(d); free(final); free(tmp);
    return rc;
}

/* ---------------------------------------------------------------- load */

/* Rank 0: where the checkpoint is. Returns the step named by DIR/latest (>= 0), -3 when DIR is
 * itself a step directory, -1 when DIR holds no checkpoint, -2 on error (err). */
static double locate(const char *dir, char *err, size_t errlen) {
    struct stat st;
    if (stat(dir, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) { fail(err, errlen, "checkpoint: %s is not a directory", dir); return -2; }
    char *index = join(dir, "index.json"), *latest = join(dir, "latest");
    double where = -1;
    if (!index || !latest) { fail(err, errlen, "out of memory"); where = -2; }
    else if (stat(index, &st) == 0) where = -3;
    else if (stat(latest, &st) == 0) {
        unsigned char *bytes = NULL;
        char why[256];
        size_t size;
        int rc = read_file(latest, &bytes, &size, why, sizeof why);
        char *text = (char *)bytes;   /* (NUL-terminated) */
        if (rc != 0) {
            fail(err, errlen, "checkpoint: cannot read %s: %s", latest, why);
            where = -2;
        }
        else {
            size_t k = strlen(text);
            while (k > 0 && (text[k - 1] == '\n' || text[k - 1] == ' ' || text[k - 1] == '\r')) text[--k] = 0;
            int step;
            if (!parse_step_name(text, &step)) {
                fail(err, errlen, "checkpoint: %s holds '%.40s', expected step_ and 8 digits", latest, text);
                where = -2;
            } else {
                char *named = join(dir, text), *named_index = named ? join(named, "index.json") : NULL;
                if (!named_index || stat(named_index, &st) != 0) {
                    fail(err, errlen, "checkpoint: %s names %s, but %s/%s/index.json does not exist", latest, text,
                         dir, text);
                    where = -2;
                } else {
                    where = step;
                }
                free(named); free(named_index);
            }
            free(text);
        }
    }
    free(index); free(latest);
    return where;
}

static int json_int(const cJSON *obj, const char *key, int *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(x) || x->valuedouble != (double)(int)x->valuedouble) return -1;
    *v = (int)x->valuedouble;
    return 0;
}

/* An [offsets] or [sizes] pair of a piece (one number for a vector), as (row, col). */
static int json_pair(const cJSON *arr, bool vector, int *r, int *c) {
    int want = vector ? 1 : 2;
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != want) return -1;
    int v[2] = {0, 0};
    for (int k = 0; k < want; k++) {
        const cJSON *x = cJSON_GetArrayItem(arr, k);
        if (!cJSON_IsNumber(x) || x->valuedouble != (double)(int)x->valuedouble || x->valuedouble < 0) return -1;
        v[k] = (int)x->valuedouble;
    }
    if (vector) { *r = 0; *c = v[0]; } else { *r = v[0]; *c = v[1]; }
    return 0;
}

/* The model of the index against m's: 0, or -1 with the first value that differs named. */
static int check_model(const cJSON *model, const llama_config *c, const char *where, char *err, size_t errlen) {
    if (!cJSON_IsObject(model)) return fail(err, errlen, "checkpoint %s: the index has no \"model\"", where);
    const struct { const char *key; int have; } ints[] = {
        {"dim", c->dim}, {"n_layers", c->n_layers}, {"n_heads", c->n_heads}, {"n_kv_heads", c->n_kv_heads},
        {"ffn_dim", c->ffn_dim}, {"vocab_size", c->vocab_size}, {"seq_len", c->seq_len}};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        int v;
        if (json_int(model, ints[k].key, &v) != 0)
            return fail(err, errlen, "checkpoint %s: the index's model has no integer \"%s\"", where, ints[k].key);
        if (v != ints[k].have)
            return fail(err, errlen, "checkpoint %s was written for %s %d; this model has %s %d", where, ints[k].key,
                        v, ints[k].key, ints[k].have);
    }
    /* the experts (absent: a dense model, 0) */
    /* (moe_every, absent: 1, every layer a mixture) */
    int every = c->moe.experts > 0 && c->layer_every > 1 ? c->layer_every : 1;
    const struct { const char *key; int have, absent; } experts[] = {
        {"experts", c->moe.experts, 0}, {"top_k", c->moe.top_k, 0}, {"expert_dim", c->moe.expert_dim, 0},
        {"shared_expert", c->moe.shared_expert, 0}, {"moe_every", every, 1}};
    for (size_t k = 0; k < sizeof experts / sizeof experts[0]; k++) {
        int v = experts[k].absent;
        if (cJSON_GetObjectItemCaseSensitive(model, experts[k].key) && json_int(model, experts[k].key, &v) != 0)
            return fail(err, errlen, "checkpoint %s: the index's model has no integer \"%s\"", where, experts[k].key);
        int want = c->moe.experts > 0 ? experts[k].have : experts[k].absent;
        if (v != want)
            return fail(err, errlen, "checkpoint %s was written for %s %d; this model has %s %d", where,
                        experts[k].key, v, experts[k].key, want);
    }
    const struct { const char *key; float have; } floats[] = {{"norm_eps", c->norm_eps}, {"rope_theta", c->rope_theta}};
    for (size_t k = 0; k < 2; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(model, floats[k].key);
        if (!cJSON_IsNumber(x))
            return fail(err, errlen, "checkpoint %s: the index's model has no number \"%s\"", where, floats[k].key);
        if ((float)x->valuedouble != floats[k].have)
            return fail(err, errlen, "checkpoint %s was written for %s %.9g; this model has %s %.9g", where,
                        floats[k].key, (double)(float)x->valuedouble, floats[k].key, (double)floats[k].have);
    }
    return 0;
}

/* A rank file as the index lists it: its name (pointing into the index's JSON), size and crc32. */
typedef struct { const char *name; double bytes; uint32_t crc; } ckpt_file;

/* Parses and checks the index's pieces against the table: every piece inside its tensor, the
 * pieces of each block disjoint and covering the tensor exactly, every file among "files".
 * Fills pieces[] (malloc'd, *n of them) and files[] (*nfiles of them). */
static int read_pieces(const cJSON *root, const param_table *t, const char *where, piece **out, int *n,
                       ckpt_file **files, int *nfiles, char *err, size_t errlen) {
    const cJSON *jfiles = cJSON_GetObjectItemCaseSensitive(root, "files");
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    if (!cJSON_IsArray(jfiles) || !cJSON_IsObject(tensors))
        return fail(err, errlen, "checkpoint %s: the index has no \"files\" list or no \"tensors\"", where);
    *nfiles = cJSON_GetArraySize(jfiles);
    *files = calloc((size_t)*nfiles + 1, sizeof **files);
    for (int f = 0; f < *nfiles; f++) {
        const cJSON *jf = cJSON_GetArrayItem(jfiles, f);
        const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(jf, "file"));
        const char *hex = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(jf, "crc32"));
        const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(jf, "bytes");
        if (!s || !is_checkpoint_file(s) || strcmp(s, "index.json") == 0 || strstr(s, ".tmp"))
            return fail(err, errlen, "checkpoint %s: files[%d] has no \"file\" that is a rank_<r>.safetensors name",
                        where, f);
        char *end = NULL;
        unsigned long crc = hex ? strtoul(hex, &end, 16) : 0;
        if (!hex || strlen(hex) != 8 || *end || !cJSON_IsNumber(bytes) || bytes->valuedouble <= 0)
            return fail(err, errlen, "checkpoint %s: the index lacks the size or the crc32 (8 hex digits) of %s", where, s);
        for (int g = 0; g < f; g++)
            if (strcmp((*files)[g].name, s) == 0) return fail(err, errlen, "checkpoint %s: the index lists %s twice", where, s);
        (*files)[f] = (ckpt_file){s, bytes->valuedouble, (uint32_t)crc};
    }
    if (cJSON_GetArraySize(tensors) != t->n)
        return fail(err, errlen, "checkpoint %s: the index holds %d tensors, this model has %d", where,
                    cJSON_GetArraySize(tensors), t->n);
    int cap = 0;
    *n = 0;
    *out = NULL;
    for (int i = 0; i < t->n; i++) {
        const param_spec *s = &t->t[i].spec;
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(tensors, s->name);
        int rows, cols;
        if (!x) return fail(err, errlen, "checkpoint %s: the index has no tensor %s", where, s->name);
        if (json_pair(cJSON_GetObjectItemCaseSensitive(x, "shape"), s->is_vector, &rows, &cols) != 0 ||
            (s->is_vector ? 1 : rows) != s->rows || cols != s->cols)
            return fail(err, errlen, "checkpoint %s: %s's shape in the index is not [%d%s%d]", where, s->name,
                        s->is_vector ? s->cols : s->rows, s->is_vector ? "" : ", ", s->is_vector ? 0 : s->cols);
        if (s->is_vector) rows = 1;
        for (int b = 0; b < CKPT_NBLOCKS; b++) {
            const cJSON *list = cJSON_GetObjectItemCaseSensitive(x, block_name[b]);
            if (!cJSON_IsArray(list)) return fail(err, errlen, "checkpoint %s: %s has no \"%s\" list", where, s->name, block_name[b]);
            int first = *n;
            double area = 0;
            const cJSON *pc;
            cJSON_ArrayForEach(pc, list) {
                piece p = {i, b, 0, 0, 0, 0, -1};
                const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pc, "file"));
                for (int f = 0; file && f < *nfiles; f++)
                    if (strcmp(file, (*files)[f].name) == 0) p.file = f;
                if (p.file < 0 || json_pair(cJSON_GetObjectItemCaseSensitive(pc, "offsets"), s->is_vector, &p.r0, &p.c0) ||
                    json_pair(cJSON_GetObjectItemCaseSensitive(pc, "sizes"), s->is_vector, &p.nr, &p.nc))
                    return fail(err, errlen, "checkpoint %s: a piece of %s/%s lacks a listed file, offsets or sizes",
                                where, s->name, block_name[b]);
                if (s->is_vector) p.nr = 1;
                if (p.nr == 0 || p.nc == 0 || (long)p.r0 + p.nr > rows || (long)p.c0 + p.nc > cols)
                    return fail(err, errlen, "checkpoint %s: a piece of %s/%s (rows %d+%d, columns %d+%d) is empty or "
                                "outside [%d, %d]", where, s->name, block_name[b], p.r0, p.nr, p.c0, p.nc, rows, cols);
                for (int k = first; k < *n; k++) {
                    const piece *q = &(*out)[k];
                    if (p.r0 < q->r0 + q->nr && q->r0 < p.r0 + p.nr && p.c0 < q->c0 + q->nc && q->c0 < p.c0 + p.nc)
                        return fail(err, errlen, "checkpoint %s: two pieces of %s/%s overlap", where, s->name, block_name[b]);
                }
                area += (double)p.nr * p.nc;
                if (*n == cap) { cap = cap ? 2 * cap : 256; *out = realloc(*out, (size_t)cap * sizeof **out); }
                (*out)[(*n)++] = p;
            }
            if (area != (double)rows * cols)
                return fail(err, errlen, "checkpoint %s: the pieces of %s/%s cover %.0f of its %.0f elements", where,
                            s->name, block_name[b], area, (double)rows * cols);
        }
    }
    return 0;
}

/* One rectangle this rank stores (param_stored_slice), being filled from the pieces. */
typedef struct { int r0, nr, c0, nc; float *host; double filled; bool stored; } target;

/* Copies the overlap of piece p (its data `src`, row-major [p.nr, p.nc]) into the target. */
static void fill(target *x, const piece *p, const unsigned char *src) {
    /* BEGIN ASSIGNMENT: resharding: copy the overlap of the saved piece p (rows [p->r0, p->r0 + p->nr) x columns [p->c0, p->c0 + p->nc) of the global tensor, row-major in src) into this rank's rectangle x (row-major in x->host), and add the elements copied to x->filled */
    int r_lo = p->r0 > x->r0 ? p->r0 : x->r0, r_hi = p->r0 + p->nr < x->r0 + x->nr ? p->r0 + p->nr : x->r0 + x->nr;
    int c_lo = p->c0 > x->c0 ? p->c0 : x->c0, c_hi = p->c0 + p->nc < x->c0 + x->nc ? p->c0 + p->nc : x->c0 + x->nc;
    if (r_lo >= r_hi || c_lo >= c_hi) return;
    for (int r = r_lo; r < r_hi; r++)
        memcpy(x->host + (size_t)(r - x->r0) * x->nc + (c_lo - x->c0),
               src + ((size_t)(r - p->r0) * p->nc + (size_t)(c_lo - p->c0)) * sizeof(float),
               (size_t)(c_hi - c_lo) * sizeof(float));
    x->filled += (double)(r_hi - r_lo) * (c_hi - c_lo);
    /* END ASSIGNMENT */
}

static bool overlaps(const target *x, const piece *p) {
    return x->stored && x->nr > 0 && x->nc > 0 && p->r0 < x->r0 + x->nr && x->r0 < p->r0 + p->nr &&
           p->c0 < x->c0 + x->nc && x->c0 < p->c0 + p->nc;
}

/* Reads rank file f of the checkpoint in `path` and checks it against the index: its size and
 * crc32, then its metadata's step and settings checksum. 0 (sf filled), or -1 with err. */
static int read_rank_file(const char *path, const ckpt_file *f, int step, uint32_t trainer_crc, st_file *sf,
                          char *err, size_t errlen) {
    char *fp = join(path, f->name);
    if (!fp) return fail(err, errlen, "out of memory");
    struct stat st;
    int rc = 0;
    if (stat(fp, &st) != 0)
        rc = fail(err, errlen, "checkpoint %s: %s: %s", path, f->name, strerror(errno));
    else if ((double)st.st_size != f->bytes)
        rc = fail(err, errlen, "checkpoint %s: %s is %lld bytes, the index says %.0f: the file was truncated or replaced",
                  path, f->name, (long long)st.st_size, f->bytes);
    else if (st_read(fp, sf, err, errlen) != 0) {   /* (the index's size, yet not safetensors: corrupt) */
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        rc = fail(err, errlen, "checkpoint %s: %s is corrupt: %s", path, f->name, why);
    }
    free(fp);
    if (rc) return rc;
    uint32_t crc = checkpoint_crc32(sf->blob, sf->blob_size);
    const char *file_step = st_meta(sf, "step"), *file_trainer = st_meta(sf, "trainer_crc32");
    char want[16];
    snprintf(want, sizeof want, "%08" PRIx32, trainer_crc);
    if (crc != f->crc)
        rc = fail(err, errlen, "checkpoint %s: %s has crc32 %08" PRIx32 ", the index says %08" PRIx32 ": the file is "
                  "corrupt", path, f->name, crc, f->crc);
    else if (!file_step || atoi(file_step) != step || !file_trainer || strcmp(file_trainer, want) != 0)
        rc = fail(err, errlen, "checkpoint %s: %s was written for step %s (settings crc32 %s), the index is of step %d "
                  "(settings crc32 %s): the file belongs to another checkpoint", path, f->name,
                  file_step ? file_step : "?", file_trainer ? file_trainer : "?", step, want);
    if (rc) st_free(sf);
    return rc;
}

/* Every rank: the checkpoint in `path` into m; expect_step >= 0: the step its directory's name
 * says, which the index must hold. 0, or -1 with err. */
static int load_from(const char *path, int expect_step, llama_model *m, checkpoint_meta *meta, char *err,
                     size_t errlen) {
    param_table *t = m->params;
    char *index_path = join(path, "index.json");
    unsigned char *bytes = NULL;
    char why[256] = "out of memory";
    size_t size;
    int read_rc = index_path ? read_file(index_path, &bytes, &size, why, sizeof why) : -1;
    char *text = (char *)bytes;   /* (NUL-terminated) */
    if (read_rc != 0) {
        int rc = fail(err, errlen, "checkpoint: cannot read %s/index.json: %s", path, why);
        free(index_path);
        return rc;
    }
    free(index_path);
    cJSON *root = cJSON_Parse(text);
    free(text);
    piece *pieces = NULL;
    ckpt_file *files = NULL;
    target *targets = NULL;
    int n = 0, nfiles = 0, rc = 0, version = 0, step = 0;
    const char *format = root ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "format")) : NULL;
    const char *seed = root ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "seed")) : NULL;
    const char *trainer = root ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "trainer")) : NULL;
    if (!root) rc = fail(err, errlen, "checkpoint %s: index.json is not valid JSON", path);
    else if (format && strcmp(format, CKPT_FORMAT) == 0 && json_int(root, "version", &version) == 0 && version == 1)
        rc = fail(err, errlen, "checkpoint %s: index.json is of version 1, written before checkpoints held checksums; "
                  "this trainer loads version %d only (train again, or resume with the trainer that wrote it)", path,
                  CKPT_VERSION);
    else if (!format || strcmp(format, CKPT_FORMAT) != 0 || json_int(root, "version", &version) || version != CKPT_VERSION)
        rc = fail(err, errlen, "checkpoint %s: index.json is not a \"%s\" index of version %d", path, CKPT_FORMAT,
                  CKPT_VERSION);
    else if (json_int(root, "step", &step) || step < 0 || !seed || !trainer ||
             strlen(trainer) >= sizeof ((checkpoint_meta *)0)->trainer_json)
        rc = fail(err, errlen, "checkpoint %s: index.json lacks a valid step, seed or trainer", path);
    else if (expect_step >= 0 && step != expect_step)
        rc = fail(err, errlen, "checkpoint %s: index.json says step %d, the directory's name step %d", path, step,
                  expect_step);
    if (rc == 0) rc = check_model(cJSON_GetObjectItemCaseSensitive(root, "model"), &m->c, path, err, errlen);
    if (rc == 0) rc = read_pieces(root, t, path, &pieces, &n, &files, &nfiles, err, errlen);

    /* the rectangles this rank stores, one per block and tensor */
    if (rc == 0) {
        targets = calloc((size_t)CKPT_NBLOCKS * t->n, sizeof *targets);
        for (int b = 0; b < CKPT_NBLOCKS; b++)
            for (int i = 0; i < t->n; i++) {
                target *x = &targets[b * t->n + i];
                size_t off;
                x->stored = param_stored_slice(t, block_of(t, b), i, &x->r0, &x->nr, &x->c0, &x->nc, &off);
                if (x->stored) x->host = malloc((size_t)x->nr * x->nc * sizeof(float) + 1);
            }
    }
    /* file by file, the pieces that overlap them (a file no rectangle needs is not read) */
    for (int f = 0; rc == 0 && f < nfiles; f++) {
        bool needed = false;
        for (int k = 0; k < n && !needed; k++)
            needed = pieces[k].file == f && overlaps(&targets[pieces[k].b * t->n + pieces[k].i], &pieces[k]);
        if (!needed) continue;
        st_file sf;
        uint32_t trainer_crc = checkpoint_crc32(trainer, strlen(trainer));
        if ((rc = read_rank_file(path, &files[f], step, trainer_crc, &sf, err, errlen)) != 0) break;
        for (int k = 0; k < n && rc == 0; k++) {
            const piece *p = &pieces[k];
            target *x = &targets[p->b * t->n + p->i];
            if (p->file != f || !overlaps(x, p)) continue;
            const param_spec *s = &t->t[p->i].spec;
            char name[128];
            snprintf(name, sizeof name, "%s/%s", s->name, block_name[p->b]);
            const st_tensor *st = st_find(&sf, name);
            bool fits = st && strcmp(st->dtype, "F32") == 0 &&
                        (s->is_vector ? st->ndim == 1 && st->shape[0] == p->nc
                                      : st->ndim == 2 && st->shape[0] == p->nr && st->shape[1] == p->nc);
            char place[64];
            placement_text(place, sizeof place, p->r0, p->nr, p->c0, p->nc);
            const char *recorded = st_meta(&sf, name);
            size_t count = (size_t)p->nr * p->nc, bad = count;
            float v = 0;
            if (!fits) rc = fail(err, errlen, "checkpoint %s: %s holds no F32 tensor %s of the index's shape", path,
                                 files[f].name, name);
            else if (!recorded || strcmp(recorded, place) != 0)   /* a piece mapped to the wrong file or place */
                rc = fail(err, errlen, "checkpoint %s: %s holds %s at rows, columns '%s' (start size start size), the "
                          "index says '%s'", path, files[f].name, name, recorded ? recorded : "(not recorded)", place);
            else if ((bad = first_nonfinite(st->data, count, &v)) < count)
                rc = fail(err, errlen, "checkpoint %s: %s: %s holds %g (row %zu, column %zu): a checkpoint with "
                          "non-finite values cannot be trained on", path, files[f].name, name,
                          (double)v, p->r0 + bad / (size_t)p->nc, p->c0 + bad % (size_t)p->nc);
            else fill(x, p, st->data);
        }
        st_free(&sf);
    }
    /* every rectangle whole (the index's pieces tile each tensor), then into the device */
    for (int k = 0; rc == 0 && k < CKPT_NBLOCKS * t->n; k++) {
        const target *x = &targets[k];
        if (x->stored && x->filled != (double)x->nr * x->nc)
            rc = fail(err, errlen, "checkpoint %s: %s/%s: the pieces gave %.0f of the %.0f elements this rank stores",
                      path, t->t[k % t->n].spec.name, block_name[k / t->n], x->filled, (double)x->nr * x->nc);
    }
    for (int k = 0; rc == 0 && k < CKPT_NBLOCKS * t->n; k++) {
        const target *x = &targets[k];
        if (x->stored) param_scatter(t, block_of(t, k / t->n), k % t->n, x->host, x->r0, x->c0, (size_t)x->nc);
    }
    if (rc == 0 && meta) {
        meta->step = step;
        meta->seed = strtoull(seed, NULL, 10);
        snprintf(meta->trainer_json, sizeof meta->trainer_json, "%s", trainer);
    }
    for (int k = 0; targets && k < CKPT_NBLOCKS * t->n; k++) free(targets[k].host);
    free(targets);
    free(pieces);
    free(files);
    cJSON_Delete(root);
    return rc;
}

int checkpoint_load(const char *dir, llama_model *m, checkpoint_meta *meta, char *err, size_t errlen) {
    comm_group *w = comm_world();
    if (err && errlen) err[0] = 0;
    if (!dir || !dir[0]) return fail(err, errlen, "checkpoint: the directory is empty: expected a path");
    char *d = trimmed_dir(dir);
    /* rank 0 finds it (DIR/latest, read once) and tells the others which step */
    double where = -1;
    if (w->rank == 0) where = locate(d, err, errlen);
    where = comm_host_max(w, w->rank == 0 ? where : -1e300);
    int rc;
    if (where == -1) rc = 1;
    else if (where == -2) rc = agree(w->rank == 0 ? -1 : 0, err, errlen);
    else {
        char *path = NULL;
        if (where == -3) path = strdup(d);
        else if (asprintf(&path, "%s/step_%08d", d, (int)where) < 0) path = NULL;
        /* the step the directory's name says: latest's, or DIR's own name when it is a step_N */
        int expect = where >= 0 ? (int)where : -1;
        const char *base = strrchr(d, '/');
        if (where == -3 && !parse_step_name(base ? base + 1 : d, &expect)) expect = -1;
        rc = path ? load_from(path, expect, m, meta, err, errlen) : fail(err, errlen, "out of memory");
        rc = agree(rc, err, errlen);
        free(path);
    }
    free(d);
    return rc;
}

bool checkpoint_exists(const char *dir) {
    comm_group *w = comm_world();
    bool found = false;
    if (w->rank == 0 && dir && dir[0]) {
        char *d = trimmed_dir(dir), *latest = d ? join(d, "latest") : NULL, *index = d ? join(d, "index.json") : NULL;
        struct stat st;
        found = (latest && stat(latest, &st) == 0) || (index && stat(index, &st) == 0);
        free(d); free(latest); free(index);
    }
    return comm_host_max(w, found ? 1.0 : 0.0) > 0;
}

static bool owned_name(const char *name) {
    int step;
    char base[64];
    size_t n = name_without_temp(name);
    if (n >= sizeof base) return false;
    memcpy(base, name, n);
    base[n] = 0;
    return strcmp(base, "latest") == 0 || is_latest_temp(name) || parse_step_name(base, &step) ||
           (strncmp(name, "step_", 5) == 0 && strstr(name, ".tmp."));
}

const char *checkpoint_dir_problem(const char *dir, bool will_save, char *why, size_t len) {
    comm_group *w = comm_world();
    int bad = 0;
    if (w->rank == 0 && dir && dir[0]) {
        char *d = trimmed_dir(dir), *index = d ? join(d, "index.json") : NULL;
        const char *base = d ? strrchr(d, '/') : NULL;
        base = base ? base + 1 : d;
        int step;
        struct stat st;
        if (d && will_save && (parse_step_name(base, &step) || (index && stat(index, &st) == 0))) {
            char *slash = strrchr(d, '/');
            snprintf(why, len, "--ckpt-dir %s is a checkpoint's own folder (%s): the saves would go inside it and the "
                     "next --resume would load it again; give the folder that holds the step folders%s%.*s",
                     d, parse_step_name(base, &step) ? base : "it holds index.json", slash ? ", " : "",
                     slash ? (int)(slash - d) : 0, d);
            bad = 1;
        }
        DIR *dd = !bad && d ? opendir(d) : NULL;
        struct dirent *e;
        while (dd && !bad && (e = readdir(dd)) != NULL) {
            if (!owned_name(e->d_name)) continue;
            char *p = join(d, e->d_name);
            if (p && path_is_link(p)) {
                snprintf(why, len, "--ckpt-dir %s: %s is a symbolic link where the run writes and replaces its "
                         "checkpoints (and sweeps unfinished ones); it never does that through a link, whose target "
                         "may be another run's checkpoint or an archive: move the link out of %s", d, p, d);
                bad = 1;
            }
            free(p);
        }
        if (dd) closedir(dd);
        free(d);
        free(index);
    }
    return comm_host_max(w, bad) > 0 ? why : NULL;
}

/* ---------------------------------------------------------------- export */

static void meta_int(st_writer *w, const char *key, int v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%d", v);
    st_writer_meta(w, key, buf);
}

int checkpoint_export(const char *path, const llama_model *m, char *err, size_t errlen) {
    comm_group *w = comm_world();
    const param_table *t = m->params;
    const llama_config *c = &m->c;
    bool root = w->rank == 0;
    if (err && errlen) err[0] = 0;
    if (!path || !path[0]) return fail(err, errlen, "export: the path is empty: expected a file name");
    /* rank 0: the parent directory first (mkdir -p), so that a refusal comes before the gathers */
    char *parent = strdup(path), *slash = parent ? strrchr(parent, '/') : NULL;
    bool has_parent = slash && slash != parent;
    int rc = parent ? 0 : fail(err, errlen, "out of memory");
    if (has_parent) *slash = 0;
    if (root && rc == 0 && has_parent) {
        errno = 0;
        if (make_dirs(parent) != 0) rc = fail(err, errlen, "export: cannot create %s: %s", parent, strerror(errno));
    }
    if (agree(rc, err, errlen) != 0) { free(parent); return -1; }

    st_writer *wr = root ? st_writer_new() : NULL;
    if (root) {
        st_writer_meta(wr, "format", "pt");   /* what safetensors.torch.save_file writes */
        meta_int(wr, "dim", c->dim);
        meta_int(wr, "n_layers", c->n_layers);
        meta_int(wr, "n_heads", c->n_heads);
        meta_int(wr, "n_kv_heads", c->n_kv_heads);
        meta_int(wr, "ffn_dim", c->ffn_dim);
        meta_int(wr, "vocab_size", c->vocab_size);
        meta_int(wr, "seq_len", c->seq_len);
        char buf[32];
        snprintf(buf, sizeof buf, "%.9g", (double)c->norm_eps);
        st_writer_meta(wr, "norm_eps", buf);
        snprintf(buf, sizeof buf, "%.9g", (double)c->rope_theta);
        st_writer_meta(wr, "rope_theta", buf);
    }
    /* one tensor at a time: rank 0 holds the writer's copy and one gathered tensor */
    for (int i = 0; i < t->n; i++) {
        const param_spec *s = &t->t[i].spec;
        float *full = root ? malloc((size_t)s->rows * s->cols * sizeof(float)) : NULL;
        if (t->mesh || root) param_gather(t, i, false, full);   /* (no mesh: nothing collective) */
        if (root) {
            int64_t shape[2] = {s->rows, s->cols};
            if (s->is_vector) st_writer_add(wr, s->name, "F32", &shape[1], 1, full);
            else st_writer_add(wr, s->name, "F32", shape, 2, full);
        }
        free(full);
    }
    if (root) {   /* the writer's own <path>.tmp, then its rename */
        rc = st_writer_save(wr, path, err, errlen);
        if (rc == 0 && sync_path(path) != 0) rc = fail(err, errlen, "export: cannot sync %s: %s", path, strerror(errno));
        if (rc == 0) sync_path(has_parent ? parent : ".");
    }
    free(parent);
    return agree(rc, err, errlen);
}
