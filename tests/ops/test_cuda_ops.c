/*
 * test_cuda_ops.c -- every op of the CUDA backend against the CPU scalar references on random
 * shapes, test-backend-ops style: normalised error max|gpu - ref| / max|ref| under a per-op
 * tolerance, outputs poisoned with NaN before each run so that an unwritten element fails.
 *
 * Beyond accuracy it checks the CUDA backend's own promises bitwise: a token's matmul row is
 * the same alone or in any batch (token groups, odd n), the 16-byte and element-wise weight
 * load paths agree, per-head products take the one-launch and per-head paths alike, and the
 * attention gives the same bits split along the KV axis, walked sequentially, or with the
 * query alone; the paged cache and head strides bitwise against the contiguous layout; the
 * MoE data-movement ops (copy_rows, moe_combine) and the MoE routing (moe_route) bitwise
 * against the CPU backend, the grouped expert GEMV (matmul_experts) bitwise against
 * matmul per expert, the fused SwiGLU products (matmul_glu, matmul_experts_glu) bitwise
 * against the separate products and silu_mul, matmul_add bitwise against matmul plus the
 * addition, and mla_store bitwise against rmsnorm, rope and copy_rows. Shapes
 * include odd sizes, row views and FP8 partial blocks (block sizes 128x128, 8x32, 3x20, 1x7,
 * 2x48 over sizes that are not multiples of them).
 *
 * On a machine without a CUDA device (or a build without CUDA) it prints why and counts as
 * skipped (exit status 0).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "backend/backend.h"
#include "backend/cpu/cpu_nn.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "core/core.h"
#include "sample/sample_vec.h"
#include "sample/sampler.h"
#include "test.h"
#define TEST_RAND_SEED 0x853c49e6748fea9bull
#include "test_rand.h"
#include "test_cuda_util.h"
#include "test_route_util.h"

/* ---------------------------------------------------------------------------------------- */
/* Random weights                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* A stored host tensor [srows][scols] and a view [rows][cols] of it at row r0. */
typedef struct {
    void *data;
    float *scale;
    di_weight all, w;
} test_weight;

/* FP8 scale blocks: 48 columns (3 vectors) takes the SIMT kernel's 32-bit division, 128 and
 * 32 its shift, 20 and 7 the per-element scales; on the tensor cores (whole 32-column chunks
 * per block) 128 and 32 take the chunk shift and 96 (3 chunks) its division. */
static const int64_t g_br[] = {128, 8, 3, 1, 2, 16}, g_bc[] = {128, 32, 20, 7, 48, 96};

static test_weight make_weight(di_dtype dt, int64_t rows, int64_t cols, int64_t extra_rows,
                               int64_t extra_cols, int blk) {
    test_weight t;
    memset(&t, 0, sizeof t);
    const int64_t srows = rows + extra_rows, scols = cols + extra_cols;
    const size_t count = (size_t)(srows * scols);
    t.data = malloc(di_dtype_bytes(dt, (int64_t)count) + 64);
    for (size_t i = 0; i < count; i++) {
        float v = rnd_f();
        switch (dt) {
        case DI_DTYPE_F32:
            ((float *)t.data)[i] = v;
            break;
        case DI_DTYPE_F16:
            ((uint16_t *)t.data)[i] = di_f32_to_f16(v);
            break;
        case DI_DTYPE_BF16:
            ((uint16_t *)t.data)[i] = di_f32_to_bf16(v);
            break;
        default: {
            uint8_t b = (uint8_t)rnd_u32();
            if ((b & 0x7f) == 0x7f) b ^= 1; /* no NaN bytes */
            ((uint8_t *)t.data)[i] = b;
        }
        }
    }
    di_weight w = {.dtype = dt, .rows = srows, .cols = cols, .row_stride = scols, .data = t.data};
    if (dt == DI_DTYPE_F8_E4M3) {
        w.block_rows = g_br[blk % DI_ARRAY_LEN(g_br)];
        w.block_cols = g_bc[blk % DI_ARRAY_LEN(g_bc)];
        w.scale_cols = (scols + w.block_cols - 1) / w.block_cols;
        const int64_t n_sr = (srows + w.block_rows - 1) / w.block_rows;
        t.scale = malloc(sizeof(float) * (size_t)(n_sr * w.scale_cols));
        for (int64_t i = 0; i < n_sr * w.scale_cols; i++)
            t.scale[i] = ldexpf(1.0f + 0.5f * rnd_f(), (int)rnd_int(-10, -4));
        w.scale = t.scale;
    }
    t.all = w;
    t.w = di_weight_rows(&w, extra_rows, rows);
    return t;
}

static void free_weight(test_weight *t) {
    free(t->data);
    free(t->scale);
}

static di_weight upload(const di_weight *w) {
    di_weight d;
    memset(&d, 0, sizeof d);
    di_status st = di_cuda_weight_upload(&g_be, w, &d);
    CHECK_MSG(st == DI_OK, "upload: %s", di_last_error());
    return d;
}

static const di_dtype g_dtypes[] = {DI_DTYPE_F32, DI_DTYPE_F16, DI_DTYPE_BF16, DI_DTYPE_F8_E4M3};

/* ---------------------------------------------------------------------------------------- */
/* Matmul family                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* GPU y = W x (or W^T x) for n tokens; returns host floats. */
static float *gpu_mm_on(di_backend *b, const di_weight *dw, bool tr, const float *x, int64_t n) {
    const int64_t in = tr ? dw->rows : dw->cols, out = tr ? dw->cols : dw->rows;
    float *dx = dev_floats(x, n * in), *dy = dev_poison(n * out);
    CHECK(di_backend_cuda_sync(&g_be) == DI_OK); /* (b's stream reads g_be's uploads) */
    (tr ? b->ops->matmul_t : b->ops->matmul)(b->ctx, dw, dx, n, dy);
    CHECK(di_backend_cuda_sync(b) == DI_OK);
    float *y = host_floats(dy, n * out);
    dfree(dx), dfree(dy);
    return y;
}

static float *gpu_mm(const di_weight *dw, bool tr, const float *x, int64_t n) {
    return gpu_mm_on(&g_be, dw, tr, x, n);
}

/* One random product, checked against the reference and for batch invariance. */
static void check_mm(di_dtype dt, bool tr, int64_t rows, int64_t cols, int64_t n, int blk,
                     double tol) {
    test_weight t = make_weight(dt, rows, cols, rnd_int(0, 9), rnd_int(0, 5), blk);
    const int64_t in = tr ? rows : cols, out = tr ? cols : rows;
    float *x = rnd_vec(n * in, 1.0f), *ref = malloc((size_t)(n * out) * sizeof(float));
    (tr ? di_cpu_matmul_t_ref : di_cpu_matmul_ref)(&t.w, x, n, ref);
    di_weight dw = upload(&t.w);
    float *y = gpu_mm(&dw, tr, x, n);
    double e = nerr(y, ref, n * out);
    CHECK_MSG(e <= tol, "%s%s rows=%lld cols=%lld n=%lld blk=%d: error %.3g", di_dtype_name(dt),
              tr ? " (T)" : "", (long long)rows, (long long)cols, (long long)n, blk, e);
    /* batch invariance: the first, a middle and the last token alone */
    int64_t probes[3] = {0, n / 2, n - 1};
    for (int k = 0; k < 3 && n > 1; k++) {
        float *y1 = gpu_mm(&dw, tr, x + probes[k] * in, 1);
        CHECK_MSG(memcmp(y1, y + probes[k] * out, (size_t)out * sizeof(float)) == 0,
                  "%s%s rows=%lld cols=%lld n=%lld: token %lld alone differs", di_dtype_name(dt),
                  tr ? " (T)" : "", (long long)rows, (long long)cols, (long long)n,
                  (long long)probes[k]);
        free(y1);
    }
    di_cuda_weight_free(&g_be, &dw);
    free(x), free(ref), free(y);
    free_weight(&t);
}

TEST(matmul) {
    if (!g_have_gpu) SKIP("no CUDA device");
    static const int64_t ns[] = {1, 2, 3, 4, 5, 8, 9, 17, 40};
    for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++)
        for (int it = 0; it < 12; it++)
            check_mm(g_dtypes[d], false, rnd_int(1, 300), rnd_int(1, 1100),
                     ns[rnd_u32() % DI_ARRAY_LEN(ns)], it, 1e-5);
    /* model-sized rows (V3's hidden size), 128x128 fp8 blocks */
    check_mm(DI_DTYPE_BF16, false, 512, 7168, 8, 0, 1e-5);
    check_mm(DI_DTYPE_F8_E4M3, false, 600, 7168, 3, 0, 1e-5);
    check_mm(DI_DTYPE_F8_E4M3, false, 257, 2000, 1, 2, 1e-5);
    /* rows long enough for the K split over 4 warps, with a partial last vector */
    check_mm(DI_DTYPE_BF16, false, 37, 2049, 5, 0, 1e-5);
    /* one token, short split rows (4 rows per group), row counts not a multiple of 4 */
    check_mm(DI_DTYPE_BF16, false, 301, 2048, 3, 0, 1e-5);
    check_mm(DI_DTYPE_F32, false, 99, 1500, 2, 0, 1e-5);
    check_mm(DI_DTYPE_F8_E4M3, false, 45, 4100, 17, 0, 1e-5);
    check_mm(DI_DTYPE_F8_E4M3, false, 64, 4096, 2, 1, 1e-5);
    check_mm(DI_DTYPE_F8_E4M3, false, 70, 3000, 1, 4, 1e-5); /* 48-column scale blocks */
    check_mm(DI_DTYPE_F8_E4M3, false, 33, 900, 5, 4, 1e-5);
}

/* FP8 bytes 0x7f / 0xff are NaN and must propagate; scales too large for the fast
 * conversion take the exact path. */
TEST(matmul_fp8_special) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int it = 0; it < 4; it++) {
        const int64_t rows = 9, cols = it < 2 ? 300 : 5000, n = it % 2 ? 3 : 1;
        test_weight t = make_weight(DI_DTYPE_F8_E4M3, rows, cols, 0, 0, it % 2 ? 0 : 1);
        ((uint8_t *)t.data)[3 * cols + cols / 2] = it % 2 ? 0xff : 0x7f; /* row 3 */
        t.scale[0] = 300.0f; /* first scale block: the slow path */
        float *x = rnd_vec(n * cols, 1.0f), *ref = malloc((size_t)(n * rows) * sizeof(float));
        di_cpu_matmul_ref(&t.w, x, n, ref);
        di_weight dw = upload(&t.w);
        float *y = gpu_mm(&dw, false, x, n);
        for (int64_t tk = 0; tk < n; tk++)
            CHECK(isnan(y[tk * rows + 3]) && isnan(ref[tk * rows + 3]));
        CHECK_MSG(nerr(y, ref, n * rows) <= 1e-5, "error %.3g", nerr(y, ref, n * rows));
        di_cuda_weight_free(&g_be, &dw);
        free(x), free(ref), free(y);
        free_weight(&t);
    }
}

TEST(matmul_t) {
    if (!g_have_gpu) SKIP("no CUDA device");
    static const int64_t ns[] = {1, 2, 4, 5, 7};
    for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++)
        for (int it = 0; it < 10; it++)
            check_mm(g_dtypes[d], true, rnd_int(1, 200), rnd_int(1, 700),
                     ns[rnd_u32() % DI_ARRAY_LEN(ns)], it, 1e-5);
    check_mm(DI_DTYPE_F8_E4M3, true, 128, 512, 4, 0, 1e-5); /* W_UK^T's shape */
}

/* silu_mul(a, b) on the GPU over n floats of host data; returns host floats. */
static float *gpu_silu_mul(const float *a, const float *b, int64_t n) {
    float *da = dev_floats(a, n), *db = dev_floats(b, n), *dy = dev_poison(n);
    g_be.ops->silu_mul(g_be.ctx, da, db, n, dy);
    float *y = host_floats(dy, n);
    dfree(da), dfree(db), dfree(dy);
    return y;
}

/* matmul_glu: bitwise silu_mul(matmul(gate), matmul(up)) on the GPU, for every dtype, odd
 * sizes, row views and token counts across the token-group sizes; and a token alone. */
static void check_glu(di_dtype dt, int64_t rows, int64_t cols, int64_t n, int blk) {
    const int64_t er = rnd_int(0, 9), ec = rnd_int(0, 5);
    test_weight tg = make_weight(dt, rows, cols, er, ec, blk);
    test_weight tu = make_weight(dt, rows, cols, er, ec, blk);
    di_weight dg = upload(&tg.w), du = upload(&tu.w);
    float *x = rnd_vec(n * cols, 1.0f);
    float *yg = gpu_mm(&dg, false, x, n), *yu = gpu_mm(&du, false, x, n);
    float *ref = gpu_silu_mul(yg, yu, n * rows);
    float *dx = dev_floats(x, n * cols), *dy = dev_poison(n * rows);
    g_be.ops->matmul_glu(g_be.ctx, &dg, &du, dx, n, dy);
    float *y = host_floats(dy, n * rows);
    CHECK_MSG(memcmp(y, ref, (size_t)(n * rows) * 4) == 0,
              "%s glu rows=%lld cols=%lld n=%lld blk=%d: differs from matmul + silu_mul",
              di_dtype_name(dt), (long long)rows, (long long)cols, (long long)n, blk);
    /* every token alone (from 9 tokens the batch took another kernel: the same sums) */
    float *y1 = NULL;
    for (int64_t t = 0; t < n; t++) {
        g_be.ops->matmul_glu(g_be.ctx, &dg, &du, dx + t * cols, 1, dy);
        free(y1);
        y1 = host_floats(dy, rows);
        CHECK_MSG(memcmp(y1, ref + t * rows, (size_t)rows * 4) == 0,
                  "%s glu rows=%lld cols=%lld n=%lld: token %lld alone differs", di_dtype_name(dt),
                  (long long)rows, (long long)cols, (long long)n, (long long)t);
    }
    CHECK(di_backend_cuda_sync(&g_be) == DI_OK);
    di_cuda_weight_free(&g_be, &dg), di_cuda_weight_free(&g_be, &du);
    dfree(dx), dfree(dy);
    free(x), free(yg), free(yu), free(ref), free(y), free(y1);
    free_weight(&tg), free_weight(&tu);
}

/* matmul_add: y0 + W x rounded once per element, i.e. bitwise y0 + matmul's result. */
static void check_add(di_dtype dt, int64_t rows, int64_t cols, int64_t n, int blk) {
    test_weight t = make_weight(dt, rows, cols, rnd_int(0, 9), rnd_int(0, 5), blk);
    di_weight dw = upload(&t.w);
    float *x = rnd_vec(n * cols, 1.0f), *y0 = rnd_vec(n * rows, 2.0f);
    float *ym = gpu_mm(&dw, false, x, n);
    float *dx = dev_floats(x, n * cols), *dy = dev_floats(y0, n * rows);
    g_be.ops->matmul_add(g_be.ctx, &dw, dx, n, dy);
    float *y = host_floats(dy, n * rows);
    int64_t bad = -1;
    for (int64_t i = 0; i < n * rows && bad < 0; i++) {
        const float want = y0[i] + ym[i];
        if (memcmp(&want, &y[i], sizeof want) != 0) bad = i;
    }
    CHECK_MSG(bad < 0,
              "%s add rows=%lld cols=%lld n=%lld blk=%d: element %lld differs from "
              "y0 + matmul",
              di_dtype_name(dt), (long long)rows, (long long)cols, (long long)n, blk,
              (long long)bad);
    CHECK(di_backend_cuda_sync(&g_be) == DI_OK);
    di_cuda_weight_free(&g_be, &dw);
    dfree(dx), dfree(dy);
    free(x), free(y0), free(ym), free(y);
    free_weight(&t);
}

TEST(matmul_add) {
    if (!g_have_gpu) SKIP("no CUDA device");
    static const int64_t ns[] = {1, 2, 3, 4, 5, 8, 13};
    for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++)
        for (int it = 0; it < 6; it++)
            check_add(g_dtypes[d], rnd_int(1, 200), rnd_int(1, 2100),
                      ns[rnd_u32() % DI_ARRAY_LEN(ns)], it);
    check_add(DI_DTYPE_BF16, 2048, 2048, 1, 0);  /* V2-Lite's o_proj, decode */
    check_add(DI_DTYPE_BF16, 2048, 1408, 1, 0);  /* its expert down */
    check_add(DI_DTYPE_BF16, 2048, 2048, 64, 0); /* o_proj at 64 sequences (wide kernel) */
    check_add(DI_DTYPE_BF16, 2048, 2816, 33, 0); /* shared experts' down, a partial group */
    check_add(DI_DTYPE_BF16, 700, 200, 40, 0);   /* wide with 1, 2 and 4 K runs */
    check_add(DI_DTYPE_BF16, 1000, 256, 33, 0);
    check_add(DI_DTYPE_BF16, 300, 520, 17, 0);
    check_add(DI_DTYPE_F8_E4M3, 7168, 2048, 3, 0);
}

