/*
 * mla_cache.c -- see mla_cache.h. Two arrays of backend memory, sized once.
 */
#include "kv/mla_cache.h"

#include <string.h>

int64_t di_mla_cache_bytes_per_token(int64_t n_layers, int64_t kv_lora_rank, int64_t rope_dim) {
    return n_layers * (kv_lora_rank + rope_dim) * (int64_t)sizeof(float);
}

di_status di_mla_cache_init(di_mla_cache *c, const di_backend *be, int64_t n_layers,
                            int64_t capacity, int64_t kv_lora_rank, int64_t rope_dim) {
    memset(c, 0, sizeof *c);
    if (!be || n_layers <= 0 || capacity <= 0 || kv_lora_rank <= 0 || rope_dim <= 0)
        return di_error(DI_ERR_INVALID_ARG, "mla cache: bad dimensions");
    size_t rows = (size_t)n_layers * (size_t)capacity;
    size_t a = rows * (size_t)kv_lora_rank * sizeof(float);
    size_t b = rows * (size_t)rope_dim * sizeof(float);
    /* buf_alloc zero-fills. */
    float *ckv = be->ops->buf_alloc(be->ctx, a);
    float *kr = ckv ? be->ops->buf_alloc(be->ctx, b) : NULL;
    if (!ckv || !kr) {
        if (ckv) be->ops->buf_free(be->ctx, ckv);
        return di_error(DI_ERR_OUT_OF_MEMORY,
                        "mla cache: cannot allocate %zu bytes for %lld tokens on %s", a + b,
                        (long long)capacity, be->ops->name);
    }
    *c = (di_mla_cache){n_layers, capacity, kv_lora_rank, rope_dim, ckv, kr, be};
    return DI_OK;
}

void di_mla_cache_free(di_mla_cache *c) {
    if (!c) return;
    if (c->be) {
        if (c->c_kv) c->be->ops->buf_free(c->be->ctx, c->c_kv);
        if (c->k_rope) c->be->ops->buf_free(c->be->ctx, c->k_rope);
    }
    memset(c, 0, sizeof *c);
}
