/*
 * bench_cuda_matmul.c -- throughput of the CUDA backend's GEMV (not a test; never run by
 * ctest). Run by tools/gpu_check.sh on a GPU machine.
 *
 *   bench_cuda_matmul [device [dtype [max_n [name [min_n]]]]]
 *       dtype: BF16, F8_E4M3 or F4 -- only that dtype, no attention; `copy`: only the copy
 *       bandwidth; `lines`: the copy bandwidth and the read probe of cuda_probe.cu (738 MiB of
 *       4 KiB rows, as V2-Lite's 64 experts' gate / up, with each warp load covering 64, 128,
 *       256 or 512 bytes per row); max_n / min_n: largest / smallest batch timed; name: only
 *       the shapes whose name contains it (e.g. "q_proj", to profile one product with Nsight
 *       Compute)
 *
 * Prints the device's measured copy bandwidth (bytes read + written per second, the
 * roofline), then for DeepSeek-V3 weight shapes in BF16 and block-scaled FP8, and V4-Flash
 * expert shapes in FP4 (e2m1 with E8M0 scales, through matmul_fp4), and batch sizes
 * n = 1 .. 64 (256 and 1024 too where max_n allows): the time of one matmul and the weight bytes
 * (scales included) streamed per second, as GB/s and as a share of the copy bandwidth. Each shape
 * cycles over enough distinct device copies
 * (>= 512 MiB) that the 60 MB L2 cannot serve repeats. Then the MLA decode attention's time
 * for a few context lengths. Without a CUDA device it says so and exits 0.
 */
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CYCLE_BYTES ((size_t)512 << 20)

static uint64_t g_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_state >> 32);
}

/* A host weight with finite random values (fp8: no NaN bytes; 128x128 scale blocks; fp4:
 * E8M0 scales 2^-8 .. 2^2 per 32 columns). */
static di_weight make_host(di_dtype dt, int64_t rows, int64_t cols) {
    size_t bytes = di_dtype_bytes(dt, rows * cols);
    uint32_t *d = malloc((bytes + 3) / 4 * 4);
    for (size_t i = 0; i < (bytes + 3) / 4; i++) {
        uint32_t r = rnd();
        d[i] = dt == DI_DTYPE_BF16 ? (r & 0x807f807fu) | 0x3c003c00u : (r & 0xf7f7f7f7u);
    }
    di_weight w = {.dtype = dt, .rows = rows, .cols = cols, .row_stride = cols, .data = d};
    if (dt == DI_DTYPE_F8_E4M3) {
        w.block_rows = w.block_cols = 128;
        w.scale_cols = (cols + 127) / 128;
        int64_t ns = (rows + 127) / 128 * w.scale_cols;
        float *s = malloc(sizeof(float) * (size_t)ns);
        for (int64_t i = 0; i < ns; i++)
            s[i] = 1e-3f * (1.0f + (float)(rnd() % 100) / 100.0f);
        w.scale = s;
    }
    if (dt == DI_DTYPE_F4_E2M1) {
        w.block_rows = 1;
        w.block_cols = 32;
        w.scale_cols = (cols + 31) / 32;
        uint8_t *s = malloc((size_t)(rows * w.scale_cols));
        for (int64_t i = 0; i < rows * w.scale_cols; i++)
            s[i] = (uint8_t)(119 + rnd() % 11);
        w.scale_e8m0 = s;
    }
    return w;
}

