/*
 * cpu_matmul_avx512.c -- AVX-512 (F/BW/VL/DQ) converter and micro-kernels for the matmul
 * driver in cpu_matmul.c (contract: cpu_matmul_impl.h). Compiled with AVX-512 flags and
 * used only when the CPU has them.
 *
 * Design stance: 16 lanes; every (token, row) output accumulates one zmm in column order.
 * Micro-kernels hold m <= 6 tokens of x and 4x m accumulators in registers (29 of 32 zmm),
 * streaming one converted weight vector at a time. The direct decode kernel converts 4 rows
 * in registers (fp8: 32 bytes per widening, as port 5 is its limit) and prefetches the next
 * 4 rows. Tails use masked loads, so any cols works.
 *
 * Conversions are exact and bitwise equal to di_mm_convert_scalar:
 *   bf16 -> f32: zero-extend and shift left 16 (bf16 is the top half of an f32).
 *   f16  -> f32: vcvtph2ps.
 *   e4m3 -> f32: sign-extend the byte to 16 bits and shift left 7, which puts the 4 exponent
 *     and 3 mantissa bits where an f16 has its exponent and top mantissa bits (bias 15, not 7);
 *     clearing bit 14 (a copy of the sign) leaves an f16 equal to value * 2^-8, e4m3
 *     subnormals becoming f16 subnormals, which vcvtph2ps widens exactly. In the fp8 block
 *     order that raw value is what is summed; in the scaled order one multiply by
 *     (scale * 2^8) -- an exact power-of-two rescale of the block scale -- gives the
 *     correctly rounded value * scale. Bytes 0x7f/0xff become NaN. (Going straight to f32 with
 *     a 2^-120 bias would make f32 denormals, and multiplying those costs a microcode assist
 *     per instruction: 40x slower on random data.)
 */
#include "backend/cpu/cpu_matmul_impl.h"
#include "core/core.h"

#include <immintrin.h>

#define L 16

/* ---------------------------------------------------------------------------------------- */
/* Conversion                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static inline __mmask16 tail_mask(int64_t n) {
    return (__mmask16)((1u << n) - 1u);
}

static inline __m512 bf16x16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* e4m3 bytes -> value * 2^-8, exactly. NaN bytes are not handled here (callers do). */
static inline __m512 e4m3_raw16(__m128i b) {
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
    h = _mm256_and_si256(h, _mm256_set1_epi16((short)0xbfff));
    return _mm512_cvtph_ps(h);
}

/* e4m3 bytes -> value * 2^-8 * mul (mul = scale * 2^8 gives value * scale, one rounding). */
static inline __m512 e4m3x16(__m128i b, __m512 mul) {
    return _mm512_mul_ps(e4m3_raw16(b), mul);
}

/* Bit i set where byte i is an e4m3 NaN (0x7f or 0xff: all exponent and mantissa bits). */
static inline __mmask64 e4m3_nan_mask(__m512i b) {
    return _mm512_cmpeq_epi8_mask(_mm512_or_si512(b, _mm512_set1_epi8((char)0x80)),
                                  _mm512_set1_epi8((char)0xff));
}

/* 128-bit lane q of b. The intrinsic wants a constant lane: a switch gives it one in every
 * build (the loop below is unrolled when optimizing; clang at -O0, the fuzz build, does not). */
static inline __m128i lane128(__m512i b, int q) {
    switch (q) {
    case 0: return _mm512_extracti32x4_epi32(b, 0);
    case 1: return _mm512_extracti32x4_epi32(b, 1);
    case 2: return _mm512_extracti32x4_epi32(b, 2);
    default: return _mm512_extracti32x4_epi32(b, 3);
    }
}

/* Converts len e4m3 bytes into out as f16(e4m3 * 2^-8) * mul (then * post, if post != 0),
 * the partial vector masked. 64 bytes per step: one NaN test for all of them, and a NaN
 * fix-up only when one is there (never, in published checkpoints). */
