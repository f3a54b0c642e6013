/*
 * cpu_v4_fp4_avx512.c -- AVX-512 (F/BW/VL/DQ) rows of the FP4 (e2m1) matmul; the driver and
 * the summation order are in cpu_v4_ops.c / cpu_v4_fp4_impl.h. Compiled with AVX-512 flags
 * and used only when the CPU has them.
 *
 * Design stance: the weights are read once, as stored, straight into registers, with no
 * widening: a 128-column chunk is 64 bytes, loaded as 16 dwords; dword k holds the 8 nibbles
 * of columns 8k .. 8k + 7, and vpermps over a 16-entry table (which looks only at an index's
 * low 4 bits) decodes nibble s of every dword after a shift by 4s -- 8 permutes and 7 shifts
 * per 128 weights. x arrives in the matching "nibbles" order (cpu_v4_fp4_impl.h). Lane k
 * only ever sees columns of group k / 4, so one FMA per chunk folds in the 4 group scales
 * (each repeated over its 4 lanes). Scales are converted from their E8M0 bytes once per call
 * (16 per step: the byte shifted into a float's exponent field) and expanded into a small
 * stack array, read straight from L1 in the hot loop. The last cols % 128 columns go by
 * 32-column groups ("pairs" order: even columns from the low nibbles, odd from the high).
 *
 * A call covers 4 rows and up to 4 tokens per pass (16 totals in zmm registers); more tokens
 * take more passes over the same 4 rows, which stay in L1. The next 4 rows are prefetched.
 */
#include "backend/cpu/cpu_v4_fp4_impl.h"
#include "core/core.h"

#include <immintrin.h>

#define L     16
#define MT    4                      /* tokens per pass */
#define SC_LD (DI_FP4_MAX_COLS / 32) /* floats per row of scales, one per group */
#define SX_LD (DI_FP4_MAX_COLS / 8)  /* floats per row of expanded scales, 16 per chunk */

/* E8M0 bytes -> 2^(e - 127); e == 0 gives 2^-127 (a subnormal), e == 0xff NaN, as
 * di_e8m0_to_f32 defines them. */
static void e8m0_row(const uint8_t *s, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i += L) {
        const __mmask16 m = n - i >= L ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        const __m512i e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, s + i));
        __m512i bits = _mm512_slli_epi32(e, 23);
        bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                     _mm512_set1_epi32(0x00400000));
        bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255)),
                                     _mm512_set1_epi32(0x7fc00000));
        _mm512_mask_storeu_ps(out + i, m, _mm512_castsi512_ps(bits));
    }
}

