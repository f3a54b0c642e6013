/*
 * cpu_attention.c -- MLA attention in absorbed form over the latent cache, on the CPU.
 *
 * With W_UK folded into the query (q_lat = W_UK^T q_nope) the keys are the cached latents
 * themselves, and the values too (W_UV is applied by the caller after the weighted sum), so
 * no per-head K or V is ever materialized:
 *     s_j = scale * (q_lat . c_kv[j] + q_rope . k_rope[j]),  j <= pos0 + t
 *     out = sum_j softmax(s)_j c_kv[j]
 *
 * The fast version runs one (head, query) pair per work item over the thread pool, with a
 * per-thread score row from the caller's scratch (small problems run on the calling thread). Each
 * item's arithmetic depends only on (R, rope_dim, its key count), so results do not depend on the
 * batch or the thread count.
 *
 * A paged cache (block_table set) only changes where row j is read from, so a paged and a
 * contiguous cache holding the same rows give bitwise equal outputs (the engine's batched
 * runner relies on this to match the single-sequence context).
 *
 * Also here: the per-head products on either side of it (W_UK^T q_nope and W_UV o), one
 * parallel loop over heads with single-threaded kernels inside.
 */
#include "backend/cpu/cpu_nn.h"
#include "backend/cpu/cpu_matmul_impl.h"
#include "backend/cpu/cpu_ops.h"

#include <math.h>

/* ---------------------------------------------------------------------------------------- */
/* Vector helpers                                                                             */
/* ---------------------------------------------------------------------------------------- */

static float dot_portable(const float *a, const float *b, int64_t n) {
    /* Eight independent partial sums, reduced in a fixed tree: the compiler can vectorize
     * this without reassociating, and the order is the same on every call. */
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

static void axpy_portable(float a, const float *x, int64_t n, float *y) {
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

typedef float (*dot_fn)(const float *, const float *, int64_t);
typedef void (*axpy_fn)(float, const float *, int64_t, float *);

static dot_fn g_dot;
static axpy_fn g_axpy;

static void pick_vec_impl(void) {
    if (g_dot) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        g_axpy = di_cpu_vec_axpy_avx2;
        g_dot = di_cpu_vec_dot_avx2;
        return;
    }
#endif
    g_axpy = axpy_portable;
    g_dot = dot_portable;
}

float di_cpu_vec_dot(const float *a, const float *b, int64_t n) {
    pick_vec_impl();
    return g_dot(a, b, n);
}

void di_cpu_vec_axpy(float a, const float *x, int64_t n, float *y) {
    pick_vec_impl();
    g_axpy(a, x, n, y);
}

/* ---------------------------------------------------------------------------------------- */
/* Reference                                                                                  */
/* ---------------------------------------------------------------------------------------- */

void di_cpu_mla_attention_ref(const di_mla_attn_params *p) {
    const int64_t R = p->kv_lora_rank, dr = p->rope_dim;
    float *s = di_malloc((size_t)(p->pos0 + p->n_tokens) * sizeof(float));
    if (!s) return;
    for (int64_t h = 0; h < p->n_heads; h++) {
        for (int64_t t = 0; t < p->n_tokens; t++) {
            const float *ql = di_mla_attn_q(p, h, t);
            const float *qr = p->q_rope + t * p->q_rope_tstride + h * p->q_rope_hstride;
            float *o = di_mla_attn_out(p, h, t);
            int64_t L = p->pos0 + t + 1;
            float m = -INFINITY;
            for (int64_t j = 0; j < L; j++) {
                const int64_t row = di_mla_attn_row(p, j);
                float acc = 0.0f;
                for (int64_t i = 0; i < R; i++)
                    acc += ql[i] * p->c_kv[row * R + i];
                for (int64_t i = 0; i < dr; i++)
                    acc += qr[i] * p->k_rope[row * dr + i];
                s[j] = acc * p->scale;
                if (s[j] > m) m = s[j];
            }
            float sum = 0.0f;
            for (int64_t j = 0; j < L; j++) {
                s[j] = expf(s[j] - m);
                sum += s[j];
            }
            for (int64_t i = 0; i < R; i++)
                o[i] = 0.0f;
            for (int64_t j = 0; j < L; j++) {
                const int64_t row = di_mla_attn_row(p, j);
                for (int64_t i = 0; i < R; i++)
                    o[i] += s[j] * p->c_kv[row * R + i];
            }
            float inv = 1.0f / sum;
            for (int64_t i = 0; i < R; i++)
                o[i] *= inv;
        }
    }
    di_free(s);
}

/* ---------------------------------------------------------------------------------------- */
/* Fast version                                                                               */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    const di_mla_attn_params *p;
    float *scratch; /* [n_threads][stride] */
    int64_t stride;
} attn_job;

