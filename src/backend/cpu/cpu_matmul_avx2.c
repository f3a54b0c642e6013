/*
 * cpu_matmul_avx2.c -- AVX2+FMA+F16C converter and micro-kernels for the matmul driver in
 * cpu_matmul.c (contract: cpu_matmul_impl.h). Used when AVX-512 is absent (or DI_SIMD=avx2).
 *
 * Design stance: 8 lanes; every (token, row) output accumulates one ymm in column order.
 * Micro-kernels keep m <= 3 tokens of x and 4 x m accumulators in registers (16 ymm), loading
 * one converted weight vector at a time. Column tails: x under a mask, weights zero-padded.
 * Conversions are exact and equal to di_mm_convert_scalar (the e4m3 bit trick is explained
 * in cpu_matmul_avx512.c); partial vectors are converted by the scalar code.
 */
#include "backend/cpu/cpu_matmul_impl.h"
#include "core/core.h"

#include <immintrin.h>
#include <string.h>

#define L 8

/* ---------------------------------------------------------------------------------------- */
/* Conversion                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static inline __m256 e4m3x8(__m128i b, __m256 mul) {
    __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(b), 7);
    h = _mm_and_si128(h, _mm_set1_epi16((short)0xbfff));
    __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), mul);
    /* NaN bytes 0x7f / 0xff: all seven exponent and mantissa bits set. */
    const __m128i em = _mm_set1_epi16(0x3f80);
    __m128i nan16 = _mm_cmpeq_epi16(_mm_and_si128(h, em), em);
    __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan16));
    return _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_nanf("")), nan);
}

/* Converts the whole vectors of len e4m3 bytes sharing the scale s; returns how many. */
static int64_t e4m3_span(const uint8_t *src, int64_t len, float s, float *out) {
    int64_t i = 0;
    if (s < 0x1p100f && s > -0x1p100f) { /* s * 2^8 is finite and exact: one rounding */
        const __m256 mul = _mm256_set1_ps(s * 256.0f);
        for (; i + L <= len; i += L)
            _mm256_storeu_ps(out + i, e4m3x8(_mm_loadl_epi64((const __m128i *)(src + i)), mul));
    } else { /* huge or NaN scale: the exact value first, then one rounding by s */
        const __m256 mul = _mm256_set1_ps(256.0f), sv = _mm256_set1_ps(s);
        for (; i + L <= len; i += L) {
            __m256 v = e4m3x8(_mm_loadl_epi64((const __m128i *)(src + i)), mul);
            _mm256_storeu_ps(out + i, _mm256_mul_ps(v, sv));
        }
    }
    return i;
}

static void convert(const di_weight *w, int64_t r, int64_t c0, int64_t len, float *out) {
    const size_t base = (size_t)(r * w->row_stride + c0);
    int64_t i = 0;
    switch (w->dtype) {
    case DI_DTYPE_BF16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
        for (; i + L <= len; i += L) {
            __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
            _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        break;
    }
    case DI_DTYPE_F16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
        for (; i + L <= len; i += L)
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
        break;
    }
    case DI_DTYPE_F32: {
        const float *s = (const float *)w->data + base;
        for (; i + L <= len; i += L)
            _mm256_storeu_ps(out + i, _mm256_loadu_ps(s + i));
        break;
    }
    case DI_DTYPE_F8_E4M3: {
        const uint8_t *s = (const uint8_t *)w->data + base;
        const float *srow = di_mm_scale_row(w, r);
        const int64_t bc = w->block_cols;
        while (i < len) { /* one span per scale block; its partial vector done by scalar code */
            const int64_t c = c0 + i, end = DI_MIN((c / bc + 1) * bc - c0, len);
            int64_t done = e4m3_span(s + i, end - i, srow[c / bc], out + i);
            if (i + done < end)
                di_mm_convert_scalar(w, r, c0 + i + done, end - i - done, out + i + done);
            i = end;
        }
        break;
    }
    default:
        break;
    }
    if (i < len) di_mm_convert_scalar(w, r, c0 + i, len - i, out + i);
    for (i = len; i % L; i++)
        out[i] = 0.0f;
}

/* F8_E4M3 without its scale: e4m3 * 2^-8, exactly (the fp8 block order's weights). */
static void convert_raw(const di_weight *w, int64_t r, int64_t c0, int64_t len, float *out) {
    const uint8_t *s = (const uint8_t *)w->data + r * w->row_stride + c0;
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + L <= len; i += L)
        _mm256_storeu_ps(out + i, e4m3x8(_mm_loadl_epi64((const __m128i *)(s + i)), one));
    for (; i < len; i++)
        out[i] = di_e4m3_to_f32(s[i]) * 0x1p-8f;
    for (; i % L; i++)
        out[i] = 0.0f;
}

/* ---------------------------------------------------------------------------------------- */
/* Micro-kernels: m tokens x 4 rows                                                           */
/* ---------------------------------------------------------------------------------------- */

