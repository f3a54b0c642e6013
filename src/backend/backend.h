/*
 * backend.h -- the op interface the model's forward pass is written against.
 *
 * A backend is a table of function pointers plus a `void *ctx` (the ggml / llama.cpp
 * shape). The forward pass in src/model never calls a kernel directly: it calls
 * `be->ops->rmsnorm(be->ctx, ...)`, so a CUDA backend slots in by filling the same table.
 *
 * Design stance:
 *   - Activations are float32 row-major buffers that the backend can address (host memory
 *     for the CPU backend, device memory for a GPU backend), allocated and filled through the
 *     memory slots at the end of the table. Weights are di_weight views in their stored
 *     dtype (copied into the backend's memory by weight_upload when it has one); the backend
 *     converts on the fly.
 *   - Ops never allocate. Scratch that an op needs (attention's per-thread score rows) is
 *     sized once when the backend is created, from `max_ctx`.
 *   - Every op computes each output row with an arithmetic order that depends only on the
 *     op's shape parameters (never on the number of rows, the thread count or the split),
 *     so results are batch-invariant and identical for any thread count. (Unless batch
 *     invariance is turned off: see di_backend_cpu_set_batch_invariant.)
 *   - Arguments are trusted: the model validated shapes at load time. Ops do not fail.
 *
 * Every op has a scalar reference on the CPU (tests/ops compares the fast versions with it).
 */
#ifndef DI_BACKEND_H
#define DI_BACKEND_H

#include "backend/weight.h"
#include "core/core.h"
#include "core/threadpool.h"
#include "moe/router.h"

#include <math.h>
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
    /* Paged cache (optional): when block_table != NULL, logical row j lives at physical row
     * block_table[j / block_size] * block_size + j % block_size of c_kv / k_rope. The
     * arithmetic is the same as for a contiguous cache, so the results are bitwise equal.
     * The CPU and CUDA backends support it (block_table is backend memory). */
    const int32_t *block_table; /* [ceil((pos0 + n_tokens) / block_size)] or NULL */
    int64_t block_size;
    /* Head strides of q_lat and out in floats (optional; 0: n_tokens * R, the layout above).
     * The engine's runner sets them to address one sequence's rows inside a batch. */
    int64_t q_lat_hstride, out_hstride;
    /* Queries of different sequences in one call (optional; a decode batch, or a device's
     * chunk of several prompts -- several queries may share a table): when q_pos !=
     * NULL, query t sits at position q_pos[t] (pos0 is ignored) and reads the paged cache
     * through its own block table q_tables + q_table_off[t] (block_size as above;
     * block_table is ignored). All three are backend memory, so a captured decode step
     * (CUDA graphs) reads each step's values. Each query's result is the one it gets alone. */
    const int32_t *q_pos;
    const int32_t *q_tables;
    const int32_t *q_table_off;
    /* Queries' rope parts not yet rotated (optional, only on a backend whose
     * mla_attention_rotates is set; NULL: q_rope is rotated): query t's pairs are rotated by
     * row t of q_cos / q_sin ([n_tokens][rope_dim / 2], backend memory) as the rope op
     * rotates them (interleaved pairs (2i, 2i + 1) where q_rope_interleaved, else (i, i +
     * rope_dim / 2)), the same bits, without a launch of their own. */
    const float *q_cos, *q_sin;
    bool q_rope_interleaved;
} di_mla_attn_params;

/* q_lat / out rows of (head h, query t). */
static inline const float *di_mla_attn_q(const di_mla_attn_params *p, int64_t h, int64_t t) {
    int64_t hs = p->q_lat_hstride ? p->q_lat_hstride : p->n_tokens * p->kv_lora_rank;
    return p->q_lat + h * hs + t * p->kv_lora_rank;
}
static inline float *di_mla_attn_out(const di_mla_attn_params *p, int64_t h, int64_t t) {
    int64_t hs = p->out_hstride ? p->out_hstride : p->n_tokens * p->kv_lora_rank;
    return p->out + h * hs + t * p->kv_lora_rank;
}

