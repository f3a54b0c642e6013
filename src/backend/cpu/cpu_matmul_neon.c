/*
 * cpu_matmul_neon.c -- arm64 Advanced SIMD converter and micro-kernels for the matmul driver
 * in cpu_matmul.c (contract: cpu_matmul_impl.h). Compiled on arm64 only.
 *
 * Design stance: 8 lanes, i.e. each (token, row) accumulator is a pair of float32x4 that
 * walks the columns in order with fused multiply-adds; micro-kernels take m <= 2 tokens x 4
 * rows (16 accumulator registers of 32). There is no direct decode kernel: decode uses the
 * chunked path, which converts a 16-row panel chunk into L1 and reads it once per token.
 * Conversions equal di_mm_convert_scalar bitwise; e4m3 uses the same f16 bit trick as the
 * x86 kernels (see cpu_matmul_avx512.c), and groups of 8 bytes holding a NaN byte fall back
 * to the scalar conversion.
 */
#include "backend/cpu/cpu_matmul_impl.h"
#include "core/core.h"

#include <arm_neon.h>

#define L 8

/* ---------------------------------------------------------------------------------------- */
/* Conversion                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* 8 e4m3 bytes -> e4m3 * 2^-8 (exact) in two float32x4; returns 0 if a byte is a NaN. */
static inline int e4m3_raw8(const uint8_t *p, float32x4_t *lo, float32x4_t *hi) {
    const uint8x8_t b = vld1_u8(p);
    if (vmaxv_u8(vorr_u8(b, vdup_n_u8(0x80))) == 0xff) return 0;
    int16x8_t h = vshlq_n_s16(vmovl_s8(vreinterpret_s8_u8(b)), 7);
    h = vandq_s16(h, vdupq_n_s16((int16_t)0xbfff));
    const float16x8_t f = vreinterpretq_f16_s16(h);
    *lo = vcvt_f32_f16(vget_low_f16(f));
    *hi = vcvt_high_f32_f16(f);
    return 1;
}

/* Converts [c0, c0 + len) of an e4m3 row, all in one scale block when scaled (mul, post as in
 * the x86 kernels: out = raw * mul, then * post if post != 0). Scalar for the rest. */
static void e4m3_span(const di_weight *w, int64_t r, int64_t c0, int64_t len, float mul, float post,
                      int raw, float *out) {
    const uint8_t *s = (const uint8_t *)w->data + r * w->row_stride + c0;
    const float32x4_t mv = vdupq_n_f32(mul), pv = vdupq_n_f32(post);
    int64_t i = 0;
    for (; i + L <= len; i += L) {
        float32x4_t lo, hi;
        if (!e4m3_raw8(s + i, &lo, &hi)) break; /* NaN: the scalar code below handles it */
        lo = vmulq_f32(lo, mv), hi = vmulq_f32(hi, mv);
        if (post != 0.0f) lo = vmulq_f32(lo, pv), hi = vmulq_f32(hi, pv);
        vst1q_f32(out + i, lo);
        vst1q_f32(out + i + 4, hi);
    }
    if (i < len) {
        if (raw)
            for (; i < len; i++)
                out[i] = di_e4m3_to_f32(s[i]) * 0x1p-8f;
        else
            di_mm_convert_scalar(w, r, c0 + i, len - i, out + i);
    }
}

