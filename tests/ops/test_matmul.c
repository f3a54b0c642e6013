/*
 * test_matmul.c -- the CPU matmul kernels against their scalar references.
 *
 * For every weight dtype (F32, F16, BF16, F8_E4M3 with 2-D block scales) and every SIMD level
 * this machine has, random shapes (odd ones included, views with row_stride != cols and
 * row_offset != 0) are compared with di_cpu_matmul_ref / di_cpu_matmul_t_ref by normalised
 * error, max|a - b| / max|ref|, under a per-dtype tolerance. Batch invariance and thread
 * invariance are checked bitwise. The scalar dtype conversions of core/dtype.h, which define
 * every kernel's weights, are tested first.
 */
#include "backend/cpu/cpu_ops.h"
#include "core/core.h"
#include "test.h"
#define TEST_RAND_SEED 0x9e3779b97f4a7c15ull
#include "test_rand.h"

static const char *const g_levels[] = {"scalar", "avx2", "avx512", "neon"};
static const di_dtype g_dtypes[] = {DI_DTYPE_F32, DI_DTYPE_F16, DI_DTYPE_BF16, DI_DTYPE_F8_E4M3};

/* ---------------------------------------------------------------------------------------- */
/* Helpers: random numbers and random weights                                                 */
/* ---------------------------------------------------------------------------------------- */

/* A stored tensor [srows][scols] and a view [rows][cols] of it at (r0, 0). */
typedef struct {
    void *data;
    float *scale;
    di_weight w;
} test_weight;

/* fp8 blocks: (block_rows, block_cols) picked by `blk` to cover odd cases. */
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
            if ((b & 0x7f) == 0x7f) b ^= 1; /* no NaN here; NaN has its own test */
            ((uint8_t *)t.data)[i] = b;
        }
        }
    }
    di_weight w = {.dtype = dt, .rows = srows, .cols = cols, .row_stride = scols, .data = t.data};
    if (dt == DI_DTYPE_F8_E4M3) {
        static const int64_t br[] = {128, 8, 3, 1}, bc[] = {128, 32, 20, 7};
        w.block_rows = br[blk % 4];
        w.block_cols = bc[blk % 4];
        w.scale_cols = (scols + w.block_cols - 1) / w.block_cols;
        const int64_t n_sr = (srows + w.block_rows - 1) / w.block_rows;
        t.scale = malloc(sizeof(float) * (size_t)(n_sr * w.scale_cols));
        for (int64_t i = 0; i < n_sr * w.scale_cols; i++)
            t.scale[i] = ldexpf(1.0f + 0.5f * rnd_f(), (int)rnd_int(-10, -4));
        w.scale = t.scale;
    }
    t.w = di_weight_rows(&w, extra_rows, rows); /* row_offset = extra_rows */
    return t;
}

static void free_weight(test_weight *t) {
    free(t->data);
    free(t->scale);
}

static float *rnd_unit_vec(int64_t n) {
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++)
        v[i] = rnd_f();
    return v;
}

static double norm_err(const float *a, const float *ref, int64_t n) {
    double md = 0.0, mr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - (double)ref[i]));
        mr = fmax(mr, fabs((double)ref[i]));
        if (isnan(a[i]) != isnan(ref[i])) return INFINITY;
    }
    return mr > 0 ? md / mr : md;
}

static double tolerance(di_dtype dt) {
    /* Weights are exact in float (fp8 up to one rounding), so only float summation remains. */
    return dt == DI_DTYPE_F8_E4M3 ? 3e-6 : 2e-6;
}

/* ---------------------------------------------------------------------------------------- */
/* Scalar dtype conversions                                                                   */
/* ---------------------------------------------------------------------------------------- */

TEST(dtype_e4m3_all_values) {
    for (int b = 0; b < 256; b++) {
        float v = di_e4m3_to_f32((uint8_t)b);
        int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
        if ((b & 0x7f) == 0x7f) {
            CHECK_MSG(isnan(v), "byte 0x%02x", b);
            continue;
        }
        double want = e == 0 ? (m / 8.0) * ldexp(1.0, -6) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
        if (s) want = -want;
        CHECK_MSG((double)v == want && (signbit(v) != 0) == (s != 0), "byte 0x%02x: %g vs %g", b, v,
                  want);
    }
    CHECK(di_e4m3_to_f32(0x7e) == 448.0f);
    CHECK(di_e4m3_to_f32(0x01) == 0x1p-9f); /* smallest subnormal */
}

