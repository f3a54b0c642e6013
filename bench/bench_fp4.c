/*
 * bench_fp4.c -- throughput of the DeepSeek-V4 routed-expert FP4 (e2m1) matmul
 * (di_cpu_matmul_fp4; not a test, never run by ctest).
 *
 *   bench_fp4 [threads]          (DI_SIMD=scalar|avx2|avx512 forces a lower SIMD level)
 *
 * Prints the measured memory read bandwidth; for decode (n = 1..4) the stored bytes (packed
 * nibbles + one E8M0 byte per 32 columns) read per second and their share of that bandwidth,
 * over >= 256 MB of distinct V4-Flash-shaped expert matrices cycled so that caches cannot
 * help; for prefill (n = 64) GFLOP/s. Each figure is the best of several repetitions.
 */
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_v4_ops.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>

#define DECODE_BYTES ((size_t)256 << 20)

static uint64_t g_state = 88172645463325252ull;
static uint32_t rnd(void) {
    g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_state >> 32);
}

/* A [rows][cols] FP4 weight: random nibbles, E8M0 scales near 2^-7 (as the V4 slice). */
static di_weight make(int64_t rows, int64_t cols, void **data, void **scale) {
    const size_t nb = (size_t)(rows * cols / 2), ns = (size_t)(rows * cols / 32);
    uint8_t *d = di_aligned_alloc(nb), *s = di_aligned_alloc(ns);
    for (size_t i = 0; i < nb; i++)
        d[i] = (uint8_t)rnd();
    for (size_t i = 0; i < ns; i++)
        s[i] = (uint8_t)(120 + rnd() % 4);
    *data = d, *scale = s;
    return (di_weight){.dtype = DI_DTYPE_F4_E2M1,
                       .rows = rows,
                       .cols = cols,
                       .row_stride = cols,
                       .data = d,
                       .scale_e8m0 = s,
                       .scale_cols = cols / 32,
                       .block_rows = 1,
                       .block_cols = 32};
}

static void free_weight(void *data, void *scale) {
    di_aligned_free(data);
    di_aligned_free(scale);
}

static float *vec(int64_t n) {
    float *v = di_aligned_alloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    return v;
}

static void bench_decode(di_pool *pool, int64_t rows, int64_t cols, int64_t n, double bw) {
    const size_t one = (size_t)(rows * cols / 2 + rows * cols / 32); /* stored bytes */
    const int count = (int)((DECODE_BYTES + one - 1) / one);
    di_weight *ws = calloc((size_t)count, sizeof *ws);
    void **data = calloc((size_t)count, sizeof *data),
         **scales = calloc((size_t)count, sizeof *data);
    for (int i = 0; i < count; i++)
        ws[i] = make(rows, cols, &data[i], &scales[i]);
    float *x = vec(n * cols), *y = vec(n * rows);
    double best = 1e30;
    for (int rep = 0; rep < 6; rep++) { /* rep 0 warms up (page tables, thread wake-up) */
        double t = di_time_now();
        for (int i = 0; i < count; i++)
            di_cpu_matmul_fp4(pool, &ws[i], x, n, y);
        t = di_time_now() - t;
        if (rep > 0 && t < best) best = t;
    }
    double gbs = (double)one * count / best / 1e9;
    printf("  decode  fp4 %5lldx%-5lld n=%lld x%-3d %7.1f us/matmul  %6.2f GB/s stored  %5.1f%% "
           "of read bw\n",
           (long long)rows, (long long)cols, (long long)n, count, best / count * 1e6, gbs,
           100.0 * gbs * 1e9 / bw);
    for (int i = 0; i < count; i++)
        free_weight(data[i], scales[i]);
    free(ws), free(data), free(scales);
    di_aligned_free(x), di_aligned_free(y);
}

static void bench_prefill(di_pool *pool, int64_t rows, int64_t cols, int64_t n) {
    void *data, *scale;
    di_weight w = make(rows, cols, &data, &scale);
    float *x = vec(n * cols), *y = vec(n * rows);
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t = di_time_now();
        di_cpu_matmul_fp4(pool, &w, x, n, y);
        t = di_time_now() - t;
        if (t < best) best = t;
    }
    printf("  prefill fp4 %5lldx%-5lld n=%-4lld  %8.2f ms  %7.1f GFLOP/s\n", (long long)rows,
           (long long)cols, (long long)n, best * 1e3, 2.0 * (double)n * rows * cols / best / 1e9);
    free_weight(data, scale);
    di_aligned_free(x), di_aligned_free(y);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    di_pool *pool = di_pool_create(threads);
    if (!pool) return 1;
    printf("bench_fp4: simd %s, %d threads\n", di_cpu_simd_name(), di_pool_size(pool));
    double bw = di_cpu_measure_read_bandwidth(pool, (size_t)256 << 20);
    printf("  read bandwidth (256 MiB): %.2f GB/s\n", bw / 1e9);
    /* V4-Flash routed expert: w1 / w3 [2048][4096], w2 [4096][2048]. */
    static const int64_t shapes[][2] = {{2048, 4096}, {4096, 2048}};
    for (size_t s = 0; s < 2; s++)
        for (int64_t n = 1; n <= 4; n++)
            bench_decode(pool, shapes[s][0], shapes[s][1], n, bw);
    for (size_t s = 0; s < 2; s++)
        bench_prefill(pool, shapes[s][0], shapes[s][1], 64);
    di_pool_free(pool);
    return 0;
}
