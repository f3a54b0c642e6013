/*
 * cpu_v4_ops.c -- CPU kernels of the DeepSeek-V4 ops: FP4 (e2m1) matmul, mHC mixing
 * (Sinkhorn) and its update, sink attention over explicit key lists, the compressor's
 * softmax pooling, Lightning-indexer scores and the clamped SwiGLU.
 *
 * Design stance: these ops are cheap next to the matmuls, so they are plain loops threaded
 * over independent rows (tokens). Every output element's arithmetic depends only on the op's
 * shape, never on the split, so the fast and reference versions agree bitwise for any thread
 * count (batch invariance). The FP4 matmul is the exception in cost: its driver is here, its
 * AVX-512 / AVX2 kernels (cpu_v4_fp4_*.c) read the stored bytes once, in their own fixed
 * order (cpu_v4_fp4_impl.h): batch- and thread-invariant, equal to the reference to rounding.
 * Sums that decide numerics (norm statistics, mixing products, softmax denominators) run in
 * double: the goldens are float64 and fp32 accumulation error would show in the comparison.
 */
#include "backend/cpu/cpu_v4_ops.h"
#include "backend/cpu/cpu_v4_fp4_impl.h"
#include "backend/cpu/cpu_nn.h"
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

/* Runs fn over [0, n) on the pool, or inline when there is no pool or little work. */
static void run_rows(di_pool *pool, int64_t n, int64_t work, di_pool_fn fn, void *ctx) {
    if (!pool || n < 2 || work < 32768) {
        fn(ctx, 0, n, 0);
        return;
    }
    di_pool_run(pool, n, 1, fn, ctx);
}

/* ---------------------------------------------------------------------------------------- */
/* FP4 e2m1 matmul with E8M0 scales per 32 columns                                            */
/* ---------------------------------------------------------------------------------------- */

/* Value of element (r, c) of an F4_E2M1 weight (exact in float: a 2-bit mantissa times a
 * power-of-two scale; the stored E8M0 byte is decoded by di_e8m0_to_f32, the definition). */
static inline float fp4_at(const di_weight *w, int64_t r, int64_t c) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)(r * w->row_stride / 2);
    uint8_t b = row[c / 2];
    float q = di_e2m1_table[(c & 1) ? (b >> 4) : (b & 15)];
    return q * di_e8m0_to_f32(w->scale_e8m0[r * w->scale_cols + c / w->block_cols]);
}

void di_cpu_matmul_fp4_ref(const di_weight *w, const float *x, int64_t n, float *y) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < w->rows; r++) {
            double s = 0.0;
            for (int64_t c = 0; c < w->cols; c++)
                s += (double)x[t * w->cols + c] * (double)fp4_at(w, r, c);
            y[t * w->rows + r] = (float)s;
        }
}

typedef struct {
    const di_weight *w;
    const float *x;
    float *y;
    int64_t n;
    di_fp4_prep_fn prep; /* SIMD levels: x in the kernel's column order */
    di_fp4_rows_fn simd; /* NULL: the scalar rows */
} fp4_job;

/* Scalar level, rows [b, e) for every token. Per block of block_cols columns the unscaled
 * products are summed in column order (float), then scaled once and added into a double
 * accumulator: the order depends only on cols, never on n or the split. */
static void fp4_rows(void *vctx, int64_t b, int64_t e, int tid) {
    const fp4_job *j = vctx;
    const di_weight *w = j->w;
    const int64_t C = w->cols, bc = w->block_cols;
    for (int64_t r = b; r < e; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)(r * w->row_stride / 2);
        const uint8_t *sc = w->scale_e8m0 + r * w->scale_cols;
        for (int64_t t = 0; t < j->n; t++) {
            const float *x = j->x + t * C;
            double acc = 0.0;
            for (int64_t c0 = 0; c0 < C; c0 += bc) {
                float part = 0.0f;
                int64_t c1 = DI_MIN(c0 + bc, C);
                for (int64_t c = c0; c < c1; c++) {
                    uint8_t byte = row[c / 2];
                    part += x[c] * di_e2m1_table[(c & 1) ? (byte >> 4) : (byte & 15)];
                }
                acc += (double)part * (double)di_e8m0_to_f32(sc[c0 / bc]);
            }
            j->y[t * w->rows + r] = (float)acc;
        }
    }
}

/* SIMD levels, rows [b, e): per block of tokens (as many as fit DI_FP4_MAX_COLS floats),
 * x is put in the kernel's column order in thread-private stack scratch (see
 * cpu_v4_fp4_impl.h), then the kernel runs 4 rows at a time over it. */