/* lane i += lane i + 8, then + 4, + 2, + 1: a fixed tree. */
static inline float hsum(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

void di_cpu_fp4_prep_avx512(const float *x, int64_t cols, float *xd) {
    int64_t c = 0;
    for (; c + 128 <= cols; c += 128)
        for (int64_t s = 0; s < 8; s++)
            for (int64_t k = 0; k < 16; k++)
                xd[c + 16 * s + k] = x[c + 8 * k + s];
    di_fp4_prep_pairs(x, c / 32, cols / 32, xd);
}

/* M tokens x 4 rows. rp: the rows' bytes; sx: their scales expanded per chunk (16 floats per
 * 128 columns, rows SX_LD apart), sc: per group (the tail, rows SC_LD apart). */
static inline __attribute__((always_inline)) void
pass(const int M, const uint8_t *const *rp, const uint8_t *const *pf, const float *sx,
     const float *sc, const float *xd, int64_t cols, int nr, float *y, int64_t ldy) {
    /* e2m1 nibble -> value: 0, .5, 1, 1.5, 2, 3, 4, 6, then the same negated (bit 3). */
    const __m512 tbl = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f,
                                      -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    __m512 tot[MT][DI_FP4_NR];
    _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_FP4_NR; j++) tot[i][j] = _mm512_setzero_ps();
    }
    int64_t c = 0;
    for (; c + 128 <= cols; c += 128) {
        const float *xc = xd + c;
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_FP4_NR; j++) {
            _mm_prefetch((const char *)pf[j] + c / 2, _MM_HINT_T0);
            const __m512i v = _mm512_loadu_si512(rp[j] + c / 2);
            __m512 wv[8];
            wv[0] = _mm512_permutexvar_ps(v, tbl);
            _Pragma("GCC unroll 8") for (int q = 1; q < 8; q++) wv[q] =
                _mm512_permutexvar_ps(_mm512_srli_epi32(v, (unsigned)(4 * q)), tbl);
            const __m512 s = _mm512_load_ps(sx + j * SX_LD + c / 8);
            _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) {
                const float *x = xc + i * cols;
                __m512 a = _mm512_mul_ps(wv[0], _mm512_loadu_ps(x));
                _Pragma("GCC unroll 8") for (int q = 1; q < 8; q++) a =
                    _mm512_fmadd_ps(wv[q], _mm512_loadu_ps(x + 16 * q), a);
                tot[i][j] = _mm512_fmadd_ps(a, s, tot[i][j]);
            }
        }
    }
    for (; c < cols; c += 32) { /* the tail, by 32-column groups */
        const float *xg = xd + c;
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_FP4_NR; j++) {
            const __m512i v =
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rp[j] + c / 2)));
            const __m512 we = _mm512_permutexvar_ps(v, tbl);
            const __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tbl);
            const __m512 s = _mm512_set1_ps(sc[j * SC_LD + c / 32]);
            _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) {
                __m512 a = _mm512_mul_ps(we, _mm512_loadu_ps(xg + i * cols));
                a = _mm512_fmadd_ps(wo, _mm512_loadu_ps(xg + i * cols + L), a);
                tot[i][j] = _mm512_fmadd_ps(a, s, tot[i][j]);
            }
        }
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < nr; j++)
            y[i * ldy + j] = hsum(tot[i][j]);
}

void di_cpu_fp4_rows_avx512(const di_weight *w, int64_t r, int nr, const float *xd, int64_t nt,
                            float *y, int64_t ldy) {
    const int64_t cols = w->cols, G = cols / 32;
    const uint8_t *rp[DI_FP4_NR], *pf[DI_FP4_NR];
    _Alignas(64) float sc[DI_FP4_NR * SC_LD], sx[DI_FP4_NR * SX_LD];
    /* lane k of chunk q takes group 4q + k / 4 */
    const __m512i rep4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int j = 0; j < DI_FP4_NR; j++) { /* rows past nr repeat the last; results unused */
        const int64_t rj = r + DI_MIN(j, nr - 1);
        rp[j] = (const uint8_t *)w->data + (size_t)(rj * w->row_stride / 2);
        pf[j] = (const uint8_t *)w->data +
                (size_t)(DI_MIN(r + DI_FP4_NR + j, w->rows - 1) * w->row_stride / 2);
        float *scj = sc + j * SC_LD;
        e8m0_row(w->scale_e8m0 + rj * w->scale_cols, G, scj);
        for (int64_t q = 0; q < G / 4; q++)
            _mm512_store_ps(
                sx + j * SX_LD + 16 * q,
                _mm512_permutexvar_ps(rep4, _mm512_castps128_ps512(_mm_loadu_ps(scj + 4 * q))));
    }
    for (int64_t t0 = 0; t0 < nt; t0 += MT) {
        const float *xt = xd + t0 * cols;
        float *yt = y + t0 * ldy;
        switch (DI_MIN(nt - t0, MT)) {
        case 1:
            pass(1, rp, pf, sx, sc, xt, cols, nr, yt, ldy);
            break;
        case 2:
            pass(2, rp, pf, sx, sc, xt, cols, nr, yt, ldy);
            break;
        case 3:
            pass(3, rp, pf, sx, sc, xt, cols, nr, yt, ldy);
            break;
        default:
            pass(4, rp, pf, sx, sc, xt, cols, nr, yt, ldy);
            break;
        }
    }
}
