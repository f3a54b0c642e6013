/*
 * sample_full_row.h -- the sampler's unfiltered draw (temperature only: no top_k, top_p,
 * min_p, logit processor or logprobs) as inline functions that compile both as C on the host
 * and as CUDA device code, so that a GPU can choose the token the host sampler would choose
 * from the same row, bit for bit, without the row leaving the device.
 *
 * It is the host sampler's arithmetic (sample_vec.c, sample_filter.c, philox.c) written out
 * once more, operation by operation: each float or double operation is rounded once, in the
 * order written (device code uses the _rn intrinsics, which are never contracted into fused
 * multiply-adds; the host compiles this in ISO C mode, where GCC does not contract either).
 * The unit test test_sample_full_row checks it against di_sampler_sample on the host; the
 * CUDA op test checks the device kernel (cuda_sample.cu) against di_sampler_sample.
 *
 * The draw over a full row: weights w_i = exp((x_i - max) / T) (0 for -inf), summed per block
 * of DI_SAMPLE_BLOCK ids in eight interleaved double lanes then a fixed tree (combine8), the
 * blocks' sums added in order into the total; u from Philox (seed, sample index, position);
 * then whole blocks while the running sum stays at or below u * total, and the ids of the
 * block where it would pass it.
 */
#ifndef DI_SAMPLE_FULL_ROW_H
#define DI_SAMPLE_FULL_ROW_H

#include "sample/sample_vec.h"
#include "sample/sample_vec_exp.h"

#include <float.h>
#include <stdint.h>
#if !defined(__CUDACC__)
#include <string.h>
#endif

#if defined(__CUDACC__)
#define DS_HD __host__ __device__ static __forceinline__
#else
#define DS_HD static inline
#endif

#if defined(__CUDA_ARCH__)
#define DS_FMUL(a, b) __fmul_rn((a), (b))
#define DS_FADD(a, b) __fadd_rn((a), (b))
#define DS_FSUB(a, b) __fsub_rn((a), (b))
#define DS_DADD(a, b) __dadd_rn((a), (b))
#define DS_DMUL(a, b) __dmul_rn((a), (b))
#else
#define DS_FMUL(a, b) ((a) * (b))
#define DS_FADD(a, b) ((a) + (b))
#define DS_FSUB(a, b) ((a) - (b))
#define DS_DADD(a, b) ((a) + (b))
#define DS_DMUL(a, b) ((a) * (b))
#endif

DS_HD uint32_t ds_float_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
#endif
}

DS_HD float ds_bits_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(b);
#else
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
#endif
}

/* sample_vec.c's exp_core: Cody-Waite reduction and the degree-7 polynomial. */
DS_HD float ds_exp_core(float y) {
    float k = DS_FMUL(y, EXP_LOG2E);
    k = DS_FADD(k, EXP_MAGIC);
    const uint32_t n = ds_float_bits(k) - ds_float_bits(EXP_MAGIC);
    const float fn = DS_FSUB(k, EXP_MAGIC);
    float t = DS_FMUL(fn, EXP_LN2_HI);
    float r = DS_FSUB(y, t);
    t = DS_FMUL(fn, EXP_LN2_LO);
    r = DS_FSUB(r, t);
    const float z = DS_FMUL(r, r);
    float p = EXP_P0;
    p = DS_FMUL(p, r);
    p = DS_FADD(p, EXP_P1);
    p = DS_FMUL(p, r);
    p = DS_FADD(p, EXP_P2);
    p = DS_FMUL(p, r);
    p = DS_FADD(p, EXP_P3);
    p = DS_FMUL(p, r);
    p = DS_FADD(p, EXP_P4);
    p = DS_FMUL(p, r);
    p = DS_FADD(p, EXP_P5);
    p = DS_FMUL(p, z);
    p = DS_FADD(p, r);
    p = DS_FADD(p, 1.0f);
    return ds_bits_float(ds_float_bits(p) + (n << 23));
}