TEST(dtype_bf16_f16_round_trips) {
    for (uint32_t h = 0; h < 65536; h++) {
        float b = di_bf16_to_f32((uint16_t)h), f = di_f16_to_f32((uint16_t)h);
        if (isnan(b))
            CHECK(isnan(di_bf16_to_f32(di_f32_to_bf16(b))));
        else
            CHECK_EQ_INT(di_f32_to_bf16(b), h);
        if (isnan(f))
            CHECK(isnan(di_f16_to_f32(di_f32_to_f16(f))));
        else
            CHECK_EQ_INT(di_f32_to_f16(f), h);
    }
    CHECK(di_f16_to_f32(0x0001) == 0x1p-24f); /* f16 subnormal */
    CHECK(di_f16_to_f32(0x7c00) == INFINITY);
    CHECK(di_f32_to_bf16(1.00390625f) == 0x3f80); /* halfway: ties to even */
    CHECK(di_f32_to_bf16(1.01171875f) == 0x3f82);
    for (int i = 0; i < 10000; i++) { /* rounding error at most half an ulp */
        float v = rnd_f() * 1000.0f;
        CHECK(fabsf(di_bf16_to_f32(di_f32_to_bf16(v)) - v) <= fabsf(v) * 0x1p-8f);
        CHECK(fabsf(di_f16_to_f32(di_f32_to_f16(v)) - v) <= fmaxf(fabsf(v) * 0x1p-11f, 0x1p-25f));
    }
}

TEST(weight_row_f32_matches_scalar) {
    for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++) {
        test_weight t = make_weight(g_dtypes[d], 9, 77, 5, 3, (int)d + 1);
        float *row = malloc(sizeof(float) * 77);
        for (int64_t r = 0; r < t.w.rows; r++) {
            di_cpu_weight_row_f32(&t.w, r, row);
            for (int64_t c = 0; c < t.w.cols; c++) {
                size_t i = (size_t)(r * t.w.row_stride + c) + (size_t)(5 * t.w.row_stride);
                float want;
                switch (g_dtypes[d]) {
                case DI_DTYPE_F32:
                    want = ((float *)t.data)[i];
                    break;
                case DI_DTYPE_F16:
                    want = di_f16_to_f32(((uint16_t *)t.data)[i]);
                    break;
                case DI_DTYPE_BF16:
                    want = di_bf16_to_f32(((uint16_t *)t.data)[i]);
                    break;
                default:
                    want =
                        di_e4m3_to_f32(((uint8_t *)t.data)[i]) *
                        t.scale[((5 + r) / t.w.block_rows) * t.w.scale_cols + c / t.w.block_cols];
                }
                CHECK(row[c] == want);
            }
        }
        free(row);
        free_weight(&t);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Fast kernels vs references                                                                 */
/* ---------------------------------------------------------------------------------------- */

static int g_levels_run;

TEST(matmul_vs_ref_all_levels) {
    di_pool *pool = di_pool_create(2);
    static const int64_t fixed[][3] = {{1, 1, 1},    {3, 17, 2},   {37, 129, 5}, {64, 256, 70},
                                       {20, 300, 9}, {16, 128, 1}, {5, 15, 3},   {33, 700, 48}};
    for (size_t lv = 0; lv < DI_ARRAY_LEN(g_levels); lv++) {
        if (di_cpu_simd_force(g_levels[lv]) != 0) continue;
        g_levels_run++;
        for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++) {
            for (int it = 0; it < 20; it++) {
                int64_t rows, cols, n;
                if (it < (int)DI_ARRAY_LEN(fixed)) {
                    rows = fixed[it][0], cols = fixed[it][1], n = fixed[it][2];
                } else {
                    rows = rnd_int(1, 90), cols = rnd_int(1, 520), n = rnd_int(1, 70);
                }
                test_weight t = make_weight(g_dtypes[d], rows, cols, it % 3 ? 0 : rnd_int(1, 9),
                                            it % 2 ? 0 : rnd_int(1, 40), it);
                float *x = rnd_unit_vec(n * cols), *y = rnd_unit_vec(n * rows),
                      *yr = rnd_unit_vec(n * rows);
                di_cpu_matmul(pool, &t.w, x, n, y);
                di_cpu_matmul_ref(&t.w, x, n, yr);
                double e = norm_err(y, yr, n * rows);
                CHECK_MSG(e <= tolerance(g_dtypes[d]), "%s %s rows=%lld cols=%lld n=%lld err=%g",
                          g_levels[lv], di_dtype_name(g_dtypes[d]), (long long)rows,
                          (long long)cols, (long long)n, e);
                /* transposed: x is [n][rows], y is [n][cols] */
                float *xt = rnd_unit_vec(n * rows), *yt = rnd_unit_vec(n * cols),
                      *ytr = rnd_unit_vec(n * cols);
                di_cpu_matmul_t(pool, &t.w, xt, n, yt);
                di_cpu_matmul_t_ref(&t.w, xt, n, ytr);
                e = norm_err(yt, ytr, n * cols);
                CHECK_MSG(e <= tolerance(g_dtypes[d]) * 2,
                          "matmul_t %s %s rows=%lld cols=%lld err=%g", g_levels[lv],
                          di_dtype_name(g_dtypes[d]), (long long)rows, (long long)cols, e);
                free(x), free(y), free(yr), free(xt), free(yt), free(ytr);
                free_weight(&t);
            }
        }
    }
    di_cpu_simd_force(NULL);
    CHECK(g_levels_run >= 1);
    printf("  levels tested: %d (best: %s)\n", g_levels_run, di_cpu_simd_name());
    di_pool_free(pool);
}

