/*
 * sample_full_row.h -- the sampler's full-row draw (temperature and min_p: no top_k, top_p,
 * logit processor or logprobs; sample_mass.h has the filtered one) as inline functions that compile both as C on the host
 * and as CUDA device code, so that a GPU can choose the token the host sampler would choose
 * from the same row, bit for bit, without the row leaving the device.
 *
 * It is the host sampler's own arithmetic, not a copy: sample_vec.c's exponential,
 * philox.c's generator and sample_filter.c's full-row walk call these functions. Each float
 * or double operation is rounded once, in the order written (device code uses the _rn
 * intrinsics, which are never contracted into fused multiply-adds; the host compiles this in
 * ISO C mode, where GCC does not contract either, and clang gets the pragma below). The
 * block sums of ds_block_sum are the vector kernels' (sample_vec*.c) too; test_sample's
 * full_row_draw_matches checks the whole draw against di_sampler_sample, and the CUDA op
 * test checks the device kernel (cuda_sample.cu) against it.
 *
 * The draw over a full row: weights w_i = exp((x_i - max) / T) (0 below the cutoff: -inf,
 * or min_p's), summed per block
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

#if defined(__clang__) && !defined(__CUDACC__)
#pragma STDC FP_CONTRACT OFF
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

/* The sampler's exponential without the range check (di_sample_exp adds it): Cody-Waite
 * reduction and the degree-7 polynomial, branch-free so that loops calling it vectorise. */
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

/* The weight of logit x (the row's maximum max, 1 / T inv_t, tokens below cutoff dropped):
 * the weights kernels' value. */
DS_HD float ds_weight(float x, float max, float inv_t, float cutoff) {
    float d = DS_FSUB(x, max);
    d = DS_FMUL(d, inv_t);
    return x >= cutoff && d >= DI_SAMPLE_EXP_MIN ? ds_exp_core(d) : 0.0f;
}

/* The sum of the weights of ids [b0, end) (b0 a multiple of 8), as the weights kernels add
 * one block: eight lanes (lane i % 8) in id order, then combine8's tree. */
DS_HD double ds_block_sum(const float *x, int64_t b0, int64_t end, float max, float inv_t,
                          float cutoff) {
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = b0; i < end; i += 8) /* lane l takes ids i + l (fixed indices: registers) */
        for (int l = 0; l < 8; l++)
            if (i + l < end) s[l] = DS_DADD(s[l], (double)ds_weight(x[i + l], max, inv_t, cutoff));
    return DS_DADD(DS_DADD(DS_DADD(s[0], s[4]), DS_DADD(s[2], s[6])),
                   DS_DADD(DS_DADD(s[1], s[5]), DS_DADD(s[3], s[7])));
}

/* One Philox4x32-10 block (philox.h): ten rounds of two 32x32->64 multiplications whose high
 * halves are mixed with the other two words and the round key; the key is bumped by the Weyl
 * constants (golden ratio, sqrt(3) - 1) between rounds. */
DS_HD void ds_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
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
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* di_philox_uniform: the block at counter (position, sample index, lane) under the seed,
 * 27 + 26 = 53 of its bits as k / 2^53 in [0, 1). */
DS_HD double ds_philox_uniform(int64_t seed, int32_t sample_index, int64_t position,
                               uint32_t lane) {
    const uint64_t s = (uint64_t)seed, pos = (uint64_t)position;
    const uint32_t key[2] = {(uint32_t)s, (uint32_t)(s >> 32)};
    const uint32_t ctr[4] = {(uint32_t)pos, (uint32_t)(pos >> 32), (uint32_t)sample_index, lane};
    uint32_t out[4];
    ds_philox4x32_10(ctr, key, out);
    const uint64_t bits = ((uint64_t)(out[0] >> 5) << 26) | (out[1] >> 6);
    return DS_DMUL((double)bits, 1.0 / 9007199254740992.0);
}

/* The last id of block b (ids [b0, end)) with a positive weight, or -1. */
DS_HD int32_t ds_last_kept(const float *x, int64_t b0, int64_t end, float max, float inv_t,
                           float cutoff) {
    for (int64_t i = end - 1; i >= b0; i--)
        if (ds_weight(x[i], max, inv_t, cutoff) > 0.0f) return (int32_t)i;
    return -1;
}

/* The full-row draw over n ids given their block sums: whole blocks while the running sum
 * stays at or below target (u times the total), then the ids of the block where it would
 * pass it; the last kept id when rounding left target at or above the final sum. */
DS_HD int32_t ds_draw_full_row(const float *x, int64_t n, float max, float inv_t, float cutoff,
                               const double *block_sum, double target) {
    const int64_t nb = (n + DI_SAMPLE_BLOCK - 1) / DI_SAMPLE_BLOCK;
    double acc = 0.0;
    int64_t b = 0, last_b = -1;
    for (; b < nb; b++) {
        const double next = DS_DADD(acc, block_sum[b]);
        if (next > target) break;
        if (block_sum[b] > 0.0) last_b = b;
        acc = next;
    }
    if (b == nb) {
        if (last_b < 0) return -1;
        const int64_t e = (last_b + 1) * DI_SAMPLE_BLOCK;
        return ds_last_kept(x, last_b * DI_SAMPLE_BLOCK, e < n ? e : n, max, inv_t, cutoff);
    }
    const int64_t b0 = b * DI_SAMPLE_BLOCK, e = b0 + DI_SAMPLE_BLOCK < n ? b0 + DI_SAMPLE_BLOCK : n;
    for (int64_t i = b0; i < e; i++) {
        const float w = ds_weight(x[i], max, inv_t, cutoff);
        if (!(w > 0.0f)) continue;
        acc = DS_DADD(acc, (double)w);
        if (acc > target) return (int32_t)i;
    }
    return ds_last_kept(x, b0, e, max, inv_t, cutoff);
}

#endif /* DI_SAMPLE_FULL_ROW_H */
