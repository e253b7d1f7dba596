/* safetensors.h: read and write the safetensors format (https://github.com/huggingface/safetensors):
 *   8 bytes little-endian u64 N | N bytes JSON header | raw little-endian tensor data
 * header: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *          "__metadata__": {"key": "value", ...}}   (offsets relative to the data section)
 * The JSON is parsed and written with cJSON.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "cdefs.h"

C_BEGIN

#define ST_MAX_DIMS 8
#define ST_MAX_NAME 256

typedef struct {
    char name[ST_MAX_NAME];
    char dtype[8];               /* "F32", "I32", ... */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t nbytes;
    const void *data;            /* points into the file's data section */
} st_tensor;

typedef struct {
    int n_tensors;
    st_tensor *tensors;
    int n_meta;
    char (*meta_keys)[128];
    char (*meta_values)[256];
    unsigned char *blob;         /* the whole file */
    size_t blob_size;
} st_file;

/* 0 on success; on failure -1 with one line in err naming the problem
 * (truncated file, header length past the end, bad JSON, offsets out of range, ...). */
int st_read(const char *path, st_file *out, char *err, size_t errlen);
void st_free(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);
const char *st_meta(const st_file *f, const char *key);   /* NULL when absent */
size_t st_dtype_size(const char *dtype);                 /* 0 for unknown dtypes */

/* Writer: collect tensors (data is copied) and metadata, then save. */
typedef struct st_writer st_writer;
st_writer *st_writer_new(void);
void st_writer_add(st_writer *w, const char *name, const char *dtype, const int64_t *shape,
                   int ndim, const void *data);
void st_writer_meta(st_writer *w, const char *key, const char *value);
/* 0 on success, -1 with a message in err. Frees the writer either way. */
int st_writer_save(st_writer *w, const char *path, char *err, size_t errlen);

C_END