TEST(matmul_glu) {
    if (!g_have_gpu) SKIP("no CUDA device");
    static const int64_t ns[] = {1, 2, 3, 4, 5, 8, 13};
    for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++)
        for (int it = 0; it < 8; it++)
            check_glu(g_dtypes[d], rnd_int(1, 200), rnd_int(1, 700),
                      ns[rnd_u32() % DI_ARRAY_LEN(ns)], it);
    /* rows long enough for the K split over 4 warps: odd row counts, small token groups */
    static const int64_t ns_k[] = {1, 2, 3, 4};
    for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++)
        for (int it = 0; it < 3; it++)
            check_glu(g_dtypes[d], 2 * rnd_int(1, 150) + 1, rnd_int(2048, 4100),
                      ns_k[rnd_u32() % DI_ARRAY_LEN(ns_k)], it);
    check_glu(DI_DTYPE_BF16, 2816, 2048, 1, 0); /* V2-Lite's shared experts, decode */
    check_glu(DI_DTYPE_BF16, 2816, 2048, 8, 0);
    check_glu(DI_DTYPE_BF16, 2816, 2048, 64, 0); /* the same at 64 sequences (wide kernel) */
    check_glu(DI_DTYPE_BF16, 301, 1000, 40, 0);  /* odd rows, a partial chunk, wide */
    check_glu(DI_DTYPE_BF16, 700, 200, 40, 0);   /* wide with 1, 2 and 4 K runs */
    check_glu(DI_DTYPE_BF16, 1000, 256, 33, 0);
    check_glu(DI_DTYPE_BF16, 300, 520, 17, 0);
    check_glu(DI_DTYPE_F8_E4M3, 2048, 7168, 1, 0); /* V3's shared expert */
    check_glu(DI_DTYPE_F8_E4M3, 2048, 7168, 5, 0);
}

/* false while matmul_simt_bf16 runs the tests on a backend without the tensor-core path */
static bool g_tc = true;

/* Weights whose rows are not 16-byte aligned take the element-wise load path; it must give
 * the bits of the 16-byte path. The unaligned weight is a one-column shift of an upload.
 * (With the tensor-core path on, an aligned BF16 weight with K % 8 == 0 takes it and its
 * shifted view the SIMT GEMV: other bits, so such K are left to the SIMT pass.) */
TEST(matmul_unaligned) {
    if (!g_have_gpu) SKIP("no CUDA device");
    static const di_dtype dts[] = {DI_DTYPE_F32, DI_DTYPE_F16, DI_DTYPE_BF16};
    for (size_t d = 0; d < DI_ARRAY_LEN(dts); d++) {
        for (int it = 0; it < 4; it++) {
            const int64_t rows = rnd_int(1, 100), n = rnd_int(1, 6);
            int64_t cols = rnd_int(2, 600);
            if (g_tc && dts[d] == DI_DTYPE_BF16 && cols % 8 == 0) cols++;
            test_weight t = make_weight(dts[d], rows, cols + 1, 0, 0, 0);
            const size_t esz = di_dtype_bytes(dts[d], 1);
            di_weight hv = t.w; /* columns [1, cols] of every row */
            hv.data = (const char *)hv.data + esz;
            hv.cols = cols;
            di_weight dall = upload(&t.w), dv = dall;
            dv.data = (const char *)dv.data + esz;
            dv.cols = cols;
            di_weight daligned = upload(&hv);
            for (int tr = 0; tr < 2; tr++) {
                const int64_t in = tr ? rows : cols, out = tr ? cols : rows;
                float *x = rnd_vec(n * in, 1.0f), *ref = malloc((size_t)(n * out) * 4);
                (tr ? di_cpu_matmul_t_ref : di_cpu_matmul_ref)(&hv, x, n, ref);
                float *y1 = gpu_mm(&dv, tr, x, n), *y2 = gpu_mm(&daligned, tr, x, n);
                CHECK_MSG(nerr(y1, ref, n * out) <= 1e-5, "%s: error %.3g", di_dtype_name(dts[d]),
                          nerr(y1, ref, n * out));
                CHECK(memcmp(y1, y2, (size_t)(n * out) * sizeof(float)) == 0);
                free(x), free(ref), free(y1), free(y2);
            }
            di_cuda_weight_free(&g_be, &dall);
            di_cuda_weight_free(&g_be, &daligned);
            free_weight(&t);
        }
    }
}

/* Per-head products as the model uses them: views of one tensor (one launch) and heads
 * uploaded one by one (one launch per head), both directions, model-like strides. */
TEST(head_matmul) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int iter = 0; iter < 16; iter++) {
        const bool tr = iter % 2 == 0, per_head = iter % 4 >= 2;
        const di_dtype dt = iter % 8 < 4 ? DI_DTYPE_BF16 : DI_DTYPE_F8_E4M3;
        int64_t nh = rnd_int(1, 6), n = rnd_int(1, 7), rows = rnd_int(1, 70),
                cols = rnd_int(1, 300);
        if (iter >= 8 && iter < 12) n = rnd_int(8, 20);  /* BF16 blocks of 8 tokens */
        if (iter >= 12) rows = 128, cols = 512, nh = 16; /* V2-Lite's W_UK / W_UV */
        const int64_t in = tr ? rows : cols, out = tr ? cols : rows;
        test_weight t = make_weight(dt, nh * rows, cols, 0, 0, iter % 4);
        di_weight *hw = malloc((size_t)nh * sizeof(di_weight));
        di_weight *dw = malloc((size_t)nh * sizeof(di_weight));
        di_weight dall = upload(&t.w);
        for (int64_t h = 0; h < nh; h++) {
            hw[h] = di_weight_rows(&t.w, h * rows, rows);
            dw[h] = per_head ? upload(&hw[h]) : di_weight_rows(&dall, h * rows, rows);
        }
        /* x token-major [n][nh][in + 2] and y head-major, or the other way round */
        const bool xs = iter % 3 == 0;
        const int64_t xh = xs ? in + 2 : n * in, xt = xs ? nh * (in + 2) : in;
        const int64_t yh = xs ? n * out : out, yt = xs ? out : nh * out;
        const int64_t nx = nh * n * (in + 2), ny = nh * n * out;
        float *x = rnd_vec(nx, 1.0f), *ref = malloc((size_t)ny * sizeof(float));
        di_head_matmul_params p = {.w = hw,
                                   .transposed = tr,
                                   .n_heads = nh,
                                   .n_tokens = n,
                                   .x = x,
                                   .x_hstride = xh,
                                   .x_tstride = xt,
                                   .y = ref,
                                   .y_hstride = yh,
                                   .y_tstride = yt};
        di_cpu_head_matmul_ref(&p);
        float *dx = dev_floats(x, nx), *dy = dev_poison(ny);
        p.w = dw;
        p.x = dx;
        p.y = dy;
        g_be.ops->head_matmul(g_be.ctx, &p);
        float *y = host_floats(dy, ny);
        double e = nerr(y, ref, ny);
        CHECK_MSG(e <= 1e-5, "%s%s nh=%lld n=%lld rows=%lld cols=%lld per_head=%d: error %.3g",
                  di_dtype_name(dt), tr ? " (T)" : "", (long long)nh, (long long)n, (long long)rows,
                  (long long)cols, per_head, e);
        if (per_head)
            for (int64_t h = 0; h < nh; h++)
                di_cuda_weight_free(&g_be, &dw[h]);
        di_cuda_weight_free(&g_be, &dall);
        dfree(dx), dfree(dy);
        free(hw), free(dw), free(x), free(ref), free(y);
        free_weight(&t);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Other ops                                                                                  */
/* ---------------------------------------------------------------------------------------- */

TEST(embed) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++) {
        const int64_t V = rnd_int(1, 300), D = rnd_int(1, 900), n = rnd_int(1, 20);
        test_weight t = make_weight(g_dtypes[d], V, D, rnd_int(0, 4), rnd_int(0, 3), (int)d);
        int32_t *ids = malloc((size_t)n * sizeof(int32_t));
        for (int64_t i = 0; i < n; i++)
            ids[i] = (int32_t)rnd_int(0, V - 1);
        float *ref = malloc((size_t)(n * D) * sizeof(float));
        for (int64_t i = 0; i < n; i++)
            di_cpu_weight_row_f32(&t.w, ids[i], ref + i * D);
        di_weight dw = upload(&t.w);
        int32_t *dids = dev_from(ids, (size_t)n * sizeof(int32_t));
        float *dout = dev_poison(n * D);
        g_be.ops->embed(g_be.ctx, &dw, dids, n, dout);
        float *out = host_floats(dout, n * D);
        CHECK_MSG(memcmp(out, ref, (size_t)(n * D) * sizeof(float)) == 0, "%s: error %.3g",
                  di_dtype_name(g_dtypes[d]), nerr(out, ref, n * D));
        di_cuda_weight_free(&g_be, &dw);
        dfree(dids), dfree(dout);
        free(ids), free(ref), free(out);
        free_weight(&t);
    }
}

TEST(rmsnorm) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int iter = 0; iter < 20; iter++) {
        const int64_t n = rnd_int(1, 40), dim = iter < 16 ? rnd_int(1, 700) : 7168;
        const int64_t xs = dim + rnd_int(0, 9);
        const bool in_place = iter % 3 == 0;
        const int64_t ys = in_place ? xs : dim;
        float *x = rnd_vec(n * xs, 3.0f), *w = rnd_vec(dim, 1.0f);
        float *ref = malloc((size_t)(n * ys) * sizeof(float));
        memcpy(ref, x, (size_t)(in_place ? n * xs : 0) * sizeof(float));
        di_cpu_rmsnorm_ref(x, xs, w, n, dim, 1e-6f, ref, ys);
        float *dx = dev_floats(x, n * xs), *dw = dev_floats(w, dim);
        float *dy = in_place ? dx : dev_poison(n * ys);
        g_be.ops->rmsnorm(g_be.ctx, dx, xs, dw, n, dim, 1e-6f, dy, ys);
        float *y = host_floats(dy, n * ys);
        double e = 0;
        for (int64_t t = 0; t < n; t++)
            e = fmax(e, nerr(y + t * ys, ref + t * ys, dim));
        CHECK_MSG(e <= 1e-6, "n=%lld dim=%lld in_place=%d: error %.3g", (long long)n,
                  (long long)dim, in_place, e);
        dfree(dx), dfree(dw);
        if (!in_place) dfree(dy);
        free(x), free(w), free(ref), free(y);
    }
}

TEST(rope) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int iter = 0; iter < 20; iter++) {
        const int64_t n = rnd_int(1, 20), nh = rnd_int(1, 6), dr = 2 * rnd_int(1, 40);
        const int64_t hs = dr + rnd_int(0, 8), ts = nh * hs + rnd_int(0, 5), half = dr / 2;
        float *x = rnd_vec(n * ts, 1.0f), *cs = rnd_vec(n * half, 1.0f),
              *sn = rnd_vec(n * half, 1.0f);
        float *ref = malloc((size_t)(n * ts) * sizeof(float));
        memcpy(ref, x, (size_t)(n * ts) * sizeof(float));
        di_rope_op_params p = {.x = ref,
                               .n_tokens = n,
                               .n_heads = nh,
                               .rope_dim = dr,
                               .tstride = ts,
                               .hstride = hs,
                               .cos = cs,
                               .sin = sn,
                               .interleaved = iter % 2 == 0};
        di_cpu_rope_ref(&p);
        float *dx = dev_floats(x, n * ts), *dc = dev_floats(cs, n * half),
              *ds = dev_floats(sn, n * half);
        p.x = dx, p.cos = dc, p.sin = ds;
        g_be.ops->rope(g_be.ctx, &p);
        float *y = host_floats(dx, n * ts);
        CHECK_MSG(memcmp(y, ref, (size_t)(n * ts) * sizeof(float)) == 0, "error %.3g",
                  nerr(y, ref, n * ts));
        dfree(dx), dfree(dc), dfree(ds);
        free(x), free(cs), free(sn), free(ref), free(y);
    }
}

/* mla_store: bitwise the separate ops on the GPU (rmsnorm of the latent in place, rope of the
 * key, two copy_rows into the pool), for random sizes, row lists (replayed rows skipped,
 * shuffled pool rows) and both rope layouts; the pool rows not listed stay untouched. */
TEST(mla_store) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int iter = 0; iter < 12; iter++) {
        const int64_t R = iter < 2 ? 512 : rnd_int(1, 700), dr = iter < 2 ? 64 : 2 * rnd_int(1, 40);
        const int64_t n = rnd_int(1, 12), half = dr / 2, pool = n + rnd_int(0, 9);
        const int64_t W = R + dr;
        float *kva = rnd_vec(n * W, 3.0f), *w = rnd_vec(R, 1.0f);
        float *cs = rnd_vec(n * half, 1.0f), *sn = rnd_vec(n * half, 1.0f);
        float *pc = rnd_vec(pool * R, 1.0f), *pk = rnd_vec(pool * dr, 1.0f);
        int32_t src[12], dst[32];
        int64_t nw = 0;
        for (int64_t t = 0; t < n; t++)
            if (iter % 3 != 0 || t % 2 == 0) src[nw++] = (int32_t)t; /* some rows replayed */
        for (int64_t r = 0; r < pool; r++)
            dst[r] = (int32_t)r;
        for (int64_t r = pool - 1; r > 0; r--) { /* distinct pool rows in a random order */
            const int64_t k = rnd_int(0, r);
            const int32_t tmp = dst[r];
            dst[r] = dst[k], dst[k] = tmp;
        }
        float *dkva = dev_floats(kva, n * W), *dw = dev_floats(w, R);
        float *dc = dev_floats(cs, n * half), *ds = dev_floats(sn, n * half);
        int32_t *dsrc = dev_from(src, (size_t)nw * 4), *ddst = dev_from(dst, (size_t)nw * 4);
        /* reference: the separate ops on a copy of kva */
        float *rkva = dev_floats(kva, n * W), *rpc = dev_floats(pc, pool * R),
              *rpk = dev_floats(pk, pool * dr);
        g_be.ops->rmsnorm(g_be.ctx, rkva, W, dw, n, R, 1e-6f, rkva, W);
        di_rope_op_params rp = {.x = rkva + R,
                                .n_tokens = n,
                                .n_heads = 1,
                                .rope_dim = dr,
                                .tstride = W,
                                .cos = dc,
                                .sin = ds,
                                .interleaved = iter % 2 == 0};
        g_be.ops->rope(g_be.ctx, &rp);
        g_be.ops->copy_rows(g_be.ctx, rpc, R, ddst, rkva, W, dsrc, nw, R);
        g_be.ops->copy_rows(g_be.ctx, rpk, dr, ddst, rkva + R, W, dsrc, nw, dr);
        /* fused */
        float *fpc = dev_floats(pc, pool * R), *fpk = dev_floats(pk, pool * dr);
        di_mla_store_params sp = {.kva = dkva,
                                  .R = R,
                                  .dr = dr,
                                  .norm_w = dw,
                                  .eps = 1e-6f,
                                  .cos = dc,
                                  .sin = ds,
                                  .interleaved = iter % 2 == 0,
                                  .src_rows = dsrc,
                                  .dst_rows = ddst,
                                  .n_rows = nw,
                                  .ckv = fpc,
                                  .krope = fpk};
        g_be.ops->mla_store(g_be.ctx, &sp);
        float *a = host_floats(rpc, pool * R), *b = host_floats(fpc, pool * R);
        float *ak = host_floats(rpk, pool * dr), *bk = host_floats(fpk, pool * dr);
        float *kv2 = host_floats(dkva, n * W);
        CHECK_MSG(memcmp(a, b, (size_t)(pool * R) * 4) == 0 &&
                      memcmp(ak, bk, (size_t)(pool * dr) * 4) == 0,
                  "R=%lld dr=%lld n=%lld rows=%lld: the fused store differs", (long long)R,
                  (long long)dr, (long long)n, (long long)nw);
        CHECK_MSG(memcmp(kv2, kva, (size_t)(n * W) * 4) == 0, "mla_store changed kva");
        CHECK(di_backend_cuda_sync(&g_be) == DI_OK);
        dfree(dkva), dfree(dw), dfree(dc), dfree(ds), dfree(dsrc), dfree(ddst);
        dfree(rkva), dfree(rpc), dfree(rpk), dfree(fpc), dfree(fpk);
        free(kva), free(w), free(cs), free(sn), free(pc), free(pk);
        free(a), free(b), free(ak), free(bk), free(kv2);
    }
}

TEST(silu_axpy_copy) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int iter = 0; iter < 6; iter++) {
        const int64_t n = iter < 3 ? rnd_int(1, 1000) : rnd_int(40000, 300000);
        float *g = rnd_vec(n, 8.0f), *u = rnd_vec(n, 2.0f), *ref = malloc((size_t)n * 4);
        di_cpu_silu_mul_ref(g, u, n, ref);
        float *dg = dev_floats(g, n), *du = dev_floats(u, n);
        g_be.ops->silu_mul(g_be.ctx, dg, du, n, dg); /* in place, as the model calls it */
        float *y = host_floats(dg, n);
        CHECK_MSG(nerr(y, ref, n) <= 1e-6, "silu_mul n=%lld: error %.3g", (long long)n,
                  nerr(y, ref, n));
        /* axpy: bitwise (one rounded multiply, one rounded add) */
        float *ax = malloc((size_t)n * 4);
        memcpy(ax, u, (size_t)n * 4);
        di_cpu_axpy(NULL, 0.37f, g, n, ax);
        float *dx = dev_floats(g, n), *dyy = dev_floats(u, n);
        g_be.ops->axpy(g_be.ctx, 0.37f, dx, n, dyy);
        float *ay = host_floats(dyy, n);
        CHECK(memcmp(ay, ax, (size_t)n * 4) == 0);
        free(g), free(u), free(ref), free(y), free(ax), free(ay);
        dfree(dg), dfree(du), dfree(dx), dfree(dyy);
    }
    /* copy2d between strided buffers */
    const int64_t rows = 37, cols = 29, ss = 41, ds = 33;
    float *src = rnd_vec(rows * ss, 1.0f), *dst0 = rnd_vec(rows * ds, 1.0f);
    float *dsrc = dev_floats(src, rows * ss), *ddst = dev_floats(dst0, rows * ds);
    g_be.ops->copy2d(g_be.ctx, ddst, ds, dsrc + 3, ss, rows, cols);
    float *dst = host_floats(ddst, rows * ds);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ds; c++)
            bad += dst[r * ds + c] != (c < cols ? src[r * ss + 3 + c] : dst0[r * ds + c]);
    CHECK_EQ_INT(bad, 0);
    dfree(dsrc), dfree(ddst);
    free(src), free(dst0), free(dst);
}