/* The non-invariant matmul (batch_invariant = false) against the scalar reference, by
 * normalised error, on every level, with n around the decode / fast-path boundaries. Also
 * close to (not necessarily equal to) the invariant result. */
TEST(matmul_fast_vs_ref_all_levels) {
    di_pool *pool = di_pool_create(2);
    static const int64_t fixed[][3] = {{1, 1, 1},    {4, 32, 2},  {37, 129, 5}, {64, 256, 8},
                                       {20, 300, 3}, {16, 48, 1}, {5, 15, 7},   {33, 700, 9},
                                       {96, 256, 6}, {9, 2048, 4}};
    int levels = 0;
    for (size_t lv = 0; lv < DI_ARRAY_LEN(g_levels); lv++) {
        if (di_cpu_simd_force(g_levels[lv]) != 0) continue;
        levels++;
        for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++) {
            for (int it = 0; it < 24; it++) {
                int64_t rows, cols, n;
                if (it < (int)DI_ARRAY_LEN(fixed)) {
                    rows = fixed[it][0], cols = fixed[it][1], n = fixed[it][2];
                } else {
                    rows = rnd_int(1, 90), cols = rnd_int(1, 520), n = rnd_int(1, 12);
                }
                test_weight t = make_weight(g_dtypes[d], rows, cols, it % 3 ? 0 : rnd_int(1, 9),
                                            it % 2 ? 0 : rnd_int(1, 40), it);
                float *x = rnd_unit_vec(n * cols), *y = rnd_unit_vec(n * rows),
                      *yr = rnd_unit_vec(n * rows), *yi = rnd_unit_vec(n * rows);
                di_cpu_matmul_fast(pool, &t.w, x, n, y);
                di_cpu_matmul_ref(&t.w, x, n, yr);
                di_cpu_matmul(pool, &t.w, x, n, yi);
                double e = norm_err(y, yr, n * rows), ei = norm_err(y, yi, n * rows);
                CHECK_MSG(e <= tolerance(g_dtypes[d]) && ei <= 2 * tolerance(g_dtypes[d]),
                          "fast %s %s rows=%lld cols=%lld n=%lld err=%g (vs invariant %g)",
                          g_levels[lv], di_dtype_name(g_dtypes[d]), (long long)rows,
                          (long long)cols, (long long)n, e, ei);
                free(x), free(y), free(yr), free(yi);
                free_weight(&t);
            }
        }
    }
    di_cpu_simd_force(NULL);
    CHECK(levels >= 1);
    di_pool_free(pool);
}