static void e4m3_span(const uint8_t *src, int64_t len, float mul_s, float post, float *out) {
    const __m512 qnan = _mm512_set1_ps(__builtin_nanf(""));
    const __m512 mul = _mm512_set1_ps(mul_s), pv = _mm512_set1_ps(post);
    for (int64_t i = 0; i < len; i += 64) {
        const int64_t left = len - i;
        const __mmask64 m64 = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
        const __m512i b = _mm512_maskz_loadu_epi8(m64, src + i);
        const __mmask64 nan = e4m3_nan_mask(b) & m64;
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            if (q * 16 >= left) break;
            __m512 v = e4m3x16(lane128(b, q), mul);
            if (post != 0.0f) v = _mm512_mul_ps(v, pv);
            if (nan) v = _mm512_mask_mov_ps(v, (__mmask16)(nan >> (16 * q)), qnan);
            const __mmask16 m16 =
                left - q * 16 >= 16 ? (__mmask16)0xffff : tail_mask(left - q * 16);
            _mm512_mask_storeu_ps(out + i + q * 16, m16, v);
        }
    }
}

/* Scaled e4m3 span: s * 2^8 is exact unless it overflows; then 2^8 and s apply separately
 * (the first product is exact, so there is still one rounding). */
static void e4m3_span_scaled(const uint8_t *src, int64_t len, float s, float *out) {
    if (s < 0x1p100f && s > -0x1p100f)
        e4m3_span(src, len, s * 256.0f, 0.0f, out);
    else
        e4m3_span(src, len, 256.0f, s, out);
}

static void convert(const di_weight *w, int64_t r, int64_t c0, int64_t len, float *out) {
    const size_t base = (size_t)(r * w->row_stride + c0);
    int64_t i = 0;
    switch (w->dtype) {
    case DI_DTYPE_BF16: {
        /* The prefill hot loop: whole vectors 4 at a time (one widening load and one shift
         * each), then the masked tail. */
        const uint16_t *s = (const uint16_t *)w->data + base;
        for (; i + 4 * L <= len; i += 4 * L) {
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) _mm512_store_ps(
                out + i + q * L, bf16x16(_mm256_loadu_si256((const __m256i *)(s + i + q * L))));
        }
        for (; i < len; i += L) {
            __mmask16 m = len - i >= L ? (__mmask16)0xffff : tail_mask(len - i);
            _mm512_store_ps(out + i, bf16x16(_mm256_maskz_loadu_epi16(m, s + i)));
        }
        return; /* the masked tail already wrote the zero padding */
    }
    case DI_DTYPE_F16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
        const int bf = w->dtype == DI_DTYPE_BF16;
        for (; i < len; i += L) {
            __mmask16 m = len - i >= L ? (__mmask16)0xffff : tail_mask(len - i);
            __m256i h = _mm256_maskz_loadu_epi16(m, s + i);
            _mm512_store_ps(out + i, bf ? bf16x16(h) : _mm512_cvtph_ps(h));
        }
        return; /* the masked tail already wrote the zero padding */
    }
    case DI_DTYPE_F32: {
        const float *s = (const float *)w->data + base;
        for (; i < len; i += L) {
            __mmask16 m = len - i >= L ? (__mmask16)0xffff : tail_mask(len - i);
            _mm512_store_ps(out + i, _mm512_maskz_loadu_ps(m, s + i));
        }
        return;
    }
    case DI_DTYPE_F8_E4M3: {
        const uint8_t *s = (const uint8_t *)w->data + base;
        const float *srow = di_mm_scale_row(w, r);
        const int64_t bc = w->block_cols;
        while (i < len) { /* one span per scale block */
            const int64_t c = c0 + i, end = DI_MIN((c / bc + 1) * bc - c0, len);
            e4m3_span_scaled(s + i, end - i, srow[c / bc], out + i);
            i = end;
        }
        break;
    }
    default:
        di_mm_convert_scalar(w, r, c0, len, out);
        break;
    }
    for (; i % L; i++)
        out[i] = 0.0f;
}