/* ---------------------------------------------------------------------------------------- */
/* MLA attention                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* Runs the GPU attention on host-side problem p (pointers replaced by device copies), with
 * `heads` heads per block (0: the backend's choice). */
static float *gpu_attn_heads(const di_mla_attn_params *hp, di_cuda_attn_mode mode, int heads) {
    const int64_t R = hp->kv_lora_rank, dr = hp->rope_dim, n = hp->n_tokens, nh = hp->n_heads;
    const int64_t L = hp->pos0 + n;
    const int64_t nqr = (n - 1) * hp->q_rope_tstride + (nh - 1) * hp->q_rope_hstride + dr;
    di_mla_attn_params p = *hp;
    float *dql = dev_floats(hp->q_lat, nh * n * R), *dqr = dev_floats(hp->q_rope, nqr);
    float *dckv = dev_floats(hp->c_kv, L * R), *dkr = dev_floats(hp->k_rope, L * dr);
    float *dout = dev_poison(nh * n * R);
    p.q_lat = dql, p.q_rope = dqr, p.c_kv = dckv, p.k_rope = dkr, p.out = dout;
    di_backend_cuda_set_attn_mode(&g_be, mode);
    di_backend_cuda_set_attn_heads(&g_be, heads);
    g_be.ops->mla_attention(g_be.ctx, &p);
    di_backend_cuda_set_attn_mode(&g_be, DI_CUDA_ATTN_AUTO);
    di_backend_cuda_set_attn_heads(&g_be, 0);
    float *out = host_floats(dout, nh * n * R);
    dfree(dql), dfree(dqr), dfree(dckv), dfree(dkr), dfree(dout);
    return out;
}

static float *gpu_attn(const di_mla_attn_params *hp, di_cuda_attn_mode mode) {
    return gpu_attn_heads(hp, mode, 0);
}

/* Device problem p (its q_rope unrotated, nqr floats from q_rope; p->out unused) run twice into
 * fresh buffers: with a copy of the queries rotated by the rope op by the rows of dcs / dsn
 * ([n_tokens][rope_dim / 2], device memory; pairs interleaved where il), and with the attention
 * rotating them as it reads them (q_cos / q_sin). Checks the two outputs bitwise equal and the
 * queries left as they were. */
static void check_rotation_same(const di_mla_attn_params *p, int64_t nqr, const float *dcs,
                                const float *dsn, bool il, const char *what) {
    const int64_t no = p->n_heads * p->n_tokens * p->kv_lora_rank;
    float *q0 = host_floats(p->q_rope, nqr);
    float *drot = dev_floats(q0, nqr), *dout1 = dev_poison(no), *dout2 = dev_poison(no);
    di_rope_op_params rp = {.x = drot,
                            .n_tokens = p->n_tokens,
                            .n_heads = p->n_heads,
                            .rope_dim = p->rope_dim,
                            .tstride = p->q_rope_tstride,
                            .hstride = p->q_rope_hstride,
                            .cos = dcs,
                            .sin = dsn,
                            .interleaved = il};
    g_be.ops->rope(g_be.ctx, &rp);
    di_mla_attn_params pa = *p, pb = *p;
    pa.q_rope = drot, pa.out = dout1;
    g_be.ops->mla_attention(g_be.ctx, &pa);
    pb.out = dout2, pb.q_cos = dcs, pb.q_sin = dsn, pb.q_rope_interleaved = il;
    g_be.ops->mla_attention(g_be.ctx, &pb);
    float *y1 = host_floats(dout1, no), *y2 = host_floats(dout2, no);
    float *q1 = host_floats(p->q_rope, nqr);
    CHECK_MSG(memcmp(y1, y2, (size_t)no * sizeof(float)) == 0,
              "%s (n=%lld nh=%lld dr=%lld interleaved=%d): rotated in the attention differs "
              "from the rope op's",
              what, (long long)p->n_tokens, (long long)p->n_heads, (long long)p->rope_dim, (int)il);
    CHECK_MSG(memcmp(q0, q1, (size_t)nqr * sizeof(float)) == 0,
              "%s: the attention wrote its queries", what);
    free(y1), free(y2), free(q0), free(q1);
    dfree(drot), dfree(dout1), dfree(dout2);
}

static void check_attn(int64_t n, int64_t nh, int64_t R, int64_t dr, int64_t pos0) {
    const int64_t L = pos0 + n, hs = dr + 3, ts = nh * hs;
    float *ql = rnd_vec(nh * n * R, 1.0f), *qr = rnd_vec(n * ts, 1.0f);
    float *ckv = rnd_vec(L * R, 1.5f), *kr = rnd_vec(L * dr, 1.5f);
    float *ref = malloc((size_t)(nh * n * R) * sizeof(float));
    di_mla_attn_params p = {.n_tokens = n,
                            .n_heads = nh,
                            .pos0 = pos0,
                            .kv_lora_rank = R,
                            .rope_dim = dr,
                            .scale = 0.3f / sqrtf((float)R / 64.0f),
                            .q_lat = ql,
                            .q_rope = qr,
                            .q_rope_tstride = ts,
                            .q_rope_hstride = hs,
                            .c_kv = ckv,
                            .k_rope = kr,
                            .out = ref};
    di_cpu_mla_attention_ref(&p);
    float *ys = gpu_attn(&p, DI_CUDA_ATTN_SPLIT), *yq = gpu_attn(&p, DI_CUDA_ATTN_SEQUENTIAL);
    const double e = nerr(ys, ref, nh * n * R);
    CHECK_MSG(e <= 2e-5, "n=%lld nh=%lld R=%lld dr=%lld pos0=%lld: error %.3g", (long long)n,
              (long long)nh, (long long)R, (long long)dr, (long long)pos0, e);
    CHECK_MSG(memcmp(ys, yq, (size_t)(nh * n * R) * sizeof(float)) == 0,
              "n=%lld nh=%lld R=%lld pos0=%lld: split and sequential differ", (long long)n,
              (long long)nh, (long long)R, (long long)pos0);
    /* the queries rotated by the attention (both pair layouts, 2 and 8 heads a block) */
    const int64_t nqr = (n - 1) * ts + (nh - 1) * hs + dr, half = dr / 2;
    float *cs = rnd_vec(n * half, 1.0f), *sn = rnd_vec(n * half, 1.0f);
    float *dcs = dev_floats(cs, n * half), *dsn = dev_floats(sn, n * half);
    float *dql = dev_floats(ql, nh * n * R), *dqr = dev_floats(qr, nqr);
    float *dckv = dev_floats(ckv, L * R), *dkr = dev_floats(kr, L * dr);
    di_mla_attn_params pd = p;
    pd.q_lat = dql, pd.q_rope = dqr, pd.c_kv = dckv, pd.k_rope = dkr;
    for (int v = 0; v < 4; v++) {
        di_backend_cuda_set_attn_heads(&g_be, v < 2 ? 2 : 8);
        check_rotation_same(&pd, nqr, dcs, dsn, v & 1,
                            v < 2 ? "2 heads a block" : "8 heads a block");
    }
    di_backend_cuda_set_attn_heads(&g_be, 0);
    dfree(dcs), dfree(dsn), dfree(dql), dfree(dqr), dfree(dckv), dfree(dkr);
    free(cs), free(sn);
    /* 2, 4 or 8 heads per block, either schedule: the same bits */
    for (int v = 0; v < 6; v++) {
        const int heads = 2 << (v / 2);
        float *yv = gpu_attn_heads(&p, v & 1 ? DI_CUDA_ATTN_SEQUENTIAL : DI_CUDA_ATTN_SPLIT, heads);
        CHECK_MSG(memcmp(ys, yv, (size_t)(nh * n * R) * sizeof(float)) == 0,
                  "n=%lld nh=%lld R=%lld pos0=%lld: %s with %d heads per block differs",
                  (long long)n, (long long)nh, (long long)R, (long long)pos0,
                  v & 1 ? "sequential" : "split", heads);
        free(yv);
    }
    /* batch invariance: the last query alone */
    float *ql1 = malloc((size_t)(nh * R) * sizeof(float));
    for (int64_t h = 0; h < nh; h++)
        memcpy(ql1 + h * R, ql + (h * n + n - 1) * R, (size_t)R * sizeof(float));
    di_mla_attn_params p1 = p;
    p1.n_tokens = 1;
    p1.pos0 = pos0 + n - 1;
    p1.q_lat = ql1;
    p1.q_rope = qr + (n - 1) * ts;
    float *y1 = gpu_attn(&p1, DI_CUDA_ATTN_AUTO);
    for (int64_t h = 0; h < nh; h++)
        CHECK_MSG(memcmp(y1 + h * R, ys + (h * n + n - 1) * R, (size_t)R * sizeof(float)) == 0,
                  "n=%lld pos0=%lld head %lld: last query alone differs", (long long)n,
                  (long long)pos0, (long long)h);
    free(ql), free(qr), free(ckv), free(kr), free(ref), free(ys), free(yq), free(ql1), free(y1);
}

TEST(mla_attention) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int iter = 0; iter < 20; iter++)
        check_attn(rnd_int(1, 9), rnd_int(1, 11), rnd_int(1, 80), 2 * rnd_int(1, 20),
                   iter % 3 == 0 ? 0 : rnd_int(0, 300));
    /* DeepSeek shapes: R = 512, rope 64; decode and short prefill over several chunks */
    check_attn(1, 16, 512, 64, 1500);
    check_attn(4, 16, 512, 64, 700);
    check_attn(1, 128, 512, 64, 257);
    check_attn(33, 8, 512, 64, 230);
    /* split blocks walking several chunks each (with 8 heads per block, as forced in
     * check_attn: S = 1 and S = 4 blocks per query), and 2-head blocks with 1 < S < chunks
     * (batch 1 at 128 heads: S = 5 over 12 chunks) */
    check_attn(32, 128, 512, 64, 1500);
    check_attn(40, 16, 512, 64, 2000);
    check_attn(1, 128, 512, 64, 3000);
}

/* Paged cache on the GPU: the same problem through a shuffled block table gives bitwise the
 * contiguous result, for block sizes that cut tiles (7), match them (32) or hold several
 * (64); and the head strides address queries / outputs inside wider buffers. */
static void check_attn_paged(int64_t n, int64_t nh, int64_t R, int64_t dr, int64_t pos0,
                             int64_t bs) {
    const int64_t L = pos0 + n, nb = (L + bs - 1) / bs, pool = nb + 2, ts = nh * dr;
    float *ql = rnd_vec(nh * n * R, 1.0f), *qr = rnd_vec(n * ts, 1.0f);
    float *ckv = rnd_vec(L * R, 1.5f), *kr = rnd_vec(L * dr, 1.5f);
    float *pckv = rnd_vec(pool * bs * R, 9.0f), *pkr = rnd_vec(pool * bs * dr, 9.0f);
    int32_t *table = malloc((size_t)nb * sizeof(int32_t));
    for (int64_t b = 0; b < nb; b++)
        table[b] = (int32_t)(pool - 1 - b); /* reversed: logical and physical order differ */
    for (int64_t j = 0; j < L; j++) {
        int64_t row = (int64_t)table[j / bs] * bs + j % bs;
        memcpy(pckv + row * R, ckv + j * R, (size_t)R * sizeof(float));
        memcpy(pkr + row * dr, kr + j * dr, (size_t)dr * sizeof(float));
    }
    di_mla_attn_params p = {.n_tokens = n,
                            .n_heads = nh,
                            .pos0 = pos0,
                            .kv_lora_rank = R,
                            .rope_dim = dr,
                            .scale = 0.25f,
                            .q_lat = ql,
                            .q_rope = qr,
                            .q_rope_tstride = ts,
                            .q_rope_hstride = dr,
                            .c_kv = ckv,
                            .k_rope = kr};
    float *yc = gpu_attn(&p, DI_CUDA_ATTN_SPLIT);
    /* paged: the pool and the table on the device */
    const int64_t no = nh * n * R;
    float *dql = dev_floats(ql, nh * n * R), *dqr = dev_floats(qr, n * ts);
    float *dckv = dev_floats(pckv, pool * bs * R), *dkr = dev_floats(pkr, pool * bs * dr);
    int32_t *dtab = dev_from(table, (size_t)nb * sizeof(int32_t));
    const int64_t hs = (n + 2) * R; /* head stride of the wide buffers (rows at offset 1) */
    float *dqw = dev_poison(nh * hs), *dow = dev_poison(nh * hs), *dout = dev_poison(no);
    for (int64_t h = 0; h < nh; h++)
        g_be.ops->copy2d(g_be.ctx, dqw + h * hs + R, R, dql + h * n * R, R, n, R);
    di_mla_attn_params pp = p;
    pp.q_lat = dql, pp.q_rope = dqr, pp.c_kv = dckv, pp.k_rope = dkr, pp.out = dout;
    pp.block_table = dtab, pp.block_size = bs;
    for (int mode = 0; mode < 2; mode++) {
        di_backend_cuda_set_attn_mode(&g_be, mode ? DI_CUDA_ATTN_SEQUENTIAL : DI_CUDA_ATTN_SPLIT);
        g_be.ops->mla_attention(g_be.ctx, &pp);
        float *yp = host_floats(dout, no);
        CHECK_MSG(memcmp(yp, yc, (size_t)no * sizeof(float)) == 0,
                  "paged n=%lld bs=%lld pos0=%lld mode %d: differs from contiguous", (long long)n,
                  (long long)bs, (long long)pos0, mode);
        free(yp);
        di_mla_attn_params ps = pp;
        ps.q_lat = dqw + R, ps.out = dow + R, ps.q_lat_hstride = hs, ps.out_hstride = hs;
        g_be.ops->mla_attention(g_be.ctx, &ps);
        float *yw = host_floats(dow, nh * hs);
        for (int64_t h = 0; h < nh; h++)
            CHECK_MSG(memcmp(yw + h * hs + R, yc + h * n * R, (size_t)(n * R) * sizeof(float)) == 0,
                      "head strides n=%lld bs=%lld mode %d head %lld differ", (long long)n,
                      (long long)bs, mode, (long long)h);
        free(yw);
    }
    /* Per-query positions and tables (a decode batch, q_pos): query t as a sequence of its
     * own at position pos0 + t, over one of two copies of the table, in any mode. */
    int32_t *qpos = malloc((size_t)n * 4), *toff = malloc((size_t)n * 4);
    int32_t *tabs = malloc((size_t)(2 * nb) * 4);
    memcpy(tabs, table, (size_t)nb * 4), memcpy(tabs + nb, table, (size_t)nb * 4);
    for (int64_t t = 0; t < n; t++)
        qpos[t] = (int32_t)(pos0 + t), toff[t] = (int32_t)(t % 2 ? nb : 0);
    int32_t *dqpos = dev_from(qpos, (size_t)n * 4), *dtoff = dev_from(toff, (size_t)n * 4);
    int32_t *dtabs = dev_from(tabs, (size_t)(2 * nb) * 4);
    for (int mode = 0; mode < 12; mode++) { /* schedule mode % 3, heads per block 0, 2, 4, 8 */
        di_backend_cuda_set_attn_mode(&g_be, mode % 3 == 0   ? DI_CUDA_ATTN_AUTO
                                             : mode % 3 == 1 ? DI_CUDA_ATTN_SPLIT
                                                             : DI_CUDA_ATTN_SEQUENTIAL);
        di_backend_cuda_set_attn_heads(&g_be, mode < 3 ? 0 : 1 << (mode / 3));
        di_mla_attn_params pq = pp;
        pq.pos0 = 12345, pq.block_table = NULL; /* ignored */
        pq.q_pos = dqpos, pq.q_tables = dtabs, pq.q_table_off = dtoff;
        g_be.ops->mla_attention(g_be.ctx, &pq);
        float *yq = host_floats(dout, no);
        CHECK_MSG(memcmp(yq, yc, (size_t)no * sizeof(float)) == 0,
                  "per-query n=%lld bs=%lld pos0=%lld mode %d: differs from contiguous",
                  (long long)n, (long long)bs, (long long)pos0, mode);
        free(yq);
    }
    /* ... and with the queries rotated by the attention (q_cos: the V2/V3 runner's decode
     * step) */
    const int64_t half = dr / 2;
    float *cs = rnd_vec(n * half, 1.0f), *sn = rnd_vec(n * half, 1.0f);
    float *dcs = dev_floats(cs, n * half), *dsn = dev_floats(sn, n * half);
    di_mla_attn_params pr = pp;
    pr.pos0 = 12345, pr.block_table = NULL;
    pr.q_pos = dqpos, pr.q_tables = dtabs, pr.q_table_off = dtoff;
    check_rotation_same(&pr, n * ts, dcs, dsn, true, "per-query positions and tables");
    free(cs), free(sn);
    dfree(dcs), dfree(dsn);
    dfree(dqpos), dfree(dtoff), dfree(dtabs);
    free(qpos), free(toff), free(tabs);
    di_backend_cuda_set_attn_mode(&g_be, DI_CUDA_ATTN_AUTO);
    di_backend_cuda_set_attn_heads(&g_be, 0);
    dfree(dql), dfree(dqr), dfree(dckv), dfree(dkr), dfree(dtab), dfree(dqw), dfree(dow);
    dfree(dout);
    free(ql), free(qr), free(ckv), free(kr), free(pckv), free(pkr), free(table), free(yc);
}

