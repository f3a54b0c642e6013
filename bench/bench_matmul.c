/*
 * bench_matmul.c -- throughput of the CPU matmul kernels (not a test; never run by ctest).
 *
 *   bench_matmul [threads [--invariance-only]]   (DI_SIMD=scalar|avx2|avx512 forces a level)
 *
 * Prints: the measured memory read bandwidth; for decode shapes (n = 1) the weight bytes read
 * per second and their share of that bandwidth, per dtype, over >= 256 MB of distinct
 * matrices cycled so that caches cannot help; for prefill shapes (n = 64, 256, 512) GFLOP/s;
 * then the batch-invariant matmul against di_cpu_matmul_fast on the models' shapes.
 */
#include "backend/cpu/cpu_ops.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DECODE_BYTES ((size_t)256 << 20)

static uint64_t g_state = 88172645463325252ull;
static uint32_t rnd(void) {
    g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_state >> 32);
}

/* Fills a [rows][cols] weight of dtype dt with finite random values (and unit-ish scales). */
static di_weight make(di_dtype dt, int64_t rows, int64_t cols, void **data, float **scale) {
    size_t bytes = di_dtype_bytes(dt, rows * cols);
    uint32_t *d = di_aligned_alloc((bytes + 3) / 4 * 4);
    for (size_t i = 0; i < (bytes + 3) / 4; i++) {
        uint32_t r = rnd();
        /* bf16: exponents near 1.0; fp8: bit 3 cleared, so never the NaN byte 0x7f/0xff. */
        d[i] = dt == DI_DTYPE_BF16 ? (r & 0x807f807fu) | 0x3c003c00u : (r & 0xf7f7f7f7u);
    }
    di_weight w = {.dtype = dt, .rows = rows, .cols = cols, .row_stride = cols, .data = d};
    *scale = NULL;
    if (dt == DI_DTYPE_F8_E4M3) {
        w.block_rows = w.block_cols = 128;
        w.scale_cols = (cols + 127) / 128;
        int64_t ns = (rows + 127) / 128 * w.scale_cols;
        *scale = di_aligned_alloc(sizeof(float) * (size_t)ns);
        for (int64_t i = 0; i < ns; i++)
            (*scale)[i] = 1e-3f * (1.0f + (float)(rnd() % 100) / 100.0f);
        w.scale = *scale;
    }
    *data = d;
    return w;
}

static float *vec(int64_t n) {
    float *v = di_aligned_alloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    return v;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* Single-core AVX-512 FMA throughput (12 independent chains), the prefill roofline. */
__attribute__((target("avx512f"))) static double fma_peak_avx512(void) {
    __m512 a[12], b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    const long iters = 4000000;
    double t = di_time_now();
    for (long k = 0; k < iters; k++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_fmadd_ps(a[i], b, c);
        __asm__ volatile(""
                         : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(a[4]), "+v"(a[5]),
                           "+v"(a[6]), "+v"(a[7]), "+v"(a[8]), "+v"(a[9]), "+v"(a[10]),
                           "+v"(a[11]));
    }
    t = di_time_now() - t;
    return iters * 12.0 * 32.0 / t;
}
#endif

static void bench_decode(di_pool *pool, di_dtype dt, int64_t rows, int64_t cols, double bw) {
    const size_t one = di_dtype_bytes(dt, rows * cols);
    const int count = (int)((DECODE_BYTES + one - 1) / one);
    di_weight *ws = calloc((size_t)count, sizeof *ws);
    void **data = calloc((size_t)count, sizeof *data);
    float **scales = calloc((size_t)count, sizeof *scales);
    for (int i = 0; i < count; i++)
        ws[i] = make(dt, rows, cols, &data[i], &scales[i]);
    float *x = vec(cols), *y = vec(rows);
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) { /* rep 0 warms up (page tables, thread wake-up) */
        double t = di_time_now();
        for (int i = 0; i < count; i++)
            di_cpu_matmul(pool, &ws[i], x, 1, y);
        t = di_time_now() - t;
        if (rep > 0 && t < best) best = t;
    }
    double gbs = (double)one * count / best / 1e9;
    printf("  decode %-8s %6lldx%-6lld x%-4d  %7.1f us/matmul  %6.2f GB/s  %5.1f%% of read bw\n",
           di_dtype_name(dt), (long long)rows, (long long)cols, count, best / count * 1e6, gbs,
           100.0 * gbs * 1e9 / bw);
    for (int i = 0; i < count; i++) {
        di_aligned_free(data[i]);
        di_aligned_free(scales[i]);
    }
    free(ws), free(data), free(scales);
    di_aligned_free(x), di_aligned_free(y);
}

static void bench_prefill(di_pool *pool, di_dtype dt, int64_t rows, int64_t cols, int64_t n) {
    void *data;
    float *scale;
    di_weight w = make(dt, rows, cols, &data, &scale);
    float *x = vec(n * cols), *y = vec(n * rows);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t = di_time_now();
        di_cpu_matmul(pool, &w, x, n, y);
        t = di_time_now() - t;
        if (t < best) best = t;
    }
    printf("  prefill %-8s %6lldx%-6lld n=%-4lld  %8.2f ms  %7.1f GFLOP/s\n", di_dtype_name(dt),
           (long long)rows, (long long)cols, (long long)n, best * 1e3,
           2.0 * (double)n * rows * cols / best / 1e9);
    di_aligned_free(data), di_aligned_free(scale), di_aligned_free(x), di_aligned_free(y);
}