/* F8_E4M3 without its scale: e4m3 * 2^-8, exactly (the fp8 block order's weights). */
static void convert_raw(const di_weight *w, int64_t r, int64_t c0, int64_t len, float *out) {
    e4m3_span((const uint8_t *)w->data + r * w->row_stride + c0, len, 1.0f, 0.0f, out);
    for (int64_t i = len; i % L; i++)
        out[i] = 0.0f;
}

/* ---------------------------------------------------------------------------------------- */
/* Micro-kernels: m tokens x 4 rows                                                           */
/* ---------------------------------------------------------------------------------------- */

/* One column group: load m x vectors (masked on the tail), then per weight row one load and
 * m FMAs. The accumulation order per output is the column order, independent of m. */
#define STEP(M, XLOAD)                                                                             \
    do {                                                                                           \
        __m512 xv[DI_MM_MAXMT];                                                                    \
        _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) xv[i] = XLOAD;                         \
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) {                               \
            const __m512 wv = _mm512_load_ps(wb + j * ldw + k);                                    \
            _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) a[i][j] =                          \
                _mm512_fmadd_ps(wv, xv[i], a[i][j]);                                               \
        }                                                                                          \
    } while (0)

static inline __attribute__((always_inline)) void micro(const int M, const di_mm_tile *t) {
    const float *wb = t->wb, *x = t->x;
    const int64_t ldw = t->ldw, ldx = t->ldx, as = t->acc_stride, kc = t->kc;
    __m512 a[DI_MM_MAXMT][DI_MM_NR];
    _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) a[i][j] =
            t->init ? _mm512_setzero_ps() : _mm512_load_ps(t->acc + i * as + j * L);
    }
    int64_t k = 0;
    for (; k + L <= kc; k += L)
        STEP(M, _mm512_loadu_ps(x + i * ldx + k));
    if (k < kc) {
        const __mmask16 m = tail_mask(kc - k);
        STEP(M, _mm512_maskz_loadu_ps(m, x + i * ldx + k));
    }
    if (t->finish) { /* fp8 block order: fold the block into the totals */
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) {
            const __m512 sv = _mm512_set1_ps(t->scale[j]);
            _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {
                float *p = t->tot + i * as + j * L;
                const __m512 base = t->tot_init ? _mm512_setzero_ps() : _mm512_load_ps(p);
                _mm512_store_ps(p, _mm512_fmadd_ps(a[i][j], sv, base));
            }
        }
        return;
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++)
            _mm512_store_ps(t->acc + i * as + j * L, a[i][j]);
    }
}

#define MICRO(M)                                                                                   \
    static void micro_##M(const di_mm_tile *t) {                                                   \
        micro(M, t);                                                                               \
    }
MICRO(1)
MICRO(2)
MICRO(3)
MICRO(4)
MICRO(5)
MICRO(6)

/* ---------------------------------------------------------------------------------------- */
/* Direct decode kernel: m tokens x 4 rows, weights converted in registers                    */
/* ---------------------------------------------------------------------------------------- */

/* One L-column group at column k: WCVT(j) yields row j's converted weights (zero past kc). */
#define DSTEP(M, WCVT, XLOAD)                                                                      \
    do {                                                                                           \
        __m512 xv[DI_MM_MAXMT];                                                                    \
        _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) xv[i] = XLOAD;                         \
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) {                               \
            _mm_prefetch(pf[j] + k * esz, _MM_HINT_T0);                                            \
            const __m512 wv = WCVT(j);                                                             \
            _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) a[i][j] =                          \
                _mm512_fmadd_ps(wv, xv[i], a[i][j]);                                               \
        }                                                                                          \
    } while (0)

#define XFULL      _mm512_loadu_ps(x + i * ldx + k)
#define XTAIL      _mm512_maskz_loadu_ps(tm, x + i * ldx + k)
#define W_BF16(j)  bf16x16(_mm256_loadu_si256((const __m256i *)(rp16[j] + k)))
#define W_BF16T(j) bf16x16(_mm256_maskz_loadu_epi16(tm, rp16[j] + k))
#define W_F16(j)   _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rp16[j] + k)))
#define W_F16T(j)  _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tm, rp16[j] + k))
#define W_F32(j)   _mm512_loadu_ps(rp32[j] + k)
#define W_F32T(j)  _mm512_maskz_loadu_ps(tm, rp32[j] + k)
#define W_E4M3(j)  e4m3_direct(rp8[j] + k, 0xffff, &seen)
#define W_E4M3T(j) e4m3_direct(rp8[j] + k, tm, &seen)