TEST(mla_attention_paged) {
    if (!g_have_gpu) SKIP("no CUDA device");
    static const int64_t bss[] = {7, 32, 64};
    for (int iter = 0; iter < 9; iter++)
        check_attn_paged(rnd_int(1, 6), rnd_int(1, 11), rnd_int(1, 80), 2 * rnd_int(1, 20),
                         rnd_int(0, 600), bss[iter % 3]);
    check_attn_paged(1, 16, 512, 64, 700, 64);
    check_attn_paged(5, 16, 512, 64, 300, 7);
    check_attn_paged(5, 128, 512, 64, 1400, 64); /* decode batch: 4 split blocks, 6 chunks */
}

/* copy_rows (gather and scatter) and moe_combine: bitwise the CPU backend's results. */
TEST(copy_rows_moe_combine) {
    if (!g_have_gpu) SKIP("no CUDA device");
    di_pool *pool = di_pool_create(1);
    di_backend cpu;
    CHECK(di_backend_cpu_init(&cpu, pool, 16) == DI_OK);
    for (int iter = 0; iter < 6; iter++) {
        const int64_t T = rnd_int(1, 40), K = rnd_int(1, 8), D = rnd_int(1, 3000), NR = T * K;
        float *rows = rnd_vec(NR * D, 2.0f), *w = rnd_vec(NR, 1.0f);
        int32_t *perm = malloc((size_t)NR * sizeof(int32_t)), *gi = malloc((size_t)NR * 4);
        for (int64_t i = 0; i < NR; i++)
            perm[i] = (int32_t)i;
        for (int64_t i = NR - 1; i > 0; i--) {
            int64_t k = rnd_int(0, (int)i);
            int32_t t = perm[i];
            perm[i] = perm[k], perm[k] = t;
        }
        for (int64_t i = 0; i < NR; i++)
            gi[i] = (int32_t)rnd_int(0, (int)T - 1);
        /* CPU */
        float *cg = malloc((size_t)(NR * D) * 4), *cs = calloc((size_t)(NR * D), 4);
        float *co = malloc((size_t)(T * D) * 4);
        cpu.ops->copy_rows(cpu.ctx, cg, D, NULL, rows, D, gi, NR, D);
        cpu.ops->copy_rows(cpu.ctx, cs, D, perm, cg, D, NULL, NR, D);
        cpu.ops->moe_combine(cpu.ctx, cs, perm, w, T, K, D, co);
        /* GPU */
        float *drows = dev_floats(rows, NR * D), *dw = dev_floats(w, NR);
        int32_t *dperm = dev_from(perm, (size_t)NR * 4), *dgi = dev_from(gi, (size_t)NR * 4);
        float *dg = dev_poison(NR * D), *ds = dev_poison(NR * D), *dout = dev_poison(T * D);
        g_be.ops->copy_rows(g_be.ctx, dg, D, NULL, drows, D, dgi, NR, D);
        g_be.ops->copy_rows(g_be.ctx, ds, D, dperm, dg, D, NULL, NR, D);
        g_be.ops->moe_combine(g_be.ctx, ds, dperm, dw, T, K, D, dout);
        float *gs = host_floats(ds, NR * D), *go = host_floats(dout, T * D);
        CHECK_MSG(memcmp(gs, cs, (size_t)(NR * D) * 4) == 0, "copy_rows T=%lld K=%lld D=%lld",
                  (long long)T, (long long)K, (long long)D);
        CHECK_MSG(memcmp(go, co, (size_t)(T * D) * 4) == 0, "moe_combine T=%lld K=%lld D=%lld",
                  (long long)T, (long long)K, (long long)D);
        /* moe_combine_add: resid += sum (+ add, every other iteration), bitwise the CPU's
         * moe_combine and axpy steps */
        const bool with_add = iter % 2 == 0;
        float *add = rnd_vec(T * D, 1.0f), *res = rnd_vec(T * D, 3.0f);
        float *dadd = dev_floats(add, T * D), *dres = dev_floats(res, T * D);
        if (with_add) cpu.ops->axpy(cpu.ctx, 1.0f, add, T * D, co);
        cpu.ops->axpy(cpu.ctx, 1.0f, co, T * D, res);
        g_be.ops->moe_combine_add(g_be.ctx, ds, dperm, dw, T, K, D, with_add ? dadd : NULL, dres);
        float *gres = host_floats(dres, T * D);
        CHECK_MSG(memcmp(gres, res, (size_t)(T * D) * 4) == 0,
                  "moe_combine_add T=%lld K=%lld D=%lld add=%d", (long long)T, (long long)K,
                  (long long)D, (int)with_add);
        CHECK(di_backend_cuda_sync(&g_be) == DI_OK);
        dfree(drows), dfree(dw), dfree(dperm), dfree(dgi), dfree(dg), dfree(ds), dfree(dout);
        dfree(dadd), dfree(dres);
        free(rows), free(w), free(perm), free(gi), free(cg), free(cs), free(co), free(gs);
        free(go), free(add), free(res), free(gres);
    }
    di_backend_free(&cpu);
    di_pool_free(pool);
}

/* ---------------------------------------------------------------------------------------- */
/* MoE on the device: routing and the grouped expert GEMV                                     */
/* ---------------------------------------------------------------------------------------- */

/* Router configurations: V2 softmax greedy, V2 group-limited, V3 sigmoid + bias noaux_tc
 * (renormalised, scaled), V4-like sqrt(softplus). */
/* The routing buffers in device memory (test_route_util.h has the host ones). */
static route_bufs route_dev_alloc(int64_t E, int64_t nk) {
    route_bufs b;
    const size_t e4 = (size_t)(E + 1) * 4, k4 = (size_t)nk * 4, s4 = (size_t)(3 * E) * 4;
    b.off = di_cuda_malloc(&g_be, e4), b.act = di_cuda_malloc(&g_be, e4);
    b.src = di_cuda_malloc(&g_be, k4), b.rows = di_cuda_malloc(&g_be, k4);
    b.w = di_cuda_malloc(&g_be, k4), b.scr = di_cuda_malloc(&g_be, s4);
    return b;
}

static void route_dev_free(route_bufs *b) {
    dfree(b->off), dfree(b->act), dfree(b->src), dfree(b->rows), dfree(b->w), dfree(b->scr);
}

static int32_t *host_ints(const int32_t *dev, int64_t n) {
    return (int32_t *)host_floats((const float *)dev, n);
}

/* One moe_route call of n tokens on the device against the CPU backend: selection,
 * weights and grouping, bitwise. ties: logits on a few levels. hash: V4's hash routing
 * (the experts from a table by token id, some rows repeating an expert). */
static void check_route(di_backend *cpu, di_router_params r, int64_t n, bool ties, bool hash,
                        const char *what_config) {
    const int64_t E = r.n_experts, K = r.top_k, nk = n * K, V = 97;
    float *bias = rnd_vec(E, 0.5f), *lg = rnd_vec(n * E, 4.0f);
    if (ties)
        for (int64_t i = 0; i < n * E; i++)
            lg[i] = (float)rnd_int(-3, 3) * 0.5f;
    float *dbias = dev_floats(bias, E), *dlg = dev_floats(lg, n * E);
    int32_t *table = malloc((size_t)(V * K) * 4), *tok = malloc((size_t)n * 4);
    for (int64_t i = 0; i < V * K; i++)
        table[i] = i / K % 4 == 0 && i % K ? table[i - i % K] : rnd_int(0, (int)E - 1);
    for (int64_t t = 0; t < n; t++)
        tok[t] = rnd_int(0, V - 1);
    int32_t *dtable = (int32_t *)dev_floats((const float *)table, V * K);
    int32_t *dtok = (int32_t *)dev_floats((const float *)tok, n);
    di_router_params rc = r, rg = r;
    if (r.score == DI_SCORE_SIGMOID) rc.bias = bias, rg.bias = dbias;
    route_bufs hb = route_host_alloc(E, nk), db = route_dev_alloc(E, nk);
    route_run_hash(cpu, &rc, n, lg, hash ? table : NULL, tok, &hb);
    route_run_hash(&g_be, &rg, n, dlg, hash ? dtable : NULL, dtok, &db);
    int32_t *off = host_ints(db.off, E + 1), *act = host_ints(db.act, E + 1);
    int32_t *src = host_ints(db.src, nk), *rows = host_ints(db.rows, nk);
    float *w = host_floats(db.w, nk);
    const char *what = memcmp(off, hb.off, (size_t)(E + 1) * 4)           ? "offsets"
                       : memcmp(act, hb.act, (size_t)(hb.act[0] + 1) * 4) ? "active"
                       : memcmp(src, hb.src, (size_t)nk * 4)              ? "src"
                       : memcmp(rows, hb.rows, (size_t)nk * 4)            ? "rows_of"
                       : memcmp(w, hb.w, (size_t)nk * 4)                  ? "weights"
                                                                          : NULL;
    CHECK_MSG(what == NULL, "%s E=%lld K=%lld n=%lld%s%s: %s differ from the CPU", what_config,
              (long long)E, (long long)K, (long long)n, ties ? " (ties)" : "",
              hash ? " (hash)" : "", what ? what : "");
    CHECK(di_backend_cuda_sync(&g_be) == DI_OK);
    route_host_free(&hb), route_dev_free(&db);
    dfree(dbias), dfree(dlg), dfree(dtable), dfree(dtok);
    free(off), free(act), free(src), free(rows), free(w), free(bias), free(lg), free(table);
    free(tok);
}

/* moe_route on the device: the CPU backend's selection, weights and grouping, bitwise
 * (the scores use the device's double exp: equal after rounding to float in practice, see
 * cuda_moe.cu). Logits on a few levels make ties, which must go to the lower id. Up to 8
 * tokens (fewer past 243 experts) select and group in one kernel, more in two. */
TEST(moe_route) {
    if (!g_have_gpu) SKIP("no CUDA device");
    di_pool *pool = di_pool_create(1);
    di_backend cpu;
    CHECK(di_backend_cpu_init(&cpu, pool, 16) == DI_OK);
    static const int64_t ns[] = {1, 2, 7, 64, 200, 256};
    static const char *configs[] = {"softmax greedy", "group-limited", "noaux_tc", "sqrt-softplus"};
    for (int iter = 0; iter < 32; iter++)
        check_route(&cpu, test_router_config(iter % 4), ns[(iter / 4) % 6], iter % 3 == 0, false,
                    configs[iter % 4]);
    /* hash routing (V4): 1 to 256 tokens, one kernel and two */
    for (int iter = 0; iter < 12; iter++)
        check_route(&cpu, test_router_config(iter % 4), ns[iter % 6], false, true,
                    configs[iter % 4]);
    /* an odd expert count (each warp's scratch rounded to 16 bytes for its doubles), the
     * most experts (one warp per selection block), 8 tokens at 256 experts (two kernels) */
    static const int64_t odd[][3] = {{63, 5, 1},   {63, 5, 3},  {63, 5, 64}, {1024, 8, 1},
                                     {1024, 8, 9}, {256, 8, 8}, {256, 8, 7}};
    /* the V2/V3 runner's largest device chunks (DI_BACKEND_ROUTE_ENTRIES): 1365 tokens at
     * top-6 (V2), 1024 at top-8 (V3) */
    check_route(&cpu, test_router_plain(64, 6), 1365, false, false, "plain");
    check_route(&cpu, test_router_config(2), 1024, false, false, "noaux_tc");
    for (size_t i = 0; i < DI_ARRAY_LEN(odd); i++)
        for (int ties = 0; ties < 2; ties++)
            check_route(&cpu, test_router_plain(odd[i][0], odd[i][1]), odd[i][2], ties, false,
                        "plain");
    di_backend_free(&cpu);
    di_pool_free(pool);
}

/* E random experts of one shape, uploaded separately, and their device table. */
typedef struct {
    test_weight *tw;
    di_weight *dw;
    di_expert_weights ew;
} expert_set;

static expert_set make_experts(di_dtype dt, int64_t E, int64_t rows, int64_t cols) {
    expert_set x;
    x.tw = malloc((size_t)E * sizeof *x.tw);
    x.dw = malloc((size_t)E * sizeof *x.dw);
    for (int64_t e = 0; e < E; e++) {
        x.tw[e] = make_weight(dt, rows, cols, 0, 0, 0);
        x.dw[e] = upload(&x.tw[e].w);
    }
    void *tab = NULL;
    CHECK_MSG(g_be.ops->expert_table(g_be.ctx, x.dw, E, &tab) == DI_OK, "%s", di_last_error());
    x.ew = (di_expert_weights){.w = x.dw, .n_experts = E, .table = tab};
    return x;
}

static void free_experts(expert_set *x) {
    for (int64_t e = 0; e < x->ew.n_experts; e++) {
        di_cuda_weight_free(&g_be, &x->dw[e]);
        free_weight(&x->tw[e]);
    }
    g_be.ops->buf_free(g_be.ctx, (void *)x->ew.table);
    free(x->tw), free(x->dw);
}

/* A CUDA backend with one environment variable set during its creation. */
static di_backend backend_with(const char *var, const char *value) {
    di_backend b;
    memset(&b, 0, sizeof b);
    setenv(var, value, 1);
    di_status st = di_backend_cuda_init(&b, 0, 8192);
    unsetenv(var);
    CHECK_MSG(st == DI_OK, "%s", di_last_error());
    return b;
}

/* moe_combine_add_norm (an op of its own since the twenty-fifth round) */
TEST(moe_combine_add_norm) {
    if (!g_have_gpu) SKIP("no CUDA device");
    /* Bitwise moe_combine_add then rmsnorm (the GPU's two ops, each compared with the CPU in
     * TEST(copy_rows_moe_combine) and TEST(rmsnorm)), as one kernel for up to 8 tokens
     * (DI_CUDA_COMBINE_NORM_MAX_N=8; opt-in) of at most 4096 values (4, 8 or 16 a thread) and 8
     * slots, and as the two otherwise; {T, D, K} */
    static const int64_t cases[][3] = {{1, 2048, 6},  {5, 1000, 8}, {8, 4096, 1},
                                       {9, 2048, 6},  {3, 7168, 6}, {2, 1, 3},
                                       {64, 2048, 6}, {4, 2048, 9}, {6, 3000, 2}};
    di_backend bf = backend_with("DI_CUDA_COMBINE_NORM_MAX_N", "8");
    if (!bf.ctx) return;
    int64_t fused = 0;
    const int64_t launches = di_backend_cuda_moe_combine_norm_launches();
    for (size_t ci = 0; ci < DI_ARRAY_LEN(cases); ci++) {
        const int64_t T = cases[ci][0], D = cases[ci][1], K = cases[ci][2], NR = T * K;
        fused += T <= 8 && D <= 4096 && K <= 8;
        float *rows = rnd_vec(NR * D, 2.0f), *w = rnd_vec(NR, 1.0f), *add = rnd_vec(T * D, 1.0f);
        float *res = rnd_vec(T * D, 3.0f), *nw = rnd_vec(D, 1.0f);
        int32_t *ro = malloc((size_t)NR * 4);
        for (int64_t i = 0; i < NR; i++)
            ro[i] = (int32_t)((i * 7 + 3) % NR); /* a permutation: 7 divides no NR here */
        float *drows = dev_floats(rows, NR * D), *dw = dev_floats(w, NR);
        float *dadd = dev_floats(add, T * D), *dnw = dev_floats(nw, D);
        float *dres1 = dev_floats(res, T * D), *dres2 = dev_floats(res, T * D);
        float *dy1 = dev_poison(T * D), *dy2 = dev_poison(T * D);
        int32_t *dro = dev_from(ro, (size_t)NR * 4);
        const float *a = ci % 2 ? NULL : dadd; /* with and without the shared experts' rows */
        g_be.ops->moe_combine_add(g_be.ctx, drows, dro, dw, T, K, D, a, dres1);
        g_be.ops->rmsnorm(g_be.ctx, dres1, D, dnw, T, D, 1e-6f, dy1, D);
        bf.ops->moe_combine_add_norm(bf.ctx, drows, dro, dw, T, K, D, a, dres2, dnw, 1e-6f, dy2);
        CHECK(di_backend_cuda_sync(&bf) == DI_OK); /* host_floats syncs g_be only */
        float *r1 = host_floats(dres1, T * D), *r2 = host_floats(dres2, T * D);
        float *y1 = host_floats(dy1, T * D), *y2 = host_floats(dy2, T * D);
        CHECK_MSG(memcmp(r1, r2, (size_t)(T * D) * 4) == 0 &&
                      memcmp(y1, y2, (size_t)(T * D) * 4) == 0,
                  "moe_combine_add_norm T=%lld D=%lld K=%lld add=%d: not the two ops' bits",
                  (long long)T, (long long)D, (long long)K, (int)(a != NULL));
        dfree(drows), dfree(dw), dfree(dadd), dfree(dnw), dfree(dres1), dfree(dres2), dfree(dy1);
        dfree(dy2), dfree(dro);
        free(rows), free(w), free(add), free(res), free(nw), free(ro), free(r1), free(r2), free(y1);
        free(y2);
    }
    CHECK_MSG(di_backend_cuda_moe_combine_norm_launches() - launches == fused,
              "%lld of %lld moe_combine_add_norm calls fused",
              (long long)(di_backend_cuda_moe_combine_norm_launches() - launches),
              (long long)fused);
    di_backend_free(&bf);
    /* the default (0) never fuses */
    const int64_t before = di_backend_cuda_moe_combine_norm_launches();
    float *x = rnd_vec(2 * 64, 1.0f), *nw = rnd_vec(64, 1.0f), *wr = rnd_vec(2, 1.0f);
    int32_t ro[2] = {1, 0};
    float *dx = dev_floats(x, 2 * 64), *dnw = dev_floats(nw, 64), *dwr = dev_floats(wr, 2);
    float *dres = dev_floats(x, 64), *dy = dev_poison(64);
    int32_t *dro = dev_from(ro, sizeof ro);
    g_be.ops->moe_combine_add_norm(g_be.ctx, dx, dro, dwr, 1, 2, 64, NULL, dres, dnw, 1e-6f, dy);
    CHECK(di_backend_cuda_sync(&g_be) == DI_OK);
    CHECK_MSG(di_backend_cuda_moe_combine_norm_launches() == before,
              "the default backend fused moe_combine_add_norm");
    dfree(dx), dfree(dnw), dfree(dwr), dfree(dres), dfree(dy), dfree(dro);
    free(x), free(nw), free(wr);
}