static void attn_items(void *vctx, int64_t begin, int64_t end, int tid) {
    const attn_job *job = vctx;
    const di_mla_attn_params *p = job->p;
    const int64_t R = p->kv_lora_rank, dr = p->rope_dim;
    float *s = job->scratch + (int64_t)tid * job->stride; /* [L] scores, then weights */
    for (int64_t item = begin; item < end; item++) {
        int64_t h = item / p->n_tokens, t = item % p->n_tokens;
        const float *ql = di_mla_attn_q(p, h, t);
        const float *qr = p->q_rope + t * p->q_rope_tstride + h * p->q_rope_hstride;
        float *o = di_mla_attn_out(p, h, t);
        int64_t L = p->pos0 + t + 1;
        float m = -INFINITY;
        for (int64_t j = 0; j < L; j++) {
            const int64_t row = di_mla_attn_row(p, j);
            float acc = g_dot(ql, p->c_kv + row * R, R) + g_dot(qr, p->k_rope + row * dr, dr);
            s[j] = acc * p->scale;
            if (s[j] > m) m = s[j];
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < L; j++) {
            s[j] = expf(s[j] - m);
            sum += s[j];
        }
        for (int64_t i = 0; i < R; i++)
            o[i] = 0.0f;
        for (int64_t j = 0; j < L; j++)
            g_axpy(s[j], p->c_kv + di_mla_attn_row(p, j) * R, R, o);
        float inv = 1.0f / sum;
        for (int64_t i = 0; i < R; i++)
            o[i] *= inv;
    }
}

void di_cpu_mla_attention(di_pool *pool, const di_mla_attn_params *p, float *scratch,
                          int64_t scratch_stride) {
    pick_vec_impl();
    attn_job job = {p, scratch, scratch_stride};
    /* Work in multiply-adds, roughly; below a few tens of thousands the pool's wake-up
     * costs more than it saves. */
    int64_t work =
        p->n_heads * p->n_tokens * (p->pos0 + p->n_tokens) * (2 * p->kv_lora_rank + p->rope_dim);
    if (work < 65536) pool = NULL;
    di_pool_run(pool, p->n_heads * p->n_tokens, 1, attn_items, &job);
}

/* ---------------------------------------------------------------------------------------- */
/* Per-head products around the absorbed attention (W_UK^T q, W_UV o)                        */
/* ---------------------------------------------------------------------------------------- */

static bool head_rows_contiguous(const di_head_matmul_params *p, int64_t in, int64_t out) {
    return p->n_tokens == 1 || (p->x_tstride == in && p->y_tstride == out);
}

/* Head h's products on one thread: one kernel call when the token rows are contiguous,
 * else one call per token (the kernels' results do not depend on n, so the bits agree). */
static void head_products(const di_head_matmul_params *p, int64_t h, bool ref) {
    const di_weight *w = &p->w[h];
    const int64_t in = p->transposed ? w->rows : w->cols, out = p->transposed ? w->cols : w->rows;
    const float *x = p->x + h * p->x_hstride;
    float *y = p->y + h * p->y_hstride;
    if (!ref) { /* strided kernels: all tokens in one call, the same bits as per token */
        if (p->transposed)
            di_cpu_matmul_t_strided(NULL, w, x, p->x_tstride, p->n_tokens, y, p->y_tstride);
        else
            di_cpu_matmul_strided(NULL, w, x, p->x_tstride, p->n_tokens, y, p->y_tstride);
        return;
    }
    bool whole = head_rows_contiguous(p, in, out);
    int64_t steps = whole ? 1 : p->n_tokens, n = whole ? p->n_tokens : 1;
    for (int64_t t = 0; t < steps; t++) {
        const float *xt = x + t * p->x_tstride;
        float *yt = y + t * p->y_tstride;
        if (ref)
            (p->transposed ? di_cpu_matmul_t_ref : di_cpu_matmul_ref)(w, xt, n, yt);
        else if (p->transposed)
            di_cpu_matmul_t(NULL, w, xt, n, yt);
        else
            di_cpu_matmul(NULL, w, xt, n, yt);
    }
}

void di_cpu_head_matmul_ref(const di_head_matmul_params *p) {
    for (int64_t h = 0; h < p->n_heads; h++)
        head_products(p, h, true);
}

static void head_items(void *vctx, int64_t begin, int64_t end, int tid) {
    for (int64_t h = begin; h < end; h++)
        head_products(vctx, h, false);
}

void di_cpu_head_matmul(di_pool *pool, const di_head_matmul_params *p) {
    const di_weight *w = &p->w[0];
    /* Small problems (decode of a tiny model) are not worth waking the pool. */
    if (p->n_heads * p->n_tokens * w->rows * w->cols < 65536) pool = NULL;
    di_pool_run(pool, p->n_heads, 1, head_items, (void *)p);
}