/* Masked lanes give +0 (as the chunked path's zero padding). NaN bytes are only flagged:
 * *seen = max(*seen, b | 0x80) reaches 0xff exactly when some byte is 0x7f or 0xff, using
 * no port-5 compare (port 5 already widens and converts, and limits fp8 decode). */
static inline __m512 e4m3_direct(const uint8_t *p, __mmask16 m, __m256i *seen) {
    const __m128i b = _mm_maskz_loadu_epi8(m, p);
    *seen =
        _mm256_max_epu8(*seen, _mm256_zextsi128_si256(_mm_or_si128(b, _mm_set1_epi8((char)0x80))));
    return e4m3_raw16(b); /* masked bytes are 0, which gives +0 */
}

static inline __attribute__((always_inline)) int direct(const int M, const di_weight *w, int64_t r,
                                                        int nr, const float *x, int64_t ldx,
                                                        float *acc, int64_t as) {
    const int64_t cols = w->cols;
    const size_t esz = di_dtype_bytes(w->dtype, 1);
    const char *rp[DI_MM_NR];
    for (int j = 0; j < DI_MM_NR; j++) /* rows past nr repeat the last one; results unused */
        rp[j] = (const char *)w->data + (size_t)((r + DI_MIN(j, nr - 1)) * w->row_stride) * esz;
    /* The next group's rows, prefetched at the same column: 4 short row streams restart at
     * every group, which the hardware prefetcher alone follows too late (rows of 2-4 KiB). */
    const char *pf[DI_MM_NR];
    for (int j = 0; j < DI_MM_NR; j++)
        pf[j] = (const char *)w->data +
                (size_t)(DI_MIN(r + DI_MM_NR + j, w->rows - 1) * w->row_stride) * esz;
    const uint16_t *rp16[DI_MM_NR];
    const float *rp32[DI_MM_NR];
    const uint8_t *rp8[DI_MM_NR];
    for (int j = 0; j < DI_MM_NR; j++) {
        rp16[j] = (const uint16_t *)rp[j], rp32[j] = (const float *)rp[j];
        rp8[j] = (const uint8_t *)rp[j];
    }
    __m512 a[DI_MM_MAXMT][DI_MM_NR];
    _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) a[i][j] = _mm512_setzero_ps();
    }
    int64_t k = 0;
    const __mmask16 tm = tail_mask(cols % L);
    switch (w->dtype) {
    case DI_DTYPE_BF16:
        for (; k + L <= cols; k += L)
            DSTEP(M, W_BF16, XFULL);
        if (k < cols) DSTEP(M, W_BF16T, XTAIL);
        break;
    case DI_DTYPE_F16:
        for (; k + L <= cols; k += L)
            DSTEP(M, W_F16, XFULL);
        if (k < cols) DSTEP(M, W_F16T, XTAIL);
        break;
    case DI_DTYPE_F32:
        for (; k + L <= cols; k += L)
            DSTEP(M, W_F32, XFULL);
        if (k < cols) DSTEP(M, W_F32T, XTAIL);
        break;
    case DI_DTYPE_F8_E4M3: {
        /* Block order (see cpu_matmul_impl.h): a holds the block sum, tsum the totals. */
        if (!di_mm_block_order(w) || M > 2) return 0; /* 2 x 8 accumulators + 2M x: 32 zmm */
        const int64_t bc = w->block_cols;
        const float *srow[DI_MM_NR];
        for (int j = 0; j < DI_MM_NR; j++)
            srow[j] = di_mm_scale_row(w, r + DI_MIN(j, nr - 1));
        __m512 tsum[2][DI_MM_NR];
        _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {
            _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) tsum[i][j] =
                _mm512_setzero_ps();
        }
        __m256i seen = _mm256_setzero_si256();
        for (int64_t c0 = 0; c0 < cols; c0 += bc) {
            const int64_t end = DI_MIN(c0 + bc, cols);
            _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {
                _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) a[i][j] =
                    _mm512_setzero_ps();
            }
            /* 32 columns per step: one widening and one NaN test per 32 bytes (port 5 is the
             * limit here), then the two 16-column groups in column order. */
            for (; k + 2 * L <= end; k += 2 * L) {
                __m512 x0[2], x1[2];
                _Pragma("GCC unroll 2") for (int i = 0; i < M; i++) {
                    x0[i] = _mm512_loadu_ps(x + i * ldx + k);
                    x1[i] = _mm512_loadu_ps(x + i * ldx + k + L);
                }
                _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) {
                    _mm_prefetch(pf[j] + k, _MM_HINT_T0);
                    const __m256i b = _mm256_loadu_si256((const __m256i *)(rp8[j] + k));
                    seen = _mm256_max_epu8(seen, _mm256_or_si256(b, _mm256_set1_epi8((char)0x80)));
                    __m512i h = _mm512_slli_epi16(_mm512_cvtepi8_epi16(b), 7);
                    h = _mm512_and_si512(h, _mm512_set1_epi16((short)0xbfff));
                    const __m512 w0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
                    const __m512 w1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
                    _Pragma("GCC unroll 2") for (int i = 0; i < M; i++) {
                        a[i][j] = _mm512_fmadd_ps(w0, x0[i], a[i][j]);
                        a[i][j] = _mm512_fmadd_ps(w1, x1[i], a[i][j]);
                    }
                }
            }
            for (; k + L <= end; k += L)
                DSTEP(M, W_E4M3, XFULL);
            if (k < end) DSTEP(M, W_E4M3T, XTAIL);
            _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) {
                const __m512 sv = _mm512_set1_ps(srow[j][c0 / bc] * 256.0f);
                _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) tsum[i][j] =
                    _mm512_fmadd_ps(a[i][j], sv, tsum[i][j]);
            }
        }
        if (_mm256_cmpeq_epi8_mask(seen, _mm256_set1_epi8((char)0xff))) return 0; /* a NaN */
        _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {
            _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) a[i][j] = tsum[i][j];
        }
        break;
    }
    default:
        return 0;
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++)
            _mm512_store_ps(acc + i * as + j * L, a[i][j]);
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
    case 4:
        return direct(4, w, r, nr, x, ldx, acc, as);
    default:
        return 0;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Not batch-invariant: the decode kernel with two partial sums per output                    */
