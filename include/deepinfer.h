/*
 * deepinfer.h -- the one public header of deepinfer, an inference engine for DeepSeek's
 * Mixture-of-Experts language models.
 *
 * Design stance:
 *   - Opaque handles; plain-old-data parameter structs with *_default_params() constructors.
 *   - Every call that can fail returns a di_status. On failure, di_last_error() returns a
 *     message a user can act on (it names the file, tensor, field or argument), and the
 *     objects passed in are left as they were.
 *   - Whatever the library allocates, the library frees (di_*_free).
 *   - Functions that fill a caller's buffer return the count written, or -needed when the
 *     buffer is too small.
 *   - Sized integer types: int32_t token ids, int64_t counts and sizes.
 */
#ifndef DEEPINFER_H
#define DEEPINFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(DI_BUILDING_LIBRARY)
#define DI_API __attribute__((visibility("default")))
#else
#define DI_API
#endif

/* ---------------------------------------------------------------------------------------- */
/* Status codes                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* One X-macro generates the enum and di_status_str(). */
#define DI_STATUS_LIST(X)                                                                      \
    X(DI_OK, "ok")                                                                             \
    X(DI_ERR_INVALID_ARG, "invalid argument")                                                  \
    X(DI_ERR_IO, "i/o error")                                                                  \
    X(DI_ERR_FORMAT, "malformed file")                                                         \
    X(DI_ERR_CONFIG, "invalid model configuration")                                            \
    X(DI_ERR_UNSUPPORTED, "unsupported")                                                       \
    X(DI_ERR_OUT_OF_MEMORY, "out of memory")                                                   \
    X(DI_ERR_NOT_FOUND, "not found")                                                           \
    X(DI_ERR_RANGE, "value out of range")                                                      \
    X(DI_ERR_INTERNAL, "internal error")

typedef enum {
#define DI_STATUS_ENUM_(name, str) name,
    DI_STATUS_LIST(DI_STATUS_ENUM_)
#undef DI_STATUS_ENUM_
        DI_STATUS_COUNT_
} di_status;

DI_API const char *di_status_str(di_status s);

/* The message of the last failure on the calling thread ("" if none). */
DI_API const char *di_last_error(void);

/* ---------------------------------------------------------------------------------------- */
/* Logging and allocation hooks                                                               */
/* ---------------------------------------------------------------------------------------- */

typedef enum { DI_LOG_DEBUG, DI_LOG_INFO, DI_LOG_WARN, DI_LOG_ERROR } di_log_level;
typedef void (*di_log_fn)(di_log_level level, const char *msg, void *user);

/* Replaces the log sink (default: stderr, level >= DI_LOG_WARN). fn == NULL restores it. */
DI_API void di_set_log(di_log_fn fn, void *user, di_log_level min_level);

typedef struct di_allocator {
    void *(*malloc_fn)(size_t size, void *user);
    void *(*realloc_fn)(void *p, size_t size, void *user);
    void (*free_fn)(void *p, void *user);
    void *user;
} di_allocator;

/* Replaces the allocator used for the library's own (non-mmap) allocations. Call before
 * creating any object; NULL restores the libc allocator. */
DI_API void di_set_allocator(const di_allocator *a);

/* Frees memory the library returned to the caller (e.g. from di_detokenize_alloc). */
DI_API void di_free(void *p);

/* ---------------------------------------------------------------------------------------- */
/* Models                                                                                     */
/* ---------------------------------------------------------------------------------------- */

typedef struct di_model di_model;

typedef struct di_model_params {
    int32_t n_threads; /* compute threads; <= 0 means all online cores */
    bool verbose;      /* log loading progress at INFO level */
} di_model_params;

DI_API di_model_params di_model_default_params(void);

/* Loads a checkpoint folder as published (config.json + *.safetensors [+ index]).
 * Weights are memory-mapped and used in their stored dtype. */
DI_API di_status di_model_load(const char *dir, const di_model_params *params, di_model **out);
DI_API void di_model_free(di_model *model);

typedef struct di_model_info {
    char architecture[64];      /* e.g. "DeepseekV3ForCausalLM" */
    char family[32];            /* "deepseek_v2", "deepseek_v3", ... */
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t n_layers;
    int64_t max_context;        /* max_position_embeddings */
    int64_t n_params_total;     /* parameters of the main model (MTP layers excluded) */
    int64_t n_params_active;    /* parameters touched per token */
    int64_t n_params_mtp;       /* parameters of the MTP layers, loaded but not used */
    int64_t weight_bytes;       /* bytes of weights as stored (main model + MTP) */
    int64_t kv_bytes_per_token; /* cache bytes per token of context, all layers */
    char dtypes[64];            /* stored dtypes seen, e.g. "bf16+f8_e4m3" */
    int32_t bos_token_id;       /* -1 if none */
    int32_t eos_token_id;       /* -1 if none */
} di_model_info;

DI_API di_status di_model_get_info(const di_model *model, di_model_info *out);

/* ---------------------------------------------------------------------------------------- */
/* Contexts: one sequence's cache and scratch, for direct evaluation                          */
/* ---------------------------------------------------------------------------------------- */

typedef struct di_context di_context;

typedef struct di_context_params {
    int64_t max_tokens; /* capacity of the sequence (prompt + generated); <= 0: model max */
    int32_t n_threads;  /* <= 0: the model's */
} di_context_params;

DI_API di_context_params di_context_default_params(void);
DI_API di_status di_context_create(di_model *model, const di_context_params *params,
                                   di_context **out);
DI_API void di_context_free(di_context *ctx);

/* Forgets the sequence; the next eval starts at position 0. */
DI_API void di_context_reset(di_context *ctx);

/* Number of tokens already in the context's cache. */
DI_API int64_t di_context_n_past(const di_context *ctx);

/* Appends n_ids tokens to the sequence and runs them through the model. If logits is not
 * NULL, writes float32 logits for the last n_logits of those positions, row-major
 * [n_logits][vocab_size] (1 <= n_logits <= n_ids). */
DI_API di_status di_context_eval(di_context *ctx, const int32_t *ids, int64_t n_ids,
                                 float *logits, int64_t n_logits);

/* ---------------------------------------------------------------------------------------- */
/* Tokenizer                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* (section owned by the tokenizer module) */

#ifdef __cplusplus
}
#endif

#endif /* DEEPINFER_H */