/* Physical row of logical cache row j (see di_mla_attn_params.block_table). */
static inline int64_t di_mla_attn_row(const di_mla_attn_params *p, int64_t j) {
    if (!p->block_table) return j;
    return (int64_t)p->block_table[j / p->block_size] * p->block_size + j % p->block_size;
}

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

/* ---- DeepSeek-V4 ops (cpu_v4_ops.c; semantics in docs/v4-reference-notes.md) ---------------- */

/* mHC mixing weights and collapse for n tokens with n_hc streams of width dim:
 *   f = flatten(X[t]) / sqrt(mean(f^2) + eps);  mix = fn f   ([(2 + n_hc) n_hc] or [n_hc])
 *   pre = sigmoid(mix[0:n_hc] * scale[0] + base[0:n_hc]) + hc_eps;   h[t] = sum_j pre_j X[t][j]
 * With iters > 0 (a sublayer) also post = 2 sigmoid(mix[n:2n] * scale[1] + base[n:2n]) and
 * M = Sinkhorn(softmax_rows(mix[2n:] * scale[2] + base[2n:]) + hc_eps, iters); with
 * iters == 0 (the head) only pre and h. All in fp32 (sums in double). */
typedef struct di_v4_hc_params {
    int64_t n_tokens, n_hc, dim;
    const float *x;     /* [n_tokens][n_hc][dim] streams */
    const float *fn;    /* [n_mix][n_hc * dim], n_mix = iters ? (2 + n_hc) n_hc : n_hc */
    const float *base;  /* [n_mix] */
    const float *scale; /* [3] (sublayer) or [1] (head) */
    int64_t iters;
    float eps, hc_eps;
    float *h;    /* [n_tokens][dim] collapsed input */
    float *post; /* [n_tokens][n_hc] (iters > 0) */
    float *mix;  /* [n_tokens][n_hc][n_hc] M (iters > 0) */
} di_v4_hc_params;

/* Sink attention over an explicit key list per query (V4's shared K=V head): for query t,
 * head h, keys k_j = keys[t * max_keys + j] (j < n_keys[t], each a [dim] row):
 *   l_j = scale q(t,h).k_j;  p_j = exp(l_j - M) / (sum_i exp(l_i - M) + exp(sink_h - M)),
 *   M = max(max_j l_j, sink_h);  out(t,h) = sum_j p_j k_j.
 * q(t,h) at q + t * q_tstride + h * dim; out likewise with out_tstride.
 * scratch: [scratch_rows][max_keys] floats (score rows); scratch_rows >= n_tokens. A backend
 * may use one row per worker instead of one per token (to spread heads over threads).
 * On the CUDA backend keys (like v4_pool's c / z) is a device array of device row pointers
 * and scratch is unused (backend/cuda/cuda_backend.h). */
typedef struct di_v4_attn_params {
    int64_t n_tokens, n_heads, dim;
    float scale;
    const float *q;
    int64_t q_tstride;
    const float *sinks; /* [n_heads] */
    const float *const *keys;
    const int32_t *n_keys; /* [n_tokens] */
    int64_t max_keys;
    float *out;
    int64_t out_tstride;
    float *scratch;
    int64_t scratch_rows;
} di_v4_attn_params;

/* One compressed entry: out[c] = sum_i softmax_i(z_i[c]) c_i[c] over n_slots slots, per
 * channel c < width (the compressor's softmax pooling, fp32 with a double sum). */
typedef struct di_v4_pool_params {
    int64_t n_slots, width;
    const float *const *c; /* [n_slots] rows of width floats */
    const float *const *z; /* [n_slots] */
    float *out;            /* [width] */
} di_v4_pool_params;

/* Lightning-indexer scores: for query t and entry w < n_visible[t],
 *   out[t * out_stride + w] = sum_h weights[t][h] * relu(q(t,h) . keys[w]) * scale
 * q: [n_tokens][n_heads][dim], weights: [n_tokens][n_heads], keys: [>= n_visible][dim]. */