/* ---------------------------------------------------------------------------------------- */

/* Like direct(), but each (token, row) output keeps two accumulators, one for the even and
 * one for the odd 16-column groups, added at the end. With one or two tokens the invariant
 * kernel has only 4 or 8 FMA chains, too few to cover the FMA latency when the weights come
 * from cache; this one has twice as many. The sum order differs from the invariant one (so
 * it is used only when batch invariance is off). bf16 / f16 / f32 only; returns 0 otherwise. */
#define FW_BF16(j, o)  bf16x16(_mm256_loadu_si256((const __m256i *)(rp16[j] + k + (o))))
#define FW_F16(j, o)   _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rp16[j] + k + (o))))
#define FW_F32(j, o)   _mm512_loadu_ps(rp32[j] + k + (o))
#define FW_BF16T(j, o) bf16x16(_mm256_maskz_loadu_epi16(tm, rp16[j] + k))
#define FW_F16T(j, o)  _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tm, rp16[j] + k))
#define FW_F32T(j, o)  _mm512_maskz_loadu_ps(tm, rp32[j] + k)

/* Two column groups at k and k + L into a0 and a1. */
#define FSTEP2(M, WCVT)                                                                            \
    do {                                                                                           \
        __m512 x0[2], x1[2];                                                                       \
        _Pragma("GCC unroll 2") for (int i = 0; i < M; i++) {                                      \
            x0[i] = _mm512_loadu_ps(x + i * ldx + k);                                              \
            x1[i] = _mm512_loadu_ps(x + i * ldx + k + L);                                          \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) {                               \
            _mm_prefetch(pf[j] + k * esz, _MM_HINT_T0);                                            \
            const __m512 w0 = WCVT(j, 0), w1 = WCVT(j, L);                                         \
            _Pragma("GCC unroll 2") for (int i = 0; i < M; i++) {                                  \
                a0[i][j] = _mm512_fmadd_ps(w0, x0[i], a0[i][j]);                                   \
                a1[i][j] = _mm512_fmadd_ps(w1, x1[i], a1[i][j]);                                   \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* One (possibly masked) column group at k into a0. */
#define FSTEP1(M, WCVT, XLOAD)                                                                     \
    do {                                                                                           \
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) {                               \
            const __m512 wv = WCVT(j, 0);                                                          \
            _Pragma("GCC unroll 2") for (int i = 0; i < M; i++) a0[i][j] =                         \
                _mm512_fmadd_ps(wv, XLOAD, a0[i][j]);                                              \
        }                                                                                          \
    } while (0)

static inline __attribute__((always_inline)) int direct2(const int M, const di_weight *w, int64_t r,
                                                         int nr, const float *x, int64_t ldx,
                                                         float *acc, int64_t as) {
    if (w->dtype != DI_DTYPE_BF16 && w->dtype != DI_DTYPE_F16 && w->dtype != DI_DTYPE_F32) return 0;
    const int64_t cols = w->cols;
    const size_t esz = di_dtype_bytes(w->dtype, 1);
    const uint16_t *rp16[DI_MM_NR];
    const float *rp32[DI_MM_NR];
    const char *pf[DI_MM_NR];
    for (int j = 0; j < DI_MM_NR; j++) {
        const char *rp =
            (const char *)w->data + (size_t)((r + DI_MIN(j, nr - 1)) * w->row_stride) * esz;
        rp16[j] = (const uint16_t *)rp, rp32[j] = (const float *)rp;
        pf[j] = (const char *)w->data +
                (size_t)(DI_MIN(r + DI_MM_NR + j, w->rows - 1) * w->row_stride) * esz;
    }
    __m512 a0[2][DI_MM_NR], a1[2][DI_MM_NR];
    _Pragma("GCC unroll 2") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++) a0[i][j] = a1[i][j] =
            _mm512_setzero_ps();
    }
    int64_t k = 0;
    const __mmask16 tm = tail_mask(cols % L);
    switch (w->dtype) {
    case DI_DTYPE_BF16:
        for (; k + 2 * L <= cols; k += 2 * L)
            FSTEP2(M, FW_BF16);
        if (k + L <= cols) {
            FSTEP1(M, FW_BF16, _mm512_loadu_ps(x + i * ldx + k));
            k += L;
        }
        if (k < cols) FSTEP1(M, FW_BF16T, _mm512_maskz_loadu_ps(tm, x + i * ldx + k));
        break;
    case DI_DTYPE_F16:
        for (; k + 2 * L <= cols; k += 2 * L)
            FSTEP2(M, FW_F16);
        if (k + L <= cols) {
            FSTEP1(M, FW_F16, _mm512_loadu_ps(x + i * ldx + k));
            k += L;
        }
        if (k < cols) FSTEP1(M, FW_F16T, _mm512_maskz_loadu_ps(tm, x + i * ldx + k));
        break;
    default:
        for (; k + 2 * L <= cols; k += 2 * L)
            FSTEP2(M, FW_F32);
        if (k + L <= cols) {
            FSTEP1(M, FW_F32, _mm512_loadu_ps(x + i * ldx + k));
            k += L;
        }
        if (k < cols) FSTEP1(M, FW_F32T, _mm512_maskz_loadu_ps(tm, x + i * ldx + k));
        break;
    }
    _Pragma("GCC unroll 2") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < DI_MM_NR; j++)
            _mm512_store_ps(acc + i * as + j * L, _mm512_add_ps(a0[i][j], a1[i][j]));
    }
    return 1;
}