static void fp4_rows_simd(void *vctx, int64_t b, int64_t e, int tid) {
    const fp4_job *j = vctx;
    const int64_t C = j->w->cols, rows = j->w->rows, tb = DI_MAX(DI_FP4_MAX_COLS / C, 1);
    _Alignas(64) float xd[DI_FP4_MAX_COLS];
    for (int64_t t0 = 0; t0 < j->n; t0 += tb) {
        const int64_t nt = DI_MIN(tb, j->n - t0);
        for (int64_t t = 0; t < nt; t++)
            j->prep(j->x + (t0 + t) * C, C, xd + t * C);
        for (int64_t r = b; r < e; r += DI_FP4_NR)
            j->simd(j->w, r, (int)DI_MIN(DI_FP4_NR, e - r), xd, nt, j->y + t0 * rows + r, rows);
    }
}

/* The active SIMD level (DI_SIMD, di_cpu_simd_force) picks the kernel, like the stock
 * matmuls; the SIMD kernels need 32-column blocks and at most DI_FP4_MAX_COLS columns. */
void di_cpu_matmul_fp4(di_pool *pool, const di_weight *w, const float *x, int64_t n, float *y) {
    if (n <= 0 || w->rows <= 0) return;
    fp4_job j = {w, x, y, n, NULL, NULL};
#if defined(__x86_64__) || defined(_M_X64)
    const char *lvl = di_cpu_simd_name();
    if (w->block_cols == 32 && w->cols % 32 == 0 && w->cols > 0 && w->cols <= DI_FP4_MAX_COLS) {
        if (strcmp(lvl, "avx512") == 0)
            j.prep = di_cpu_fp4_prep_avx512, j.simd = di_cpu_fp4_rows_avx512;
        else if (strcmp(lvl, "avx2") == 0)
            j.prep = di_cpu_fp4_prep_avx2, j.simd = di_cpu_fp4_rows_avx2;
    }
#endif
    if (!j.simd) {
        run_rows(pool, w->rows, n * w->rows * w->cols, fp4_rows, &j);
        return;
    }
    if (!pool || w->rows <= DI_FP4_NR || n * w->rows * w->cols < 32768)
        fp4_rows_simd(&j, 0, w->rows, 0);
    else /* whole 4-row groups per thread: the split never changes a value */
        di_pool_run(pool, w->rows, 4 * DI_FP4_NR, fp4_rows_simd, &j);
}

/* ---------------------------------------------------------------------------------------- */
/* mHC                                                                                        */
/* ---------------------------------------------------------------------------------------- */

static float sigmoidf_(float v) {
    return (float)(1.0 / (1.0 + exp(-(double)v)));
}

/* Largest n_hc supported by the fixed-size locals below (Flash uses 4). */
#define HC_MAX 64

static void hc_pre_row(const di_v4_hc_params *p, int64_t t) {
    const int64_t n = p->n_hc, D = p->dim, ND = n * D;
    const int64_t n_mix = p->iters > 0 ? (2 + n) * n : n;
    const float *x = p->x + t * ND;
    double ss = 0.0;
    for (int64_t i = 0; i < ND; i++)
        ss += (double)x[i] * (double)x[i];
    float rs = 1.0f / sqrtf((float)(ss / (double)ND) + p->eps);
    float mix[(2 + HC_MAX) * HC_MAX];
    for (int64_t k = 0; k < n_mix; k++) {
        const float *f = p->fn + k * ND;
        double s = 0.0;
        for (int64_t i = 0; i < ND; i++)
            s += (double)f[i] * (double)(x[i] * rs);
        mix[k] = (float)s;
    }
    float pre[HC_MAX];
    for (int64_t j = 0; j < n; j++)
        pre[j] = sigmoidf_(mix[j] * p->scale[0] + p->base[j]) + p->hc_eps;
    float *h = p->h + t * D;
    for (int64_t d = 0; d < D; d++) {
        double s = 0.0;
        for (int64_t j = 0; j < n; j++)
            s += (double)pre[j] * (double)x[j * D + d];
        h[d] = (float)s;
    }
    if (p->iters <= 0) return;

    float *post = p->post + t * n, *M = p->mix + t * n * n;
    for (int64_t j = 0; j < n; j++)
        post[j] = 2.0f * sigmoidf_(mix[n + j] * p->scale[1] + p->base[n + j]);
    /* Row softmax of the n x n logits, then Sinkhorn: columns first, then (iters - 1) x
     * (rows, columns), hc_eps in every denominator as transformers does. */
    for (int64_t j = 0; j < n; j++) {
        float *row = M + j * n;
        float mx = -INFINITY;
        for (int64_t k = 0; k < n; k++) {
            row[k] = mix[2 * n + j * n + k] * p->scale[2] + p->base[2 * n + j * n + k];
            mx = fmaxf(mx, row[k]);
        }
        double s = 0.0;
        for (int64_t k = 0; k < n; k++)
            s += exp((double)(row[k] - mx));
        for (int64_t k = 0; k < n; k++)
            row[k] = (float)(exp((double)(row[k] - mx)) / s) + p->hc_eps;
    }
    for (int64_t it = 0; it < p->iters; it++) {
        if (it > 0)
            for (int64_t j = 0; j < n; j++) {
                double s = 0.0;
                for (int64_t k = 0; k < n; k++)
                    s += M[j * n + k];
                float den = (float)s + p->hc_eps;
                for (int64_t k = 0; k < n; k++)
                    M[j * n + k] /= den;
            }
        for (int64_t k = 0; k < n; k++) {
            double s = 0.0;
            for (int64_t j = 0; j < n; j++)
                s += M[j * n + k];
            float den = (float)s + p->hc_eps;
            for (int64_t j = 0; j < n; j++)
                M[j * n + k] /= den;
        }
    }
}

