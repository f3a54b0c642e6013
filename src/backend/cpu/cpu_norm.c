/*
 * cpu_norm.c -- the CPU backend's element-wise and row-wise ops: RMSNorm, SwiGLU, axpy and
 * the embedding gather.
 *
 * These are cheap next to the matmuls, so the fast versions only add threads (over rows or
 * over element ranges) and compute every element exactly as the reference does: results are
 * bitwise equal to the reference for any thread count.
 *
 * RMSNorm follows transformers: variance = mean(x^2) in float, then
 * y = w * (x * rsqrt(variance + eps)). The mean is accumulated in double so it is exact
 * enough that the summation order does not matter at float precision.
 */
#include "backend/cpu/cpu_nn.h"
#include "backend/cpu/cpu_ops.h"

#include <math.h>

/* ---------------------------------------------------------------------------------------- */
/* RMSNorm                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static void rmsnorm_row(const float *x, const float *w, int64_t dim, float eps, float *y) {
    double ss = 0.0;
    for (int64_t i = 0; i < dim; i++)
        ss += (double)x[i] * (double)x[i];
    float var = (float)(ss / (double)dim);
    float r = 1.0f / sqrtf(var + eps);
    for (int64_t i = 0; i < dim; i++)
        y[i] = w[i] * (x[i] * r);
}

void di_cpu_rmsnorm_ref(const float *x, int64_t x_stride, const float *w, int64_t n, int64_t dim,
                        float eps, float *y, int64_t y_stride) {
    for (int64_t t = 0; t < n; t++)
        rmsnorm_row(x + t * x_stride, w, dim, eps, y + t * y_stride);
}

typedef struct {
    const float *x, *w;
    float *y;
    int64_t x_stride, y_stride, dim;
    float eps;
} rms_job;

static void rms_rows(void *vctx, int64_t b, int64_t e, int tid) {
    const rms_job *j = vctx;
    for (int64_t t = b; t < e; t++)
        rmsnorm_row(j->x + t * j->x_stride, j->w, j->dim, j->eps, j->y + t * j->y_stride);
}

void di_cpu_rmsnorm(di_pool *pool, const float *x, int64_t x_stride, const float *w, int64_t n,
                    int64_t dim, float eps, float *y, int64_t y_stride) {
    rms_job j = {x, w, y, x_stride, y_stride, dim, eps};
    if (n * dim < 16384) {
        rms_rows(&j, 0, n, 0); /* not worth waking the pool */
        return;
    }
    di_pool_run(pool, n, 1, rms_rows, &j);
}

/* ---------------------------------------------------------------------------------------- */
/* SwiGLU and axpy                                                                            */
/* ---------------------------------------------------------------------------------------- */

static inline float silu(float g) {
    return g / (1.0f + expf(-g));
}

void di_cpu_silu_mul_ref(const float *gate, const float *up, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++)
        out[i] = silu(gate[i]) * up[i];
}

typedef struct {
    const float *gate, *up;
    float *out;
} silu_job;

static void silu_range(void *vctx, int64_t b, int64_t e, int tid) {
    const silu_job *j = vctx;
    for (int64_t i = b; i < e; i++)
        j->out[i] = silu(j->gate[i]) * j->up[i];
}

void di_cpu_silu_mul(di_pool *pool, const float *gate, const float *up, int64_t n, float *out) {
    silu_job j = {gate, up, out};
    if (n < 32768) {
        silu_range(&j, 0, n, 0);
        return;
    }
    di_pool_run(pool, n, 4096, silu_range, &j);
}

void di_cpu_axpy(di_pool *pool, float a, const float *x, int64_t n, float *y) {
    (void)pool; /* memory-bound and small: one thread */
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* ---------------------------------------------------------------------------------------- */
/* Embedding gather                                                                           */
/* ---------------------------------------------------------------------------------------- */

void di_cpu_embed(di_pool *pool, const di_weight *table, const int32_t *ids, int64_t n,
                  float *out) {
    (void)pool;
    for (int64_t t = 0; t < n; t++)
        di_cpu_weight_row_f32(table, ids[t], out + t * table->cols);
}
