/* safetensors.c: a strict reader and a simple writer of the safetensors format.
 *
 * The format (https://github.com/huggingface/safetensors) is three parts:
 *
 *     [ N: u64, little-endian ][ N bytes of JSON header ][ data section ]
 *
 * The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, where
 * the offsets are byte positions inside the data section. An optional "__metadata__" entry maps
 * strings to strings. The spec also asks that the header start with '{', that it may be padded
 * with trailing spaces (writers use this to align the data section), that the tensors cover the
 * data section exactly (no gaps, no overlaps), and that tensor data be little-endian, row-major.
 *
 * Why a strict reader: every file this tutorial reads was written by a run (dumps, checkpoints)
 * and a corrupt one should fail loudly with the exact problem, never hand out a pointer past
 * the end of a buffer. So every number in the header is checked against the file before use,
 * and every failure leaves ONE line in `err`: "<path>: <what is wrong>".
 */
#include "files.h"
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tensor data is handed out as raw pointers into the file, so the host must share the file's
 * byte order. Every platform this tutorial targets (x86-64, aarch64) is little-endian. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian and this reader assumes a little-endian host"
#endif

/* The reference implementation refuses headers above 100 MB (a guard against hostile files). */
#define ST_MAX_HEADER ((uint64_t)100 << 20)
/* cJSON stores every number as a double, which holds integers exactly up to 2^53. */
#define ST_MAX_JSON_INT 9007199254740992.0

#define ST_META_KEY_MAX   ((int)sizeof(((st_file *)0)->meta_keys[0]))     /* 128, with the NUL */
#define ST_META_VALUE_MAX ((int)sizeof(((st_file *)0)->meta_values[0]))   /* 256, with the NUL */

/* ------------------------------------------------------------------------------ dtypes */

typedef struct { const char *name; size_t size; } st_dtype_info;

/* Every dtype the spec names, with its element size in bytes. The tutorial itself writes F32
 * and I32 (and U8 for fp8 payloads); the others are accepted so foreign files read too. */
static const st_dtype_info st_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},
    {"I32", 4},  {"U32", 4}, {"F32", 4},
    {"I64", 8},  {"U64", 8}, {"F64", 8},
};
#define ST_N_DTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

/* Reads: dtype. Returns its element size in bytes, 0 when the name is not a known dtype. */
size_t st_dtype_size(const char *dtype) {
    if (!dtype) return 0;
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (strcmp(st_dtypes[i].name, dtype) == 0) return st_dtypes[i].size;
    return 0;
}

/* ------------------------------------------------------------------------------ errors */

/* Writes "<path>: <message>" into err (when there is room for it) and returns -1, so that a
 * check reads as `if (bad) return st_fail(...)`. */
