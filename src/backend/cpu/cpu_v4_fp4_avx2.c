/*
 * cpu_v4_fp4_avx2.c -- AVX2+FMA rows of the FP4 (e2m1) matmul (cpu_v4_ops.c dispatches here
 * when the active SIMD level is avx2 or avx512; compiled with -mavx2 -mfma, x86-64 only).
 *
 * A 32-column block is 16 bytes: the nibbles are split, interleaved back into column order,
 * mapped through a pshufb table to 2 x e2m1 as int8 (0, 1, 2, 3, 4, 6, 8, 12 and negatives:
 * exact integers), widened to float and multiplied by scale / 2 -- the exact dequantized
 * weights, since the scale is a power of two. Each token keeps one 8-lane accumulator that
 * the blocks are fused into in column order, so y[t][r]'s bits depend only on cols: the
 * result does not change with n, the row split or the thread count. Up to 8 tokens share
 * one decode of each block.
 */
#include "backend/cpu/cpu_v4_ops.h"

#include <immintrin.h>

void di_cpu_fp4_rows_avx2(const di_weight *w, const float *x, int64_t n, float *y, int64_t r0,
                          int64_t r1);

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

void di_cpu_fp4_rows_avx2(const di_weight *w, const float *x, int64_t n, float *y, int64_t r0,
                          int64_t r1) {
    const int64_t C = w->cols;
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i mask = _mm_set1_epi8(0x0f);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)(r * w->row_stride / 2);
        const float *sc = w->scale + r * w->scale_cols;
        for (int64_t t0 = 0; t0 < n; t0 += 8) {
            const int64_t nt = n - t0 < 8 ? n - t0 : 8;
            __m256 acc[8];
            for (int64_t j = 0; j < 8; j++)
                acc[j] = _mm256_setzero_ps();
            for (int64_t c0 = 0; c0 < C; c0 += 32) {
                __m128i b = _mm_loadu_si128((const __m128i *)(row + c0 / 2));
                __m128i lo = _mm_and_si128(b, mask);
                __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
                __m128i v0 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi)); /* cols 0..15 */
                __m128i v1 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi)); /* 16..31 */
                const __m256 s = _mm256_set1_ps(0.5f * sc[c0 / 32]);
                __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)), s);
                __m256 w1 = _mm256_mul_ps(
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8))), s);
                __m256 w2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)), s);
                __m256 w3 = _mm256_mul_ps(
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8))), s);
                for (int64_t j = 0; j < nt; j++) {
                    const float *xt = x + (t0 + j) * C + c0;
                    __m256 a = acc[j];
                    a = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), a);
                    a = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), a);
                    a = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt + 16), a);
                    a = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), a);
                    acc[j] = a;
                }
            }
            for (int64_t j = 0; j < nt; j++)
                y[(t0 + j) * w->rows + r] = hsum(acc[j]);
        }
    }
}