static const int32_t g_mask_src[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

#define STEP(M, XLOAD)                                                                             \
    do {                                                                                           \
        __m256 xv[3];                                                                              \
        _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) xv[i] = XLOAD;                         \
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) {                               \
            const __m256 wv = _mm256_load_ps(wb + j * ldw + k);                                    \
            _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) a[i][j] =                          \
                _mm256_fmadd_ps(wv, xv[i], a[i][j]);                                               \
        }                                                                                          \
    } while (0)

static inline __attribute__((always_inline)) void micro(const int M, const di_mm_tile *t) {
    const float *wb = t->wb, *x = t->x;
    const int64_t ldw = t->ldw, ldx = t->ldx, as = t->acc_stride, kc = t->kc;
    __m256 a[3][DI_MM_NR];
    _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) a[i][j] =
            t->init ? _mm256_setzero_ps() : _mm256_load_ps(t->acc + i * as + j * L);
    }
    int64_t k = 0;
    for (; k + L <= kc; k += L)
        STEP(M, _mm256_loadu_ps(x + i * ldx + k));
    if (k < kc) {
        const __m256i m = _mm256_loadu_si256((const __m256i *)(g_mask_src + L - (kc - k)));
        STEP(M, _mm256_maskload_ps(x + i * ldx + k, m));
    }
    if (t->finish) { /* fp8 block order: fold the block into the totals */
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) {
            const __m256 sv = _mm256_set1_ps(t->scale[j]);
            _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) {
                float *p = t->tot + i * as + j * L;
                const __m256 base = t->tot_init ? _mm256_setzero_ps() : _mm256_load_ps(p);
                _mm256_store_ps(p, _mm256_fmadd_ps(a[i][j], sv, base));
            }
        }
        return;
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++)
            _mm256_store_ps(t->acc + i * as + j * L, a[i][j]);
    }
}

#define MICRO(M)                                                                                   \
    static void micro_##M(const di_mm_tile *t) {                                                   \
        micro(M, t);                                                                               \
    }
MICRO(1)
MICRO(2)
MICRO(3)

/* ---------------------------------------------------------------------------------------- */
/* Direct decode kernel: m tokens x 4 rows, weights converted in registers                    */
/* ---------------------------------------------------------------------------------------- */

/* Weight vector of row j at column k; `src` is the row or, on the tail, a zero-padded copy. */
static inline __m256 w_bf16(const void *src) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
static inline __m256 w_f16(const void *src) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
}
static inline __m256 w_f32(const void *src) {
    return _mm256_loadu_ps((const float *)src);
}
/* e4m3 * 2^-8 (exact); NaN bytes only raise *seen to 0xff (see the AVX-512 kernel). */
static inline __m256 w_e4m3(const void *src, __m128i *seen) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)src);
    *seen = _mm_max_epu8(*seen, _mm_or_si128(b, _mm_set1_epi8((char)0x80)));
    __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(b), 7);
    return _mm256_cvtph_ps(_mm_and_si128(h, _mm_set1_epi16((short)0xbfff)));
}

/* One 8-column group at k; WCVT(p) converts the weights at byte pointer p. */
#define DSTEP(M, WCVT, TAIL)                                                                       \
    do {                                                                                           \
        __m256 xv[3];                                                                              \
        _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) xv[i] =                                \
            TAIL ? _mm256_maskload_ps(x + i * ldx + k, tmask) : _mm256_loadu_ps(x + i * ldx + k);  \
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) {                               \
            _mm_prefetch(pf[j] + k * esz, _MM_HINT_T0);                                            \
            const char *src = rp[j] + k * esz;                                                     \
            if (TAIL) {                                                                            \
                memset(tb, 0, sizeof tb);                                                          \
                memcpy(tb, src, (size_t)(cols - k) * esz);                                         \
                src = (const char *)tb;                                                            \
            }                                                                                      \
            const __m256 wv = WCVT(src);                                                           \
            _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) a[i][j] =                          \
                _mm256_fmadd_ps(wv, xv[i], a[i][j]);                                               \
        }                                                                                          \
    } while (0)

#define W_E4M3(p) w_e4m3(p, &seen)

