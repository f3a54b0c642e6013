/*
 * safetensors.h -- memory-mapped safetensors checkpoints: one file, or a sharded folder
 * with model.safetensors.index.json.
 *
 * A file is `u64 header_len (LE) | header JSON | data`. The header is untrusted input and
 * is validated before any tensor is exposed: every tensor's dtype is known, its byte range
 * lies inside the data section, its size equals prod(shape) x dtype size, and no two
 * tensors overlap. Tensors are views into the mapping (no copy, no upcast); the set owns the
 * mappings and every view dies with it.
 */
#ifndef DI_SAFETENSORS_H
#define DI_SAFETENSORS_H

#include "core/core.h"
#include "core/dtype.h"

#include <stdbool.h>

#define DI_ST_MAX_DIMS 8

typedef struct di_st_tensor {
    const char *name;               /* owned by the set */
    di_dtype dtype;
    int32_t ndim;
    int64_t shape[DI_ST_MAX_DIMS];
    const void *data;               /* inside the file's mapping */
    size_t nbytes;
    int32_t file_index;             /* which shard */
} di_st_tensor;

typedef struct di_st_set di_st_set;

/* Opens a checkpoint folder: model.safetensors.index.json if present (every shard it names
 * must exist and every tensor must be in the shard the index says), otherwise every
 * *.safetensors file in the folder. Duplicate tensor names across files are an error. */
di_status di_st_open_dir(const char *dir, di_st_set **out);
/* Opens a single file. */
di_status di_st_open_file(const char *path, di_st_set **out);
void di_st_close(di_st_set *set);

/* Lookup by exact name (hash table); NULL if absent. */
const di_st_tensor *di_st_find(const di_st_set *set, const char *name);
int64_t di_st_count(const di_st_set *set);
const di_st_tensor *di_st_at(const di_st_set *set, int64_t i);
/* Path of shard i, for error messages. */
const char *di_st_file_path(const di_st_set *set, int32_t file_index);
/* Number of elements of a tensor. */
int64_t di_st_numel(const di_st_tensor *t);
/* File name (without folder) of the shard holding t, for error messages. */
const char *di_st_file_name(const di_st_set *set, const di_st_tensor *t);

/* DI_OK if t has exactly shape dims[ndim]; else DI_ERR_FORMAT naming the shard, the tensor
 * and both shapes: `model.safetensors: tensor "x" has shape [4, 8], expected [8, 8]`. */
di_status di_st_check_shape(const di_st_set *set, const di_st_tensor *t, int32_t ndim,
                            const int64_t *dims);

/* Converts the first n elements of t (F32, BF16, F16 or F8_E8M0) to floats in out[n]; any
 * other dtype is DI_ERR_FORMAT naming the shard and the tensor. Used for the small tensors a
 * model keeps in float (norms, biases, scales). */
di_status di_st_to_float(const di_st_set *set, const di_st_tensor *t, int64_t n, float *out);

/* Parses and validates a header held in memory. `file` is the whole file image
 * (file_len bytes) and `name` is used in error messages. On success returns a set whose
 * tensors point into `file` (which must outlive it). Exposed for tests and fuzzing. */
di_status di_st_parse_buffer(const void *file, size_t file_len, const char *name,
                             di_st_set **out);

#endif /* DI_SAFETENSORS_H */
