/* ranks: 1 */
/* test_safetensors.c: the safetensors reader/writer and the --dump exports.
 *
 *   1. round trip: F32, I32 and U8 tensors plus metadata, written and read back bit for bit,
 *      with the header padded so the data section starts on an 8-byte boundary;
 *   2. the writer refuses bad input (unknown dtype, a name added twice) with a message;
 *   3. the reader refuses corrupt files with one line that names the file and the problem:
 *      truncated, header length past the end, bad JSON, offsets out of range, offsets that
 *      disagree with shape x dtype, unknown dtype, a missing file, and a few more;
 *   4. dump_params / dump_batch / dump_loss write what docs/dump-format.md promises an outside
 *      reader, inside dump_begin / dump_commit as the harness calls them;
 *   5. dumps are atomic: nothing appears at DIR before dump_commit, a second (shorter) dump
 *      replaces the first whole (no stale batch_K), dump_abort and a failed write (a file size
 *      limit standing in for a full disk) leave DIR as it was, and dump_begin refuses a regular
 *      file, a directory holding other files and an empty path, with a one-line reason;
 *   6. make_dirs: an empty path, a file in the way, an unwritable place and an overlong name
 *      fail and leave nothing behind; a long path is not truncated.
 * Everything happens in a fresh directory under /tmp that is removed at the end.
 * TEST_VERBOSE=1 prints each rejection message, i.e. what a user with a bad file would see.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <ftw.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm.h"
#include "dump.h"
#include "files.h"
#include "llama.h"
#include "safetensors.h"
#include "test_util.h"

static char tmpdir[64];
static int verbose;   /* TEST_VERBOSE=1 prints every rejection message (to see what users see) */