static int direct_fast(const di_weight *w, int64_t r, int nr, const float *x, int64_t ldx, int m,
                       float *acc, int64_t as) {
    if (m == 1) return direct2(1, w, r, nr, x, ldx, acc, as);
    if (m == 2) return direct2(2, w, r, nr, x, ldx, acc, as);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Transposed product tile: m tokens x 64 columns in registers, rows in order, mul then add   */
/* ---------------------------------------------------------------------------------------- */

static inline __attribute__((always_inline)) void t_tile(const int M, const float *wb, int64_t ldw,
                                                         int64_t rb, const float *x, int64_t ldx,
                                                         float *y, int64_t ldy, int64_t nc,
                                                         int init) {
    enum { NV = DI_MMT_NC / L };
    __mmask16 mk[NV];
    for (int j = 0; j < NV; j++) {
        const int64_t left = nc - j * L;
        mk[j] = left >= L ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : tail_mask(left);
    }
    __m512 a[DI_MM_MAXMT][NV];
    _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[i][j] =
            init ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk[j], y + i * ldy + j * L);
    }
    for (int64_t r = 0; r < rb; r++) {
        __m512 wv[NV];
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) wv[j] =
            _mm512_load_ps(wb + r * ldw + j * L);
        _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {
            const __m512 xv = _mm512_set1_ps(x[i * ldx + r]);
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[i][j] =
                _mm512_add_ps(a[i][j], _mm512_mul_ps(xv, wv[j]));
        }
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            _mm512_mask_storeu_ps(y + i * ldy + j * L, mk[j], a[i][j]);
    }
}