typedef struct di_v4_index_params {
    int64_t n_tokens, n_heads, dim;
    float scale;
    const float *q, *weights, *keys;
    const int64_t *n_visible;
    float *out;
    int64_t out_stride;
} di_v4_index_params;

/* ---- MoE on the backend: routing and the routed experts without a host round trip ---------- */

/* Routing of n tokens to top_k of n_experts experts, and the grouping of the (token, slot)
 * entries by expert. For token t, the rules of di_router_select (router.h) over logits[t]
 * give ids[t][k] and weights[t][k]; then the entries i = t K + k are sorted by expert,
 * tokens in order inside an expert (a stable counting sort), giving grouped rows
 * g = 0 .. n K - 1. Outputs (all backend memory, like the inputs):
 *   offsets[e]  first grouped row of expert e, e <= n_experts (offsets[E] = n K)
 *   active      active[0] = the number of experts with >= 1 row, then their ids ascending
 *   src[g]      the token of grouped row g          (a copy_rows gather list)
 *   rows_of[i]  the grouped row of entry i = t K + k (moe_combine's list)
 *   w[i]        entry i's weight                     (moe_combine's weights)
 * router.bias (e_score_correction_bias) is backend memory or NULL. scratch: 3 n_experts
 * floats of backend memory (a backend may ignore it). A backend must select exactly as
 * di_router_select; the CUDA one computes the same double-precision formulas with the
 * device's exp, so a score can differ from the host's in its last float bit (NOTES.md).
 * Hash routing (DeepSeek-V4's first layers): with hash_table set, token t's experts are
 * hash_table[tokens[t] top_k + k] in slot order k instead of a selection, weighted as
 * di_router_hash weights them (both backend memory; ids checked against n_experts at load,
 * token ids by the caller). A backend with its own memory takes at least
 * DI_BACKEND_ROUTE_ENTRIES entries (n top_k) per call (CUDA: DI_CUDA_ROUTE_MAX_ENTRIES). */
#define DI_BACKEND_ROUTE_ENTRIES 8192
typedef struct di_moe_route_params {
    di_router_params router;
    int64_t n;
    const float *logits; /* [n][n_experts] */
    float *scratch;
    int32_t *offsets, *active, *src, *rows_of;
    float *w;
    const int32_t *hash_table; /* [vocab][top_k] or NULL */
    const int32_t *tokens;     /* [n] token ids (hash routing) */
} di_moe_route_params;

/* The experts of one MoE projection (gate, up or down): n_experts weights of the same shape
 * and dtype (host array of backend weights) and the backend's table of them, made once at
 * load by expert_table (NULL on a backend that needs none). */
typedef struct di_expert_weights {
    const di_weight *w;
    int64_t n_experts;
    const void *table;
} di_expert_weights;

/* The MLA latent store (backend op mla_store): for i < n_rows, chunk row t = src_rows[i] of
 * kva ([.][R + dr], the kv_a projection): the RMSNorm (weight norm_w, eps) of its first R
 * values into row dst_rows[i] of ckv ([.][R]), and its last dr values rotated (cos / sin row
 * t, layout as di_rope_op_params) into row dst_rows[i] of krope ([.][dr]). kva is not
 * changed. The same bits as rmsnorm and rope over kva followed by two copy_rows. The CUDA
 * backend takes R <= 4096 (DeepSeek's latents are 512 wide). */
typedef struct di_mla_store_params {
    const float *kva;
    int64_t R, dr;
    const float *norm_w;
    float eps;
    const float *cos, *sin; /* [chunk rows][dr / 2] */
    bool interleaved;
    const int32_t *src_rows, *dst_rows; /* backend memory */
    int64_t n_rows;
    float *ckv, *krope;
} di_mla_store_params;