static void convert(const di_weight *w, int64_t r, int64_t c0, int64_t len, float *out) {
    const size_t base = (size_t)(r * w->row_stride + c0);
    int64_t i = 0;
    switch (w->dtype) {
    case DI_DTYPE_BF16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
        for (; i + L <= len; i += L) {
            const uint16x8_t v = vld1q_u16(s + i);
            vst1q_f32(out + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)));
            vst1q_f32(out + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(v, 16)));
        }
        break;
    }
    case DI_DTYPE_F16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
        for (; i + L <= len; i += L) {
            const float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(s + i));
            vst1q_f32(out + i, vcvt_f32_f16(vget_low_f16(v)));
            vst1q_f32(out + i + 4, vcvt_high_f32_f16(v));
        }
        break;
    }
    case DI_DTYPE_F8_E4M3: {
        const float *srow = di_mm_scale_row(w, r);
        const int64_t bc = w->block_cols;
        while (i < len) { /* one span per scale block */
            const int64_t c = c0 + i, end = DI_MIN((c / bc + 1) * bc - c0, len);
            const float sc = srow[c / bc];
            const int small = sc < 0x1p100f && sc > -0x1p100f;
            e4m3_span(w, r, c, end - i, small ? sc * 256.0f : 256.0f, small ? 0.0f : sc, 0,
                      out + i);
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

static void convert_raw(const di_weight *w, int64_t r, int64_t c0, int64_t len, float *out) {
    e4m3_span(w, r, c0, len, 1.0f, 0.0f, 1, out);
    for (int64_t i = len; i % L; i++)
        out[i] = 0.0f;
}

/* ---------------------------------------------------------------------------------------- */
/* Micro-kernels: m tokens x 4 rows                                                           */
/* ---------------------------------------------------------------------------------------- */

static inline __attribute__((always_inline)) void micro(const int M, const di_mm_tile *t) {
    const int64_t ldw = t->ldw, ldx = t->ldx, as = t->acc_stride, kc = t->kc;
    float32x4_t a[2][DI_MM_NR][2];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < DI_MM_NR; j++)
            for (int h = 0; h < 2; h++)
                a[i][j][h] =
                    t->init ? vdupq_n_f32(0.0f) : vld1q_f32(t->acc + i * as + j * L + 4 * h);
    _Alignas(16) float xt[2][L]; /* the zero-padded x tail */
    for (int64_t k = 0; k < kc; k += L) {
        float32x4_t xv[2][2];
        for (int i = 0; i < M; i++) {
            const float *xp = t->x + i * ldx + k;
            if (k + L > kc) {
                for (int l = 0; l < L; l++)
                    xt[i][l] = k + l < kc ? xp[l] : 0.0f;
                xp = xt[i];
            }
            xv[i][0] = vld1q_f32(xp);
            xv[i][1] = vld1q_f32(xp + 4);
        }
        for (int j = 0; j < DI_MM_NR; j++) {
            const float32x4_t w0 = vld1q_f32(t->wb + j * ldw + k);
            const float32x4_t w1 = vld1q_f32(t->wb + j * ldw + k + 4);
            for (int i = 0; i < M; i++) {
                a[i][j][0] = vfmaq_f32(a[i][j][0], w0, xv[i][0]);
                a[i][j][1] = vfmaq_f32(a[i][j][1], w1, xv[i][1]);
            }
        }
    }
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < DI_MM_NR; j++) {
            for (int h = 0; h < 2; h++) {
                if (t->finish) { /* fp8 block order: tot = fma(acc, scale, tot) */
                    float *p = t->tot + i * as + j * L + 4 * h;
                    const float32x4_t base = t->tot_init ? vdupq_n_f32(0.0f) : vld1q_f32(p);
                    vst1q_f32(p, vfmaq_f32(base, a[i][j][h], vdupq_n_f32(t->scale[j])));
                } else {
                    vst1q_f32(t->acc + i * as + j * L + 4 * h, a[i][j][h]);
                }
            }
        }
    }
}

static void micro_1(const di_mm_tile *t) {
    micro(1, t);
}
static void micro_2(const di_mm_tile *t) {
    micro(2, t);
}

/* ---------------------------------------------------------------------------------------- */
/* Bandwidth probe                                                                            */
/* ---------------------------------------------------------------------------------------- */

static uint64_t read_sum(const void *p, size_t bytes) {
    const uint8_t *q = p;
    uint8x16_t s0 = vdupq_n_u8(0), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < bytes; i += 64) {
        s0 = veorq_u8(s0, vld1q_u8(q + i));
        s1 = veorq_u8(s1, vld1q_u8(q + i + 16));
        s2 = veorq_u8(s2, vld1q_u8(q + i + 32));
        s3 = veorq_u8(s3, vld1q_u8(q + i + 48));
    }
    const uint64x2_t s = vreinterpretq_u64_u8(veorq_u8(veorq_u8(s0, s1), veorq_u8(s2, s3)));
    return (uint64_t)(vgetq_lane_u64(s, 0) ^ vgetq_lane_u64(s, 1));
}

const di_mm_kernels di_mm_kernels_neon = {
    .name = "neon",
    .lanes = L,
    .mt = 2,
    .convert = convert,
    .convert_raw = convert_raw,
    .micro = {NULL, micro_1, micro_2},
    .direct = NULL,
    .read_sum = read_sum,
};