/* The same, with a decode batch's grouped products on tc_kernel (DI_CUDA_TC_STREAM=0) instead
 * of the streaming kernel. */
static di_backend tc_kernel_backend_with(const char *var, const char *value) {
    setenv("DI_CUDA_TC_STREAM", "0", 1);
    di_backend b = backend_with(var, value);
    unsetenv("DI_CUDA_TC_STREAM");
    return b;
}

/* The backend that runs check_experts' grouped products, and the one that runs the plain
 * products they are compared with (the rest runs on g_be). */
static di_backend *g_xbe = &g_be, *g_pbe = &g_be;
/* When positive, check_experts routes exactly the first g_hot_rows tokens to expert 0 (an
 * expert with more rows than the others, as real routing gives some). */
static int64_t g_hot_rows;

/* matmul_experts: each expert's rows bitwise equal to matmul of the same rows (so to a row
 * alone: batch invariance), and within tolerance of the scalar reference (on the default
 * backend; a variant's rows, bitwise the default's plain products, skip that CPU work).
 * Experts of one shape uploaded separately, routing by moe_route on the device; the grouped
 * products on g_xbe. */
static void check_experts(di_dtype dt, int64_t E, int64_t K, int64_t n, int64_t rows,
                          int64_t cols) {
    const int64_t nk = n * K;
    expert_set gate = make_experts(dt, E, rows, cols);
    const test_weight *tw = gate.tw;
    const di_weight *dw = gate.dw;
    const di_expert_weights ew = gate.ew;
    const di_router_params r = test_router_plain(E, K);
    float *lg = rnd_vec(n * E, 3.0f);
    for (int64_t t = 0; g_hot_rows > 0 && t < n; t++)
        lg[t * E] = t < g_hot_rows ? 100.0f : -100.0f;
    float *dlg = dev_floats(lg, n * E);
    route_bufs db = route_dev_alloc(E, nk);
    /* routed on g_xbe, as the models route on the backend that runs the experts: its later
     * grouped products of this routing find it settled (di_cuda_mm_params.routing_settled) */
    CHECK(di_backend_cuda_sync(&g_be) == DI_OK); /* the logits' upload, before g_xbe reads it */
    route_run(g_xbe, &r, n, dlg, &db);
    float *x = rnd_vec(nk * cols, 1.0f), *dx = dev_floats(x, nk * cols);
    float *dy = dev_poison(nk * rows);
    CHECK(di_backend_cuda_sync(&g_be) == DI_OK); /* the uploads, before g_xbe's stream reads them */
    g_xbe->ops->matmul_experts(g_xbe->ctx, &ew, db.off, db.act, DI_MIN(E, nk), nk, dx, dy);
    CHECK(di_backend_cuda_sync(g_xbe) == DI_OK);
    float *y = host_floats(dy, nk * rows);
    int32_t *off = host_ints(db.off, E + 1);
    float *ref = malloc((size_t)(nk * rows) * 4);
    for (int64_t e = 0; e < E; e++) {
        const int64_t g0 = off[e], ne = off[e + 1] - g0;
        if (ne == 0) continue;
        if (g_xbe == &g_be) di_cpu_matmul_ref(&tw[e].w, x + g0 * cols, ne, ref + g0 * rows);
        float *y1 = gpu_mm_on(g_pbe, &dw[e], false, x + g0 * cols, ne);
        CHECK_MSG(memcmp(y1, y + g0 * rows, (size_t)(ne * rows) * 4) == 0,
                  "%s E=%lld K=%lld n=%lld %lldx%lld: expert %lld differs from matmul",
                  di_dtype_name(dt), (long long)E, (long long)K, (long long)n, (long long)rows,
                  (long long)cols, (long long)e);
        free(y1);
    }
    CHECK_MSG(g_xbe != &g_be || nerr(y, ref, nk * rows) <= 1e-5, "%s experts: error %.3g",
              di_dtype_name(dt), nerr(y, ref, nk * rows));
    /* matmul_experts_glu: bitwise silu_mul of the gate (the experts above) and an up set. */
    expert_set up = make_experts(dt, E, rows, cols);
    dfree(dy);
    dy = dev_poison(nk * rows);
    CHECK(di_backend_cuda_sync(&g_be) == DI_OK);
    g_xbe->ops->matmul_experts(g_xbe->ctx, &up.ew, db.off, db.act, DI_MIN(E, nk), nk, dx, dy);
    CHECK(di_backend_cuda_sync(g_xbe) == DI_OK);
    float *yu = host_floats(dy, nk * rows), *gref = gpu_silu_mul(y, yu, nk * rows);
    float *dg = dev_poison(nk * rows);
    g_xbe->ops->matmul_experts_glu(g_xbe->ctx, &ew, &up.ew, db.off, db.act, DI_MIN(E, nk), nk, dx,
                                   NULL, NULL, dg);
    CHECK(di_backend_cuda_sync(g_xbe) == DI_OK);
    float *yg = host_floats(dg, nk * rows);
    CHECK_MSG(memcmp(yg, gref, (size_t)(nk * rows) * 4) == 0,
              "%s E=%lld K=%lld n=%lld %lldx%lld: experts glu differs from matmul_experts + "
              "silu_mul",
              di_dtype_name(dt), (long long)E, (long long)K, (long long)n, (long long)rows,
              (long long)cols);
    /* ... and with the grouped rows read from token rows through the routing's src list
     * (in place on the streaming and wide kernels, else gathered into the scratch): bitwise the
     * product of the same rows gathered on the host. */
    int32_t *src = host_ints(db.src, nk);
    float *xt = rnd_vec(n * cols, 1.0f), *xg = malloc((size_t)(nk * cols) * 4);
    for (int64_t g = 0; g < nk; g++)
        memcpy(xg + g * cols, xt + src[g] * cols, (size_t)cols * 4);
    float *dxt = dev_floats(xt, n * cols), *dxg = dev_floats(xg, nk * cols);
    float *dscr = dev_poison(nk * cols), *dg1 = dev_poison(nk * rows), *dg2 = dev_poison(nk * rows);
    CHECK(di_backend_cuda_sync(&g_be) == DI_OK);
    g_xbe->ops->matmul_experts_glu(g_xbe->ctx, &ew, &up.ew, db.off, db.act, DI_MIN(E, nk), nk, dxg,
                                   NULL, NULL, dg1);
    g_xbe->ops->matmul_experts_glu(g_xbe->ctx, &ew, &up.ew, db.off, db.act, DI_MIN(E, nk), nk, dxt,
                                   db.src, dscr, dg2);
    CHECK(di_backend_cuda_sync(g_xbe) == DI_OK);
    float *yg1 = host_floats(dg1, nk * rows), *yg2 = host_floats(dg2, nk * rows);
    CHECK_MSG(memcmp(yg1, yg2, (size_t)(nk * rows) * 4) == 0,
              "%s E=%lld K=%lld n=%lld %lldx%lld: experts glu over x_rows differs from the "
              "gathered rows",
              di_dtype_name(dt), (long long)E, (long long)K, (long long)n, (long long)rows,
              (long long)cols);
    CHECK(di_backend_cuda_sync(&g_be) == DI_OK);
    free_experts(&gate), free_experts(&up);
    dfree(dg), dfree(dg1), dfree(dg2), dfree(dxt), dfree(dxg), dfree(dscr);
    free(yu), free(gref), free(yg), free(yg1), free(yg2), free(src), free(xt), free(xg);
    route_dev_free(&db);
    dfree(dlg), dfree(dx), dfree(dy);
    free(lg), free(x), free(y), free(off), free(ref);
}

/* A decode batch's grouped products on backend b, each expert's rows bitwise the plain
 * product: one row per expert (batch 1) and 6 (64 sequences) at V2-Lite's shapes, 2 K runs
 * (200 x 256), a last chunk short of 32 columns (K = 2056), rows past the last tile (1376
 * rows: 43 tiles of 32 rows, 86 GLU tiles of 16), experts of 1..8 rows and of more than 8
 * (two passes), some with none. */
static void check_decode_experts(di_backend *b) {
    g_xbe = b;
    check_experts(DI_DTYPE_BF16, 64, 6, 1, 1408, 2048);
    check_experts(DI_DTYPE_BF16, 64, 6, 64, 1408, 2048);
    check_experts(DI_DTYPE_BF16, 64, 6, 40, 2048, 1408);
    check_experts(DI_DTYPE_BF16, 16, 4, 16, 200, 256);
    check_experts(DI_DTYPE_BF16, 16, 4, 8, 300, 2056);
    check_experts(DI_DTYPE_BF16, 16, 4, 30, 1376, 2056);
    g_xbe = &g_be;
}

/* The experts' own K order by default (DI_CUDA_TC_TARGET_EXPERTS unset: 512, so V2-Lite's
 * down projection takes 4 K runs where a plain product of the same weight, at the default
 * target, takes 8; the rest of this file sets it to 0, the plain products' order): grouped
 * products on such a backend, as the engine runs them, against plain products on one whose
 * target for every weight is 512. Batch 1 and 64 sequences (the streaming kernel), a
 * prefill's rows per expert (the wide kernel). And the target stays the experts': a plain
 * product of the down projection's shape on the default backend is bitwise g_be's (8 K runs),
 * not the 512 backend's (4). */
static void check_experts_target(void) {
    unsetenv("DI_CUDA_TC_TARGET_EXPERTS");
    di_backend bx = backend_with("DI_CUDA_TC_TARGET", "1024"); /* the default's */
    setenv("DI_CUDA_TC_TARGET_EXPERTS", "0", 1);
    di_backend bp = backend_with("DI_CUDA_TC_TARGET", "512");
    if (!bx.ctx || !bp.ctx) {
        if (bx.ctx) di_backend_free(&bx);
        if (bp.ctx) di_backend_free(&bp);
        return;
    }
    test_weight t = make_weight(DI_DTYPE_BF16, 2048, 1408, 0, 0, 0);
    di_weight dw = upload(&t.w);
    float *x = rnd_vec(3 * 1408, 1.0f);
    float *yx = gpu_mm_on(&bx, &dw, false, x, 3), *y0 = gpu_mm_on(&g_be, &dw, false, x, 3);
    float *yp = gpu_mm_on(&bp, &dw, false, x, 3);
    CHECK_MSG(memcmp(yx, y0, (size_t)(3 * 2048) * 4) == 0,
              "the experts' target changed a plain product's K order");
    CHECK_MSG(memcmp(yx, yp, (size_t)(3 * 2048) * 4) != 0,
              "a plain product at targets 1024 and 512: the same bits (the same K runs?)");
    free(yx), free(y0), free(yp), free(x);
    di_cuda_weight_free(&g_be, &dw);
    free_weight(&t);
    g_xbe = &bx, g_pbe = &bp;
    check_experts(DI_DTYPE_BF16, 64, 6, 1, 2048, 1408);
    check_experts(DI_DTYPE_BF16, 64, 6, 64, 2048, 1408);
    check_experts(DI_DTYPE_BF16, 64, 6, 64, 1408, 2048);
    check_experts(DI_DTYPE_BF16, 8, 6, 80, 2048, 1408);
    g_hot_rows = 13; /* a pass of 16 at one K run per warp for the down projection too */
    check_experts(DI_DTYPE_BF16, 16, 2, 48, 2048, 1408);
    g_hot_rows = 0;
    g_xbe = &g_be, g_pbe = &g_be;
    di_backend_free(&bx), di_backend_free(&bp);
}