/* One row's sampling parameters for sample_rows (src/sample's draw without logit processors
 * or logprobs). log_min_p: logf(min_p) as the host computes it, when min_p > 0 (min_p's
 * cutoff is max + temperature x log_min_p, rounded as the host rounds it). */
typedef struct di_sample_row {
    float temperature;
    int32_t sample_index;
    int64_t seed;
    int64_t position;
    int32_t top_k; /* <= 0 or >= the vocabulary: none */
    float top_p;   /* 1: none */
    float min_p;   /* 0: none */
    float log_min_p;
} di_sample_row;

/* The row of a request's sampling parameters and its draw's Philox key. */
static inline di_sample_row di_sample_row_of(const di_sampling_params *sp, int64_t seed,
                                             int32_t sample_index, int64_t position) {
    di_sample_row r; /* (assignments: C and the CUDA files' C++ alike) */
    r.temperature = sp->temperature;
    r.sample_index = sample_index;
    r.seed = seed;
    r.position = position;
    r.top_k = sp->top_k;
    r.top_p = sp->top_p;
    r.min_p = sp->min_p;
    r.log_min_p = sp->min_p > 0.0f ? logf(sp->min_p) : 0.0f;
    return r;
}

/* The sampling parameters a row carries (the rest the defaults): the host sampler's view of
 * it, for backends that draw on the host and for tests. */