static void hc_pre_rows(void *vctx, int64_t b, int64_t e, int tid) {
    for (int64_t t = b; t < e; t++)
        hc_pre_row(vctx, t);
}

void di_cpu_v4_hc_pre_ref(const di_v4_hc_params *p) {
    hc_pre_rows((void *)p, 0, p->n_tokens, 0);
}

void di_cpu_v4_hc_pre(di_pool *pool, const di_v4_hc_params *p) {
    int64_t n_mix = p->iters > 0 ? (2 + p->n_hc) * p->n_hc : p->n_hc;
    run_rows(pool, p->n_tokens, p->n_tokens * n_mix * p->n_hc * p->dim, hc_pre_rows, (void *)p);
}

typedef struct {
    int64_t n, D;
    const float *x, *y, *post, *mix;
    float *out;
} hc_post_job;

static void hc_post_rows(void *vctx, int64_t b, int64_t e, int tid) {
    const hc_post_job *j = vctx;
    const int64_t n = j->n, D = j->D;
    for (int64_t t = b; t < e; t++) {
        const float *x = j->x + t * n * D, *y = j->y + t * D;
        const float *post = j->post + t * n, *M = j->mix + t * n * n;
        for (int64_t k = 0; k < n; k++) {
            float *o = j->out + (t * n + k) * D;
            for (int64_t d = 0; d < D; d++) {
                double s = (double)post[k] * (double)y[d];
                for (int64_t i = 0; i < n; i++)
                    s += (double)M[i * n + k] * (double)x[i * D + d];
                o[d] = (float)s;
            }
        }
    }
}

void di_cpu_v4_hc_post(di_pool *pool, int64_t n_tokens, int64_t n_hc, int64_t dim, const float *x,
                       const float *y, const float *post, const float *mix, float *out) {
    hc_post_job j = {n_hc, dim, x, y, post, mix, out};
    run_rows(pool, n_tokens, n_tokens * n_hc * n_hc * dim, hc_post_rows, &j);
}

/* ---------------------------------------------------------------------------------------- */
/* Sink attention                                                                             */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    const di_v4_attn_params *p;
    bool ref;
    bool per_worker; /* items are (token, head) pairs and scratch rows are per worker */
} attn_job;

static double dot_ref(const float *a, const float *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * (double)b[i];
    return s;
}

/* Query t, head h with score row s. The arithmetic depends only on (t, h)'s inputs. */
static void attn_one(const attn_job *job, int64_t t, int64_t h, float *s) {
    const di_v4_attn_params *p = job->p;
    const int64_t d = p->dim, nk = p->n_keys[t];
    const float *const *keys = p->keys + t * p->max_keys;
    const float *q = p->q + t * p->q_tstride + h * d;
    float *o = p->out + t * p->out_tstride + h * d;
    float sink = p->sinks[h], mx = sink;
    for (int64_t k = 0; k < nk; k++) {
        float dot = job->ref ? (float)dot_ref(q, keys[k], d) : di_cpu_vec_dot(q, keys[k], d);
        s[k] = dot * p->scale;
        mx = fmaxf(mx, s[k]);
    }
    /* The sink joins the normaliser (and the max) but has no value row. */
    double den = exp((double)(sink - mx));
    for (int64_t k = 0; k < nk; k++) {
        s[k] = (float)exp((double)(s[k] - mx));
        den += s[k];
    }
    memset(o, 0, (size_t)d * sizeof(float));
    for (int64_t k = 0; k < nk; k++) {
        float pk = (float)(s[k] / den);
        if (job->ref)
            for (int64_t i = 0; i < d; i++)
                o[i] += pk * keys[k][i];
        else
            di_cpu_vec_axpy(pk, keys[k], d, o);
    }
}