TEST(matmul_experts) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++) {
        check_experts(g_dtypes[d], 8, 2, 1, rnd_int(1, 200), rnd_int(1, 700));
        check_experts(g_dtypes[d], 12, 3, rnd_int(2, 40), rnd_int(1, 200), rnd_int(1, 700));
    }
    /* V2-Lite's expert shapes (gate / up 1408 x 2048, down 2048 x 1408), decode batches: one
     * row per expert (one K run per warp) and, at 64 sequences, 6 rows per expert (2 K runs
     * per warp for the down projection's shape at the runs' default target, tc_runs, with
     * the 8 K runs this file's experts' target gives it; the engine's default gives it 4, one
     * per warp), on the streaming kernel (the default for them) */
    const int64_t runs = di_backend_cuda_tc_runs_launches();
    const int64_t streamed0 = di_backend_cuda_tc_stream_launches();
    check_experts(DI_DTYPE_BF16, 64, 6, 1, 1408, 2048);
    check_experts(DI_DTYPE_BF16, 64, 6, 64, 2048, 1408);
    /* ... and fewer K runs per tile: 4 (4096 x 1024, as a V3 down projection's 7168 x 2048),
     * several tiles per block; 2 (200 x 256) */
    check_experts(DI_DTYPE_BF16, 16, 4, 1, 4096, 1024);
    check_experts(DI_DTYPE_BF16, 16, 4, 16, 4096, 1024);
    check_experts(DI_DTYPE_BF16, 16, 4, 16, 200, 256);
    CHECK_MSG(!g_tc || di_backend_cuda_tc_runs_launches() > runs,
              "no grouped product took several K runs per warp");
    /* A decode batch's grouped products take the streaming kernel by default (above, and
     * the RUNS cases below: R = 1, 2, 4 and 8 on it); tc_kernel's grouped path
     * (DI_CUDA_TC_STREAM=0) at one K run per warp (batch 1), 2 and 4 (64 sequences) and 8
     * (target 1: one warp per tile, no tree). */
    CHECK_MSG(!g_tc || di_backend_cuda_tc_stream_launches() > streamed0,
              "the default ran no grouped product on the streaming kernel");
    /* An expert with more rows than a pass of 8 (expert 0 given exactly `hot` rows, the others
     * about 6): one pass of 16 rows for 9-16 of them, passes of 16 and then of 16 or 8 beyond
     * -- at one K run per warp (the gate / up, 8 warps per tile), at two (the down projection
     * at this file's experts' target), with one warp per tile (K = 200: one K run), rows past
     * the last tile and a last chunk short of 32 columns (1376 x 2056) -- each expert's rows
     * bitwise the plain products. Three backends, each routing for itself (check_experts), so
     * that its later grouped products of one routing (the up experts, the GLU calls) find the
     * routing settled: the default, which requests their first weights before the PDL wait
     * (their values are checked here; the race that must not be lost, under PDL in a graph,
     * in the model tests); one with DI_CUDA_TC_STREAM16=0 (passes of 8 only: no pass of 16
     * counted on the device; early as the default); one with DI_CUDA_TC_EARLY=0 (passes of 16,
     * none early although the routing is settled: the passes of 16 without the early start,
     * GLU at two K runs included). */
    static const int64_t hot[] = {9, 16, 17, 24, 40}, hot_few[] = {13, 24};
    static const char *const variant[][2] = {
        {NULL, NULL}, {"DI_CUDA_TC_STREAM16", "0"}, {"DI_CUDA_TC_EARLY", "0"}};
    for (int v = 0; g_tc && v < 3; v++) {
        di_backend bv = v ? backend_with(variant[v][0], variant[v][1]) : g_be;
        if (!bv.ctx) return;
        CHECK(di_backend_cuda_sync(&g_be) == DI_OK);
        const int64_t p16 = di_backend_cuda_tc_stream16_passes();
        const int64_t early0 = di_backend_cuda_tc_early_launches();
        g_xbe = v ? &bv : &g_be;
        for (size_t h = 0; h < DI_ARRAY_LEN(hot); h++) {
            g_hot_rows = hot[h];
            check_experts(DI_DTYPE_BF16, 16, 2, 48, 1408, 2048);
            check_experts(DI_DTYPE_BF16, 16, 2, 48, 2048, 1408);
        }
        for (size_t h = 0; h < DI_ARRAY_LEN(hot_few); h++) {
            g_hot_rows = hot_few[h];
            check_experts(DI_DTYPE_BF16, 16, 2, 48, 1376, 2056);
            check_experts(DI_DTYPE_BF16, 16, 2, 48, 300, 200);
        }
        g_hot_rows = 0, g_xbe = &g_be;
        CHECK(di_backend_cuda_sync(&bv) == DI_OK);
        const int64_t made = di_backend_cuda_tc_stream16_passes() - p16;
        const int64_t early = di_backend_cuda_tc_early_launches() - early0;
        CHECK_MSG(v == 1 ? made == 0 : made > 0, "backend %d: %lld passes of 16 rows", v,
                  (long long)made);
        CHECK_MSG(v == 2 ? early == 0 : early > 0,
                  "backend %d: %lld launches requested weights before the PDL wait", v,
                  (long long)early);
        if (v) di_backend_free(&bv);
    }
    for (int ti = 0; g_tc && ti < 2; ti++) {
        di_backend bs = tc_kernel_backend_with("DI_CUDA_TC_RUNS_TARGET", ti == 0 ? "256" : "1");
        if (!bs.ctx) return;
        const int64_t streamed = di_backend_cuda_tc_stream_launches();
        const int64_t ran = di_backend_cuda_tc_runs_launches();
        check_decode_experts(&bs);
        di_backend_free(&bs);
        CHECK_MSG(di_backend_cuda_tc_stream_launches() == streamed,
                  "DI_CUDA_TC_STREAM=0 ran the streaming kernel");
        CHECK_MSG(di_backend_cuda_tc_runs_launches() > ran,
                  "DI_CUDA_TC_STREAM=0: no product took several K runs per warp");
    }
    /* tc_kernel's two row tiles per warp, one K run each (the runs off: with them a warp
     * takes one row tile; the streaming kernel off: it takes one): the last block's second
     * tile past the end (43 tiles), and two tiles per block (2 K runs) with the last one past
     * the end; 5..8 rows per expert, rows past the end */
    if (g_tc) { /* b0 is a tensor-core backend: compared with the default's products */
        di_backend b0 = tc_kernel_backend_with("DI_CUDA_TC_RUNS_MIN_N", "0");
        if (!b0.ctx) return;
        const int64_t runs0 = di_backend_cuda_tc_runs_launches();
        g_xbe = &b0;
        check_experts(DI_DTYPE_BF16, 64, 6, 40, 1376, 2048);
        check_experts(DI_DTYPE_BF16, 16, 4, 16, 200, 256);
        check_experts(DI_DTYPE_BF16, 64, 6, 64, 1376, 2048);
        g_xbe = &g_be;
        di_backend_free(&b0);
        CHECK_MSG(di_backend_cuda_tc_runs_launches() == runs0,
                  "DI_CUDA_TC_RUNS_MIN_N=0 ran a product with several K runs per warp");
    }
    /* the same shapes on the default's kernel and runs (1376 rows) */
    check_experts(DI_DTYPE_BF16, 64, 6, 40, 1376, 2048);
    check_experts(DI_DTYPE_BF16, 64, 6, 64, 1376, 2048);
    if (!g_tc) {
        check_experts(DI_DTYPE_F8_E4M3, 16, 8, 9, 256, 7168);
        return;
    }
    /* a prefill's rows per expert on the GEMV's wider variants (DI_CUDA_TC_WIDE_GROUPED=0):
     * 16 (two token groups) and 32 (four), each expert's rows in several passes where it has
     * more */
    di_backend bn = backend_with("DI_CUDA_TC_WIDE_GROUPED", "0");
    if (!bn.ctx) return;
    const int64_t wide = di_backend_cuda_wide_launches(true);
    g_xbe = &bn;
    check_experts(DI_DTYPE_BF16, 16, 4, 64, 1408, 2048);
    check_experts(DI_DTYPE_BF16, 16, 4, 128, 2048, 1408);
    g_xbe = &g_be;
    CHECK_MSG(di_backend_cuda_wide_launches(true) == wide,
              "the opt-out ran a grouped wide product");
    di_backend_free(&bn);
    /* many tokens per expert (a prefill) on the wide kernel (the default from 9): 8 K runs, 2
     * (200 x 256), 1 (300 x 200); experts of 9 to about 100 tokens. A tensor-core kernel:
     * compared with the tensor-core products, not with matmul_simt_bf16's SIMT ones.
     * (n K / E >= 9: the launcher's rows per active expert) */
    check_experts(DI_DTYPE_BF16, 8, 2, 100, 1408, 2048); /* 8 K runs */
    check_experts(DI_DTYPE_BF16, 8, 6, 80, 2048, 1408);
    check_experts(DI_DTYPE_BF16, 4, 2, 80, 200, 256); /* 2 */
    check_experts(DI_DTYPE_BF16, 4, 2, 40, 300, 520); /* 4 */
    check_experts(DI_DTYPE_BF16, 4, 2, 33, 300, 200); /* 1 */
    /* about 50 rows per expert: two passes of one K run, dead warps in the second row block */
    check_experts(DI_DTYPE_BF16, 2, 1, 100, 300, 200);
    /* about 100 and 300 rows per expert: 4 and 8 blocks (DI_CUDA_TC_WIDE_X's cap) sharing a
     * weight tile's token chunks, the latter each block taking one or two of its 9-10 */
    check_experts(DI_DTYPE_BF16, 4, 2, 200, 300, 520);
    check_experts(DI_DTYPE_BF16, 2, 2, 300, 300, 200);
    CHECK_MSG(di_backend_cuda_wide_launches(true) > wide,
              "the default ran no grouped wide product");
    const int64_t wide1 = di_backend_cuda_wide_launches(true);
    /* and a decode batch's few rows per expert (some with none) on it too
     * (DI_CUDA_TC_WIDE_GROUPED=1: every grouped product) */
    di_backend b1 = backend_with("DI_CUDA_TC_WIDE_GROUPED", "1");
    if (!b1.ctx) return;
    g_xbe = &b1;
    check_experts(DI_DTYPE_BF16, 64, 6, 64, 1408, 2048);
    check_experts(DI_DTYPE_BF16, 64, 6, 40, 2048, 1408);
    check_experts(DI_DTYPE_BF16, 16, 4, 3, 200, 256);
    g_xbe = &g_be;
    di_backend_free(&b1);
    CHECK_MSG(di_backend_cuda_wide_launches(true) > wide1,
              "DI_CUDA_TC_WIDE_GROUPED=1 ran no grouped wide product");
    check_experts(DI_DTYPE_F8_E4M3, 16, 8, 9, 256, 7168);
    check_experts_target();
    /* Several K runs per warp at other targets, on the default (streaming) kernel: 8 runs
     * per warp (target 1: one warp per tile, no shared-memory tree) and 4 or 8 (target 128);
     * runs of 8 and 9 chunks with a short last chunk (K = 2056). */
    static const char *targets[] = {"1", "128"};
    for (size_t ti = 0; ti < DI_ARRAY_LEN(targets); ti++) {
        di_backend bt = backend_with("DI_CUDA_TC_RUNS_TARGET", targets[ti]);
        if (!bt.ctx) return;
        const int64_t ran = di_backend_cuda_tc_runs_launches();
        check_decode_experts(&bt);
        di_backend_free(&bt);
        CHECK_MSG(di_backend_cuda_tc_runs_launches() > ran,
                  "DI_CUDA_TC_RUNS_TARGET=%s: no product took several K runs per warp",
                  targets[ti]);
    }
}

/* Backend b's one-token-group products (an opt-in variant, `what`) bitwise the default
 * backend's: plain, GLU with distinct gate and up weights, accumulate (onto the same y), 1..8
 * tokens, over shapes with K runs of whole and partial load groups (K = 1408: 44 chunks over
 * 8 runs), 2 K runs (K = 296), a last chunk short of 32 columns by 24, 16 or 8 (K = 2056,
 * 2064, 2072, 8), rows not a tile multiple. Nothing may be written past the n rows of y: a
 * poisoned tail of 8 rows must come back untouched. */
/* A gate and an up weight of one shape (uploaded through g_be), n tokens of activations and
 * a starting y: what the GLU and accumulate comparisons below share. */
typedef struct {
    test_weight tg, tu;
    di_weight dg, du;
    float *x, *dx, *y0;
} glu_case;

static glu_case glu_case_make(di_dtype dt, int64_t rows, int64_t cols, int64_t n) {
    glu_case c;
    c.tg = make_weight(dt, rows, cols, 0, 0, 0);
    c.tu = make_weight(dt, rows, cols, 0, 0, 0);
    c.dg = upload(&c.tg.w), c.du = upload(&c.tu.w);
    c.x = rnd_vec(n * cols, 1.0f), c.dx = dev_floats(c.x, n * cols);
    c.y0 = rnd_vec(n * rows, 1.0f);
    return c;
}

static void glu_case_free(glu_case *c) {
    di_cuda_weight_free(&g_be, &c->dg), di_cuda_weight_free(&g_be, &c->du);
    dfree(c->dx), free(c->x), free(c->y0), free_weight(&c->tg), free_weight(&c->tu);
}

/* Returns the number of products run on b. */
static int64_t check_same_bits(const di_backend *b, const char *what) {
    int64_t products = 0;
    static const int64_t shapes[][2] = {{1408, 2048}, {2048, 1408}, {37, 2056}, {40, 2064},
                                        {24, 2072},   {100, 296},   {300, 520}, {16, 8}};
    static const int64_t ns[] = {1, 2, 5, 8};
    static const char *kinds[] = {"plain", "glu", "accumulate"};
    for (size_t si = 0; si < DI_ARRAY_LEN(shapes); si++)
        for (size_t ni = 0; ni < DI_ARRAY_LEN(ns); ni++) {
            const int64_t rows = shapes[si][0], cols = shapes[si][1], n = ns[ni];
            glu_case c = glu_case_make(DI_DTYPE_BF16, rows, cols, n);
            for (int k = 0; k < 3; k++) {
                float *dy[2];
                for (int v = 0; v < 2; v++) {
                    const di_backend *e = v ? b : &g_be;
                    dy[v] = dev_poison((n + 8) * rows);
                    if (k == 2)
                        CHECK(di_cuda_upload(e, dy[v], c.y0, (size_t)(n * rows) * 4) == DI_OK);
                    products += v;
                    if (k == 0) e->ops->matmul(e->ctx, &c.dg, c.dx, n, dy[v]);
                    if (k == 1) e->ops->matmul_glu(e->ctx, &c.dg, &c.du, c.dx, n, dy[v]);
                    if (k == 2) e->ops->matmul_add(e->ctx, &c.dg, c.dx, n, dy[v]);
                    CHECK(di_backend_cuda_sync(e) == DI_OK);
                }
                float *ya = host_floats(dy[0], (n + 8) * rows);
                float *yb = host_floats(dy[1], (n + 8) * rows);
                CHECK_MSG(memcmp(ya, yb, (size_t)(n * rows) * 4) == 0,
                          "%s: %lldx%lld n=%lld %s: not the default's bits", what, (long long)rows,
                          (long long)cols, (long long)n, kinds[k]);
                int64_t past = 0;
                for (int64_t i = n * rows; i < (n + 8) * rows; i++)
                    past += !isnan(ya[i]) || !isnan(yb[i]);
                CHECK_MSG(past == 0, "%s: %lldx%lld n=%lld %s: %lld values written past y", what,
                          (long long)rows, (long long)cols, (long long)n, kinds[k],
                          (long long)past);
                free(ya), free(yb);
                dfree(dy[0]), dfree(dy[1]);
            }
            glu_case_free(&c);
        }
    return products;
}

/* One BF16 product of n tokens (1408 x 2048) on backend be, waited for. */
static void one_product(di_backend *be, int64_t n) {
    test_weight t = make_weight(DI_DTYPE_BF16, 1408, 2048, 0, 0, 0);
    di_weight dw = upload(&t.w);
    float *x = rnd_vec(n * 2048, 1.0f), *dx = dev_floats(x, n * 2048), *dy = dev_poison(n * 1408);
    be->ops->matmul(be->ctx, &dw, dx, n, dy);
    CHECK(di_backend_cuda_sync(be) == DI_OK);
    di_cuda_weight_free(&g_be, &dw);
    dfree(dx), dfree(dy), free(x), free_weight(&t);
}

/* BF16 products on the tensor cores (cuda_tc_gemv.cu, the default, and from 9 tokens
 * cuda_tc_wide.cu): the reference's accuracy and the same bits for a token alone (the GEMV)
 * and in batches of any size (the wide kernel), over the kernels' cases: 1-8 K runs,
 * partial row tiles, row blocks and chunks (K % 32 == 8), every token group count (the
 * default: 2 bf16 parts per activation; 3 with DI_CUDA_TC_TERMS=3, every bit of the fp32
 * activations). */
static void check_tc(di_backend *be, di_dtype dt, int blk, int64_t rows, int64_t cols, double tol) {
    static const int64_t ns[] = {3, 8, 9, 17, 40, 64, 100};
    /* FP8: a row view (5 rows skipped: row_offset 5, the scale rows shifted) */
    test_weight t = make_weight(dt, rows, cols, dt == DI_DTYPE_F8_E4M3 ? 5 : 0, 0, blk);
    di_weight dw;
    CHECK(di_cuda_weight_upload(be, &t.w, &dw) == DI_OK);
    const int64_t nmax = 100;
    float *x = rnd_vec(nmax * cols, 1.0f), *dx = dev_floats(x, nmax * cols);
    float *ref = malloc((size_t)(nmax * rows) * 4);
    di_cpu_matmul_ref(&t.w, x, nmax, ref);
    /* every token alone (the GEMV) */
    float *dy = dev_poison(nmax * rows);
    for (int64_t k = 0; k < nmax; k++)
        be->ops->matmul(be->ctx, &dw, dx + k * cols, 1, dy + k * rows);
    /* (host_floats copies on g_be's stream: wait for be's own first) */
    CHECK(di_backend_cuda_sync(be) == DI_OK);
    float *alone = host_floats(dy, nmax * rows);
    CHECK_MSG(nerr(alone, ref, nmax * rows) <= tol, "tc %lldx%lld n=1: error %.3g", (long long)rows,
              (long long)cols, nerr(alone, ref, nmax * rows));
    for (size_t ni = 0; ni < DI_ARRAY_LEN(ns); ni++) {
        const int64_t n = ns[ni];
        be->ops->matmul(be->ctx, &dw, dx, n, dy);
        CHECK(di_backend_cuda_sync(be) == DI_OK);
        float *y = host_floats(dy, n * rows);
        const double e = nerr(y, ref, n * rows);
        CHECK_MSG(e <= tol, "tc %lldx%lld n=%lld: error %.3g", (long long)rows, (long long)cols,
                  (long long)n, e);
        int64_t bad = -1;
        for (int64_t k = 0; k < n && bad < 0; k++)
            if (memcmp(alone + k * rows, y + k * rows, (size_t)rows * 4) != 0) bad = k;
        CHECK_MSG(bad < 0, "tc %lldx%lld: token %lld in a batch of %lld differs from alone",
                  (long long)rows, (long long)cols, (long long)bad, (long long)n);
        free(y);
    }
    di_cuda_weight_free(be, &dw);
    dfree(dx), dfree(dy);
    free(x), free(ref), free(alone);
    free_weight(&t);
}

/* GLU and accumulate on backend be: each token alone (the GEMV) bitwise the same token in a
 * batch of n (BF16: the wide kernel from 9 tokens; FP8: the GEMV's wider variants). */
static void check_tc_modes(di_backend *be, di_dtype dt, int64_t rows, int64_t cols, int64_t n) {
    glu_case c = glu_case_make(dt, rows, cols, n);
    for (int glu = 0; glu < 2; glu++) {
        float *dy[2];
        for (int v = 0; v < 2; v++) { /* v = 0: token by token; 1: the batch */
            dy[v] = dev_poison(n * rows);
            CHECK(di_cuda_upload(be, dy[v], c.y0, (size_t)(n * rows) * 4) == DI_OK);
            for (int64_t k = 0; k < (v ? 1 : n); k++) {
                const int64_t m = v ? n : 1;
                if (glu)
                    be->ops->matmul_glu(be->ctx, &c.dg, &c.du, c.dx + k * cols, m,
                                        dy[v] + k * rows);
                else
                    be->ops->matmul_add(be->ctx, &c.dg, c.dx + k * cols, m, dy[v] + k * rows);
            }
            CHECK(di_backend_cuda_sync(be) == DI_OK);
        }
        float *ya = host_floats(dy[0], n * rows), *yb = host_floats(dy[1], n * rows);
        CHECK_MSG(memcmp(ya, yb, (size_t)(n * rows) * 4) == 0,
                  "%lldx%lld n=%lld %s: a batch differs from its tokens alone", (long long)rows,
                  (long long)cols, (long long)n, glu ? "glu" : "accumulate");
        free(ya), free(yb);
        dfree(dy[0]), dfree(dy[1]);
    }
    glu_case_free(&c);
}

/* The wide kernel on mma.sync (DI_CUDA_TC_WGMMA=0) against the default, wgmma on an sm_90
 * device: see matmul_tc. */
static void check_wide_mma(void) {
    di_device_info dev;
    int32_t ndev = 0;
    const bool sm90 = di_cuda_devices(&dev, 1, &ndev) == DI_OK && ndev > 0 && dev.cc_major == 9;
    const int64_t wg = di_backend_cuda_wgmma_launches();
    for (int terms = 2; terms <= 3; terms++) {
        if (terms == 3) setenv("DI_CUDA_TC_TERMS", "3", 1);
        di_backend bm = backend_with("DI_CUDA_TC_WGMMA", "0");
        unsetenv("DI_CUDA_TC_TERMS");
        if (!bm.ctx) return;
        const int64_t wide = di_backend_cuda_wide_launches(false),
                      before = di_backend_cuda_wgmma_launches();
        check_tc(&bm, DI_DTYPE_BF16, 0, 1408, 2048, 1e-5); /* every product on bm */
        check_tc(&bm, DI_DTYPE_BF16, 0, 37, 2056, 1e-5);   /* runs of 8 and 9 chunks */
        if (terms == 2) check_tc_modes(&bm, DI_DTYPE_BF16, 1408, 2048, 40); /* GLU, add */
        CHECK_MSG(di_backend_cuda_wide_launches(false) > wide,
                  "DI_CUDA_TC_WGMMA=0: no wide product ran");
        CHECK_MSG(di_backend_cuda_wgmma_launches() == before,
                  "DI_CUDA_TC_WGMMA=0 still launched the wgmma kernel");
        if (terms == 2) { /* grouped products of many rows per expert on bm, against g_be's
                           * plain products (on wgmma) */
            const int64_t grouped = di_backend_cuda_wide_launches(true);
            g_xbe = &bm;
            check_experts(DI_DTYPE_BF16, 8, 2, 300, 1408, 2048);
            check_experts(DI_DTYPE_BF16, 4, 2, 100, 300, 520);
            g_xbe = &g_be;
            CHECK_MSG(di_backend_cuda_wide_launches(true) > grouped,
                      "DI_CUDA_TC_WGMMA=0: no grouped wide product ran");
        }
        di_backend_free(&bm);
    }
    /* and the default ran wgmma on an sm_90 device (matmul_tc's batches before this) */
    CHECK_MSG(!sm90 || wg > 0, "%s (sm_90): no wide product ran on wgmma", dev.name);
}