static inline di_sampling_params di_sample_row_params(const di_sample_row *r) {
    di_sampling_params p = di_sampling_default_params();
    p.temperature = r->temperature;
    p.top_k = r->top_k;
    p.top_p = r->top_p;
    p.min_p = r->min_p;
    return p;
}

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

    /* ---- DeepSeek-V4 (appended; see the params structs above) ---- */
    /* y = x W^T for W in F4_E2M1 (two per byte, low nibble first) with an E8M0 scale byte per
     * block_cols columns (w->scale_e8m0 [rows][scale_cols]); other dtypes go to matmul. */
    void (*matmul_fp4)(void *ctx, const di_weight *w, const float *x, int64_t n, float *y);
    void (*v4_hc_pre)(void *ctx, const di_v4_hc_params *p);
    /* out[t][k] = post[t][k] y[t] + sum_j M[t][j][k] x[t][j]  (out must not alias x). */
    void (*v4_hc_post)(void *ctx, int64_t n_tokens, int64_t n_hc, int64_t dim, const float *x,
                       const float *y, const float *post, const float *mix, float *out);
    void (*v4_attention)(void *ctx, const di_v4_attn_params *p);
    void (*v4_pool)(void *ctx, const di_v4_pool_params *p);
    void (*v4_index_scores)(void *ctx, const di_v4_index_params *p);
    /* out[i] = silu(min(gate[i], L)) * clamp(up[i], -L, L); limit <= 0: no clamp. */
    void (*v4_swiglu)(void *ctx, const float *gate, const float *up, int64_t n, float limit,
                      float *out);

    /* ---- Memory and data movement (appended) ----
     * Buffers an op can address are "backend memory": aligned host memory for the CPU
     * backend, device memory for CUDA. The model allocates every activation buffer and cache
     * through buf_alloc at state creation, fills small host-built inputs (ids, positions,
     * rope tables, block tables, routing entries) with one upload per chunk and reads results
     * back with download. host_memory tells whether backend memory is host-addressable (then
     * upload / download are plain copies and a caller may skip them). */
    bool host_memory;
    /* Zero-filled buffer of `bytes`, or NULL with di_last_error set. Not for use inside a
     * forward (planning only). */
    void *(*buf_alloc)(void *ctx, size_t bytes);
    void (*buf_free)(void *ctx, void *p);
    /* Copies between host memory and backend memory, ordered after every op enqueued before
     * them; they return when the copy is done (the host buffer may be reused at once). */
    di_status (*upload)(void *ctx, void *dst, const void *src_host, size_t bytes);
    di_status (*download)(void *ctx, void *dst_host, const void *src, size_t bytes);
    /* Zeroes `bytes` of backend memory (enqueued like an op). */
    void (*fill_zero)(void *ctx, void *p, size_t bytes);
    /* Waits for every op enqueued so far; returns the first error any reported since. */
    di_status (*sync)(void *ctx);
    /* Weights in backend memory: a copy of w (host memory, any view) whose data / scale the
     * backend owns (free with weight_free). NULL for a backend that uses host weights in
     * place (the CPU one): then the model keeps its mapped views. */
    di_status (*weight_upload)(void *ctx, const di_weight *w, di_weight *out);
    void (*weight_free)(void *ctx, di_weight *w);

    /* dst row (dst_rows ? dst_rows[i] : i) = src row (src_rows ? src_rows[i] : i) for i < n,
     * `cols` floats each, rows at the given strides (floats). A gather, a scatter or both;
     * the index lists are backend memory. Destination rows must be distinct. */
    void (*copy_rows)(void *ctx, float *dst, int64_t dst_stride, const int32_t *dst_rows,
                      const float *src, int64_t src_stride, const int32_t *src_rows, int64_t n,
                      int64_t cols);
    /* MoE combine: out[t] = sum over slots k < K, in slot order, of w[t K + k] x
     * rows[rows_of[t K + k]] (each row `dim` floats), starting from 0, for t < n: the
     * arithmetic of zeroing out[t] and then one axpy per slot, so a token's sum depends only
     * on its own slots (batch invariance). w and rows_of are backend memory. */
    void (*moe_combine)(void *ctx, const float *rows, const int32_t *rows_of, const float *w,
                        int64_t n, int64_t K, int64_t dim, float *out);

    /* ---- MoE on the backend (appended; see di_moe_route_params) ----
     * Every model's MoE layers run through these three (every backend has them). */
    void (*moe_route)(void *ctx, const di_moe_route_params *p);
    /* Grouped rows through their experts: for each active expert e (active and offsets as
     * moe_route writes them), y[g] = W_e x[g] for g in [offsets[e], offsets[e + 1]).
     * x: [>= offsets[E]][cols], y: [>= offsets[E]][rows] (row strides cols and rows).
     * max_active bounds active[0] and n_rows is the grouped rows in all (min(E, n K) and
     * n K for n routed tokens; their ratio, the mean rows per slot, chooses the launch).
     * Each row is computed exactly as matmul computes it alone (FP4 experts: matmul_fp4),
     * whatever the other rows (batch invariance). */
    void (*matmul_experts)(void *ctx, const di_expert_weights *ew, const int32_t *offsets,
                           const int32_t *active, int64_t max_active, int64_t n_rows,
                           const float *x, float *y);
    /* A backend table of n weights of one shape and dtype (backend weights), for
     * matmul_experts; *out = NULL where the backend needs none. Load time only. Free with
     * buf_free. */
    di_status (*expert_table)(void *ctx, const di_weight *w, int64_t n, void **out);

    /* ---- Captured op sequences (appended; optional, NULL on the CPU) ----
     * graph_begin starts recording the ops enqueued next instead of running them;
     * graph_end stops and returns a replayable graph in *out (NULL with an error status if
     * anything in between could not be recorded: then nothing was run and the caller runs
     * the ops directly). graph_launch replays a graph: the same ops with the same arguments,
     * reading whatever the buffers hold then. A graph must not outlive the buffers it uses. */
    void (*graph_begin)(void *ctx);
    di_status (*graph_end)(void *ctx, void **out);
    void (*graph_launch)(void *ctx, void *graph);
    void (*graph_free)(void *ctx, void *graph);

    /* ---- Fused SwiGLU products (appended; optional, NULL: the model runs two products and
     * silu_mul) ----
     * matmul_glu: y[t][r] = silu(gate[r] . x[t]) * (up[r] . x[t]), each product and the
     * activation rounded exactly as matmul and silu_mul round them (so the fused and the
     * separate forms give the same bits). gate and up: one shape, dtype and scale layout.
     * matmul_experts_glu: the same over matmul_experts' grouped rows (gate and up tables of
     * one expert set's two projections; not for FP4 experts, which V4 clamps: an error).
     * x_rows NULL: x holds the grouped rows; else grouped row g is row x_rows[g] of x (a
     * moe_route src list over token rows of `cols` floats), which the backend reads in place
     * or first gathers into x_scratch ([n_rows][cols]): the same bits either way. */
    void (*matmul_glu)(void *ctx, const di_weight *gate, const di_weight *up, const float *x,
                       int64_t n, float *y);
    void (*matmul_experts_glu)(void *ctx, const di_expert_weights *gate,
                               const di_expert_weights *up, const int32_t *offsets,
                               const int32_t *active, int64_t max_active, int64_t n_rows,
                               const float *x, const int32_t *x_rows, float *x_scratch, float *y);
    /* y[t][r] += sum_c x[t][c] W[r][c] (a residual add in the product's epilogue; optional,
     * NULL: matmul into a scratch and axpy). Rounded exactly as matmul then axpy(1, ., y). */
    void (*matmul_add)(void *ctx, const di_weight *w, const float *x, int64_t n, float *y);
    /* The MLA latent store (di_mla_store_params; optional, NULL: rmsnorm, rope and two
     * copy_rows). */
    void (*mla_store)(void *ctx, const di_mla_store_params *p);
    /* out[t] = the first index of row t's maximum over x[t][0 .. V), for greedy decoding
     * without downloading the rows; -1 where the row holds a NaN or +inf or only -inf (the
     * host sampler then sees the row and reports it). Optional; runners use it only on
     * backends whose memory is not the host's (the CPU backend has it for tests that treat
     * its memory as separate: tests/e2e/test_device_tokens.c). */
    void (*argmax_rows)(void *ctx, const float *x, int64_t n, int64_t V, int32_t *out);
    /* out[t] = the token the host sampler (src/sample) chooses from row t with rows[t]'s
     * temperature (greedy below DI_SAMPLING_GREEDY_EPS), min_p, top_k, top_p, seed, sample
     * index and position, and no logit processor (sample_full_row.h, sample_mass.h); -1
     * where the row holds a NaN or +inf or only -inf. rows and out in backend memory.
     * Optional: the V2/V3 runner uses it for decode steps whose rows the engine marked
     * (di_batch_seq.device_draw); the CUDA backend offers it unless created with
     * DI_CUDA_SAMPLE=0. */
    void (*sample_rows)(void *ctx, const float *x, int64_t n, int64_t V, const di_sample_row *rows,
                        int32_t *out);

    /* ---- A second stream (appended; optional, NULL: every op runs in call order) ----
     * side_begin: the ops enqueued next run on a second stream, starting once everything
     * enqueued before them has run; side_end: back to the main stream, while the side's ops
     * run alongside what is enqueued there next; side_join: the ops enqueued next also wait
     * for everything enqueued on the side. Between side_begin and side_join the two streams
     * must not write what the other reads or writes; no sync, download or graph_end in
     * between. The V2/V3 runner puts an attention layer's latent projection and store there,
     * beside the queries, and both runners a MoE layer's shared experts, beside the routing
     * and the routed experts. Inside a graph capture the fork and the join become edges of the
     * graph. */
    void (*side_begin)(void *ctx);
    void (*side_end)(void *ctx);
    void (*side_join)(void *ctx);

    /* The end of a MoE layer in one op (appended; optional, NULL: moe_combine into a
     * scratch, axpy(1, add, scratch) where add is given, axpy(1, scratch, resid)):
     * resid[t] += (moe_combine's sum for token t) + add[t], rounded exactly as those ops. */
    void (*moe_combine_add)(void *ctx, const float *rows, const int32_t *rows_of, const float *w,
                            int64_t n, int64_t K, int64_t dim, const float *add, float *resid);

    /* (Appended; optional, NULL: moe_combine_add, then rmsnorm.) moe_combine_add, then
     * y[t] = the RMSNorm of resid[t] with weight norm_w and eps, rounded exactly as rmsnorm
     * (rows of dim floats, y's stride dim; y overlaps none of rows, add and resid): a MoE
     * layer's end and the next layer's first norm, which a backend may run as one kernel. */
    void (*moe_combine_add_norm)(void *ctx, const float *rows, const int32_t *rows_of,
                                 const float *w, int64_t n, int64_t K, int64_t dim,
                                 const float *add, float *resid, const float *norm_w, float eps,
                                 float *y);

    /* (Appended.) head_matmul runs W x faster than W^T x here (CUDA: only W x takes the
     * tensor cores), so a runner may keep a transposed backend copy of a weight it would
     * multiply transposed (the V2/V3 runner's W_UK). A hint; false on the CPU. */
    bool prefers_untransposed_heads;
    /* (Appended.) mla_attention takes unrotated queries (di_mla_attn_params.q_cos). */
    bool mla_attention_rotates;

    /* ---- A step queued behind the running one (appended; optional, NULL: none) ----
     * For the engine's overlap loop on a device, which enqueues step N + 1 before waiting
     * for step N. upload_async copies src_host at once (it may be reused on return) and
     * enqueues its copy to dst, ordered after every op enqueued before; it does not wait.
     * download_async enqueues a copy of src to dst_host, which holds it once fence_wait has
     * returned for a fence made after the call. fence marks everything enqueued so far and
     * returns its ticket (> 0); fence_wait waits for the ticket's ops and returns the first
     * error any op reported since the last sync or fence_wait. resolve_ids (enqueued like an
     * op): ids[i] < 0 becomes prev[-1 - ids[i]] (0 where that is negative) for i < n, both in
     * backend memory -- the ids of a step that follow tokens still on the device
     * (di_batch_args.pending_on_device). */
    di_status (*upload_async)(void *ctx, void *dst, const void *src_host, size_t bytes);
    di_status (*download_async)(void *ctx, void *dst_host, const void *src, size_t bytes);
    int64_t (*fence)(void *ctx);
    di_status (*fence_wait)(void *ctx, int64_t ticket);
    void (*resolve_ids)(void *ctx, int32_t *ids, int64_t n, const int32_t *prev);
} di_backend_ops;