static int st_fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int st_fail(char *err, size_t errlen, const char *path, const char *fmt, ...) {
    if (!err || errlen == 0) return -1;
    int n = snprintf(err, errlen, "%s: ", path ? path : "(null)");
    if (n < 0 || (size_t)n >= errlen) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Formats a shape as "[2, 3]" into buf (for error messages). */
static const char *st_shape_str(char *buf, size_t len, const int64_t *shape, int ndim) {
    size_t used = 0;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

/* ------------------------------------------------------------------------------ reading */

/* The 8-byte little-endian header length, assembled byte by byte so it is right on any host. */
static uint64_t st_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Reads: a cJSON item. Writes: *v. Returns 1 when the item is a non-negative integer that a
 * double holds exactly (the only kind of number a shape or an offset may be), else 0. */
static int st_json_uint(const cJSON *item, uint64_t *v) {
    if (!cJSON_IsNumber(item)) return 0;
    double d = item->valuedouble;
    if (!(d >= 0.0) || d > ST_MAX_JSON_INT || d != (double)(uint64_t)d) return 0;
    *v = (uint64_t)d;
    return 1;
}

/* Parses one header entry `item` (a tensor) into *t, checking it against the data section
 * [data, data + data_size). Writes: *t, *begin_out, *end_out. Returns 0, or -1 with err set. */
static int st_parse_tensor(const char *path, const cJSON *item, const unsigned char *data,
                           size_t data_size, st_tensor *t, uint64_t *begin_out, uint64_t *end_out,
                           char *err, size_t errlen) {
    const char *name = item->string;
    char shp[160];
    if (strlen(name) >= ST_MAX_NAME)
        return st_fail(err, errlen, path, "tensor name '%.40s...' is %zu bytes, the limit is %d",
                       name, strlen(name), ST_MAX_NAME - 1);
    if (!cJSON_IsObject(item))
        return st_fail(err, errlen, path, "tensor '%s' is not a JSON object", name);
    memset(t, 0, sizeof *t);
    strcpy(t->name, name);

    /* dtype: a string naming a known element type. */
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    if (!cJSON_IsString(dtype))
        return st_fail(err, errlen, path, "tensor '%s' has no \"dtype\" string", name);
    size_t esize = st_dtype_size(dtype->valuestring);
    if (esize == 0)
        return st_fail(err, errlen, path,
                       "tensor '%s' has unknown dtype '%.32s' (known: F32, F16, BF16, F64, I64, I32, "
                       "I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2)", name, dtype->valuestring);
    strcpy(t->dtype, dtype->valuestring);   /* fits: every known name is shorter than 8 */

    /* shape: an array of at most ST_MAX_DIMS non-negative integers ([] is a scalar). */
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    if (!cJSON_IsArray(shape))
        return st_fail(err, errlen, path, "tensor '%s' has no \"shape\" array", name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > ST_MAX_DIMS)
        return st_fail(err, errlen, path, "tensor '%s' has %d dimensions, the limit is %d",
                       name, ndim, ST_MAX_DIMS);
    t->ndim = ndim;
    uint64_t nelem = 1;
    int overflow = 0;
    const cJSON *dim;
    int d = 0;
    cJSON_ArrayForEach(dim, shape) {
        uint64_t v;
        if (!st_json_uint(dim, &v))
            return st_fail(err, errlen, path,
                           "tensor '%s' has shape entry %d that is not a non-negative integer",
                           name, d);
        t->shape[d++] = (int64_t)v;
        /* The product may not fit in 64 bits for a hostile shape; remember, and reject below. */
        if (__builtin_mul_overflow(nelem, v, &nelem)) overflow = 1;
    }
    uint64_t need = 0;
    if (__builtin_mul_overflow(nelem, (uint64_t)esize, &need)) overflow = 1;

    /* data_offsets: [begin, end] with begin <= end <= size of the data section. */
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !st_json_uint(cJSON_GetArrayItem(offs, 0), &begin) ||
        !st_json_uint(cJSON_GetArrayItem(offs, 1), &end))
        return st_fail(err, errlen, path,
                       "tensor '%s' needs \"data_offsets\": [begin, end] of non-negative integers",
                       name);
    if (begin > end)
        return st_fail(err, errlen, path, "tensor '%s' has data_offsets [%" PRIu64 ", %" PRIu64
                       "] that end before they begin", name, begin, end);
    if (end > data_size)
        return st_fail(err, errlen, path, "tensor '%s' has data_offsets [%" PRIu64 ", %" PRIu64
                       "] that run past the end of the data section (%zu bytes; truncated file?)",
                       name, begin, end, data_size);

    /* The byte range must be exactly what the shape and dtype call for. */
    st_shape_str(shp, sizeof shp, t->shape, ndim);
    if (overflow || need != end - begin)
        return st_fail(err, errlen, path, "tensor '%s' of shape %s and dtype %s needs %s%" PRIu64
                       " bytes but data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64,
                       name, shp, t->dtype, overflow ? "more than " : "",
                       overflow ? UINT64_MAX : need, begin, end, end - begin);
    t->nbytes = (size_t)need;
    /* A pointer into the loaded file. Files we write keep F32/I32 tensors 4-byte aligned (the
     * data section starts 8-aligned and our tensors have 4-byte multiples); a foreign file that
     * mixes dtypes may not, so code reading one of those should memcpy rather than cast. */
    t->data = data + begin;
    *begin_out = begin;
    *end_out = end;
    return 0;
}

/* Parses "__metadata__" (a string -> string object) into f->meta_keys / meta_values.
 * Writes: f->n_meta and the two arrays (allocated here). Returns 0, or -1 with err set. */
static int st_parse_metadata(const char *path, const cJSON *meta, st_file *f, char *err,
                             size_t errlen) {
    if (!cJSON_IsObject(meta))
        return st_fail(err, errlen, path, "\"__metadata__\" is not a JSON object");
    int n = cJSON_GetArraySize(meta);
    f->meta_keys = calloc((size_t)(n ? n : 1), sizeof *f->meta_keys);
    f->meta_values = calloc((size_t)(n ? n : 1), sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values)
        return st_fail(err, errlen, path, "out of memory for %d metadata entries", n);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, meta) {
        if (!cJSON_IsString(kv))
            return st_fail(err, errlen, path,
                           "metadata '%.64s' is not a string (the spec allows only strings)",
                           kv->string);
        if (strlen(kv->string) >= (size_t)ST_META_KEY_MAX)
            return st_fail(err, errlen, path, "metadata key '%.40s...' is longer than %d bytes",
                           kv->string, ST_META_KEY_MAX - 1);
        if (strlen(kv->valuestring) >= (size_t)ST_META_VALUE_MAX)
            return st_fail(err, errlen, path, "metadata '%s' has a value longer than %d bytes",
                           kv->string, ST_META_VALUE_MAX - 1);
        if (st_meta(f, kv->string))
            return st_fail(err, errlen, path, "metadata key '%s' appears twice", kv->string);
        strcpy(f->meta_keys[f->n_meta], kv->string);
        strcpy(f->meta_values[f->n_meta], kv->valuestring);
        f->n_meta++;
    }
    return 0;
}