/* Batch-invariant (di_cpu_matmul) vs. free (di_cpu_matmul_fast) on one shape at n tokens:
 * best of 5 over a set of distinct matrices of >= min_bytes (1 matrix: cache-resident). */
static void bench_modes(di_pool *pool, const char *tag, int64_t rows, int64_t cols, int64_t n,
                        size_t min_bytes) {
    const size_t one = di_dtype_bytes(DI_DTYPE_BF16, rows * cols);
    const int count = (int)DI_MAX((size_t)1, (min_bytes + one - 1) / one);
    di_weight *ws = calloc((size_t)count, sizeof *ws);
    void **data = calloc((size_t)count, sizeof *data);
    float *sc;
    for (int i = 0; i < count; i++)
        ws[i] = make(DI_DTYPE_BF16, rows, cols, &data[i], &sc);
    float *x = vec(n * cols), *y = vec(n * rows);
    double best[2] = {1e30, 1e30};
    const int inner = (int)DI_MAX(1, (int64_t)(4e6 / ((double)rows * cols * n) / count));
    for (int rep = 0; rep < 6; rep++)
        for (int mi = 0; mi < 2; mi++) { /* interleaved, alternating which goes first */
            const int mode = (mi + rep) % 2;
            double t = di_time_now();
            for (int it = 0; it < inner; it++)
                for (int i = 0; i < count; i++)
                    (mode ? di_cpu_matmul_fast
                          : di_cpu_matmul)(rows * cols * n < 65536 ? NULL : pool, &ws[i], x, n, y);
            t = (di_time_now() - t) / (inner * count);
            if (rep > 0 && t < best[mode]) best[mode] = t;
        }
    printf("  %-22s bf16 %6lldx%-5lld n=%-3lld  invariant %8.2f us  fast %8.2f us  x%.2f\n", tag,
           (long long)rows, (long long)cols, (long long)n, best[0] * 1e6, best[1] * 1e6,
           best[0] / best[1]);
    for (int i = 0; i < count; i++)
        di_aligned_free(data[i]);
    free(ws), free(data);
    di_aligned_free(x), di_aligned_free(y);
}

/* The shapes of the models we run: V2-Lite (hidden 2048, experts 1408) from memory, and the
 * bundled V4 tiny model (hidden 256, experts 48; 15 MB, so cache-resident). */
static void bench_invariance(di_pool *pool) {
    printf("batch-invariant vs fast matmul (DI_MM fast mode):\n");
    static const struct {
        const char *tag;
        int64_t rows, cols;
        size_t bytes;
    } shapes[] = {{"v2lite q_proj", 3072, 2048, 64u << 20},
                  {"v2lite expert gate/up", 1408, 2048, 64u << 20},
                  {"v2lite expert down", 2048, 1408, 64u << 20},
                  {"v4tiny wq_a", 96, 256, 0},
                  {"v4tiny expert gate/up", 48, 256, 0},
                  {"v4tiny expert down", 256, 48, 0},
                  {"v4tiny lm_head", 6144, 256, 0}};
    static const int64_t ns[] = {1, 2, 4, 6, 8};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t k = 0; k < 5; k++)
            bench_modes(pool, shapes[s].tag, shapes[s].rows, shapes[s].cols, ns[k],
                        shapes[s].bytes);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows through pipes too */
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    di_pool *pool = di_pool_create(threads);
    if (!pool) return 1;
    if (argc > 2 && strcmp(argv[2], "--invariance-only") == 0) {
        bench_invariance(pool);
        di_pool_free(pool);
        return 0;
    }
    printf("bench_matmul: simd %s, %d threads\n", di_cpu_simd_name(), di_pool_size(pool));
    double bw = di_cpu_measure_read_bandwidth(pool, (size_t)256 << 20);
    printf("  read bandwidth (256 MiB): %.2f GB/s\n", bw / 1e9);
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f"))
        printf("  fp32 FMA peak (avx512, one core, x%d threads = roofline): %.1f GFLOP/s\n",
               di_pool_size(pool), fma_peak_avx512() / 1e9);
#endif

    static const int64_t dshapes[][2] = {{2048, 2048}, {1408, 2048}, {10944, 2048}, {2048, 7168}};
    static const di_dtype dtypes[] = {DI_DTYPE_BF16, DI_DTYPE_F8_E4M3};
    for (size_t d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof dshapes / sizeof dshapes[0]; s++)
            bench_decode(pool, dtypes[d], dshapes[s][0], dshapes[s][1], bw);

    static const int64_t ns[] = {64, 256, 512};
    for (size_t d = 0; d < 2; d++)
        for (size_t k = 0; k < 3; k++)
            bench_prefill(pool, dtypes[d], 2048, 2048, ns[k]);
    bench_invariance(pool);
    di_pool_free(pool);
    return 0;
}