static void attn_items(void *vctx, int64_t b, int64_t e, int tid) {
    const attn_job *job = vctx;
    const di_v4_attn_params *p = job->p;
    for (int64_t i = b; i < e; i++) {
        if (job->per_worker) {
            attn_one(job, i / p->n_heads, i % p->n_heads, p->scratch + tid * p->max_keys);
        } else {
            for (int64_t h = 0; h < p->n_heads; h++)
                attn_one(job, i, h, p->scratch + i * p->max_keys);
        }
    }
}

void di_cpu_v4_attention_ref(const di_v4_attn_params *p) {
    attn_job j = {p, true, false};
    attn_items(&j, 0, p->n_tokens, 0);
}

/* Decode has one token and many heads: spread (token, head) pairs over the workers when
 * there is a scratch row per worker, else whole tokens. Same bits either way. */
void di_cpu_v4_attention(di_pool *pool, const di_v4_attn_params *p) {
    int64_t work = p->n_tokens * p->n_heads * p->max_keys * p->dim * 2;
    int nt = pool ? di_pool_size(pool) : 1;
    attn_job j = {p, false, nt > 1 && nt <= p->scratch_rows && p->n_heads > 1};
    run_rows(pool, j.per_worker ? p->n_tokens * p->n_heads : p->n_tokens, work, attn_items, &j);
}

/* ---------------------------------------------------------------------------------------- */
/* Compressor pooling, indexer scores, SwiGLU                                                 */
/* ---------------------------------------------------------------------------------------- */

void di_cpu_v4_pool(di_pool *pool, const di_v4_pool_params *p) {
    (void)pool; /* one row of width floats: never worth the pool */
    for (int64_t c = 0; c < p->width; c++) {
        float mx = -INFINITY;
        for (int64_t i = 0; i < p->n_slots; i++)
            mx = fmaxf(mx, p->z[i][c]);
        double den = 0.0, num = 0.0;
        for (int64_t i = 0; i < p->n_slots; i++) {
            double wgt = exp((double)(p->z[i][c] - mx));
            den += wgt;
            num += wgt * (double)p->c[i][c];
        }
        p->out[c] = (float)(num / den);
    }
}

/* Items are (token, block of INDEX_BLOCK entries): one decode query over a long context
 * still spreads over every worker. */
#define INDEX_BLOCK 64

typedef struct {
    const di_v4_index_params *p;
    int64_t n_blocks;
    bool ref;
} index_job;

static void index_items(void *vctx, int64_t b, int64_t e, int tid) {
    const index_job *j = vctx;
    const di_v4_index_params *p = j->p;
    const int64_t nh = p->n_heads, d = p->dim;
    for (int64_t it = b; it < e; it++) {
        const int64_t t = it / j->n_blocks, w0 = (it % j->n_blocks) * INDEX_BLOCK;
        const int64_t w1 = DI_MIN(w0 + INDEX_BLOCK, p->n_visible[t]);
        const float *q = p->q + t * nh * d, *wt = p->weights + t * nh;
        for (int64_t w = w0; w < w1; w++) {
            const float *k = p->keys + w * d;
            double s = 0.0;
            for (int64_t h = 0; h < nh; h++) {
                double dot = j->ref ? dot_ref(q + h * d, k, d) : di_cpu_vec_dot(q + h * d, k, d);
                if (dot > 0) s += (double)wt[h] * dot; /* ReLU per head */
            }
            p->out[t * p->out_stride + w] = (float)(s * (double)p->scale);
        }
    }
}

static int64_t index_blocks(const di_v4_index_params *p) {
    int64_t maxv = 0;
    for (int64_t t = 0; t < p->n_tokens; t++)
        maxv = DI_MAX(maxv, p->n_visible[t]);
    return DI_MAX((maxv + INDEX_BLOCK - 1) / INDEX_BLOCK, 1);
}

void di_cpu_v4_index_scores_ref(const di_v4_index_params *p) {
    index_job j = {p, index_blocks(p), true};
    index_items(&j, 0, p->n_tokens * j.n_blocks, 0);
}

void di_cpu_v4_index_scores(di_pool *pool, const di_v4_index_params *p) {
    index_job j = {p, index_blocks(p), false};
    int64_t n = p->n_tokens * j.n_blocks;
    run_rows(pool, n, n * INDEX_BLOCK * p->n_heads * p->dim, index_items, &j);
}

void di_cpu_v4_swiglu(di_pool *pool, const float *gate, const float *up, int64_t n, float limit,
                      float *out) {
    (void)pool;
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i];
        if (limit > 0) {
            g = fminf(g, limit);
            u = fminf(fmaxf(u, -limit), limit);
        }
        out[i] = (float)((double)g / (1.0 + exp(-(double)g))) * u;
    }
}