/* tmpdir/name in a static rotating buffer. */
static const char *tpath(const char *name) {
    static char buf[4][256];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

/* Writes a hand-made safetensors file: the 8-byte length field `hlen` (which need not match
 * the header, so we can lie), the header text, and `ndata` bytes of data. */
static void write_raw(const char *path, uint64_t hlen, const char *header, size_t ndata) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    for (int i = 0; i < 8; i++) fputc((int)((hlen >> (8 * i)) & 0xff), f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < ndata; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

/* A file whose length field matches its header. */
static void write_st(const char *path, const char *header, size_t ndata) {
    write_raw(path, strlen(header), header, ndata);
}

/* st_read must fail on `path` with an error of one line that names the file and contains
 * `expect`. */
static void expect_reject(const char *path, const char *expect, const char *what) {
    st_file f;
    char err[512];
    memset(err, 'x', sizeof err - 1);
    err[sizeof err - 1] = '\0';
    int rc = st_read(path, &f, err, sizeof err);
    CHECK(rc == -1, "%s: st_read returned %d, want -1", what, rc);
    CHECK(strstr(err, path) == err, "%s: error does not start with the path: %s", what, err);
    CHECK(strstr(err, expect) != NULL, "%s: error '%s' lacks '%s'", what, err, expect);
    CHECK(strchr(err, '\n') == NULL, "%s: error is more than one line: %s", what, err);
    CHECK(f.blob == NULL && f.n_tensors == 0 && f.tensors == NULL, "%s: st_file not cleared", what);
    if (verbose) printf("  rejects %-34s %s\n", what, err);
    st_free(&f);   /* harmless on a cleared st_file */
}

static void test_round_trip(void) {
    const float w[6] = {1.5f, -2.25f, 3.0e-8f, 1e30f, -0.0f, 0.1f};
    const int32_t ids[4] = {7, -100, 0, 2147483647};
    const unsigned char bytes[3] = {0x00, 0x7f, 0xff};
    int64_t shape_w[2] = {2, 3}, shape_ids[1] = {4}, shape_b[1] = {3}, shape_e[2] = {0, 5};
    char err[512];

    st_writer *wr = st_writer_new();
    st_writer_add(wr, "w", "F32", shape_w, 2, w);
    st_writer_add(wr, "bytes", "U8", shape_b, 1, bytes);   /* odd size: the next one is unaligned */
    st_writer_add(wr, "ids", "I32", shape_ids, 1, ids);
    st_writer_add(wr, "empty", "F32", shape_e, 2, NULL);   /* zero elements are legal */
    st_writer_meta(wr, "format", "pt");
    st_writer_meta(wr, "note", "quotes \" and \\ survive");
    st_writer_meta(wr, "format", "pt2");                    /* a second value replaces the first */
    const char *path = tpath("round.safetensors");
    int rc = st_writer_save(wr, path, err, sizeof err);
    CHECK(rc == 0, "st_writer_save: %s", err);

    /* The raw layout: header length a multiple of 8, header starts with '{' and is padded with
     * spaces, data section = 24 + 3 + 16 bytes. */
    FILE *fp = fopen(path, "rb");
    unsigned char raw[8] = {0};
    size_t got = fp ? fread(raw, 1, 8, fp) : 0;
    CHECK(got == 8, "could not read the length field");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | raw[i];
    CHECK(hlen % 8 == 0, "header length %llu is not a multiple of 8", (unsigned long long)hlen);
    int first = fp ? fgetc(fp) : -1;
    CHECK(first == '{', "header starts with 0x%02x", first);
    if (fp) {
        fseek(fp, 0, SEEK_END);
        long size = ftell(fp);
        CHECK(size == (long)(8 + hlen + 24 + 3 + 16), "file is %ld bytes", size);
        fclose(fp);
    }

    st_file f;
    rc = st_read(path, &f, err, sizeof err);
    CHECK(rc == 0, "st_read: %s", err);
    if (rc != 0) return;
    CHECK(f.n_tensors == 4, "n_tensors %d", f.n_tensors);
    /* header order is the order added */
    CHECK(f.n_tensors == 4 && strcmp(f.tensors[0].name, "w") == 0 &&
          strcmp(f.tensors[1].name, "bytes") == 0 && strcmp(f.tensors[2].name, "ids") == 0 &&
          strcmp(f.tensors[3].name, "empty") == 0, "tensor order");

    const st_tensor *t = st_find(&f, "w");
    CHECK(t && strcmp(t->dtype, "F32") == 0 && t->ndim == 2 && t->shape[0] == 2 &&
          t->shape[1] == 3 && t->nbytes == sizeof w, "w: dtype/shape/nbytes");
    CHECK(t && memcmp(t->data, w, sizeof w) == 0, "w: data differs");
    CHECK(t && ((uintptr_t)t->data % 8) == 0, "w: data section not 8-byte aligned");
    t = st_find(&f, "bytes");
    CHECK(t && strcmp(t->dtype, "U8") == 0 && t->ndim == 1 && t->shape[0] == 3 &&
          t->nbytes == 3 && memcmp(t->data, bytes, 3) == 0, "bytes");
    t = st_find(&f, "ids");
    int32_t ids_back[4] = {0};
    if (t && t->nbytes == sizeof ids_back) memcpy(ids_back, t->data, sizeof ids_back);  /* unaligned */
    CHECK(t && strcmp(t->dtype, "I32") == 0 && t->ndim == 1 && t->shape[0] == 4 &&
          memcmp(ids_back, ids, sizeof ids) == 0, "ids");
    t = st_find(&f, "empty");
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 5 && t->nbytes == 0, "empty");
    CHECK(st_find(&f, "absent") == NULL, "st_find of an absent name");

    CHECK(f.n_meta == 2, "n_meta %d", f.n_meta);
    const char *m = st_meta(&f, "format");
    CHECK(m && strcmp(m, "pt2") == 0, "format = %s", m ? m : "(null)");
    m = st_meta(&f, "note");
    CHECK(m && strcmp(m, "quotes \" and \\ survive") == 0, "note = %s", m ? m : "(null)");
    CHECK(st_meta(&f, "absent") == NULL, "st_meta of an absent key");
    st_free(&f);
    CHECK(f.blob == NULL && f.n_tensors == 0, "st_free clears the struct");

    /* A file with no tensors and no metadata is legal: "{}" padded to 8 bytes. */
    rc = st_writer_save(st_writer_new(), tpath("empty.safetensors"), err, sizeof err);
    CHECK(rc == 0, "empty save: %s", err);
    rc = st_read(tpath("empty.safetensors"), &f, err, sizeof err);
    CHECK(rc == 0 && f.n_tensors == 0 && f.n_meta == 0, "empty read: %s", err);
    st_free(&f);

    CHECK(st_dtype_size("F32") == 4 && st_dtype_size("I32") == 4 && st_dtype_size("BF16") == 2 &&
          st_dtype_size("F16") == 2 && st_dtype_size("I64") == 8 && st_dtype_size("U8") == 1 &&
          st_dtype_size("F8_E4M3") == 1 && st_dtype_size("F8_E5M2") == 1 &&
          st_dtype_size("F31") == 0 && st_dtype_size("f32") == 0, "st_dtype_size");
}

static void test_writer_errors(void) {
    char err[512];
    float x[2] = {1, 2};
    int64_t shape[1] = {2};

    st_writer *w = st_writer_new();
    st_writer_add(w, "x", "F31", shape, 1, x);
    int rc = st_writer_save(w, tpath("bad_dtype_w.safetensors"), err, sizeof err);
    CHECK(rc == -1 && strstr(err, "unknown dtype 'F31'"), "writer, unknown dtype: %s", err);
    CHECK(access(tpath("bad_dtype_w.safetensors"), F_OK) != 0, "a failed save left a file");

    w = st_writer_new();
    st_writer_add(w, "x", "F32", shape, 1, x);
    st_writer_add(w, "x", "F32", shape, 1, x);
    rc = st_writer_save(w, tpath("dup_w.safetensors"), err, sizeof err);
    CHECK(rc == -1 && strstr(err, "added twice"), "writer, duplicate: %s", err);

    w = st_writer_new();
    st_writer_add(w, "x", "F32", shape, 1, x);
    rc = st_writer_save(w, tpath("no_such_dir/x.safetensors"), err, sizeof err);
    CHECK(rc == -1 && strstr(err, "cannot create"), "writer, missing directory: %s", err);
}

static void test_reader_errors(void) {
    char err[512];
    const char *p;

    /* Truncated: a good file with its last 2 bytes cut off, and one cut to 5 bytes. */
    float v[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    st_writer *w = st_writer_new();
    st_writer_add(w, "v", "F32", shape, 1, v);
    CHECK(st_writer_save(w, tpath("good.safetensors"), err, sizeof err) == 0, "save: %s", err);
    FILE *fp = fopen(tpath("good.safetensors"), "rb");
    unsigned char buf[256];
    size_t n = fp ? fread(buf, 1, sizeof buf, fp) : 0;
    if (fp) fclose(fp);
    p = tpath("truncated.safetensors");
    fp = fopen(p, "wb");
    if (fp) { fwrite(buf, 1, n - 2, fp); fclose(fp); }
    expect_reject(p, "run past the end of the data section", "a truncated file");
    p = tpath("stub.safetensors");
    fp = fopen(p, "wb");
    if (fp) { fwrite(buf, 1, 5, fp); fclose(fp); }
    expect_reject(p, "too short for the 8-byte header length", "a 5-byte file");

    /* The length field claims 4096 bytes of header in a small file. */
    p = tpath("hlen.safetensors");
    write_raw(p, 4096, "{\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect_reject(p, "header length 4096 runs past the end of the file", "a header length past the end");

    p = tpath("json.safetensors");
    write_st(p, "{\"v\":{\"dtype\":\"F32\",\"shape\":[1],", 4);
    expect_reject(p, "bad JSON in the header", "bad JSON");

    p = tpath("range.safetensors");
    write_st(p, "{\"v\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8);
    expect_reject(p, "data_offsets [0, 16] that run past the end of the data section (8 bytes",
                  "data_offsets out of range");

    p = tpath("size.safetensors");
    write_st(p, "{\"v\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20);
    expect_reject(p, "shape [2, 3] and dtype F32 needs 24 bytes but data_offsets [0, 20] hold 20",
                  "offsets that disagree with shape");

    p = tpath("dtype.safetensors");
    write_st(p, "{\"v\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect_reject(p, "unknown dtype 'F31'", "an unknown dtype");

    p = tpath("does_not_exist.safetensors");
    expect_reject(p, "cannot open: No such file or directory", "a missing file");

    /* More of what the spec forbids. */
    p = tpath("order.safetensors");
    write_st(p, "{\"v\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4);
    expect_reject(p, "end before they begin", "begin > end");

    p = tpath("gap.safetensors");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12);
    expect_reject(p, "a gap", "a gap between tensors");

    p = tpath("overlap.safetensors");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    expect_reject(p, "an overlap", "overlapping tensors");

    p = tpath("tail.safetensors");
    write_st(p, "{\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12);
    expect_reject(p, "belong to no tensor", "data past the last tensor");

    p = tpath("dup.safetensors");
    write_st(p, "{\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    expect_reject(p, "appears twice", "a duplicate name");

    p = tpath("meta.safetensors");
    write_st(p, "{\"__metadata__\":{\"n\":3},"
                "\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect_reject(p, "metadata 'n' is not a string", "non-string metadata");

    p = tpath("negative.safetensors");
    write_st(p, "{\"v\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4);
    expect_reject(p, "not a non-negative integer", "a negative dimension");

    p = tpath("garbage.safetensors");
    write_st(p, "{\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}  x", 4);
    expect_reject(p, "after the header JSON", "bytes after the JSON");

    p = tpath("notjson.safetensors");
    write_st(p, "PK\x03\x04 not a header", 4);
    expect_reject(p, "does not start with '{'", "a header that is not JSON");

    /* A tiny err buffer truncates the message but never overflows. */
    char small[8];
    memset(small, 'x', sizeof small);
    st_file f;
    CHECK(st_read(tpath("does_not_exist.safetensors"), &f, small, sizeof small) == -1 &&
          small[7] == '\0', "short err buffer");
    CHECK(st_read(tpath("does_not_exist.safetensors"), &f, NULL, 0) == -1, "NULL err buffer");
}

/* The exports of DESIGN.md, read back with nothing but st_read and fopen. */
static void test_dump(void) {
    llama_config c = llama_config_default();
    adamw_config o = adamw_config_default();
    int n = llama_num_params(&c);
    float **params = calloc((size_t)n, sizeof *params);
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(&c, i);
        params[i] = malloc((size_t)s.rows * s.cols * sizeof(float));
        for (int j = 0; j < s.rows * s.cols; j++) params[i][j] = (float)i + 1e-3f * (float)j;
    }
    const char *dir = tpath("dump/nested");   /* created by the dump (its parent too) */
    CHECK(dump_begin(dir) == 0, "dump_begin: %s", dump_error());
    CHECK(dump_params(dir, "init.safetensors", &c, &o, params) == 0, "dump_params: %s", dump_error());
    int B = 2, T = 3;
    int tokens[6] = {1, 2, 3, 4, 5, 6}, targets[6] = {2, 3, -100, 5, 6, 7};
    CHECK(dump_batch(dir, 4, tokens, targets, B, T) == 0, "dump_batch");
    CHECK(dump_loss(dir, 1, 9.0, NAN) == 0, "dump_loss 1");
    CHECK(dump_loss(dir, 2, 8.0, NAN) == 0, "dump_loss 2");
    CHECK(dump_loss(dir, 1, 4.8520441055297852, NAN) == 0, "dump_loss 1 again");
    CHECK(dump_loss(dir, 2, 1.0 / 3.0, NAN) == 0, "dump_loss 2 again");
    CHECK(dump_loss(dir, 3, 0.25, 3e-4) == 0, "dump_loss 3 with its scheduled lr");
    CHECK(dump_commit() == 0, "dump_commit: %s", dump_error());

    char path[300], err[512];
    snprintf(path, sizeof path, "%s/init.safetensors", dir);
    st_file f;
    int rc = st_read(path, &f, err, sizeof err);
    CHECK(rc == 0, "read init: %s", err);
    if (rc == 0) {
        CHECK(f.n_tensors == n, "init has %d tensors, want %d", f.n_tensors, n);
        for (int i = 0; i < n && i < f.n_tensors; i++) {
            param_spec s = llama_param_spec(&c, i);
            const st_tensor *t = &f.tensors[i];
            int shape_ok = s.is_vector ? (t->ndim == 1 && t->shape[0] == s.cols)
                                       : (t->ndim == 2 && t->shape[0] == s.rows && t->shape[1] == s.cols);
            CHECK(strcmp(t->name, s.name) == 0 && strcmp(t->dtype, "F32") == 0 && shape_ok &&
                  memcmp(t->data, params[i], t->nbytes) == 0, "init tensor %d (%s)", i, s.name);
        }
        const st_tensor *nw = st_find(&f, "norm.weight");
        CHECK(nw && nw->ndim == 1 && nw->shape[0] == c.dim, "norm.weight is [dim]");
        char want[32];
        const char *m = st_meta(&f, "dim");
        snprintf(want, sizeof want, "%d", c.dim);
        CHECK(m && strcmp(m, want) == 0, "meta dim = %s, want %s", m ? m : "(null)", want);
        m = st_meta(&f, "lr");
        CHECK(m && (float)atof(m) == o.lr, "meta lr = %s", m ? m : "(null)");
        m = st_meta(&f, "norm_eps");
        CHECK(m && (float)atof(m) == c.norm_eps, "meta norm_eps = %s", m ? m : "(null)");
        const char *keys[] = {"dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size",
                              "seq_len", "norm_eps", "rope_theta", "lr", "beta1", "beta2", "eps",
                              "weight_decay"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            CHECK(st_meta(&f, keys[k]) != NULL, "metadata '%s' missing", keys[k]);
        st_free(&f);
    }
    for (int i = 0; i < n; i++) free(params[i]);
    free(params);

    snprintf(path, sizeof path, "%s/batch_4.safetensors", dir);
    rc = st_read(path, &f, err, sizeof err);
    CHECK(rc == 0, "read batch: %s", err);
    if (rc == 0) {
        const st_tensor *tk = st_find(&f, "tokens"), *tg = st_find(&f, "targets");
        CHECK(tk && strcmp(tk->dtype, "I32") == 0 && tk->ndim == 2 && tk->shape[0] == B &&
              tk->shape[1] == T && memcmp(tk->data, tokens, sizeof tokens) == 0, "tokens");
        CHECK(tg && strcmp(tg->dtype, "I32") == 0 && tg->ndim == 2 &&
              memcmp(tg->data, targets, sizeof targets) == 0, "targets");
        st_free(&f);
    }

    /* losses.txt: step 1 truncates (a stale line from an earlier run must vanish). */
    snprintf(path, sizeof path, "%s/losses.txt", dir);
    FILE *fp = fopen(path, "r");
    char text[256] = {0};
    size_t got = fp ? fread(text, 1, sizeof text - 1, fp) : 0;
    if (fp) fclose(fp);
    CHECK(got > 0 && strcmp(text, "1 4.85204411\n2 0.333333333\n3 0.25 0.0003\n") == 0, "losses.txt is '%s'", text);
}

/* ---- atomic dumps ---- */

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* The number of entries in a directory (-1 if it cannot be read). */
static int count_entries(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls -A '%s' 2>/dev/null | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = -1;
        pclose(p);
    }
    return exists(dir) ? n : -1;
}

/* The temporaries beside `path` (PATH.tmp.<pid>.<random>, files.h: temp_name) made by this
 * process: how many there are, and the last one's full name in found[len] ("" if none). */
static int temps_of(const char *path, char *found, size_t len) {
    char parent[400], prefix[200];
    const char *slash = strrchr(path, '/');
    snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    snprintf(prefix, sizeof prefix, "%s.tmp.%ld.", slash ? slash + 1 : path, (long)getpid());
    if (found && len) found[0] = 0;
    int n = 0;
    DIR *d = opendir(parent);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            n++;
            if (found && strlen(parent) + strlen(e->d_name) + 2 <= len) { strcpy(found, parent); strcat(found, "/"); strcat(found, e->d_name); }
        }
    if (d) closedir(d);
    return n;
}

/* The whole text of a small file ("" if missing) in a static buffer. */
static const char *slurp(const char *path) {
    static char text[256];
    memset(text, 0, sizeof text);
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        fclose(f);
    }
    return text;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) { fputs(text, f); fclose(f); }
}

static void test_dump_atomic(void) {
    char dir[300], tmp[400], p[600];
    snprintf(dir, sizeof dir, "%s", tpath("atomic"));
    int tok[4] = {1, 2, 3, 4}, tgt[4] = {2, 3, 4, -100};

    /* a. nothing at DIR until the commit (the dump is written in DIR.tmp.<pid>.<random>);
     *    everything there after it, and no temporary left */
    CHECK(dump_begin(dir) == 0, "begin: %s", dump_error());
    CHECK(temps_of(dir, tmp, sizeof tmp) == 1 && exists(tmp) && !exists(dir), "before the commit: %d temporaries, dir %d",
          temps_of(dir, NULL, 0), exists(dir));
    for (int k = 1; k <= 3; k++) CHECK(dump_batch(dir, k, tok, tgt, 2, 2) == 0, "batch %d", k);
    CHECK(dump_loss(dir, 1, 5.0, NAN) == 0 && dump_loss(dir, 2, 4.0, NAN) == 0 && dump_loss(dir, 3, 3.0, NAN) == 0, "losses");
    CHECK(!exists(dir), "DIR appeared before dump_commit");
    CHECK(dump_commit() == 0, "commit: %s", dump_error());
    CHECK(count_entries(dir) == 4 && temps_of(dir, NULL, 0) == 0, "after the commit: %d entries, %d temporaries",
          count_entries(dir), temps_of(dir, NULL, 0));

    /* b. a shorter second dump replaces the first whole: no stale batch_2, batch_3 */
    snprintf(p, sizeof p, "%s/", dir);   /* a trailing '/' names the same directory */
    CHECK(dump_begin(p) == 0, "begin 2: %s", dump_error());
    CHECK(dump_batch(p, 1, tok, tgt, 2, 2) == 0 && dump_loss(p, 1, 7.0, NAN) == 0, "dump 2");
    snprintf(p, sizeof p, "%s/losses.txt", dir);
    CHECK(strcmp(slurp(p), "1 5\n2 4\n3 3\n") == 0, "the first dump changed before the commit: '%s'", slurp(p));
    CHECK(dump_commit() == 0, "commit 2: %s", dump_error());
    snprintf(p, sizeof p, "%s/batch_2.safetensors", dir);
    CHECK(!exists(p), "a stale batch_2 of the longer first dump is still there");
    snprintf(p, sizeof p, "%s/losses.txt", dir);
    CHECK(count_entries(dir) == 2 && strcmp(slurp(p), "1 7\n") == 0, "second dump: %d entries, losses '%s'",
          count_entries(dir), slurp(p));
    CHECK(temps_of(dir, NULL, 0) == 0, "the old dump was not removed");

    /* c. dump_abort leaves DIR as it was */
    CHECK(dump_begin(dir) == 0, "begin 3: %s", dump_error());
    CHECK(dump_loss(dir, 1, 99.0, NAN) == 0 && dump_batch(dir, 5, tok, tgt, 2, 2) == 0, "dump 3");
    dump_abort();
    CHECK(temps_of(dir, NULL, 0) == 0 && count_entries(dir) == 2 && strcmp(slurp(p), "1 7\n") == 0,
          "after dump_abort: %d temporaries, %d entries, losses '%s'", temps_of(dir, NULL, 0), count_entries(dir),
          slurp(p));
    dump_abort();   /* twice is harmless */

    /* d. a write that fails half-way (a file size limit: EFBIG, as a full disk gives ENOSPC)
     *    leaves no half-written file, and after dump_abort DIR is as it was */
    llama_config c = llama_config_default();
    adamw_config o = adamw_config_default();
    int n = llama_num_params(&c);
    float **params = calloc((size_t)n, sizeof *params);
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(&c, i);
        params[i] = calloc((size_t)s.rows * s.cols, sizeof(float));
    }
    CHECK(dump_begin(dir) == 0, "begin 4: %s", dump_error());
    CHECK(temps_of(dir, tmp, sizeof tmp) == 1, "begin 4: %d temporaries", temps_of(dir, NULL, 0));
    CHECK(dump_batch(dir, 1, tok, tgt, 2, 2) == 0, "batch before the failure");
    struct rlimit old, small = {4096, 4096};
    getrlimit(RLIMIT_FSIZE, &old);
    small.rlim_max = old.rlim_max;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &small);
    int rc = dump_params(dir, "init.safetensors", &c, &o, params);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    CHECK(rc == -1 && strstr(dump_error(), "File too large") && !strchr(dump_error(), '\n'),
          "a failed write: rc %d, error '%s'", rc, dump_error());
    snprintf(p, sizeof p, "%s/init.safetensors", tmp);
    CHECK(exists(tmp) && !exists(p) && temps_of(p, NULL, 0) == 0, "the failed write left %s or its temporary", p);
    dump_abort();
    snprintf(p, sizeof p, "%s/losses.txt", dir);
    CHECK(!exists(tmp) && temps_of(dir, NULL, 0) == 0 && count_entries(dir) == 2 && strcmp(slurp(p), "1 7\n") == 0,
          "after a failed write and dump_abort: %d temporaries, %d entries", temps_of(dir, NULL, 0), count_entries(dir));
    for (int i = 0; i < n; i++) free(params[i]);
    free(params);

    /* e. refusals, each with a one-line reason, touching nothing */
    snprintf(p, sizeof p, "%s", tpath("a_file"));
    write_text(p, "x");
    CHECK(dump_begin(p) == -1 && strstr(dump_error(), "is not a directory"), "a regular file: %s", dump_error());
    snprintf(p, sizeof p, "%s", tpath("mine"));
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/notes.txt", tpath("mine"));
    write_text(p, "keep me");
    CHECK(dump_begin(tpath("mine")) == -1 && strstr(dump_error(), "notes.txt") &&
          strstr(dump_error(), "new or empty"), "a directory with other files: %s", dump_error());
    CHECK(strcmp(slurp(p), "keep me") == 0, "a refused directory was touched");
    CHECK(dump_begin("") == -1 && strstr(dump_error(), "empty"), "an empty path: %s", dump_error());
    CHECK(dump_begin("/") == -1, "/ as a dump directory");
    CHECK(dump_commit() == -1, "dump_commit without dump_begin");
    CHECK(!strchr(dump_error(), '\n'), "a reason is one line: %s", dump_error());

    /* f. an empty directory (as cli_require_output_dir leaves it) is replaced; a missing parent
     *    is created */
    snprintf(p, sizeof p, "%s", tpath("empty_first"));
    mkdir(p, 0755);
    CHECK(dump_begin(p) == 0 && dump_loss(p, 1, 1.0, NAN) == 0 && dump_commit() == 0, "into an empty dir: %s",
          dump_error());
    snprintf(p, sizeof p, "%s/losses.txt", tpath("empty_first"));
    CHECK(strcmp(slurp(p), "1 1\n") == 0, "empty dir: losses '%s'", slurp(p));
    snprintf(p, sizeof p, "%s", tpath("new_parent/sub/d"));
    CHECK(dump_begin(p) == 0 && dump_loss(p, 1, 2.0, NAN) == 0 && dump_commit() == 0, "missing parents: %s",
          dump_error());
    snprintf(p, sizeof p, "%s/losses.txt", tpath("new_parent/sub/d"));
    CHECK(strcmp(slurp(p), "1 2\n") == 0, "missing parents: losses '%s'", slurp(p));
}

/* ---- make_dirs ---- */

static void test_make_dirs(void) {
    errno = 0;
    CHECK(make_dirs("") == -1 && errno == ENOENT, "an empty path: errno %d", errno);
    CHECK(make_dirs(NULL) == -1, "a NULL path");
    write_text(tpath("plain_file"), "x");
    CHECK(make_dirs(tpath("plain_file")) == -1 && errno == ENOTDIR, "a file in the way: errno %d", errno);
    CHECK(make_dirs(tpath("plain_file/sub")) == -1, "a file as a parent");
    CHECK(make_dirs("/proc/no_such_dir_here") == -1 && !exists("/proc/no_such_dir_here"), "/proc/x");
    CHECK(make_dirs(tpath("md/a/b/")) == 0 && exists(tpath("md/a/b")), "a trailing '/'");
    CHECK(make_dirs(tpath("md//c")) == 0 && exists(tpath("md/c")), "a double '/'");

    /* an overlong last component fails (ENAMETOOLONG) and the parents it made are removed */
    char *p = malloc(8192);
    int k = snprintf(p, 8192, "%s/undo/x/", tmpdir);
    memset(p + k, 'n', 300);
    p[k + 300] = 0;
    CHECK(make_dirs(p) == -1 && errno == ENAMETOOLONG, "a 300-byte name: errno %d", errno);
    CHECK(!exists(tpath("undo")), "a failed make_dirs left the directories it created");

    /* a path over PATH_MAX is refused, not cut */
    k = snprintf(p, 8192, "%s/", tmpdir);
    for (int i = k; i < 8000; i++) p[i] = (i % 100 == 99) ? '/' : 'd';
    p[8000] = 0;
    CHECK(make_dirs(p) == -1 && errno == ENAMETOOLONG, "an 8000-byte path: errno %d", errno);

    /* a long path (over the old 1024-byte buffer) is created whole */
    k = snprintf(p, 8192, "%s/long/", tmpdir);
    for (int i = k; i < 1500; i++) p[i] = (i % 100 == 99) ? '/' : 'l';
    p[1500] = 0;
    CHECK(make_dirs(p) == 0 && exists(p), "a 1500-byte path");
    free(p);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    verbose = getenv("TEST_VERBOSE") != NULL;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_safetensors_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }

    test_round_trip();
    test_writer_errors();
    test_reader_errors();
    test_dump();
    test_dump_atomic();
    test_make_dirs();

    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    comm_finalize();
    return tu_finish("test_safetensors");
}
