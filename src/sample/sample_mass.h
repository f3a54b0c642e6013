/*
 * sample_mass.h -- the filtered draw's exact arithmetic (top_k, top_p), as inline functions
 * that compile both as C on the host and as CUDA device code, so that a GPU finds the token
 * the host sampler finds from the same row without the row leaving the device.
 *
 * Why integers: top_p keeps the best tokens until their mass reaches top_p of the total, and
 * the draw walks the kept tokens until the running mass passes u times their total. Summed in
 * floating point, both answers depend on the order of the additions, which a GPU (many
 * threads, histograms built with atomics) cannot reproduce cheaply. Here each weight w (in
 * (0, 1]: the row's maximum weighs 1) becomes the integer mass floor(w 2^52), and every sum is
 * exact in 128 bits, so any order of additions gives the same answer:
 *   - a kept token's probability is its mass over the kept total (weights below 2^-52 of the
 *     best token's -- a logit more than 36 T below the maximum -- have mass 0 and are never
 *     drawn, where a float sum would draw them with probability under 2^-52);
 *   - top_p keeps the tokens, best first, while the mass before them is below
 *     need = ceil(top_p x total), computed exactly from top_p's float bits;
 *   - the draw takes t = floor(u x total) with u = b / 2^53 (Philox's 53 bits, exactly) and
 *     returns the first kept id, increasing, whose running mass passes t (always one: t <
 *     total).
 * The ranking order is sample_filter.c's: a higher logit first, then a lower id, as one
 * 64-bit key (smaller = better).
 */
#ifndef DI_SAMPLE_MASS_H
#define DI_SAMPLE_MASS_H

#include "sample/sample_full_row.h" /* DS_HD, ds_float_bits */

#include <stdbool.h>
#include <stdint.h>

typedef unsigned __int128 ds_u128; /* GCC, clang and nvcc on 64-bit hosts */

/* The largest vocabulary the filtered draw takes: its masses (at most 2^52 each) sum to at
 * most 2^75, so the draw's product of 53 random bits and the total fits 128 bits. */
#define DI_SAMPLE_MASS_MAX_VOCAB (1 << 23)

/* The largest vocabulary whose rows a device draws (backend.h's sample_rows; the CUDA kernel's
 * shared memory holds the block sums of 2^20 ids): di_sampler_device_draw is false above. */
#define DI_SAMPLE_DEVICE_MAX_VOCAB (1 << 20)

#define DS_MASS_SCALE 4503599627370496.0f /* 2^52 */

/* Does a random draw take the filtered path (top_k below the vocabulary or top_p below 1),
 * whose cut and draw use these integer masses? (Else the full-row draw of
 * sample_full_row.h.) */
DS_HD bool ds_filtered(int32_t top_k, float top_p, int64_t vocab) {
    return (top_k > 0 && top_k < vocab) || top_p < 1.0f;
}

/* A float's bits as a uint32 that orders like the float (NaN excluded by the callers); -0
 * as +0, since every comparison of the sampler (top_k's heap, the argmax) holds them equal:
 * tied logits, ranked by id. */
DS_HD uint32_t ds_float_order(float x) {
    uint32_t b = ds_float_bits(x);
    if (b == 0x80000000u) b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* The ranking key of token id with logit x: smaller = better (higher logit, then lower id). */
DS_HD uint64_t ds_rank_key(float x, int32_t id) {
    return ((uint64_t)~ds_float_order(x) << 32) | (uint32_t)id;
}

DS_HD int32_t ds_key_id(uint64_t key) {
    return (int32_t)(uint32_t)key;
}

/* The integer mass of weight w in [0, 1]: floor(w 2^52) (the product is exact: a power of
 * two, and w <= 1 leaves no overflow; the conversion truncates). */
DS_HD uint64_t ds_mass(float w) {
#if defined(__CUDA_ARCH__)
    return __float2ull_rz(__fmul_rn(w, DS_MASS_SCALE));
#else
    return (uint64_t)(w * DS_MASS_SCALE);
#endif
}

/* need = ceil(top_p x total) exactly, top_p in (0, 1] a float m 2^-s (m < 2^24, total <=
 * 2^75: m x total fits 128 bits). */
DS_HD ds_u128 ds_top_p_need(float top_p, ds_u128 total) {
    const uint32_t b = ds_float_bits(top_p), e = (b >> 23) & 0xffu;
    const uint64_t m = e ? (b & 0x7fffffu) | 0x800000u : (b & 0x7fffffu);
    const int s = e ? 150 - (int)e : 149; /* top_p = m 2^-s */
    const ds_u128 p = (ds_u128)m * total;
    if (s <= 0) return p << -s; /* top_p >= 2^23: not a top_p the sampler takes */
    if (s >= 128) return p != 0;
    return (p >> s) + ((p & (((ds_u128)1 << s) - 1)) != 0);
}

/* The draw's target floor(u x total) for u = b / 2^53 (di_philox_uniform's exact form):
 * b < 2^53 and total <= 2^75, so b x total fits 128 bits. */
DS_HD ds_u128 ds_draw_target(double u, ds_u128 total) {
#if defined(__CUDA_ARCH__)
    const uint64_t bits = __double2ull_rz(__dmul_rn(u, 9007199254740992.0));
#else
    const uint64_t bits = (uint64_t)(u * 9007199254740992.0);
#endif
    return ((ds_u128)bits * total) >> 53;
}

/* A 128-bit mass as a double (rounded to nearest): for probabilities and reports. */
DS_HD double ds_u128_double(ds_u128 v) {
    return (double)(uint64_t)(v >> 64) * 18446744073709551616.0 + (double)(uint64_t)v;
}

#endif /* DI_SAMPLE_MASS_H */
