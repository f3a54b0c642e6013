/*
 * test_rand.h -- deterministic random inputs and the normalised error shared by the op tests
 * (tests/ops). A file defines TEST_RAND_SEED before including it to pick its own stream.
 *
 *   rnd_u32()            xorshift64 stream, 32 bits
 *   rnd_int(lo, hi)      integer in [lo, hi]
 *   rnd_f()              float in [-1, 1)
 *   rnd_vec(n, amp)      malloc'ed n floats in [-amp, amp)
 *   nerr(a, ref, n)      max |a - ref| / max |ref| (infinite when NaNs differ), the measure
 *                        llama.cpp's test-backend-ops uses
 */
#ifndef DI_TEST_RAND_H
#define DI_TEST_RAND_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef TEST_RAND_SEED
#define TEST_RAND_SEED 0x9e3779b97f4a7c15ull
#endif

static uint64_t g_rng = TEST_RAND_SEED;

static inline uint32_t rnd_u32(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

static inline int64_t rnd_int(int64_t lo, int64_t hi) {
    return lo + (int64_t)(rnd_u32() % (uint64_t)(hi - lo + 1));
}

static inline float rnd_f(void) { return (float)rnd_u32() / 4294967296.0f * 2.0f - 1.0f; }

static inline float *rnd_vec(int64_t n, float amp) {
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        v[i] = amp * rnd_f();
    return v;
}

static inline double nerr(const float *a, const float *ref, int64_t n) {
    double mx = 0, err = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(ref[i])) return INFINITY;
        mx = fmax(mx, fabs((double)ref[i]));
        err = fmax(err, fabs((double)a[i] - (double)ref[i]));
    }
    return mx > 0 ? err / mx : err;
}

#endif /* DI_TEST_RAND_H */