/* A tensor's byte range, for the "no gaps, no overlaps" check. */
typedef struct { uint64_t begin, end; int index; } st_range;

static int st_range_cmp(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->index - y->index;
}

/* Parses the header object `root` of a file whose data section is [data, data + data_size).
 * Writes: the tensors and metadata of *f. Returns 0, or -1 with err set. */
static int st_parse_header(const char *path, const cJSON *root, const unsigned char *data,
                           size_t data_size, st_file *f, char *err, size_t errlen) {
    if (!cJSON_IsObject(root)) return st_fail(err, errlen, path, "header is not a JSON object");

    int n_entries = cJSON_GetArraySize(root);
    f->tensors = calloc((size_t)(n_entries ? n_entries : 1), sizeof *f->tensors);
    st_range *ranges = calloc((size_t)(n_entries ? n_entries : 1), sizeof *ranges);
    if (!f->tensors || !ranges) {
        free(ranges);
        return st_fail(err, errlen, path, "out of memory for %d header entries", n_entries);
    }

    int rc = 0, seen_meta = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (seen_meta++) { rc = st_fail(err, errlen, path, "\"__metadata__\" appears twice"); break; }
            if ((rc = st_parse_metadata(path, item, f, err, errlen)) != 0) break;
            continue;
        }
        /* JSON parsers keep duplicate keys; two tensors of one name would be ambiguous. */
        if (st_find(f, item->string)) {
            rc = st_fail(err, errlen, path, "tensor '%.200s' appears twice in the header", item->string);
            break;
        }
        st_range *r = &ranges[f->n_tensors];
        rc = st_parse_tensor(path, item, data, data_size, &f->tensors[f->n_tensors],
                             &r->begin, &r->end, err, errlen);
        if (rc) break;
        r->index = f->n_tensors++;
    }

    /* The tensors must tile the data section: sorted by offset, each begins where the previous
     * ends, the first at 0 and the last at the end. This is the spec's rule, and it rules out
     * two names sharing bytes or bytes that belong to no tensor. */
    if (rc == 0) {
        qsort(ranges, (size_t)f->n_tensors, sizeof *ranges, st_range_cmp);
        uint64_t at = 0;
        for (int i = 0; i < f->n_tensors && rc == 0; i++) {
            if (ranges[i].begin != at)
                rc = st_fail(err, errlen, path,
                             "tensor '%s' starts at byte %" PRIu64 " of the data section but the "
                             "previous tensor ends at %" PRIu64 " (%s; the spec forbids it)",
                             f->tensors[ranges[i].index].name, ranges[i].begin, at,
                             ranges[i].begin > at ? "a gap" : "an overlap");
            at = ranges[i].end;
        }
        if (rc == 0 && at != data_size)
            rc = st_fail(err, errlen, path, "the tensors cover %" PRIu64 " bytes but the data "
                         "section has %zu (trailing bytes that belong to no tensor)", at, data_size);
    }
    free(ranges);
    return rc;
}

