/*
 * mla_cache.h -- one sequence's Multi-head Latent Attention cache (DeepSeek-V2/V3).
 *
 * MLA needs, per layer and per token, only the normalized latent c_kv (kv_lora_rank floats)
 * and the rotated rope key k_rope (qk_rope_head_dim floats); attention runs in absorbed
 * form straight over these rows, so no per-head K or V is ever stored.
 *
 * Design stance: capacity is fixed when the cache is created (paging comes later); rows are
 * float32, contiguous per layer, so a layer's rows [0, n) are one plain array the attention
 * op can stream. The rows live in backend memory (host for the CPU backend, device memory for
 * CUDA), allocated through the backend the cache was created with. The cache does not track
 * the sequence length itself: the owner (the model context) does, and commits it only after a
 * forward pass succeeded.
 *
 * Invariant: rows [0, n_past) of every layer hold the sequence's tokens at positions
 * 0..n_past-1; rows beyond are scratch that the next forward pass overwrites.
 */
#ifndef DI_MLA_CACHE_H
#define DI_MLA_CACHE_H

#include "backend/backend.h"
#include "core/core.h"

#include <stdint.h>

typedef struct di_mla_cache {
    int64_t n_layers;
    int64_t capacity;     /* tokens per layer */
    int64_t kv_lora_rank; /* R */
    int64_t rope_dim;     /* qk_rope_head_dim */
    float *c_kv;          /* [n_layers][capacity][R], owned (backend memory) */
    float *k_rope;        /* [n_layers][capacity][rope_dim], owned (backend memory) */
    const di_backend *be; /* borrowed: allocated the rows, frees them */
} di_mla_cache;

/* Allocates the cache (zeroed) through be (which must outlive it). On failure *c is left
 * empty and the error names the size. */
di_status di_mla_cache_init(di_mla_cache *c, const di_backend *be, int64_t n_layers,
                            int64_t capacity, int64_t kv_lora_rank, int64_t rope_dim);
void di_mla_cache_free(di_mla_cache *c);

/* Bytes one token occupies across all layers. */
int64_t di_mla_cache_bytes_per_token(int64_t n_layers, int64_t kv_lora_rank, int64_t rope_dim);

/* Row pointers of layer il at position pos (pos < capacity). */
static inline float *di_mla_cache_ckv(const di_mla_cache *c, int64_t il, int64_t pos) {
    return c->c_kv + (il * c->capacity + pos) * c->kv_lora_rank;
}
static inline float *di_mla_cache_krope(const di_mla_cache *c, int64_t il, int64_t pos) {
    return c->k_rope + (il * c->capacity + pos) * c->rope_dim;
}

#endif /* DI_MLA_CACHE_H */
