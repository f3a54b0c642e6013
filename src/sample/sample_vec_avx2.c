/*
 * sample_vec_avx2.c -- AVX2 kernels of the sampler (contract: sample_vec.h). Chosen at run
 * time when the CPU has AVX2.
 *
 * Design stance: eight float lanes; the exponential is sample_vec.c's di_sample_exp written
 * with one intrinsic per scalar operation (multiplications and additions only, never FMA),
 * so each lane rounds exactly as the scalar code does. The weight sums keep the two halves
 * of a vector in two double accumulators, which is the block order's "id % 8" lanes; partial
 * vectors at the end of a row go through the scalar exponential into the same lanes.
 */
#include "core/core.h"
#include "sample/sample_vec.h"
#include "sample/sample_vec_exp.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>

#define L          8
#define SCAN_CHUNK 2048 /* ids per chunk of the maximum scan */

/* ---------------------------------------------------------------------------------------- */
/* The exponential                                                                            */
/* ---------------------------------------------------------------------------------------- */

/* di_sample_exp of each lane, for lanes where keep is all ones; 0 elsewhere. */
static inline __m256 exp8(__m256 y, __m256 keep) {
    keep = _mm256_and_ps(keep, _mm256_cmp_ps(y, _mm256_set1_ps(DI_SAMPLE_EXP_MIN), _CMP_GE_OQ));
    const __m256 magic = _mm256_set1_ps(EXP_MAGIC);
    __m256 k = _mm256_add_ps(_mm256_mul_ps(y, _mm256_set1_ps(EXP_LOG2E)), magic);
    __m256i n = _mm256_sub_epi32(_mm256_castps_si256(k), _mm256_castps_si256(magic));
    __m256 fn = _mm256_sub_ps(k, magic);
    __m256 r = _mm256_sub_ps(y, _mm256_mul_ps(fn, _mm256_set1_ps(EXP_LN2_HI)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(fn, _mm256_set1_ps(EXP_LN2_LO)));
    __m256 z = _mm256_mul_ps(r, r);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P1));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P2));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P3));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P4));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P5));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, z), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(n, 23));
    return _mm256_and_ps(_mm256_castsi256_ps(e), keep);
}

/* ---------------------------------------------------------------------------------------- */
/* Kernels                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static int64_t next_at_least_avx2(const float *x, int64_t from, int64_t n, float thr);

/* Four accumulators of eight lanes per chunk of SCAN_CHUNK ids; NaN and +inf are flagged
 * apart from the maximum. The first chunk reaching the maximum is remembered, so the first
 * index holding it is searched in cache, from there, instead of in a second pass. */
static float scan_avx2(const float *x, int64_t n, bool *bad, int64_t *first) {
    __m256 b0 = _mm256_setzero_ps(), b1 = b0;
    const __m256 inf = _mm256_set1_ps(INFINITY);
    float best = -INFINITY;
    int64_t best_c0 = 0;
    int flag = 0;
    for (int64_t c0 = 0; c0 < n; c0 += SCAN_CHUNK) {
        const int64_t end = DI_MIN(c0 + SCAN_CHUNK, n);
        __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
        int64_t i = c0;
        for (; i + 4 * L <= end; i += 4 * L) {
            __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + L);
            __m256 v2 = _mm256_loadu_ps(x + i + 2 * L), v3 = _mm256_loadu_ps(x + i + 3 * L);
            m0 = _mm256_max_ps(v0, m0);
            m1 = _mm256_max_ps(v1, m1);
            m2 = _mm256_max_ps(v2, m2);
            m3 = _mm256_max_ps(v3, m3);
            /* NaN in any of the four: unordered; +inf: equal to inf. */
            b0 = _mm256_or_ps(b0, _mm256_or_ps(_mm256_cmp_ps(v0, v1, _CMP_UNORD_Q),
                                               _mm256_cmp_ps(v2, v3, _CMP_UNORD_Q)));
            __m256 top = _mm256_max_ps(_mm256_max_ps(v0, v1), _mm256_max_ps(v2, v3));
            b1 = _mm256_or_ps(b1, _mm256_cmp_ps(top, inf, _CMP_EQ_OQ));
        }
        for (; i + L <= end; i += L) {
            __m256 v = _mm256_loadu_ps(x + i);
            m0 = _mm256_max_ps(v, m0);
            b0 = _mm256_or_ps(b0, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            b1 = _mm256_or_ps(b1, _mm256_cmp_ps(v, inf, _CMP_EQ_OQ));
        }
        __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        float cm = _mm_cvtss_f32(h);
        for (; i < end; i++) {
            cm = x[i] > cm ? x[i] : cm;
            flag |= !(x[i] <= FLT_MAX) & (x[i] != -INFINITY);
        }
        if (cm > best) best = cm, best_c0 = c0;
    }
    flag |= _mm256_movemask_ps(_mm256_or_ps(b0, b1));
    *bad = flag != 0;
    *first = *bad ? 0 : next_at_least_avx2(x, best_c0, n, best);
    return best;
}