int st_read(const char *path, st_file *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (err && errlen) err[0] = '\0';

    unsigned char *blob;
    size_t size;
    char why[256];
    if (read_file(path, &blob, &size, why, sizeof why) != 0) return st_fail(err, errlen, path, "%s", why);
    out->blob = blob;
    out->blob_size = size;

    /* 1. The header length: 8 bytes, and the header must fit in what follows them. */
    if (size < 8) {
        st_free(out);
        return st_fail(err, errlen, path, "file is %zu bytes, too short for the 8-byte header "
                       "length (truncated file?)", size);
    }
    uint64_t hlen = st_le64(blob);
    if (hlen > size - 8) {
        st_free(out);
        return st_fail(err, errlen, path, "header length %" PRIu64 " runs past the end of the "
                       "file (%zu bytes; truncated or not a safetensors file?)", hlen, size);
    }
    if (hlen > ST_MAX_HEADER) {
        st_free(out);
        return st_fail(err, errlen, path, "header length %" PRIu64 " is above the format's "
                       "limit of %" PRIu64 " bytes", hlen, ST_MAX_HEADER);
    }
    if (hlen == 0 || blob[8] != '{') {
        st_free(out);
        return st_fail(err, errlen, path, "header does not start with '{' (not a safetensors "
                       "file?)");
    }

    /* 2. The JSON. cJSON wants a NUL-terminated string; the header in the file has none, so
     * parse a copy. return_parse_end tells where the JSON stopped (or where it went wrong). */
    char *text = malloc((size_t)hlen + 1);
    if (!text) {
        st_free(out);
        return st_fail(err, errlen, path, "out of memory for a %" PRIu64 "-byte header", hlen);
    }
    memcpy(text, blob + 8, (size_t)hlen);
    text[hlen] = '\0';
    const char *stop = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &stop, 0);
    size_t at = stop ? (size_t)(stop - text) : 0;
    int rc = 0;
    if (!root) {
        rc = st_fail(err, errlen, path, "bad JSON in the header near byte %zu of %" PRIu64, at,
                     hlen);
    } else {
        /* Only whitespace may follow the JSON: writers pad the header with spaces so the data
         * section starts on an aligned offset. */
        for (size_t i = at; i < hlen && rc == 0; i++)
            if (!strchr(" \t\r\n", text[i]) || text[i] == '\0')
                rc = st_fail(err, errlen, path, "unexpected byte 0x%02x after the header JSON at "
                             "byte %zu (only whitespace may pad the header)",
                             (unsigned char)text[i], i);
    }

    /* 3. The entries, checked against the data section. */
    if (rc == 0)
        rc = st_parse_header(path, root, blob + 8 + hlen, size - 8 - (size_t)hlen, out, err,
                             errlen);
    cJSON_Delete(root);
    free(text);
    if (rc != 0) st_free(out);
    return rc;
}

