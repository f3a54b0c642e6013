/*
 * test_cuda_util.h -- device buffers for the CUDA op tests (test_cuda_ops.c,
 * test_cuda_v4_ops.c): the test's backend, uploads of host arrays, NaN-poisoned outputs (so
 * that unwritten elements show) and synchronised downloads. Include after test.h; the test
 * initialises g_be and sets g_have_gpu in main.
 */
#ifndef DI_TEST_CUDA_UTIL_H
#define DI_TEST_CUDA_UTIL_H

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

static di_backend g_be;
static bool g_have_gpu;

static inline void *dev_from(const void *host, size_t bytes) {
    void *d = di_cuda_malloc(&g_be, bytes ? bytes : 4);
    if (d && bytes) di_cuda_upload(&g_be, d, host, bytes);
    return d;
}

static inline float *dev_floats(const float *host, int64_t n) {
    return dev_from(host, (size_t)n * sizeof(float));
}

/* A device buffer of n floats, all NaN (so that unwritten outputs show). */
static inline float *dev_poison(int64_t n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = dev_floats(h, n);
    free(h);
    return d;
}

/* Waits for the queued ops (and checks they ran) and downloads n floats. */
static inline float *host_floats(const float *dev, int64_t n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    di_status st = di_backend_cuda_sync(&g_be);
    CHECK_MSG(st == DI_OK, "%s", di_last_error());
    di_cuda_download(&g_be, h, dev, (size_t)n * sizeof(float));
    return h;
}

static inline void dfree(void *d) {
    di_cuda_free(&g_be, d);
}

#endif /* DI_TEST_CUDA_UTIL_H */