static int64_t next_at_least_avx2(const float *x, int64_t from, int64_t n, float thr) {
    const __m256 t = _mm256_set1_ps(thr);
    int64_t j = from;
    for (; j + 4 * L <= n; j += 4 * L) {
        __m256 c0 = _mm256_cmp_ps(_mm256_loadu_ps(x + j), t, _CMP_GE_OQ);
        __m256 c1 = _mm256_cmp_ps(_mm256_loadu_ps(x + j + L), t, _CMP_GE_OQ);
        __m256 c2 = _mm256_cmp_ps(_mm256_loadu_ps(x + j + 2 * L), t, _CMP_GE_OQ);
        __m256 c3 = _mm256_cmp_ps(_mm256_loadu_ps(x + j + 3 * L), t, _CMP_GE_OQ);
        if (!_mm256_testz_ps(_mm256_or_ps(c0, c1), _mm256_or_ps(c0, c1)) ||
            !_mm256_testz_ps(_mm256_or_ps(c2, c3), _mm256_or_ps(c2, c3))) {
            uint32_t m = (uint32_t)_mm256_movemask_ps(c0) | (uint32_t)_mm256_movemask_ps(c1) << 8 |
                         (uint32_t)_mm256_movemask_ps(c2) << 16 |
                         (uint32_t)_mm256_movemask_ps(c3) << 24;
            return j + __builtin_ctz(m);
        }
    }
    for (; j + L <= n; j += L) {
        int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), t, _CMP_GE_OQ));
        if (m) return j + __builtin_ctz((unsigned)m);
    }
    while (j < n && !(x[j] >= thr))
        j++;
    return j;
}

static int64_t collect_at_least_avx2(const float *v, int64_t n, float thr, int32_t *ids) {
    const __m256 t = _mm256_set1_ps(thr);
    int64_t c = 0, j = 0;
    for (; j + L <= n; j += L) {
        unsigned m =
            (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + j), t, _CMP_GE_OQ));
        while (m) {
            ids[c++] = (int32_t)(j + __builtin_ctz(m));
            m &= m - 1;
        }
    }
    for (; j < n; j++)
        if (v[j] >= thr) ids[c++] = (int32_t)j;
    return c;
}

static double weights_avx2(const float *x, int64_t n, float max, float inv_t, float cutoff,
                           float *w, double *block_sum) {
    const __m256 vmax = _mm256_set1_ps(max), vinv = _mm256_set1_ps(inv_t);
    const __m256 vcut = _mm256_set1_ps(cutoff);
    double total = 0.0;
    for (int64_t b0 = 0; b0 < n; b0 += DI_SAMPLE_BLOCK) {
        const int64_t end = DI_MIN(b0 + DI_SAMPLE_BLOCK, n);
        __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd(); /* lanes 0-3, 4-7 */
        int64_t i = b0;
        for (; i + L <= end; i += L) {
            __m256 v = _mm256_loadu_ps(x + i);
            __m256 y = _mm256_mul_ps(_mm256_sub_ps(v, vmax), vinv);
            __m256 e = exp8(y, _mm256_cmp_ps(v, vcut, _CMP_GE_OQ));
            if (w) _mm256_storeu_ps(w + i, e);
            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        }
        double s[L];
        _mm256_storeu_pd(s, lo);
        _mm256_storeu_pd(s + 4, hi);
        for (; i < end; i++) { /* the row's last partial vector, in the same lanes */
            float d = x[i] - max;
            d = d * inv_t;
            float e = x[i] >= cutoff ? di_sample_exp(d) : 0.0f;
            if (w) w[i] = e;
            s[i & 7] += e;
        }
        double bs = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
        block_sum[b0 / DI_SAMPLE_BLOCK] = bs;
        total += bs;
    }
    return total;
}

const di_sample_kernels di_sample_kernels_avx2 = {
    "avx2", scan_avx2, next_at_least_avx2, collect_at_least_avx2, weights_avx2,
};

const di_sample_kernels di_sample_kernels_avx512 = {
    "avx512", scan_avx2, next_at_least_avx2, collect_at_least_avx2, di_sample_weights_avx512,
};
