/*
 * sample_vec.h -- the sampler's whole-row kernels (max scan, threshold search, softmax
 * weights) and their run-time dispatch: a portable scalar set (sample_vec.c), an AVX2 set
 * (sample_vec_avx2.c) and the same with an AVX-512 weights kernel (sample_vec_avx512.c).
 * Internal to src/sample. DI_SIMD=scalar|avx2|avx512 picks a lower level, as for the matmul.
 *
 * Design stance: the sampled token must depend only on (logits, params, seed, position), never
 * on the machine. So every kernel returns bit-identical results at every SIMD level:
 *   - the exponential is one fixed sequence of IEEE float multiplications and additions (no
 *     FMA, no libm), evaluated lane-wise, so a vector lane and the scalar code round alike;
 *   - sums use one fixed order that does not depend on the vector width (below);
 *   - searches return positions, which are exact.
 *
 * Summation order ("block order"): ids are cut into blocks of DI_SAMPLE_BLOCK consecutive ids
 * (the last one may be shorter). Within a block, eight double partial sums s[j] take the ids
 * with id % 8 == j in increasing id; the block's sum is ((s0 + s4) + (s2 + s6)) + ((s1 + s5)
 * + (s3 + s7)). The row's total is the sum of the block sums in increasing block.
 */
#ifndef DI_SAMPLE_VEC_H
#define DI_SAMPLE_VEC_H

#include <stdbool.h>
#include <stdint.h>

#define DI_SAMPLE_BLOCK 256 /* ids per block of the summation order; a multiple of 8 */

/* Below this argument the exponential is 0: exp(-86.5) = 2.6e-38 is near the smallest normal
 * float, and no token that light can ever be drawn (its probability is below 2^-125). */
#define DI_SAMPLE_EXP_MIN -86.5f

typedef struct di_sample_kernels {
    const char *name;
    /* The maximum of x[n] (n >= 1; -inf when every entry is -inf), the first index holding
     * it in *first, and in *bad whether x holds NaN or +inf (the others are then
     * meaningless). */
    float (*scan)(const float *x, int64_t n, bool *bad, int64_t *first);
    /* The first index j in [from, n) with x[j] >= thr, or n. */
    int64_t (*next_at_least)(const float *x, int64_t from, int64_t n, float thr);
    /* Writes the indices j with v[j] >= thr, increasing, to ids; returns their count. */
    int64_t (*collect_at_least)(const float *v, int64_t n, float thr, int32_t *ids);
    /* w[i] = x[i] >= cutoff ? di_sample_exp((x[i] - max) * inv_t) : 0 for i < n (w NULL: not
     * stored), the sum of each block into block_sum[ceil(n / DI_SAMPLE_BLOCK)], and returns
     * the row's total, all in block order. */
    double (*weights)(const float *x, int64_t n, float max, float inv_t, float cutoff, float *w,
                      double *block_sum);
} di_sample_kernels;

extern const di_sample_kernels di_sample_kernels_scalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const di_sample_kernels di_sample_kernels_avx2;
/* The AVX2 kernels with sample_vec_avx512.c's weights kernel (defined in sample_vec_avx2.c). */
extern const di_sample_kernels di_sample_kernels_avx512;
double di_sample_weights_avx512(const float *x, int64_t n, float max, float inv_t, float cutoff,
                                float *w, double *block_sum);
#endif

/* The kernels in use: the best this CPU runs ("avx512", "avx2" or "scalar"), or a lower level
 * named by DI_SIMD. */
const di_sample_kernels *di_sample_kernels_active(void);

/* Selects a level ("scalar", "avx2", "avx512"; NULL: the best). Returns 0, or -1 if this
 * machine cannot run it. For tests and benchmarks comparing levels, which give the same
 * results at different speeds. */
int di_sample_simd_force(const char *level);

/* exp(y) for y <= 0 in float, 0 for y < DI_SAMPLE_EXP_MIN (and NaN): Cody-Waite reduction
 * y = n ln2 + r, |r| <= ln2 / 2, Cephes' expf polynomial for e^r (degree 7, evaluated by
 * Horner without FMA), and n added to the exponent field. Checked over every float in
 * [DI_SAMPLE_EXP_MIN, 0] against the exact exponential: maximum relative error 8.2e-8 (1.4
 * units of 2^-24), and non-decreasing, so a higher logit never gets a lower weight (top_p's
 * cuts by weight rely on it). tests/unit/test_sample.c checks a sample of both. Bit-identical
 * to the vector lanes of sample_vec_avx2.c and sample_vec_avx512.c. */
float di_sample_exp(float y);

#endif /* DI_SAMPLE_VEC_H */