/* x = identity picks single weights: y[t][r] = w[r][t] exactly, so the SIMD conversions
 * (e4m3 subnormals, scales >= 128, f16 subnormals) must equal di_cpu_weight_row_f32 bitwise. */
TEST(conversion_exact_via_identity) {
    di_pool *pool = di_pool_create(2);
    const int64_t rows = 19, cols = 150;
    for (size_t lv = 0; lv < DI_ARRAY_LEN(g_levels); lv++) {
        if (di_cpu_simd_force(g_levels[lv]) != 0) continue;
        for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++) {
            test_weight t = make_weight(g_dtypes[d], rows, cols, 2, 5, 1);
            if (t.scale) { /* odd scales: huge (two-multiply path), tiny, subnormal, negative */
                t.scale[0] = 0x1p110f, t.scale[4] = 300.0f, t.scale[1] = 1e-30f,
                t.scale[2] = 1e-40f, t.scale[3] = -0.75f;
            }
            if (g_dtypes[d] == DI_DTYPE_F16) ((uint16_t *)t.data)[2 * 155 + 3] = 0x0201;
            float *x = calloc((size_t)(cols * cols), sizeof(float));
            float *y = malloc(sizeof(float) * (size_t)(cols * rows)),
                  *row = malloc(sizeof(float) * cols);
            for (int64_t c = 0; c < cols; c++)
                x[c * cols + c] = 1.0f;
            di_cpu_matmul(pool, &t.w, x, cols, y);
            int bad = 0;
            for (int64_t r = 0; r < rows; r++) {
                di_cpu_weight_row_f32(&t.w, r, row);
                for (int64_t c = 0; c < cols; c++)
                    bad += y[c * rows + r] != row[c];
            }
            CHECK_MSG(bad == 0, "%s %s: %d weights differ", g_levels[lv],
                      di_dtype_name(g_dtypes[d]), bad);
            free(x), free(y), free(row);
            free_weight(&t);
        }
    }
    di_cpu_simd_force(NULL);
    di_pool_free(pool);
}

