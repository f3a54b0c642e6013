/*
 * sample_vec.c -- the portable scalar kernels of the sampler, the exponential (its arithmetic
 * is sample_full_row.h's ds_exp_core, which the vector kernels repeat lane by lane), and the
 * dispatch (see sample_vec.h).
 *
 * Invariant: every floating-point operation here is written so that it is rounded exactly
 * once, in the order written, because sample_vec_avx2.c performs the same operations lane by
 * lane. That needs floating-point contraction off: ISO C mode (-std=c11, as CMake builds us)
 * turns it off in GCC, and the pragma below does in clang. The unit test
 * simd_and_scalar_agree checks the equality on every build that has a vector level.
 */
#include "sample/sample_vec.h"
#include "core/core.h"
#include "sample/sample_full_row.h"
#include "sample/sample_vec_exp.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---------------------------------------------------------------------------------------- */
/* The exponential                                                                            */
/* ---------------------------------------------------------------------------------------- */

float di_sample_exp(float y) {
    return y >= DI_SAMPLE_EXP_MIN ? ds_exp_core(y) : 0.0f; /* NaN and -inf give 0 */
}

/* ---------------------------------------------------------------------------------------- */
/* Scalar kernels                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* Eight independent lanes keep the loop free of a serial dependency. */
static int64_t next_at_least_scalar(const float *x, int64_t from, int64_t n, float thr);

static float scan_scalar(const float *x, int64_t n, bool *bad, int64_t *first) {
    float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                  -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int nonfinite[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
            nonfinite[l] |= !(x[i + l] <= FLT_MAX) & (x[i + l] != -INFINITY);
        }
    for (; i < n; i++) {
        m[0] = x[i] > m[0] ? x[i] : m[0];
        nonfinite[0] |= !(x[i] <= FLT_MAX) & (x[i] != -INFINITY);
    }
    *bad = false;
    for (int l = 0; l < 8; l++) {
        m[0] = m[l] > m[0] ? m[l] : m[0];
        *bad |= nonfinite[l] != 0;
    }
    *first = *bad ? 0 : next_at_least_scalar(x, 0, n, m[0]);
    return m[0];
}

static int64_t next_at_least_scalar(const float *x, int64_t from, int64_t n, float thr) {
    int64_t j = from;
    while (j < n && !(x[j] >= thr))
        j++;
    return j;
}

static int64_t collect_at_least_scalar(const float *v, int64_t n, float thr, int32_t *ids) {
    int64_t c = 0;
    for (int64_t j = 0; j < n; j++)
        if (v[j] >= thr) ids[c++] = (int32_t)j;
    return c;
}

static double combine8(const double s[8]) {
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

static double weights_scalar(const float *x, int64_t n, float max, float inv_t, float cutoff,
                             float *w, double *block_sum) {
    double total = 0.0;
    for (int64_t b0 = 0; b0 < n; b0 += DI_SAMPLE_BLOCK) {
        const int64_t end = DI_MIN(b0 + DI_SAMPLE_BLOCK, n);
        double s[8] = {0};
        int64_t i = b0;
        for (; i + 8 <= end; i += 8) { /* eight lanes at a time: vectorisable as it stands */
            float e[8];
            for (int l = 0; l < 8; l++) {
                float d = x[i + l] - max;
                d = d * inv_t;
                float v = ds_exp_core(d);
                uint32_t keep = 0u - (uint32_t)((x[i + l] >= cutoff) & (d >= DI_SAMPLE_EXP_MIN));
                e[l] = ds_bits_float(ds_float_bits(v) & keep); /* v or +0, without a branch */
            }
            if (w) memcpy(w + i, e, sizeof e);
            for (int l = 0; l < 8; l++)
                s[l] += e[l];
        }
        for (; i < end; i++) {
            float d = x[i] - max;
            d = d * inv_t;
            float v = x[i] >= cutoff ? di_sample_exp(d) : 0.0f;
            if (w) w[i] = v;
            s[i & 7] += v;
        }
        double bs = combine8(s);
        block_sum[b0 / DI_SAMPLE_BLOCK] = bs;
        total += bs;
    }
    return total;
}

const di_sample_kernels di_sample_kernels_scalar = {
    "scalar", scan_scalar, next_at_least_scalar, collect_at_least_scalar, weights_scalar,
};

/* ---------------------------------------------------------------------------------------- */
/* Dispatch                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static _Atomic(const di_sample_kernels *) g_active;

/* Levels from the lowest; the best this CPU runs is the last non-NULL one. */
static const di_sample_kernels *level_kernels(int rank) {
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    if (rank == 1 && __builtin_cpu_supports("avx2")) return &di_sample_kernels_avx2;
    if (rank == 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2"))
        return &di_sample_kernels_avx512;
#endif
    return rank == 0 ? &di_sample_kernels_scalar : NULL;
}

static const di_sample_kernels *detect_best(void) {
    for (int rank = 2; rank > 0; rank--) {
        const di_sample_kernels *k = level_kernels(rank);
        if (k) return k;
    }
    return &di_sample_kernels_scalar;
}

/* NULL: the best; else the named level if this CPU runs it. */
static const di_sample_kernels *by_level(const char *level) {
    if (!level) return detect_best();
    static const char *const names[3] = {"scalar", "avx2", "avx512"};
    for (int rank = 0; rank < 3; rank++)
        if (strcmp(level, names[rank]) == 0) return level_kernels(rank);
    return NULL;
}

const di_sample_kernels *di_sample_kernels_active(void) {
    const di_sample_kernels *k = atomic_load_explicit(&g_active, memory_order_acquire);
    if (k) return k;
    const char *env = getenv("DI_SIMD");
    k = env && *env ? by_level(env) : NULL;
    if (!k) k = detect_best(); /* the matmul warns about an unusable DI_SIMD */
    atomic_store_explicit(&g_active, k, memory_order_release);
    return k;
}

int di_sample_simd_force(const char *level) {
    const di_sample_kernels *k = by_level(level);
    if (!k) return -1;
    atomic_store_explicit(&g_active, k, memory_order_release);
    return 0;
}