static inline __attribute__((always_inline)) int direct(const int M, const di_weight *w, int64_t r,
                                                        int nr, const float *x, int64_t ldx,
                                                        float *acc, int64_t as) {
    const int64_t cols = w->cols;
    const size_t esz = di_dtype_bytes(w->dtype, 1);
    const int blocked = di_mm_block_order(w);
    if (w->dtype == DI_DTYPE_F8_E4M3 ? (!blocked || M > 1) : M > 3) return 0;
    const char *rp[DI_MM_NR], *pf[DI_MM_NR];
    for (int j = 0; j < DI_MM_NR; j++) { /* rows past nr repeat the last one; results unused */
        rp[j] = (const char *)w->data + (size_t)((r + DI_MIN(j, nr - 1)) * w->row_stride) * esz;
        pf[j] = (const char *)w->data +
                (size_t)(DI_MIN(r + DI_MM_NR + j, w->rows - 1) * w->row_stride) * esz;
    }
    _Alignas(32) unsigned char tb[32];
    const __m256i tmask = _mm256_loadu_si256((const __m256i *)(g_mask_src + L - cols % L));
    __m256 a[3][DI_MM_NR];
    _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) a[i][j] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    switch (w->dtype) {
    case DI_DTYPE_BF16:
        for (; k + L <= cols; k += L)
            DSTEP(M, w_bf16, 0);
        if (k < cols) DSTEP(M, w_bf16, 1);
        break;
    case DI_DTYPE_F16:
        for (; k + L <= cols; k += L)
            DSTEP(M, w_f16, 0);
        if (k < cols) DSTEP(M, w_f16, 1);
        break;
    case DI_DTYPE_F32:
        for (; k + L <= cols; k += L)
            DSTEP(M, w_f32, 0);
        if (k < cols) DSTEP(M, w_f32, 1);
        break;
    case DI_DTYPE_F8_E4M3: { /* block order, M == 1: a holds the block sum, tsum the total */
        const int64_t bc = w->block_cols;
        const float *srow[DI_MM_NR];
        for (int j = 0; j < DI_MM_NR; j++)
            srow[j] = di_mm_scale_row(w, r + DI_MIN(j, nr - 1));
        __m256 tsum[DI_MM_NR];
        for (int j = 0; j < DI_MM_NR; j++)
            tsum[j] = _mm256_setzero_ps();
        __m128i seen = _mm_setzero_si128();
        for (int64_t c0 = 0; c0 < cols; c0 += bc) {
            const int64_t end = DI_MIN(c0 + bc, cols);
            for (int j = 0; j < DI_MM_NR; j++)
                a[0][j] = _mm256_setzero_ps();
            /* 16 columns per step: one widening and one NaN test per 16 bytes. */
            for (; k + 2 * L <= end; k += 2 * L) {
                const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + L);
                for (int j = 0; j < DI_MM_NR; j++) {
                    _mm_prefetch(pf[j] + k, _MM_HINT_T0);
                    const __m128i b = _mm_loadu_si128((const __m128i *)(rp[j] + k));
                    seen = _mm_max_epu8(seen, _mm_or_si128(b, _mm_set1_epi8((char)0x80)));
                    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
                    h = _mm256_and_si256(h, _mm256_set1_epi16((short)0xbfff));
                    const __m256 w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
                    const __m256 w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
                    a[0][j] = _mm256_fmadd_ps(w0, x0, a[0][j]);
                    a[0][j] = _mm256_fmadd_ps(w1, x1, a[0][j]);
                }
            }
            for (; k + L <= end; k += L)
                DSTEP(1, W_E4M3, 0);
            if (k < end) DSTEP(1, W_E4M3, 1);
            for (int j = 0; j < DI_MM_NR; j++)
                tsum[j] =
                    _mm256_fmadd_ps(a[0][j], _mm256_set1_ps(srow[j][c0 / bc] * 256.0f), tsum[j]);
        }
        if (_mm_movemask_epi8(_mm_cmpeq_epi8(seen, _mm_set1_epi8((char)0xff)))) return 0; /* NaN */
        for (int j = 0; j < DI_MM_NR; j++)
            a[0][j] = tsum[j];
        break;
    }
    default:
        return 0;
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++)
            _mm256_store_ps(acc + i * as + j * L, a[i][j]);
    }
    return 1;
}

static int direct_any(const di_weight *w, int64_t r, int nr, const float *x, int64_t ldx, int m,
                      float *acc, int64_t as) {
    switch (m) {
    case 1:
        return direct(1, w, r, nr, x, ldx, acc, as);
    case 2:
        return direct(2, w, r, nr, x, ldx, acc, as);
    case 3:
        return direct(3, w, r, nr, x, ldx, acc, as);
    default:
        return 0;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Bandwidth probe                                                                            */
/* ---------------------------------------------------------------------------------------- */

static uint64_t read_sum(const void *p, size_t bytes) {
    const char *q = p;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < bytes; i += 128) {
        s0 = _mm256_xor_si256(s0, _mm256_load_si256((const __m256i *)(q + i)));
        s1 = _mm256_xor_si256(s1, _mm256_load_si256((const __m256i *)(q + i + 32)));
        s2 = _mm256_xor_si256(s2, _mm256_load_si256((const __m256i *)(q + i + 64)));
        s3 = _mm256_xor_si256(s3, _mm256_load_si256((const __m256i *)(q + i + 96)));
    }
    s0 = _mm256_xor_si256(_mm256_xor_si256(s0, s1), _mm256_xor_si256(s2, s3));
    return (uint64_t)_mm256_extract_epi64(s0, 0) ^ (uint64_t)_mm256_extract_epi64(s0, 3);
}

const di_mm_kernels di_mm_kernels_avx2 = {
    .name = "avx2",
    .lanes = L,
    .mt = 3,
    .convert = convert,
    .convert_raw = convert_raw,
    .micro = {NULL, micro_1, micro_2, micro_3},
    .direct = direct_any,
    .read_sum = read_sum,
};