/* The weight of logit x (the row's maximum max, 1 / T inv_t): the weights kernels' value. */
DS_HD float ds_weight(float x, float max, float inv_t) {
    float d = DS_FSUB(x, max);
    d = DS_FMUL(d, inv_t);
    return x >= -FLT_MAX && d >= DI_SAMPLE_EXP_MIN ? ds_exp_core(d) : 0.0f;
}

/* The sum of the weights of ids [b0, end) (b0 a multiple of 8), as the weights kernels add
 * one block: eight lanes (lane i % 8) in id order, then combine8's tree. */
DS_HD double ds_block_sum(const float *x, int64_t b0, int64_t end, float max, float inv_t) {
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = b0; i < end; i += 8) /* lane l takes ids i + l (fixed indices: registers) */
        for (int l = 0; l < 8; l++)
            if (i + l < end) s[l] = DS_DADD(s[l], (double)ds_weight(x[i + l], max, inv_t));
    return DS_DADD(DS_DADD(DS_DADD(s[0], s[4]), DS_DADD(s[2], s[6])),
                   DS_DADD(DS_DADD(s[1], s[5]), DS_DADD(s[3], s[7])));
}

/* philox.c's di_philox_uniform (Philox4x32-10 on (position, sample index, lane), keyed by the
 * seed; 53 bits of the output as a double in [0, 1)). */
DS_HD double ds_philox_uniform(int64_t seed, int32_t sample_index, int64_t position,
                               uint32_t lane) {
    const uint64_t s = (uint64_t)seed, pos = (uint64_t)position;
    uint32_t k0 = (uint32_t)s, k1 = (uint32_t)(s >> 32);
    uint32_t c0 = (uint32_t)pos, c1 = (uint32_t)(pos >> 32), c2 = (uint32_t)sample_index, c3 = lane;
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
    }
    const uint64_t bits = ((uint64_t)(c0 >> 5) << 26) | (c1 >> 6);
    return DS_DMUL((double)bits, 1.0 / 9007199254740992.0);
}

/* The last id of block b (ids [b0, end)) with a positive weight, or -1. */
DS_HD int32_t ds_last_kept(const float *x, int64_t b0, int64_t end, float max, float inv_t) {
    for (int64_t i = end - 1; i >= b0; i--)
        if (ds_weight(x[i], max, inv_t) > 0.0f) return (int32_t)i;
    return -1;
}

/* sample_filter.c's draw_blocks over a row of n ids, given its block sums and their total:
 * whole blocks while the running sum stays at or below u * total, then the ids of the block
 * where it would pass it. */
DS_HD int32_t ds_draw_full_row(const float *x, int64_t n, float max, float inv_t,
                               const double *block_sum, double total, double u) {
    const double target = DS_DMUL(u, total);
    const int64_t nb = (n + DI_SAMPLE_BLOCK - 1) / DI_SAMPLE_BLOCK;
    double acc = 0.0;
    int64_t b = 0, last_b = -1;
    for (; b < nb; b++) {
        const double next = DS_DADD(acc, block_sum[b]);
        if (next > target) break;
        if (block_sum[b] > 0.0) last_b = b;
        acc = next;
    }
    if (b == nb) { /* only when rounding left target at or above the final sum */
        if (last_b < 0) return -1;
        const int64_t e = (last_b + 1) * DI_SAMPLE_BLOCK;
        return ds_last_kept(x, last_b * DI_SAMPLE_BLOCK, e < n ? e : n, max, inv_t);
    }
    const int64_t b0 = b * DI_SAMPLE_BLOCK, e = b0 + DI_SAMPLE_BLOCK < n ? b0 + DI_SAMPLE_BLOCK : n;
    for (int64_t i = b0; i < e; i++) {
        const float w = ds_weight(x[i], max, inv_t);
        if (!(w > 0.0f)) continue;
        acc = DS_DADD(acc, (double)w);
        if (acc > target) return (int32_t)i;
    }
    return ds_last_kept(x, b0, e, max, inv_t);
}

#endif /* DI_SAMPLE_FULL_ROW_H */