TEST(matmul_tc) {
    if (!g_have_gpu) SKIP("no CUDA device");
    static const int64_t shapes[][2] = {{37, 2056},  {1408, 2048}, {2048, 1408}, {576, 2048},
                                        {4096, 512}, {300, 520},   {16, 8},      {5000, 2048},
                                        {700, 200},  {1000, 256}}; /* 1 and 2 K runs */
    const int64_t wide = di_backend_cuda_wide_launches(false);
    for (size_t si = 0; si < DI_ARRAY_LEN(shapes); si++)
        check_tc(&g_be, DI_DTYPE_BF16, 0, shapes[si][0], shapes[si][1], 1e-5);
    /* batches of 9+ tokens took the wide kernel (the device runs its clusters) */
    CHECK_MSG(di_backend_cuda_wide_launches(false) > wide, "no wide product ran");
    /* GLU and accumulate too: each token alone (the GEMV) bitwise its batch (the wide
     * kernel), 8 K runs (1408 x 2048) and 8 runs of 8 and 9 chunks with a short last chunk */
    check_tc_modes(&g_be, DI_DTYPE_BF16, 1408, 2048, 40);
    check_tc_modes(&g_be, DI_DTYPE_BF16, 37, 2056, 12);
    /* The other one-token-group variants: the same bits as the default GEMV (which stages
     * the split activations of up to 32 KiB: DI_CUDA_TC_XS=32) for plain, GLU and accumulate,
     * grouped (matmul_experts on g_xbe against the default's plain products), and a token
     * alone against a batch on the wide kernel (check_tc), with 2 and 3 parts: every shape
     * staged (100), none (0), the lean kernel, and plain products on the streaming kernel. */
    static const char *opt_in[][2] = {{"DI_CUDA_TC_XS", "100"},
                                      {"DI_CUDA_TC_XS", "0"},
                                      {"DI_CUDA_TC_LEAN", "1"},
                                      {"DI_CUDA_TC_STREAM_PLAIN", "1"}};
    for (size_t oi = 0; oi < DI_ARRAY_LEN(opt_in); oi++) {
        di_backend bo = backend_with(opt_in[oi][0], opt_in[oi][1]);
        if (!bo.ctx) return;
        const bool lean = oi == 2, streamed = oi == 3, staged = oi == 0;
        const int64_t ran = di_backend_cuda_lean_launches();
        const int64_t ran_ts = di_backend_cuda_tc_stream_plain_launches();
        const int64_t products = check_same_bits(&bo, opt_in[oi][0]);
        if (lean) CHECK_MSG(di_backend_cuda_lean_launches() > ran, "the lean variant never ran");
        /* the streaming variant: every one of them there (none fell back), else none */
        const int64_t on_ts = di_backend_cuda_tc_stream_plain_launches() - ran_ts;
        CHECK_MSG(on_ts == (streamed ? products : 0),
                  "%s=%s: %lld of %lld plain products on the streaming kernel", opt_in[oi][0],
                  opt_in[oi][1], (long long)on_ts, (long long)products);
        if (!lean && !streamed) { /* the staging of bo alone: 8 tokens of K = 2048 take 99.8 KB
                                   * (staged with 100 KiB, not by the default's 32); one token, 12.5
                                   * KB, not staged with 0 */
            const int64_t before = di_backend_cuda_xs_launches();
            one_product(&bo, staged ? 8 : 1);
            const int64_t d = di_backend_cuda_xs_launches() - before;
            CHECK_MSG(staged ? d == 1 : d == 0, "%s=%s: %lld staged launches", opt_in[oi][0],
                      opt_in[oi][1], (long long)d);
        }
        g_xbe = &bo;
        check_experts(DI_DTYPE_BF16, 64, 6, 1, 1408, 2048);
        check_experts(DI_DTYPE_BF16, 64, 6, 64, 2048, 1408);
        check_experts(DI_DTYPE_BF16, 16, 4, 16, 200, 256);
        check_experts(DI_DTYPE_BF16, 8, 2, 3, 300, 520);
        g_xbe = &g_be;
        check_tc(&bo, DI_DTYPE_BF16, 0, 1408, 2048, 1e-5);
        check_tc(&bo, DI_DTYPE_BF16, 0, 37, 2056, 1e-5);
        di_backend_free(&bo);
        setenv("DI_CUDA_TC_TERMS", "3", 1);
        bo = backend_with(opt_in[oi][0], opt_in[oi][1]);
        unsetenv("DI_CUDA_TC_TERMS");
        if (bo.ctx) check_tc(&bo, DI_DTYPE_BF16, 0, 1408, 2048, 1e-5);
        di_backend_free(&bo);
    }
    /* By default a plain product, not GLU, goes to the streaming kernel from 256 MiB of weights
     * (the lm_head), DI_CUDA_TC_STREAM_PLAIN_MIB moving that bound: one_product's 5.77 MB
     * weight takes it from 5 MiB (5.24 MB) on, not from 6 (6.29 MB), and a GLU product of two
     * such weights from neither -- the same bits either way (check_same_bits above) */
    static const char *mib[] = {"5", "6"};
    test_weight tg = make_weight(DI_DTYPE_BF16, 1408, 2048, 0, 0, 0);
    test_weight tu = make_weight(DI_DTYPE_BF16, 1408, 2048, 0, 0, 0);
    di_weight dg = upload(&tg.w), du = upload(&tu.w);
    float *xg = rnd_vec(2048, 1.0f), *dxg = dev_floats(xg, 2048), *dyg = dev_poison(1408);
    for (int mi = 0; mi < 2; mi++) {
        di_backend bm = backend_with("DI_CUDA_TC_STREAM_PLAIN_MIB", mib[mi]);
        if (!bm.ctx) return;
        const int64_t before = di_backend_cuda_tc_stream_plain_launches();
        one_product(&bm, 1);
        const int64_t d = di_backend_cuda_tc_stream_plain_launches() - before;
        CHECK_MSG(d == (mi == 0 ? 1 : 0), "DI_CUDA_TC_STREAM_PLAIN_MIB=%s: %lld streamed launches",
                  mib[mi], (long long)d);
        bm.ops->matmul_glu(bm.ctx, &dg, &du, dxg, 1, dyg);
        CHECK(di_backend_cuda_sync(&bm) == DI_OK);
        CHECK_MSG(di_backend_cuda_tc_stream_plain_launches() - before == d,
                  "DI_CUDA_TC_STREAM_PLAIN_MIB=%s: a GLU product streamed", mib[mi]);
        di_backend_free(&bm);
    }
    di_cuda_weight_free(&g_be, &dg), di_cuda_weight_free(&g_be, &du);
    dfree(dxg), dfree(dyg), free(xg), free_weight(&tg), free_weight(&tu);
    di_backend b3 = backend_with("DI_CUDA_TC_TERMS", "3");
    if (!b3.ctx) return;
    check_tc(&b3, DI_DTYPE_BF16, 0, 1408, 2048, 1e-5);
    check_tc(&b3, DI_DTYPE_BF16, 0, 37, 2056, 1e-5);
    di_backend_free(&b3);
    /* The wide kernel on mma.sync as on wgmma (the default on sm_90): the same bits as the
     * GEMV for plain products (check_tc: a batch against its tokens alone, with 2 and 3 parts;
     * check_tc_modes: GLU and accumulate) and for a prefill's grouped ones (check_experts:
     * against the default backend's plain products, 2 parts). */
    check_wide_mma();
    /* batch invariance off: the SIMT GEMV up to 8 tokens, the tensor cores above; both at
     * the reference's accuracy, GLU still bitwise matmul + silu_mul at either size */
    di_backend_cuda_set_batch_invariant(&g_be, false);
    for (int it = 0; it < 2; it++) {
        const int64_t rows = 1408, cols = 2048, n = it ? 40 : 3;
        test_weight t = make_weight(DI_DTYPE_BF16, rows, cols, 0, 0, 0);
        di_weight dw = upload(&t.w);
        float *x = rnd_vec(n * cols, 1.0f), *ref = malloc((size_t)(n * rows) * 4);
        di_cpu_matmul_ref(&t.w, x, n, ref);
        float *y = gpu_mm(&dw, false, x, n);
        CHECK_MSG(nerr(y, ref, n * rows) <= 1e-5, "not invariant, n=%lld: error %.3g", (long long)n,
                  nerr(y, ref, n * rows));
        /* GLU with the same weight as gate and up: silu_mul(y, y) */
        float *gref = gpu_silu_mul(y, y, n * rows);
        float *dx = dev_floats(x, n * cols), *dy = dev_poison(n * rows);
        g_be.ops->matmul_glu(g_be.ctx, &dw, &dw, dx, n, dy);
        float *yg = host_floats(dy, n * rows);
        CHECK_MSG(memcmp(yg, gref, (size_t)(n * rows) * 4) == 0,
                  "not invariant, n=%lld: glu differs from matmul + silu_mul", (long long)n);
        di_cuda_weight_free(&g_be, &dw);
        dfree(dx), dfree(dy);
        free(x), free(ref), free(y), free(gref), free(yg);
        free_weight(&t);
    }
    di_backend_cuda_set_batch_invariant(&g_be, true);
}

/* Block-scaled FP8 on the tensor-core GEMV (DI_CUDA_TC_FP8=1): the reference's accuracy
 * (the block scale applied to each chunk's sum instead of to each weight), each token alone
 * bitwise its batches at every n (plain, GLU, accumulate), grouped products bitwise the plain
 * ones of the same backend; 128 x 128 scale blocks (V3's, V4's) and 8 x 32 ones (rows g and
 * g + 8 of a tile in different row blocks), K not a multiple of 32, V3's K = 7168. */
TEST(matmul_tc_fp8) {
    if (!g_have_gpu) SKIP("no CUDA device");
    di_backend b8 = backend_with("DI_CUDA_TC_FP8", "1");
    if (!b8.ctx) return;
    const int64_t ran = di_backend_cuda_tc_fp8_launches();
    check_tc(&b8, DI_DTYPE_F8_E4M3, 0, 1408, 2048, 1e-5);
    check_tc(&b8, DI_DTYPE_F8_E4M3, 1, 300, 512, 1e-5);
    check_tc(&b8, DI_DTYPE_F8_E4M3, 0, 37, 2056, 1e-5);
    check_tc(&b8, DI_DTYPE_F8_E4M3, 0, 1024, 7168, 1e-5);
    check_tc(&b8, DI_DTYPE_F8_E4M3, 5, 200, 1000, 1e-5); /* 96-column blocks: a division */
    CHECK_MSG(di_backend_cuda_tc_fp8_launches() > ran, "no FP8 tensor-core product ran");
    /* GLU bitwise matmul of each weight + silu_mul (the up weight's own scales; a GLU pair
     * shares its scale layout, glu_pair_ok) */
    for (int64_t n = 1; n <= 12; n += 11) {
        const int64_t rows = 1408, cols = 2048;
        glu_case c = glu_case_make(DI_DTYPE_F8_E4M3, rows, cols, n);
        float *dy = dev_poison(n * rows), *dyu = dev_poison(n * rows), *dgl = dev_poison(n * rows);
        b8.ops->matmul(b8.ctx, &c.dg, c.dx, n, dy);
        b8.ops->matmul(b8.ctx, &c.du, c.dx, n, dyu);
        b8.ops->matmul_glu(b8.ctx, &c.dg, &c.du, c.dx, n, dgl);
        CHECK(di_backend_cuda_sync(&b8) == DI_OK);
        float *yg = host_floats(dy, n * rows), *yu = host_floats(dyu, n * rows);
        float *want = gpu_silu_mul(yg, yu, n * rows), *got = host_floats(dgl, n * rows);
        CHECK_MSG(memcmp(got, want, (size_t)(n * rows) * 4) == 0,
                  "FP8 n=%lld: glu differs from matmul + silu_mul", (long long)n);
        free(yg), free(yu), free(want), free(got);
        dfree(dy), dfree(dyu), dfree(dgl);
        glu_case_free(&c);
    }
    check_tc_modes(&b8, DI_DTYPE_F8_E4M3, 1408, 2048, 40);
    check_tc_modes(&b8, DI_DTYPE_F8_E4M3, 37, 2056, 12);
    const di_backend saved = g_be; /* check_experts compares with g_be's plain products */
    g_be = b8;
    check_experts(DI_DTYPE_F8_E4M3, 64, 6, 1, 1408, 2048);
    check_experts(DI_DTYPE_F8_E4M3, 64, 6, 64, 2048, 1408);
    check_experts(DI_DTYPE_F8_E4M3, 16, 8, 9, 256, 7168);
    g_be = saved;
    di_backend_free(&b8);
}

/* Layouts of check_tc_heads' activations and outputs (bits). */
enum {
    HEADS_X_TOKEN_MAJOR = 1, /* x [n][nh][cols + pad] (else head-major [nh][n][cols]) */
    HEADS_Y_TOKEN_MAJOR = 2, /* y [n][nh][rows], MLA's W_UV output (else head-major) */
    HEADS_X_PAD2 = 4 /* token-major x padded by 2 floats, not 4: rows not 16-byte aligned (the
                      * kernel's scalar loads) */
};

/* A product per head on backend be's tensor cores (head_matmul: MLA's W_UV, W_UK^T from its
 * transposed copy, V4's wo_a): nh heads of [rows][cols] stored one after another, after skip
 * rows (FP8: each head's scale rows shifted), x and y in the given layout. One launch per
 * product (all heads), the reference's accuracy, and each token alone (the GEMV) bitwise the
 * same token in a batch of every token-group variant (1, 2-8 tokens; BF16 batches of 9+ on
 * the wide kernel, counted). */
static void check_tc_heads(di_backend *be, di_dtype dt, int64_t nh, int64_t rows, int64_t cols,
                           int64_t skip, int layout) {
    static const int64_t ns[] = {3, 8, 9, 16, 17, 40};
    const int64_t nmax = 40, pad = layout & HEADS_X_PAD2 ? 2 : 4;
    test_weight t = make_weight(dt, nh * rows, cols, skip, 0, 0);
    di_weight dall;
    CHECK(di_cuda_weight_upload(be, &t.w, &dall) == DI_OK);
    di_weight *hw = malloc((size_t)nh * sizeof(di_weight));
    di_weight *dw = malloc((size_t)nh * sizeof(di_weight));
    for (int64_t h = 0; h < nh; h++) {
        hw[h] = di_weight_rows(&t.w, h * rows, rows);
        dw[h] = di_weight_rows(&dall, h * rows, rows);
    }
    const bool xt_major = layout & (HEADS_X_TOKEN_MAJOR | HEADS_X_PAD2);
    const int64_t xh = xt_major ? cols + pad : nmax * cols,
                  xt = xt_major ? nh * (cols + pad) : cols;
    const int64_t yh = layout & HEADS_Y_TOKEN_MAJOR ? rows : nmax * rows;
    const int64_t yt = layout & HEADS_Y_TOKEN_MAJOR ? nh * rows : rows;
    const int64_t nx = nh * nmax * (cols + pad), ny = nh * nmax * rows;
    float *x = rnd_vec(nx, 1.0f), *ref = malloc((size_t)ny * sizeof(float));
    di_head_matmul_params p = {.w = hw,
                               .n_heads = nh,
                               .n_tokens = nmax,
                               .x = x,
                               .x_hstride = xh,
                               .x_tstride = xt,
                               .y = ref,
                               .y_hstride = yh,
                               .y_tstride = yt};
    di_cpu_head_matmul_ref(&p);
    float *dx = dev_floats(x, nx), *dy = dev_poison(ny);
    p.w = dw;
    const int64_t launches = di_backend_cuda_tc_head_launches();
    const int64_t wide = di_backend_cuda_wide_launches(false);
    int64_t wide_want = 0; /* BF16 batches of 9+ tokens (DI_CUDA_TC_WIDE_MIN_N's default) */
    for (size_t ni = 0; ni < DI_ARRAY_LEN(ns); ni++)
        wide_want += dt == DI_DTYPE_BF16 && ns[ni] >= 9 && !getenv("DI_CUDA_TC_WIDE_MIN_N");
    for (int64_t k = 0; k < nmax; k++) { /* every token alone */
        p.n_tokens = 1;
        p.x = dx + k * xt;
        p.y = dy + k * yt;
        be->ops->head_matmul(be->ctx, &p);
    }
    CHECK(di_backend_cuda_sync(be) == DI_OK);
    float *alone = host_floats(dy, ny);
    double e = nerr(alone, ref, ny);
    CHECK_MSG(e <= 1e-5, "%s heads %lld x %lldx%lld layout %d n=1: error %.3g", di_dtype_name(dt),
              (long long)nh, (long long)rows, (long long)cols, layout, e);
    for (size_t ni = 0; ni < DI_ARRAY_LEN(ns); ni++) {
        const int64_t n = ns[ni];
        float *dz = dev_poison(ny);
        p.n_tokens = n;
        p.x = dx;
        p.y = dz;
        be->ops->head_matmul(be->ctx, &p);
        CHECK(di_backend_cuda_sync(be) == DI_OK);
        float *y = host_floats(dz, ny);
        int64_t bad = -1;
        for (int64_t h = 0; h < nh && bad < 0; h++)
            for (int64_t k = 0; k < n && bad < 0; k++) {
                const int64_t o = h * yh + k * yt;
                if (memcmp(alone + o, y + o, (size_t)rows * sizeof(float)) != 0) bad = k;
            }
        CHECK_MSG(bad < 0,
                  "%s heads %lld x %lldx%lld layout %d: token %lld in a batch of %lld differs "
                  "from alone",
                  di_dtype_name(dt), (long long)nh, (long long)rows, (long long)cols, layout,
                  (long long)bad, (long long)n);
        free(y);
        dfree(dz);
    }
    CHECK_MSG(di_backend_cuda_tc_head_launches() == launches + nmax + (int64_t)DI_ARRAY_LEN(ns),
              "%s heads %lld x %lldx%lld: not one tensor-core launch per product",
              di_dtype_name(dt), (long long)nh, (long long)rows, (long long)cols);
    CHECK_MSG(di_backend_cuda_wide_launches(false) - wide == wide_want,
              "%s heads %lld x %lldx%lld: %lld of %lld batches on the wide kernel",
              di_dtype_name(dt), (long long)nh, (long long)rows, (long long)cols,
              (long long)(di_backend_cuda_wide_launches(false) - wide), (long long)wide_want);
    di_cuda_weight_free(be, &dall);
    dfree(dx), dfree(dy);
    free(hw), free(dw), free(x), free(ref), free(alone);
    free_weight(&t);
}