static float *dev_random(const di_backend *be, int64_t n) {
    float *h = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        h[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    float *d = di_cuda_malloc(be, sizeof(float) * (size_t)n);
    if (d) di_cuda_upload(be, d, h, sizeof(float) * (size_t)n);
    free(h);
    return d;
}

typedef struct {
    const char *name;
    di_dtype dt;
    int64_t rows, cols;
} shape;

static void bench_shape(const di_backend *be, const shape *s, double copy_bw, int64_t min_n,
                        int64_t max_n) {
    di_weight hw = make_host(s->dt, s->rows, s->cols);
    const size_t wbytes =
        di_dtype_bytes(s->dt, s->rows * s->cols) +
        (hw.scale ? sizeof(float) * (size_t)((s->rows + 127) / 128 * hw.scale_cols) : 0) +
        (hw.scale_e8m0 ? (size_t)(s->rows * hw.scale_cols) : 0);
    /* matmul_fp4 takes FP4 and forwards every other dtype to matmul */
    void (*mm)(void *, const di_weight *, const float *, int64_t, float *) =
        s->dt == DI_DTYPE_F4_E2M1 ? be->ops->matmul_fp4 : be->ops->matmul;
    int ncopies = (int)((CYCLE_BYTES + wbytes - 1) / wbytes);
    if (ncopies < 1) ncopies = 1;
    di_weight *dw = calloc((size_t)ncopies, sizeof(di_weight));
    for (int i = 0; i < ncopies; i++) {
        if (di_cuda_weight_upload(be, &hw, &dw[i]) != DI_OK) {
            printf("%-22s upload failed: %s\n", s->name, di_last_error());
            ncopies = i;
            break;
        }
    }
    static const int64_t ns[] = {1, 2, 4, 8, 16, 64, 256, 1024}; /* 256, 1024: a prefill's */
    int64_t nmax = 1;
    for (size_t k = 0; k < DI_ARRAY_LEN(ns) && ns[k] <= max_n; k++)
        nmax = ns[k];
    float *x = dev_random(be, nmax * s->cols);
    float *y = di_cuda_malloc(be, sizeof(float) * (size_t)(nmax * s->rows));
    for (size_t k = 0; k < DI_ARRAY_LEN(ns) && ncopies > 0 && ns[k] <= max_n; k++) {
        const int64_t n = ns[k];
        if (n < min_n) continue;
        for (int i = 0; i < ncopies; i++) /* warm-up */
            mm(be->ctx, &dw[i], x, n, y);
        di_backend_cuda_sync(be);
        int reps = 0;
        double t0 = di_time_now(), t1 = t0;
        while (t1 - t0 < 0.2 || reps < 3 * ncopies) {
            for (int i = 0; i < ncopies; i++)
                mm(be->ctx, &dw[i], x, n, y);
            reps += ncopies;
            di_backend_cuda_sync(be);
            t1 = di_time_now();
        }
        if (di_backend_cuda_sync(be) != DI_OK) {
            printf("%-22s n=%-3lld failed: %s\n", s->name, (long long)n, di_last_error());
            continue;
        }
        const double t = (t1 - t0) / reps, gbs = (double)wbytes / t / 1e9;
        const double tflops = 2.0 * (double)(n * s->rows * s->cols) / t / 1e12;
        printf("%-22s %-5s n=%-3lld %9.1f us %8.1f GB/s %5.1f%% of copy  %6.2f TFLOP/s\n", s->name,
               di_dtype_name(s->dt), (long long)n, t * 1e6, gbs, 100.0 * gbs * 1e9 / copy_bw,
               tflops);
    }
    for (int i = 0; i < ncopies; i++)
        di_cuda_weight_free(be, &dw[i]);
    di_cuda_free(be, x);
    di_cuda_free(be, y);
    free(dw);
    free((void *)hw.data);
    free((void *)hw.scale);
    free((void *)hw.scale_e8m0);
}

static void bench_attention(const di_backend *be, int64_t nh, int64_t L) {
    const int64_t R = 512, dr = 64, n = 1;
    float *ql = dev_random(be, nh * n * R), *qr = dev_random(be, n * nh * dr);
    float *ckv = dev_random(be, L * R), *kr = dev_random(be, L * dr);
    float *out = di_cuda_malloc(be, sizeof(float) * (size_t)(nh * n * R));
    di_mla_attn_params p = {.n_tokens = n,
                            .n_heads = nh,
                            .pos0 = L - n,
                            .kv_lora_rank = R,
                            .rope_dim = dr,
                            .scale = 0.07f,
                            .q_lat = ql,
                            .q_rope = qr,
                            .q_rope_tstride = nh * dr,
                            .q_rope_hstride = dr,
                            .c_kv = ckv,
                            .k_rope = kr,
                            .out = out};
    for (int i = 0; i < 3; i++)
        be->ops->mla_attention(be->ctx, &p);
    di_backend_cuda_sync(be);
    const int reps = 50;
    double t0 = di_time_now();
    for (int i = 0; i < reps; i++)
        be->ops->mla_attention(be->ctx, &p);
    di_status st = di_backend_cuda_sync(be);
    double t = (di_time_now() - t0) / reps;
    const double kv_bytes = (double)(L * (R + dr)) * sizeof(float);
    /* fp32 FMAs: scores (R + dr per key and head) and the weighted sum (R) */
    const double flops = 2.0 * (double)(nh * L * (2 * R + dr));
    printf("mla decode  heads=%-3lld L=%-6lld %9.1f us  (KV %.1f MB, %.0f GB/s if read once; "
           "%.1f TFLOP/s)%s\n",
           (long long)nh, (long long)L, t * 1e6, kv_bytes / 1e6, kv_bytes / t / 1e9,
           flops / t / 1e12, st == DI_OK ? "" : " FAILED");
    di_cuda_free(be, ql), di_cuda_free(be, qr), di_cuda_free(be, ckv), di_cuda_free(be, kr);
    di_cuda_free(be, out);
}

int main(int argc, char **argv) {
    int device = argc > 1 ? atoi(argv[1]) : 0;
    di_backend be;
    if (di_backend_cuda_init(&be, device, 32768) != DI_OK) {
        printf("bench_cuda_matmul: skipped: %s\n", di_last_error());
        return 0;
    }
    const double copy_bw = di_cuda_measure_copy_bandwidth(&be, (size_t)1 << 30);
    printf("device: %s\n", di_backend_cuda_device_name(&be));
    printf("device copy bandwidth: %.1f GB/s (read + write, 1 GiB buffers)\n", copy_bw / 1e9);
    static const shape shapes[] = {
        {"attn o_proj 7168x16384", DI_DTYPE_BF16, 7168, 16384},
        {"attn o_proj 7168x16384", DI_DTYPE_F8_E4M3, 7168, 16384},
        {"mlp gate 18432x7168", DI_DTYPE_BF16, 18432, 7168},
        {"mlp gate 18432x7168", DI_DTYPE_F8_E4M3, 18432, 7168},
        {"mlp down 7168x18432", DI_DTYPE_F8_E4M3, 7168, 18432},
        {"expert up 2048x7168", DI_DTYPE_F8_E4M3, 2048, 7168},
        {"kv_a 576x7168", DI_DTYPE_F8_E4M3, 576, 7168},
        {"v2-lite lm_head 102400x2048", DI_DTYPE_BF16, 102400, 2048},
        {"v2-lite expert gate 1408x2048", DI_DTYPE_BF16, 1408, 2048},
        {"v2-lite expert down 2048x1408", DI_DTYPE_BF16, 2048, 1408},
        {"v2-lite q_proj 3072x2048", DI_DTYPE_BF16, 3072, 2048},
        {"v2-lite o_proj 2048x2048", DI_DTYPE_BF16, 2048, 2048},
        {"v2-lite shared up 2816x2048", DI_DTYPE_BF16, 2816, 2048},
        {"v4 expert up 2048x4096", DI_DTYPE_F4_E2M1, 2048, 4096},
        {"v4 expert down 4096x2048", DI_DTYPE_F4_E2M1, 4096, 2048},
    };
    const char *only = argc > 2 ? argv[2] : NULL;
    if (only && strcmp(only, "lines") == 0) {
        static const int pieces[] = {64, 128, 256, 512};
        for (size_t i = 0; i < DI_ARRAY_LEN(pieces); i++) {
            const double bw = di_cuda_measure_read_lines(&be, pieces[i], (size_t)738 << 20);
            printf("read, %3d bytes per row per warp load: %8.1f GB/s  %5.1f%% of copy\n",
                   pieces[i], bw / 1e9, copy_bw > 0 ? 100.0 * bw / copy_bw : 0.0);
        }
    }
    const int64_t max_n = argc > 3 ? atoll(argv[3]) : 64;
    const char *name = argc > 4 ? argv[4] : NULL;
    const int64_t min_n = argc > 5 ? atoll(argv[5]) : 1;
    for (size_t i = 0; i < DI_ARRAY_LEN(shapes); i++)
        if ((!only || strcmp(only, di_dtype_name(shapes[i].dt)) == 0) &&
            (!name || strstr(shapes[i].name, name)))
            bench_shape(&be, &shapes[i], copy_bw, min_n, max_n);
    static const int64_t Ls[] = {1024, 4096, 16384};
    for (size_t i = 0; i < DI_ARRAY_LEN(Ls) && !only; i++)
        bench_attention(&be, 128, Ls[i]);
    di_backend_free(&be);
    return 0;
}