TEST(fp8_nan_propagates) {
    for (size_t lv = 0; lv < DI_ARRAY_LEN(g_levels); lv++) {
        if (di_cpu_simd_force(g_levels[lv]) != 0) continue;
        test_weight t = make_weight(DI_DTYPE_F8_E4M3, 4, 40, 0, 0, 0);
        ((uint8_t *)t.data)[1 * 40 + 17] = 0x7f;
        ((uint8_t *)t.data)[3 * 40 + 33] = 0xff;
        float *x = rnd_unit_vec(40), y[4];
        di_cpu_matmul(NULL, &t.w, x, 1, y);
        CHECK(!isnan(y[0]) && isnan(y[1]) && !isnan(y[2]) && isnan(y[3]));
        free(x);
        free_weight(&t);
    }
    di_cpu_simd_force(NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* Batch and thread invariance (bitwise)                                                      */
/* ---------------------------------------------------------------------------------------- */

TEST(batch_and_thread_invariance) {
    di_pool *p1 = di_pool_create(1), *p2 = di_pool_create(2), *p3 = di_pool_create(3);
    static const int64_t shapes[][2] = {{50, 333}, {70, 2048}, {17, 129}};
    static const int64_t ns[] = {1, 3, 5, 6, 8, 12, 16, 17, 64}; /* both sides of 8 and 16 */
    const int64_t N = 70;
    for (size_t lv = 0; lv < DI_ARRAY_LEN(g_levels); lv++) {
        if (di_cpu_simd_force(g_levels[lv]) != 0) continue;
        for (size_t d = 0; d < DI_ARRAY_LEN(g_dtypes); d++) {
            for (size_t s = 0; s < DI_ARRAY_LEN(shapes); s++) {
                const int64_t rows = shapes[s][0], cols = shapes[s][1];
                test_weight t = make_weight(g_dtypes[d], rows, cols, 3, 0, (int)s);
                float *x = rnd_unit_vec(N * cols), *full = rnd_unit_vec(N * rows),
                      *part = rnd_unit_vec(N * rows);
                di_cpu_matmul(p2, &t.w, x, N, full);
                int bad = 0;
                /* Row t alone and at different positions inside batches of n. */
                for (size_t k = 0; k < DI_ARRAY_LEN(ns); k++) {
                    for (int64_t t0 = 0; t0 + ns[k] <= N; t0 += ns[k] + 5) {
                        di_cpu_matmul(k % 2 ? p1 : p3, &t.w, x + t0 * cols, ns[k], part);
                        bad += memcmp(part, full + t0 * rows,
                                      sizeof(float) * (size_t)(ns[k] * rows)) != 0;
                    }
                }
                di_cpu_matmul(p1, &t.w, x, N, part);
                bad += memcmp(part, full, sizeof(float) * (size_t)(N * rows)) != 0;
                /* A view of rows [5, rows) computes the same values as the full matrix. */
                di_weight v = di_weight_rows(&t.w, 5, rows - 5);
                di_cpu_matmul(p2, &v, x, 2, part);
                for (int64_t tt = 0; tt < 2; tt++)
                    bad += memcmp(part + tt * (rows - 5), full + tt * rows + 5,
                                  sizeof(float) * (size_t)(rows - 5)) != 0;
                /* matmul_t: thread counts and batch positions. */
                float *xt = rnd_unit_vec(N * rows), *ft = rnd_unit_vec(N * cols),
                      *pt = rnd_unit_vec(N * cols);
                di_cpu_matmul_t(p2, &t.w, xt, N, ft);
                di_cpu_matmul_t(p1, &t.w, xt + 7 * rows, 3, pt);
                bad += memcmp(pt, ft + 7 * cols, sizeof(float) * (size_t)(3 * cols)) != 0;
                di_cpu_matmul_t(p3, &t.w, xt, N, pt);
                bad += memcmp(pt, ft, sizeof(float) * (size_t)(N * cols)) != 0;
                CHECK_MSG(bad == 0, "%s %s %lldx%lld: %d mismatches", g_levels[lv],
                          di_dtype_name(g_dtypes[d]), (long long)rows, (long long)cols, bad);
                free(x), free(full), free(part), free(xt), free(ft), free(pt);
                free_weight(&t);
            }
        }
    }
    di_cpu_simd_force(NULL);
    di_pool_free(p1);
    di_pool_free(p2);
    di_pool_free(p3);
}

TEST(edge_sizes) {
    /* cols = 0 gives zeros; n = 0 and rows = 0 write nothing. */
    test_weight t = make_weight(DI_DTYPE_BF16, 3, 0, 0, 0, 0);
    float y[3] = {1, 1, 1}, x[1] = {0};
    di_cpu_matmul(NULL, &t.w, x, 1, y);
    CHECK(y[0] == 0.0f && y[1] == 0.0f && y[2] == 0.0f);
    y[0] = 5.0f;
    di_cpu_matmul(NULL, &t.w, x, 0, y);
    CHECK(y[0] == 5.0f);
    free_weight(&t);
    CHECK(strlen(di_cpu_simd_name()) > 0);
    CHECK(di_cpu_simd_force("no-such-level") == -1);
}

TEST(bandwidth_probe) {
    di_pool *pool = di_pool_create(2);
    double bw = di_cpu_measure_read_bandwidth(pool, (size_t)8 << 20);
    CHECK(bw > 1e8 && bw < 1e13);
    di_pool_free(pool);
}

int main(void) {
    RUN(dtype_e4m3_all_values);
    RUN(dtype_bf16_f16_round_trips);
    RUN(weight_row_f32_matches_scalar);
    RUN(matmul_vs_ref_all_levels);
    RUN(matmul_fast_vs_ref_all_levels);
    RUN(conversion_exact_via_identity);
    RUN(fp8_nan_propagates);
    RUN(batch_and_thread_invariance);
    RUN(edge_sizes);
    RUN(bandwidth_probe);
    return test_summary();
}