TEST(head_matmul_tc) {
    if (!g_have_gpu) SKIP("no CUDA device");
    /* V2-Lite's W_UV (16 x 128 x 512; x head-major, y token-major: the runner's layout) and
     * W_UK^T copy (16 x 512 x 128; x token-major, y head-major), a partial row tile with a
     * short last chunk (K % 32 == 8) and unaligned x rows, two 16 x 8 heads */
    check_tc_heads(&g_be, DI_DTYPE_BF16, 16, 128, 512, 0, HEADS_Y_TOKEN_MAJOR);
    check_tc_heads(&g_be, DI_DTYPE_BF16, 16, 512, 128, 0, HEADS_X_TOKEN_MAJOR);
    check_tc_heads(&g_be, DI_DTYPE_BF16, 3, 40, 136, 8, HEADS_X_PAD2);
    check_tc_heads(&g_be, DI_DTYPE_BF16, 2, 16, 8, 0, 0);
    di_backend b8 = backend_with("DI_CUDA_TC_FP8", "1");
    if (!b8.ctx) return;
    /* FP8: heads of 128 rows after 128 skipped (kv_b_proj's layout), and heads of 40 rows
     * from row 100, the first of which crosses a 128-row scale block */
    check_tc_heads(&b8, DI_DTYPE_F8_E4M3, 16, 128, 512, 128, HEADS_Y_TOKEN_MAJOR);
    check_tc_heads(&b8, DI_DTYPE_F8_E4M3, 3, 40, 256, 100, HEADS_X_TOKEN_MAJOR);
    di_backend_free(&b8);
}

/* The SIMT GEMV for BF16 too (DI_CUDA_TC=0): the matmul, GLU, accumulate and grouped tests
 * again on a backend without the tensor-core path. */
TEST(matmul_simt_bf16) {
    if (!g_have_gpu) SKIP("no CUDA device");
    di_backend simt = backend_with("DI_CUDA_TC", "0"), saved = g_be;
    if (!simt.ctx) return;
    g_be = simt;
    g_tc = false;
    test_matmul();
    test_matmul_unaligned();
    test_matmul_glu();
    test_matmul_add();
    test_matmul_experts();
    g_tc = true;
    g_be = saved;
    di_backend_free(&simt);
}

/* argmax_rows: the CPU sampler's greedy token for every valid row (ties between equal
 * maxima at several places, -0 next to +0, -inf entries), -1 for a row holding a NaN or
 * +inf or only -inf (the sampler's errors). Calls of up to DI_CUDA_AM_ROWS (256) rows of
 * 8192+ ids take the sliced kernel, min(32, 512 / rows) slices a row: calls of 256, 70, 64,
 * 34 and 16 rows, then row 1 (its maximum at three places, in different slices), the last
 * two twice each (the arrival counters reset for the next call); 257 rows take one block
 * each; vocabularies of 8195 ids put the rows' starts off 16-byte alignment. */
TEST(argmax_rows) {
    if (!g_have_gpu) SKIP("no CUDA device");
    const int64_t vocabs[] = {1, 7, 1000, 4099, 8195, 102400};
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = 0.0f;
    void *scratch = malloc(di_sampler_scratch_size(102400));
    for (size_t vi = 0; vi < DI_ARRAY_LEN(vocabs); vi++) {
        const int64_t V = vocabs[vi], n = V == 102400 ? 70 : V == 8195 ? 257 : 37;
        float *x = rnd_vec(n * V, 4.0f);
        for (int64_t t = 0; t < n; t++) {
            float *row = x + t * V;
            const int kind = (int)(t % 8);
            if (kind == 1) { /* the maximum at several places */
                for (int k = 0; k < 3; k++)
                    row[rnd_int(0, V - 1)] = 9.0f;
            } else if (kind == 2) { /* zeros of both signs as the maximum */
                for (int64_t i = 0; i < V; i++)
                    row[i] = row[i] > 0 ? -row[i] : row[i];
                row[rnd_int(0, V - 1)] = -0.0f;
                row[rnd_int(0, V - 1)] = 0.0f;
            } else if (kind == 3) { /* banned tokens */
                for (int64_t i = 0; i < V; i += 3)
                    row[i] = -INFINITY;
            } else if (kind == 4) {
                row[rnd_int(0, V - 1)] = NAN;
            } else if (kind == 5) {
                row[rnd_int(0, V - 1)] = INFINITY;
            } else if (kind == 6 && t % 16 == 6) {
                for (int64_t i = 0; i < V; i++)
                    row[i] = -INFINITY;
            }
        }
        float *dx = dev_floats(x, n * V);
        int32_t *want = malloc((size_t)n * sizeof *want);
        for (int64_t t = 0; t < n; t++) {
            di_sample_input in = {.logits = x + t * V, .vocab = V, .eos_token_id = -1};
            di_sample_result r;
            di_status st = di_sampler_sample(&sp, &in, scratch, &r);
            want[t] = st == DI_OK ? r.token : -1;
        }
        /* (first row, rows): all (70 rows of 102400: 7 slices each; 257 of 8195: one block
         * per row); 256 rows where there are (2 slices), 64 and 34 (8 and 15); the first 16
         * (32) and row 1, twice each */
        const int64_t calls[][2] = {
            {0, n}, {0, DI_MIN(n, 256)}, {0, DI_MIN(n, 64)}, {3, 34}, {0, 16}, {0, 16}, {1, 1},
            {1, 1}};
        for (size_t ci = 0; ci < DI_ARRAY_LEN(calls); ci++) {
            const int64_t t0 = calls[ci][0], m = calls[ci][1];
            int32_t *dout = (int32_t *)dev_poison(m);
            g_be.ops->argmax_rows(g_be.ctx, dx + t0 * V, m, V, dout);
            int32_t *got = host_ints(dout, m);
            for (int64_t t = 0; t < m; t++)
                CHECK_MSG(got[t] == want[t0 + t],
                          "V=%lld row %lld of a call of %lld: device %d, "
                          "sampler %d",
                          (long long)V, (long long)(t0 + t), (long long)m, got[t], want[t0 + t]);
            dfree(dout);
            free(got);
        }
        dfree(dx);
        free(x), free(want);
    }
    free(scratch);
}

/* sample_rows: the CPU sampler's token on every valid row, over temperatures (greedy at 0),
 * min_p, top_k and top_p (the full-row and the filtered draw), seeds, sample indices and
 * positions; -1 for the rows the sampler rejects. Rows: random (scales 3 and 12), nearly
 * flat (top_p keeps most of the vocabulary), peaked (a few tokens hold the mass), on a coarse
 * grid (equal logits at every cut: the ranking's ties by id) and with -0 and +0 tied at the
 * top; each shape meets several of the filters (row t takes filter (t + t / 12) % 12). The
 * rows are drawn in one call of 80 (a block per row), one of 48 (two-block clusters) and
 * calls of up to 16 (8-block clusters). */
TEST(sample_rows) {
    if (!g_have_gpu) SKIP("no CUDA device");
    const int64_t vocabs[] = {1, 7, 1000, 4099, 129280};
    static const struct {
        int32_t k;
        float top_p, min_p;
    } filters[] = {{0, 1.0f, 0.0f},  {0, 0.9f, 0.0f},  {50, 1.0f, 0.0f},     {40, 0.8f, 0.05f},
                   {0, 1.0f, 0.1f},  {3000, 0.95f, 0}, {1, 1.0f, 0.0f},      {0, 0.3f, 0.01f},
                   {7, 0.99f, 0.0f}, {0, 1e-3f, 0.0f}, {100000, 0.5f, 0.0f}, {2, 0.999f, 0.0f}};
    void *scratch = malloc(di_sampler_scratch_size(129280));
    int filtered = 0;
    for (size_t vi = 0; vi < DI_ARRAY_LEN(vocabs); vi++) {
        const int64_t V = vocabs[vi], n = 80;
        float *x = rnd_vec(n * V, vi % 2 ? 12.0f : 3.0f);
        di_sample_row *rows = malloc((size_t)n * sizeof *rows);
        for (int64_t t = 0; t < n; t++) {
            float *row = x + t * V;
            if (t % 10 == 3) row[rnd_int(0, V - 1)] = NAN;
            if (t % 10 == 5) row[rnd_int(0, V - 1)] = INFINITY;
            if (t % 10 == 7)
                for (int64_t i = 0; i < V; i += 2)
                    row[i] = -INFINITY;
            if (t % 12 == 1) /* nearly flat */
                for (int64_t i = 0; i < V; i++)
                    row[i] *= 0.01f;
            if (t % 12 == 2) /* peaked */
                for (int i = 0; i < 20; i++)
                    row[rnd_int(0, V - 1)] += 15.0f;
            if (t % 12 == 4) /* ties */
                for (int64_t i = 0; i < V; i++)
                    row[i] = roundf(row[i]);
            if (t % 12 == 6) { /* -0 and +0 tied at the top */
                for (int64_t i = 0; i < V; i++)
                    row[i] = -fabsf(row[i]) - 0.5f;
                for (int i = 0; i < 4; i++)
                    row[rnd_int(0, V - 1)] = i % 2 ? 0.0f : -0.0f;
            }
            di_sampling_params sp = di_sampling_default_params();
            sp.temperature = t % 8 == 0 ? 0.0f : 0.2f + 0.1f * (float)(t % 9);
            const size_t f = (size_t)(t + t / 12) % DI_ARRAY_LEN(filters);
            sp.top_k = filters[f].k;
            sp.top_p = filters[f].top_p;
            sp.min_p = filters[f].min_p;
            rows[t] = di_sample_row_of(&sp, 1000 + 7 * t, (int32_t)(t % 3), 5 + 11 * t);
            filtered +=
                sp.temperature > 0.0f && ((sp.top_k > 0 && sp.top_k < V) || sp.top_p < 1.0f);
        }
        int32_t *want = malloc((size_t)n * sizeof *want);
        for (int64_t t = 0; t < n; t++) {
            const di_sampling_params sp = di_sample_row_params(&rows[t]);
            di_sample_input in = {.logits = x + t * V,
                                  .vocab = V,
                                  .eos_token_id = -1,
                                  .seed = rows[t].seed,
                                  .sample_index = rows[t].sample_index,
                                  .position = rows[t].position};
            di_sample_result r;
            want[t] = di_sampler_sample(&sp, &in, scratch, &r) == DI_OK ? r.token : -1;
        }
        float *dx = dev_floats(x, n * V);
        di_sample_row *drows = (di_sample_row *)dev_from(rows, (size_t)n * sizeof *rows);
        /* (first row, rows): all (one block per row), 48 (a two-block cluster per row), then
         * calls of a few rows (an 8-block cluster per row), one of them twice -- each where
         * the vocabulary spans the blocks */
        const int64_t calls[][2] = {{0, n}, {0, 48}, {0, 16}, {16, 16}, {32, 16}, {5, 1}, {5, 1}};
        for (size_t ci = 0; ci < DI_ARRAY_LEN(calls); ci++) {
            const int64_t t0 = calls[ci][0], m = calls[ci][1];
            const int64_t clustered = di_backend_cuda_sample_cluster_launches();
            int32_t *dout = (int32_t *)dev_poison(m);
            g_be.ops->sample_rows(g_be.ctx, dx + t0 * V, m, V, drows + t0, dout);
            int32_t *got = host_ints(dout, m);
            const bool cluster =
                (m <= 16 && V >= 8 * DI_SAMPLE_BLOCK) || (m <= 64 && V >= 2 * DI_SAMPLE_BLOCK);
            CHECK_MSG((di_backend_cuda_sample_cluster_launches() > clustered) == cluster,
                      "V=%lld: a call of %lld rows %s a cluster", (long long)V, (long long)m,
                      cluster ? "took no" : "took");
            for (int64_t t = t0; t < t0 + m; t++)
                CHECK_MSG(got[t - t0] == want[t],
                          "V=%lld row %lld of a call of %lld (T %g, top_k %d, top_p %g, min_p "
                          "%g): device %d, sampler %d",
                          (long long)V, (long long)t, (long long)m, (double)rows[t].temperature,
                          rows[t].top_k, (double)rows[t].top_p, (double)rows[t].min_p, got[t - t0],
                          want[t]);
            dfree(dout);
            free(got);
        }
        dfree(dx), dfree(drows);
        free(x), free(rows), free(want);
    }
    printf("  %d filtered rows (top_k or top_p) among them\n", filtered);
    free(scratch);
}

int main(void) {
    /* Every BF16 weight on the tensor cores, however few its rows (the default sends
     * weights of < 512 rows to the SIMT GEMV): the odd small shapes below test that path. */
    setenv("DI_CUDA_TC_MIN_ROWS", "1", 1);
    /* The default backend must be the default: the opt-in variants are compared with it, and
     * the K order must be the default's (grouped products are compared with plain ones). The
     * knobs that tools/gpu_check.sh's VARIANTS runs set (DI_CUDA_TC_RT, the wide kernel's)
     * stay as given. */
    static const char *knobs[] = {"DI_CUDA_TC_LEAN",
                                  "DI_CUDA_TC_XS",
                                  "DI_CUDA_TC_FP8",
                                  "DI_CUDA_TC_RUNS_MIN_N",
                                  "DI_CUDA_TC_RUNS_TARGET",
                                  "DI_CUDA_TC_TARGET",
                                  "DI_CUDA_TC_TARGET_EXPERTS",
                                  "DI_CUDA_TC_TERMS",
                                  "DI_CUDA_TC_STREAM",
                                  "DI_CUDA_SAMPLE_PAIRS",
                                  "DI_CUDA_TC_WGMMA",
                                  "DI_CUDA_TC_STREAM16",
                                  "DI_CUDA_TC_EARLY",
                                  "DI_CUDA_TC_STREAM_PLAIN",
                                  "DI_CUDA_COMBINE_NORM_MAX_N",
                                  "DI_CUDA_TC_STREAM_PLAIN_MIB",
                                  "DI_CUDA_ATTN_ROPE"};
    for (size_t i = 0; i < DI_ARRAY_LEN(knobs); i++)
        unsetenv(knobs[i]);
    /* ... except the experts' target, 512 by default: 0 gives an expert weight's grouped
     * products the K order of a plain product of the same weight, which check_experts
     * compares them with (check_experts_target covers the default) */
    setenv("DI_CUDA_TC_TARGET_EXPERTS", "0", 1);
    di_status st = di_backend_cuda_init(&g_be, 0, 8192);
    g_have_gpu = st == DI_OK;
    if (!g_have_gpu)
        printf("skip: %s\n", di_last_error());
    else
        printf("device: %s\n", di_backend_cuda_device_name(&g_be));
    RUN(matmul);
    RUN(matmul_fp8_special);
    RUN(matmul_t);
    RUN(matmul_glu);
    RUN(matmul_add);
    RUN(matmul_unaligned);
    RUN(head_matmul);
    RUN(embed);
    RUN(rmsnorm);
    RUN(rope);
    RUN(mla_store);
    RUN(silu_axpy_copy);
    RUN(mla_attention);
    RUN(mla_attention_paged);
    RUN(copy_rows_moe_combine);
    RUN(moe_combine_add_norm);
    RUN(moe_route);
    RUN(matmul_experts);
    RUN(matmul_tc);
    RUN(matmul_tc_fp8);
    RUN(head_matmul_tc);
    RUN(matmul_simt_bf16);
    RUN(argmax_rows);
    RUN(sample_rows);
    if (g_have_gpu) di_backend_free(&g_be);
    return test_summary();
}