static void t_tile_any(const float *wb, int64_t ldw, int64_t rb, const float *x, int64_t ldx,
                       int m, float *y, int64_t ldy, int64_t nc, int init) {
    switch (m) {
    case 1: t_tile(1, wb, ldw, rb, x, ldx, y, ldy, nc, init); break;
    case 2: t_tile(2, wb, ldw, rb, x, ldx, y, ldy, nc, init); break;
    case 3: t_tile(3, wb, ldw, rb, x, ldx, y, ldy, nc, init); break;
    case 4: t_tile(4, wb, ldw, rb, x, ldx, y, ldy, nc, init); break;
    case 5: t_tile(5, wb, ldw, rb, x, ldx, y, ldy, nc, init); break;
    default: t_tile(6, wb, ldw, rb, x, ldx, y, ldy, nc, init); break;
    }
}

/* The driver's halving tree (lanes l and l + 8, then l and l + 4, then l + 2, then l + 1),
 * pair for pair, so bitwise equal to hsum() in cpu_matmul.c. */
static void hsum_n(const float *v, int64_t cnt, float *out) {
    for (int64_t i = 0; i < cnt; i++) {
        const __m512 a = _mm512_load_ps(v + i * L);
        const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
        const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
        const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        out[i] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Bandwidth probe                                                                            */
/* ---------------------------------------------------------------------------------------- */

static uint64_t read_sum(const void *p, size_t bytes) {
    const char *q = p;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < bytes; i += 256) {
        s0 = _mm512_xor_si512(s0, _mm512_load_si512(q + i));
        s1 = _mm512_xor_si512(s1, _mm512_load_si512(q + i + 64));
        s2 = _mm512_xor_si512(s2, _mm512_load_si512(q + i + 128));
        s3 = _mm512_xor_si512(s3, _mm512_load_si512(q + i + 192));
    }
    s0 = _mm512_xor_si512(_mm512_xor_si512(s0, s1), _mm512_xor_si512(s2, s3));
    return (uint64_t)_mm512_reduce_add_epi64(s0);
}

const di_mm_kernels di_mm_kernels_avx512 = {
    .name = "avx512",
    .lanes = L,
    .mt = 6,
    .convert = convert,
    .convert_raw = convert_raw,
    .micro = {NULL, micro_1, micro_2, micro_3, micro_4, micro_5, micro_6},
    .direct = direct_any,
    .direct_fast = direct_fast,
    .direct_fast_mt = 2,
    .t_tile = t_tile_any,
    .hsum_n = hsum_n,
    .read_sum = read_sum,
};