void st_free(st_file *f) {
    if (!f) return;
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->blob);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *st_meta(const st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

/* ------------------------------------------------------------------------------ writing */

typedef struct {
    char name[ST_MAX_NAME];
    char dtype[8];
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t nbytes;
    void *data;                  /* our own copy */
} st_wtensor;

typedef struct { char *key, *value; } st_kv;

struct st_writer {
    int n, cap;
    st_wtensor *t;               /* tensors in the order added: that is their order in the file */
    int n_meta, meta_cap;
    st_kv *meta;                 /* metadata in the order set */
    /* st_writer_add and st_writer_meta return nothing, so the first problem they meet is kept
     * here and reported by st_writer_save (which then writes nothing). */
    char error[256];
};

/* Records the writer's first problem (later ones are usually consequences of it). */
static void st_writer_error(st_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void st_writer_error(st_writer *w, const char *fmt, ...) {
    if (w->error[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
}

st_writer *st_writer_new(void) {
    return calloc(1, sizeof(st_writer));   /* NULL on failure; the other calls accept NULL */
}

/* Reads: name, dtype, shape[ndim], and nbytes = product(shape) * dtype size bytes of data.
 * Writes: a copy of all of it at the end of the writer's list. */
void st_writer_add(st_writer *w, const char *name, const char *dtype, const int64_t *shape,
                   int ndim, const void *data) {
    if (!w || w->error[0]) return;
    if (!name || !name[0] || strlen(name) >= ST_MAX_NAME) {
        st_writer_error(w, "tensor name '%.40s' is empty or longer than %d bytes",
                        name ? name : "", ST_MAX_NAME - 1);
        return;
    }
    if (strcmp(name, "__metadata__") == 0) {
        st_writer_error(w, "'__metadata__' is reserved and cannot name a tensor");
        return;
    }
    size_t esize = st_dtype_size(dtype);
    if (esize == 0) {
        st_writer_error(w, "tensor '%s' has unknown dtype '%.32s'", name, dtype ? dtype : "");
        return;
    }
    if (ndim < 0 || ndim > ST_MAX_DIMS) {
        st_writer_error(w, "tensor '%s' has %d dimensions, valid: 0 to %d", name, ndim,
                        ST_MAX_DIMS);
        return;
    }
    size_t nbytes = esize;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(nbytes, (size_t)shape[d], &nbytes)) {
            st_writer_error(w, "tensor '%s' has an invalid shape entry %" PRId64, name, shape[d]);
            return;
        }
    }
    if (nbytes > 0 && !data) {
        st_writer_error(w, "tensor '%s' has no data", name);
        return;
    }
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0) {
            st_writer_error(w, "tensor '%s' is added twice", name);
            return;
        }
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        st_wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) { st_writer_error(w, "out of memory adding tensor '%s'", name); return; }
        w->t = t;
        w->cap = cap;
    }
    st_wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->data = malloc(nbytes ? nbytes : 1);
    if (!t->data) { st_writer_error(w, "out of memory copying tensor '%s'", name); return; }
    if (nbytes) memcpy(t->data, data, nbytes);
    strcpy(t->name, name);
    strcpy(t->dtype, dtype);
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->nbytes = nbytes;
    w->n++;
}

/* Reads: key, value. Writes: the pair into the writer's metadata; a second value for the same
 * key replaces the first. The limits are the reader's, so a file we write always reads back. */
void st_writer_meta(st_writer *w, const char *key, const char *value) {
    if (!w || w->error[0]) return;
    if (!key || !value) { st_writer_error(w, "metadata key or value is NULL"); return; }
    if (strlen(key) >= (size_t)ST_META_KEY_MAX || strlen(value) >= (size_t)ST_META_VALUE_MAX) {
        st_writer_error(w, "metadata '%.40s': key over %d or value over %d bytes", key,
                        ST_META_KEY_MAX - 1, ST_META_VALUE_MAX - 1);
        return;
    }
    char *v = strdup(value);
    if (!v) { st_writer_error(w, "out of memory for metadata '%s'", key); return; }
    for (int i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta[i].key, key) == 0) {
            free(w->meta[i].value);
            w->meta[i].value = v;
            return;
        }
    if (w->n_meta == w->meta_cap) {
        int cap = w->meta_cap ? 2 * w->meta_cap : 16;
        st_kv *m = realloc(w->meta, (size_t)cap * sizeof *m);
        if (!m) { free(v); st_writer_error(w, "out of memory for metadata '%s'", key); return; }
        w->meta = m;
        w->meta_cap = cap;
    }
    char *k = strdup(key);
    if (!k) { free(v); st_writer_error(w, "out of memory for metadata '%s'", key); return; }
    w->meta[w->n_meta].key = k;
    w->meta[w->n_meta].value = v;
    w->n_meta++;
}

static void st_writer_free(st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->t[i].data);
    for (int i = 0; i < w->n_meta; i++) { free(w->meta[i].key); free(w->meta[i].value); }
    free(w->t);
    free(w->meta);
    free(w);
}