typedef struct di_backend {
    const di_backend_ops *ops;
    void *ctx;
} di_backend;

/* The CPU backend over `pool` (borrowed; must outlive the backend). max_ctx: the longest
 * sequence the attention op will see (sizes its per-thread scratch). */
di_status di_backend_cpu_init(di_backend *be, di_pool *pool, int64_t max_ctx);

/* Batch invariance of a CPU backend (default on). Off, the matmul may choose its kernel by
 * the number of rows n (di_cpu_matmul_fast in cpu_ops.h), so a row's result can change in
 * the last bits with the batch around it; the other ops are unchanged. No-op for a backend
 * that is not the CPU one. Not to be called while ops run. */
void di_backend_cpu_set_batch_invariant(di_backend *be, bool on);

static inline void di_backend_free(di_backend *be) {
    if (be && be->ops && be->ops->free) be->ops->free(be->ctx);
    if (be) be->ctx = NULL;
}

/* The CUDA backend on device `device` (src/backend/cuda). Ops take device pointers and
 * device-side weights (di_cuda_weight_upload in backend/cuda/cuda_backend.h) and run on the
 * backend's own stream. max_ctx sizes the attention's split-KV scratch and bounds the key
 * count of every decode-batch attention call (positions from device memory): a query past
 * it is a caller's bug and stops the device (a trap) rather than writing past the scratch
 * (the engine and contexts pass their max_model_len / max_tokens). Fails with
 * DI_ERR_UNSUPPORTED ("no CUDA device") when there is none or the build has no CUDA. */
di_status di_backend_cuda_init(di_backend *be, int device, int64_t max_ctx);

#endif /* DI_BACKEND_H */
