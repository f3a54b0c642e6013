/*
 * mla_cache.c -- see mla_cache.h. Two aligned arrays, sized once.
 */
#include "kv/mla_cache.h"

#include <string.h>

int64_t di_mla_cache_bytes_per_token(int64_t n_layers, int64_t kv_lora_rank, int64_t rope_dim) {
    return n_layers * (kv_lora_rank + rope_dim) * (int64_t)sizeof(float);
}

di_status di_mla_cache_init(di_mla_cache *c, int64_t n_layers, int64_t capacity,
                            int64_t kv_lora_rank, int64_t rope_dim) {
    memset(c, 0, sizeof *c);
    if (n_layers <= 0 || capacity <= 0 || kv_lora_rank <= 0 || rope_dim <= 0)
        return di_error(DI_ERR_INVALID_ARG, "mla cache: bad dimensions");
    size_t rows = (size_t)n_layers * (size_t)capacity;
    size_t a = rows * (size_t)kv_lora_rank * sizeof(float);
    size_t b = rows * (size_t)rope_dim * sizeof(float);
    float *ckv = di_aligned_alloc(a), *kr = di_aligned_alloc(b);
    if (!ckv || !kr) {
        di_aligned_free(ckv);
        di_aligned_free(kr);
        return di_error(DI_ERR_OUT_OF_MEMORY,
                        "mla cache: cannot allocate %zu bytes for %lld tokens", a + b,
                        (long long)capacity);
    }
    memset(ckv, 0, a);
    memset(kr, 0, b);
    *c = (di_mla_cache){n_layers, capacity, kv_lora_rank, rope_dim, ckv, kr};
    return DI_OK;
}

void di_mla_cache_free(di_mla_cache *c) {
    if (!c) return;
    di_aligned_free(c->c_kv);
    di_aligned_free(c->k_rope);
    memset(c, 0, sizeof *c);
}
