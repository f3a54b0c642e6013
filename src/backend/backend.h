/*
 * backend.h -- the op interface the model's forward pass is written against.
 *
 * A backend is a table of function pointers plus a `void *ctx` (the ggml / llama.cpp
 * shape). The forward pass in src/model never calls a kernel directly: it calls
 * `be->ops->rmsnorm(be->ctx, ...)`, so a CUDA backend slots in by filling the same table.
 *
 * Design stance:
 *   - Activations are float32 row-major buffers that the backend can address (host memory
 *     for the CPU backend, device memory for a GPU backend). Weights are di_weight views in
 *     their stored dtype; the backend converts on the fly.
 *   - Ops never allocate. Scratch that an op needs (attention's per-thread score rows) is
 *     sized once when the backend is created, from `max_ctx`.
 *   - Every op computes each output row with an arithmetic order that depends only on the
 *     op's shape parameters (never on the number of rows, the thread count or the split),
 *     so results are batch-invariant and identical for any thread count.
 *   - Arguments are trusted: the model validated shapes at load time. Ops do not fail.
 *
 * Every op has a scalar reference on the CPU (tests/ops compares the fast versions with it).
 */
#ifndef DI_BACKEND_H
#define DI_BACKEND_H

#include "backend/weight.h"
#include "core/core.h"
#include "core/threadpool.h"

#include <stdbool.h>
#include <stdint.h>

/* Parameters of the MLA attention op in absorbed form (see cpu_attention.c).
 * Query t (0 <= t < n_tokens) sits at position pos0 + t and attends causally to cache rows
 * [0, pos0 + t]. For head h:
 *   s_j   = scale * (q_lat[h][t] . c_kv[j] + q_rope(h, t) . k_rope[j])
 *   p     = softmax_j(s)
 *   out[h][t] = sum_j p_j c_kv[j]          (a latent vector; the caller applies W_UV) */
typedef struct di_mla_attn_params {
    int64_t n_tokens, n_heads;
    int64_t pos0;
    int64_t kv_lora_rank; /* R */
    int64_t rope_dim;     /* qk_rope_head_dim */
    float scale;          /* softmax scale incl. YaRN mscale correction */
    const float *q_lat;   /* [n_heads][n_tokens][R] q_nope absorbed through W_UK */
    const float
        *q_rope; /* element (h, t, i) at q_rope[t * q_rope_tstride + h * q_rope_hstride + i] */
    int64_t q_rope_tstride, q_rope_hstride;
    const float *c_kv;   /* [>= pos0 + n_tokens][R] normalized latents (the cache) */
    const float *k_rope; /* [>= pos0 + n_tokens][rope_dim] rotated rope keys (the cache) */
    float *out;          /* [n_heads][n_tokens][R] */
} di_mla_attn_params;

/* Parameters of the rotary embedding op. Rotates, in place, the rope_dim-wide slices
 * x(t, h) = x + t * tstride + h * hstride for t < n_tokens, h < n_heads, with the angle of
 * pair i given by cos[t][i], sin[t][i] (i < rope_dim / 2, attention factor included).
 * interleaved: pair i is (2i, 2i+1) (DeepSeek's layout); else pair i is (i, i + rope_dim/2)
 * (rotate_half). */
typedef struct di_rope_op_params {
    float *x;
    int64_t n_tokens, n_heads, rope_dim;
    int64_t tstride, hstride;
    const float *cos, *sin; /* [n_tokens][rope_dim / 2] */
    bool interleaved;
} di_rope_op_params;

/* Parameters of the per-head product used around MLA's absorbed attention: for every head h
 * and token t,
 *   transposed == false:  y(h, t) = W[h] x(h, t)     (x: W[h].cols floats, y: W[h].rows)
 *   transposed == true:   y(h, t) = W[h]^T x(h, t)   (x: W[h].rows floats, y: W[h].cols)
 * where x(h, t) = x + h * x_hstride + t * x_tstride, likewise y; each vector is contiguous.
 * All heads' weights have the same shape. One op call covers all heads, so a backend can
 * spread heads over its threads instead of splitting each small product. */
typedef struct di_head_matmul_params {
    const di_weight *w; /* [n_heads] */
    bool transposed;
    int64_t n_heads, n_tokens;
    const float *x;
    int64_t x_hstride, x_tstride;
    float *y;
    int64_t y_hstride, y_tstride;
} di_head_matmul_params;

typedef struct di_backend_ops {
    const char *name;

    /* y[t][r] = sum_c x[t][c] W[r][c]. x: [n][w->cols], y: [n][w->rows]. */
    void (*matmul)(void *ctx, const di_weight *w, const float *x, int64_t n, float *y);
    /* y[t][c] = sum_r x[t][r] W[r][c]. x: [n][w->rows], y: [n][w->cols]. */
    void (*matmul_t)(void *ctx, const di_weight *w, const float *x, int64_t n, float *y);

    /* out[t] = float(table row ids[t]). table: [vocab][dim] in its stored dtype, out: [n][dim]. */
    void (*head_matmul)(void *ctx, const di_head_matmul_params *p);

    void (*embed)(void *ctx, const di_weight *table, const int32_t *ids, int64_t n, float *out);

    /* y[t] = w * x[t] / sqrt(mean(x[t]^2) + eps) for t < n, rows of `dim` floats at the given
     * strides (in floats). y may equal x. */
    void (*rmsnorm)(void *ctx, const float *x, int64_t x_stride, const float *w, int64_t n,
                    int64_t dim, float eps, float *y, int64_t y_stride);

    void (*rope)(void *ctx, const di_rope_op_params *p);

    void (*mla_attention)(void *ctx, const di_mla_attn_params *p);

    /* out[i] = silu(gate[i]) * up[i] for i < n (out may alias gate or up). */
    void (*silu_mul)(void *ctx, const float *gate, const float *up, int64_t n, float *out);

    /* y[i] += a * x[i] for i < n. */
    void (*axpy)(void *ctx, float a, const float *x, int64_t n, float *y);

    /* Copies `rows` rows of `cols` floats between strided buffers (strides in floats). */
    void (*copy2d)(void *ctx, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                   int64_t rows, int64_t cols);

    /* Releases the backend's own state (ctx). Optional (NULL: nothing to free). */
    void (*free)(void *ctx);
} di_backend_ops;

typedef struct di_backend {
    const di_backend_ops *ops;
    void *ctx;
} di_backend;

/* The CPU backend over `pool` (borrowed; must outlive the backend). max_ctx: the longest
 * sequence the attention op will see (sizes its per-thread scratch). */
di_status di_backend_cpu_init(di_backend *be, di_pool *pool, int64_t max_ctx);

static inline void di_backend_free(di_backend *be) {
    if (be && be->ops && be->ops->free) be->ops->free(be->ctx);
    if (be) be->ctx = NULL;
}

#endif /* DI_BACKEND_H */
