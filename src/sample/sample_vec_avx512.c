/*
 * sample_vec_avx512.c -- the AVX-512 weights kernel of the sampler (contract: sample_vec.h);
 * the other kernels stay AVX2 (they are bound by memory, not by arithmetic). Chosen at run
 * time when the CPU has AVX-512F.
 *
 * Design stance: sixteen float lanes running sample_vec.c's di_sample_exp one intrinsic per
 * scalar operation (never FMA), so each lane rounds as the scalar code does. A vector covers
 * ids i..i+15 with i % 8 == 0: both of its halves fall on the block order's eight lanes, so
 * one accumulator of eight doubles adds the low half, then the high half, which is each
 * lane's increasing id order.
 */
#include "core/core.h"
#include "sample/sample_vec.h"
#include "sample/sample_vec_exp.h"

#include <immintrin.h>

#define L 16

/* di_sample_exp of each lane in keep; 0 elsewhere. */
static inline __m512 exp16(__m512 y, __mmask16 keep) {
    keep &= _mm512_cmp_ps_mask(y, _mm512_set1_ps(DI_SAMPLE_EXP_MIN), _CMP_GE_OQ);
    const __m512 magic = _mm512_set1_ps(EXP_MAGIC);
    __m512 k = _mm512_add_ps(_mm512_mul_ps(y, _mm512_set1_ps(EXP_LOG2E)), magic);
    __m512i n = _mm512_sub_epi32(_mm512_castps_si512(k), _mm512_castps_si512(magic));
    __m512 fn = _mm512_sub_ps(k, magic);
    __m512 r = _mm512_sub_ps(y, _mm512_mul_ps(fn, _mm512_set1_ps(EXP_LN2_HI)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(fn, _mm512_set1_ps(EXP_LN2_LO)));
    __m512 z = _mm512_mul_ps(r, r);
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(EXP_P1));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(EXP_P2));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(EXP_P3));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(EXP_P4));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(EXP_P5));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, z), r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(n, 23));
    return _mm512_maskz_mov_ps(keep, _mm512_castsi512_ps(e));
}

double di_sample_weights_avx512(const float *x, int64_t n, float max, float inv_t, float cutoff,
                                float *w, double *block_sum) {
    const __m512 vmax = _mm512_set1_ps(max), vinv = _mm512_set1_ps(inv_t);
    const __m512 vcut = _mm512_set1_ps(cutoff);
    double total = 0.0;
    for (int64_t b0 = 0; b0 < n; b0 += DI_SAMPLE_BLOCK) {
        const int64_t end = DI_MIN(b0 + DI_SAMPLE_BLOCK, n);
        __m512d acc = _mm512_setzero_pd(); /* lane j: ids with id % 8 == j */
        int64_t i = b0;
        for (; i + L <= end; i += L) {
            __m512 v = _mm512_loadu_ps(x + i);
            __m512 y = _mm512_mul_ps(_mm512_sub_ps(v, vmax), vinv);
            __m512 e = exp16(y, _mm512_cmp_ps_mask(v, vcut, _CMP_GE_OQ));
            if (w) _mm512_storeu_ps(w + i, e);
            acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
            __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1));
            acc = _mm512_add_pd(acc, _mm512_cvtps_pd(hi));
        }
        double s[8];
        _mm512_storeu_pd(s, acc);
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
