/*
 * cpu_v4_fp4_avx2.c -- AVX2+FMA rows of the FP4 (e2m1) matmul; the driver and the summation
 * order are in cpu_v4_ops.c / cpu_v4_fp4_impl.h. Compiled with -mavx2 -mfma, x86-64 only.
 *
 * Design stance: the weights are read once, as stored, straight into registers. A 32-column
 * group is 16 bytes: its low nibbles (the even columns) and high nibbles (the odd ones) each
 * go through a pshufb table to 2 x e2m1 as int8 (0, 1, 2, 3, 4, 6, 8, 12 and negatives:
 * exact), which vpmovsxbd + vcvtdq2ps widen to 4 x 8 floats; x arrives de-interleaved to
 * match. The group's dot product (of the doubled weights: exact, a power of two) is one
 * multiply and three FMAs per token, and one more FMA folds it in times scale / 2. Scales are
 * converted from their E8M0 bytes once per call (the byte shifted into a float's exponent
 * field) into a small stack array, broadcast from L1 in the hot loop.
 *
 * A call covers 4 rows and up to 2 tokens per pass (8 totals: 16 ymm registers in all); more
 * tokens take more passes over the same 4 rows, which stay in L1. The next 4 rows are
 * prefetched.
 */
#include "backend/cpu/cpu_v4_fp4_impl.h"
#include "core/core.h"

#include <immintrin.h>

#define L  8
#define MT 2 /* tokens per pass */

/* E8M0 bytes -> 2^(e - 127) / 2 (exact); e == 0 and 0xff as di_e8m0_to_f32 defines them. */
static void e8m0_row_half(const uint8_t *s, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + L <= n; i += L) {
        const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s + i)));
        __m256i bits = _mm256_slli_epi32(e, 23);
        bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x00400000),
                                  _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
        bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000),
                                  _mm256_cmpeq_epi32(e, _mm256_set1_epi32(255)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0.5f)));
    }
    for (; i < n; i++)
        out[i] = di_e8m0_to_f32(s[i]) * 0.5f;
}

/* lane i += lane i + 4, then + 2, + 1: a fixed tree. */
static inline float hsum(__m256 v) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

static inline __m256 widen(__m128i b8) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8));
}

/* M tokens x 4 rows over all groups. rp: the rows' bytes; sc: their scales / 2, sc_ld apart. */
static inline __attribute__((always_inline)) void
pass(const int M, const uint8_t *const *rp, const uint8_t *const *pf, const float *sc,
     int64_t sc_ld, int64_t G, const float *xd, int64_t cols, int nr, float *y, int64_t ldy) {
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i mask = _mm_set1_epi8(0x0f);
    __m256 tot[MT][DI_FP4_NR];
    _Pragma("GCC unroll 2") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_FP4_NR; j++) tot[i][j] = _mm256_setzero_ps();
    }
    for (int64_t g = 0; g < G; g++) {
        const float *xg = xd + g * 32;
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_FP4_NR; j++) {
            if ((g & 3) == 0) _mm_prefetch((const char *)pf[j] + g * 16, _MM_HINT_T0);
            const __m128i b = _mm_loadu_si128((const __m128i *)(rp[j] + g * 16));
            const __m128i ve = _mm_shuffle_epi8(lut, _mm_and_si128(b, mask));
            const __m128i vo = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), mask));
            const __m256 we0 = widen(ve), we1 = widen(_mm_unpackhi_epi64(ve, ve));
            const __m256 wo0 = widen(vo), wo1 = widen(_mm_unpackhi_epi64(vo, vo));
            const __m256 s = _mm256_broadcast_ss(sc + j * sc_ld + g);
            _Pragma("GCC unroll 2") for (int i = 0; i < M; i++) {
                const float *x = xg + i * cols;
                __m256 a = _mm256_mul_ps(we0, _mm256_loadu_ps(x));
                a = _mm256_fmadd_ps(we1, _mm256_loadu_ps(x + 8), a);
                a = _mm256_fmadd_ps(wo0, _mm256_loadu_ps(x + 16), a);
                a = _mm256_fmadd_ps(wo1, _mm256_loadu_ps(x + 24), a);
                tot[i][j] = _mm256_fmadd_ps(a, s, tot[i][j]);
            }
        }
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < nr; j++)
            y[i * ldy + j] = hsum(tot[i][j]);
}

void di_cpu_fp4_prep_avx2(const float *x, int64_t cols, float *xd) {
    di_fp4_prep_pairs(x, 0, cols / 32, xd);
}

void di_cpu_fp4_rows_avx2(const di_weight *w, int64_t r, int nr, const float *xd, int64_t nt,
                          float *y, int64_t ldy) {
    const int64_t cols = w->cols, G = cols / 32;
    const uint8_t *rp[DI_FP4_NR], *pf[DI_FP4_NR];
    _Alignas(32) float sc[DI_FP4_NR * (DI_FP4_MAX_COLS / 32)];
    for (int j = 0; j < DI_FP4_NR; j++) { /* rows past nr repeat the last; results unused */
        const int64_t rj = r + DI_MIN(j, nr - 1);
        rp[j] = (const uint8_t *)w->data + (size_t)(rj * w->row_stride / 2);
        pf[j] = (const uint8_t *)w->data +
                (size_t)(DI_MIN(r + DI_FP4_NR + j, w->rows - 1) * w->row_stride / 2);
        e8m0_row_half(w->scale_e8m0 + rj * w->scale_cols, G, sc + j * G);
    }
    for (int64_t t0 = 0; t0 < nt; t0 += MT) {
        if (nt - t0 >= 2)
            pass(2, rp, pf, sc, G, G, xd + t0 * cols, cols, nr, y + t0 * ldy, ldy);
        else
            pass(1, rp, pf, sc, G, G, xd + t0 * cols, cols, nr, y + t0 * ldy, ldy);
    }
}