/* A JSON integer printed exactly. cJSON prints numbers from a double, which would round
 * offsets past 2^53 and print large ones in exponent form; a raw item is written as given. */
static cJSON *st_json_int(int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_CreateRaw(buf);
}

/* Builds the header JSON of w: metadata first (as the reference writer does), then the tensors
 * in the order added, each right after the previous in the data section.
 * Returns a malloc'd string (cJSON_free it), or NULL when out of memory. */
static char *st_writer_header(const st_writer *w) {
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && w->n_meta > 0) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        ok = meta != NULL;
        for (int i = 0; ok && i < w->n_meta; i++)
            ok = cJSON_AddStringToObject(meta, w->meta[i].key, w->meta[i].value) != NULL;
    }
    int64_t offset = 0;
    for (int i = 0; ok && i < w->n; i++) {
        const st_wtensor *t = &w->t[i];
        cJSON *obj = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = obj ? cJSON_CreateArray() : NULL;
        cJSON *offs = shape ? cJSON_CreateArray() : NULL;
        ok = offs != NULL && cJSON_AddStringToObject(obj, "dtype", t->dtype) != NULL;
        if (shape) cJSON_AddItemToObject(obj, "shape", shape);
        if (offs) cJSON_AddItemToObject(obj, "data_offsets", offs);
        for (int d = 0; ok && d < t->ndim; d++) ok = cJSON_AddItemToArray(shape, st_json_int(t->shape[d]));
        if (ok) ok = cJSON_AddItemToArray(offs, st_json_int(offset));
        offset += (int64_t)t->nbytes;
        if (ok) ok = cJSON_AddItemToArray(offs, st_json_int(offset));
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return text;
}

int st_writer_save(st_writer *w, const char *path, char *err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    if (!w) return st_fail(err, errlen, path, "out of memory creating the writer");
    if (w->error[0]) {
        st_fail(err, errlen, path, "%s", w->error);
        st_writer_free(w);
        return -1;
    }
    char *header = st_writer_header(w);
    if (!header) {
        st_writer_free(w);
        return st_fail(err, errlen, path, "out of memory building the header");
    }

    /* Pad the header with spaces to a multiple of 8 bytes: the data section then starts at an
     * offset that is a multiple of 8, so F32/I32/I64 tensors land aligned in a loaded file. */
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7) / 8 * 8;
    unsigned char lenbytes[8];
    for (int i = 0; i < 8; i++) lenbytes[i] = (unsigned char)((uint64_t)padded >> (8 * i));

    /* Write to a new temporary beside it, then rename: a run killed mid-write leaves the previous
     * file (or none), never a half-written one under the real name. The temporary's name is this
     * run's own (files.h: temp_name, created with O_EXCL), so two runs writing the same path at
     * once never write into one file; and the file is never replaced through a link. */
    char *tmp = temp_name(path);
    FILE *fp = NULL;
    int rc = 0;
    if (!tmp) rc = st_fail(err, errlen, path, "out of memory");
    if (rc == 0 && path_is_link(path))
        rc = st_fail(err, errlen, path, "it is a symbolic link: the file is written aside and renamed into its place, "
                     "which would replace the link, not write where it points");
    if (rc == 0) {
        fp = create_new_file(tmp, "wb");
        if (!fp) rc = st_fail(err, errlen, path, "cannot create %s: %s", tmp, strerror(errno));
    }
    if (rc == 0) {
        int ok = fwrite(lenbytes, 1, 8, fp) == 8 && fwrite(header, 1, hlen, fp) == hlen;
        for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', fp) != EOF;
        for (int i = 0; ok && i < w->n; i++)
            ok = fwrite(w->t[i].data, 1, w->t[i].nbytes, fp) == w->t[i].nbytes;
        int e = errno;
        if (fclose(fp) != 0 && ok) { ok = 0; e = errno; }
        if (!ok) rc = st_fail(err, errlen, path, "write failed: %s", strerror(e));
        else if (rename(tmp, path) != 0)
            rc = st_fail(err, errlen, path, "cannot rename %s to it: %s", tmp, strerror(errno));
        if (rc != 0) remove(tmp);
    }
    free(tmp);
    cJSON_free(header);
    st_writer_free(w);
    return rc;
}
