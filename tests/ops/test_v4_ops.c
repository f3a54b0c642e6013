/*
 * test_v4_ops.c -- the DeepSeek-V4 CPU ops (cpu_v4_ops.h) against their scalar references
 * and against direct definitions, on random shapes (test-backend-ops style: normalised error
 * max|fast - ref| / max|ref| under a per-op tolerance), plus 1- vs 2-thread bitwise
 * invariance and the backend vtable forwarding.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_v4_ops.h"
#include "core/core.h"
#include "test.h"
#define TEST_RAND_SEED 0x9e3779b97f4a7c15ull
#include "test_rand.h"
#include "test_fp4_util.h"
#include "test_route_util.h"

#include <math.h>

static di_pool *g_pool1, *g_pool2;

/* A random [rows][cols] FP4 weight (test_fp4_util.h) with E8M0 scales 2^(e - 127), e in
 * [lo_e, hi_e], one per 32 columns; *q and *sc own its nibbles and scales. */
static di_weight rnd_fp4(int64_t rows, int64_t cols, int lo_e, int hi_e, uint8_t **q,
                         uint8_t **sc) {
    const fp4_weight t = make_fp4(rows, cols, 0, 32, lo_e, hi_e);
    *q = t.q, *sc = t.sc;
    return t.w;
}

TEST(matmul_fp4) {
    for (int iter = 0; iter < 20; iter++) {
        int64_t rows = rnd_int(1, 300), cols = 32 * rnd_int(1, 12), n = rnd_int(1, 9);
        uint8_t *q, *sc;
        di_weight w = rnd_fp4(rows, cols, 127 - 8, 127 + 2, &q, &sc);
        /* The same matrix dequantized to F32, through the stock reference matmul. */
        float *deq = malloc((size_t)(rows * cols) * sizeof(float));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                uint8_t b = q[(r * cols + c) / 2];
                deq[r * cols + c] = di_e2m1_table[(c & 1) ? (b >> 4) : (b & 15)] *
                                    ldexpf(1.0f, sc[r * (cols / 32) + c / 32] - 127);
            }
        di_weight wf = {
            .dtype = DI_DTYPE_F32, .rows = rows, .cols = cols, .row_stride = cols, .data = deq};
        float *x = rnd_vec(n * cols, 2.0f);
        float *yr = malloc((size_t)(n * rows) * sizeof(float));
        float *yd = malloc((size_t)(n * rows) * sizeof(float));
        float *y1 = malloc((size_t)(n * rows) * sizeof(float));
        float *y2 = malloc((size_t)(n * rows) * sizeof(float));
        di_cpu_matmul_fp4_ref(&w, x, n, yr);
        di_cpu_matmul_ref(&wf, x, n, yd);
        di_cpu_matmul_fp4(g_pool1, &w, x, n, y1);
        di_cpu_matmul_fp4(g_pool2, &w, x, n, y2);
        CHECK(nerr(yr, yd, n * rows) <= 1e-6);
        CHECK(nerr(y1, yr, n * rows) <= 1e-5);
        CHECK(memcmp(y1, y2, (size_t)(n * rows) * sizeof(float)) == 0);
        /* The scalar level too (the fast level is the CPU's best). */
        float *ys = malloc((size_t)(n * rows) * sizeof(float));
        CHECK(di_cpu_simd_force("scalar") == 0);
        di_cpu_matmul_fp4(g_pool2, &w, x, n, ys);
        CHECK(di_cpu_simd_force(NULL) == 0);
        CHECK(nerr(ys, yr, n * rows) <= 1e-5);
        free(ys);
        /* Batch invariance: the last row alone gives the same bits. */
        di_cpu_matmul_fp4(g_pool2, &w, x + (n - 1) * cols, 1, y2);
        CHECK(memcmp(y1 + (n - 1) * rows, y2, (size_t)rows * sizeof(float)) == 0);
        free(q), free(sc), free(deq), free(x), free(yr), free(yd), free(y1), free(y2);
    }
}

/* Every SIMD level this CPU has, on shapes whose 32-column group count is odd (FP4 rows are
 * whole 32-column groups; odd counts catch any pairing of groups), row counts that are not a
 * multiple of the 4-row kernel: against the reference, batch invariance (n = 1, 3, 17 vs
 * each token alone, bitwise) and thread invariance (1 vs 2 threads, bitwise). */
TEST(matmul_fp4_levels) {
    static const char *levels[] = {"avx512", "avx2", "neon", "scalar"};
    static const int64_t ns[] = {1, 3, 17};
    for (size_t lv = 0; lv < sizeof levels / sizeof levels[0]; lv++) {
        if (di_cpu_simd_force(levels[lv]) != 0) continue; /* not on this CPU */
        for (int iter = 0; iter < 6; iter++) {
            int64_t rows = rnd_int(1, 70), cols = 32 * (2 * rnd_int(0, 40) + 1);
            uint8_t *q, *sc;
            di_weight w = rnd_fp4(rows, cols, 127 - 20, 127 + 20, &q, &sc);
            for (size_t k = 0; k < 3; k++) {
                const int64_t n = ns[k];
                float *x = rnd_vec(n * cols, 3.0f);
                float *yr = malloc((size_t)(n * rows) * sizeof(float));
                float *y1 = malloc((size_t)(n * rows) * sizeof(float));
                float *y2 = malloc((size_t)(n * rows) * sizeof(float));
                float *yt = malloc((size_t)rows * sizeof(float));
                di_cpu_matmul_fp4_ref(&w, x, n, yr);
                di_cpu_matmul_fp4(g_pool1, &w, x, n, y1);
                di_cpu_matmul_fp4(g_pool2, &w, x, n, y2);
                CHECK(nerr(y1, yr, n * rows) <= 1e-5);
                CHECK(memcmp(y1, y2, (size_t)(n * rows) * sizeof(float)) == 0);
                for (int64_t t = 0; t < n; t++) {
                    di_cpu_matmul_fp4(g_pool2, &w, x + t * cols, 1, yt);
                    CHECK(memcmp(y1 + t * rows, yt, (size_t)rows * sizeof(float)) == 0);
                }
                free(x), free(yr), free(y1), free(y2), free(yt);
            }
            free(q), free(sc);
        }
        /* Wide rows: 7168 (a V3-sized hidden dim), the kernels' widest (DI_FP4_MAX_COLS = 16384)
         * and one group past it (the scalar rows take that one). */
        static const int64_t wide[] = {7168, 16384, 16384 + 32};
        for (size_t k = 0; k < 3; k++) {
            uint8_t *q, *sc;
            const int64_t rows = 9, cols = wide[k], n = 5;
            di_weight w = rnd_fp4(rows, cols, 127 - 4, 127 + 4, &q, &sc);
            float *x = rnd_vec(n * cols, 1.0f);
            float *yr = malloc((size_t)(n * rows) * sizeof(float));
            float *y1 = malloc((size_t)(n * rows) * sizeof(float));
            float *yt = malloc((size_t)rows * sizeof(float));
            di_cpu_matmul_fp4_ref(&w, x, n, yr);
            di_cpu_matmul_fp4(g_pool2, &w, x, n, y1);
            CHECK(nerr(y1, yr, n * rows) <= 1e-5);
            di_cpu_matmul_fp4(g_pool1, &w, x + 4 * cols, 1, yt);
            CHECK(memcmp(y1 + 4 * rows, yt, (size_t)rows * sizeof(float)) == 0);
            free(q), free(sc), free(x), free(yr), free(y1), free(yt);
        }
        /* A wide matrix, so that the pool really splits rows and x blocks are reused. */
        uint8_t *q, *sc;
        const int64_t rows = 131, cols = 32 * 65, n = 17;
        di_weight w = rnd_fp4(rows, cols, 127 - 4, 127 + 4, &q, &sc);
        float *x = rnd_vec(n * cols, 1.0f);
        float *yr = malloc((size_t)(n * rows) * sizeof(float));
        float *y1 = malloc((size_t)(n * rows) * sizeof(float));
        float *y2 = malloc((size_t)(n * rows) * sizeof(float));
        di_cpu_matmul_fp4_ref(&w, x, n, yr);
        di_cpu_matmul_fp4(g_pool1, &w, x, n, y1);
        di_cpu_matmul_fp4(g_pool2, &w, x, n, y2);
        CHECK(nerr(y1, yr, n * rows) <= 1e-5);
        CHECK(memcmp(y1, y2, (size_t)(n * rows) * sizeof(float)) == 0);
        free(q), free(sc), free(x), free(yr), free(y1), free(y2);
    }
    CHECK(di_cpu_simd_force(NULL) == 0);
}

/* E8M0 edge bytes as dtype.h defines them: 0 is 2^-127 (a subnormal), 0xff is NaN; every
 * level agrees with the reference on them. */
TEST(matmul_fp4_e8m0_edges) {
    static const char *levels[] = {"avx512", "avx2", "neon", "scalar"};
    const int64_t rows = 6, cols = 64;
    uint8_t *q, *sc;
    di_weight w = rnd_fp4(rows, cols, 127, 127, &q, &sc);
    for (int64_t i = 0; i < rows * cols / 2; i++)
        q[i] = 0x22;        /* every weight 1.0 */
    sc[0] = 0, sc[1] = 0;   /* row 0: 2^-127 x 64 columns */
    sc[2] = 0xff;           /* row 1: NaN */
    sc[4] = 200, sc[5] = 1; /* row 2: 2^73 and 2^-126 */
    float x[64], y[6], yr[6];
    for (int i = 0; i < 64; i++)
        x[i] = 1.0f;
    di_cpu_matmul_fp4_ref(&w, x, 1, yr);
    CHECK(yr[0] == 64.0f * 0x1p-127f);
    CHECK(isnan(yr[1]));
    CHECK(yr[2] == (float)(32.0 * 0x1p73 + 32.0 * 0x1p-126));
    for (size_t lv = 0; lv < sizeof levels / sizeof levels[0]; lv++) {
        if (di_cpu_simd_force(levels[lv]) != 0) continue;
        di_cpu_matmul_fp4(g_pool1, &w, x, 1, y);
        CHECK(y[0] == yr[0]);
        CHECK(isnan(y[1]));
        CHECK(y[2] == yr[2]);
        CHECK(memcmp(y + 3, yr + 3, 3 * sizeof(float)) == 0);
    }
    CHECK(di_cpu_simd_force(NULL) == 0);
    free(q), free(sc);
}

TEST(hc_pre_post) {
    for (int iter = 0; iter < 20; iter++) {
        int64_t n = rnd_int(1, 17), nh = rnd_int(1, 5), D = rnd_int(1, 90);
        int64_t iters = iter % 4 == 0 ? 0 : rnd_int(1, 20);
        int64_t nm = iters ? (2 + nh) * nh : nh;
        float *x = rnd_vec(n * nh * D, 2.0f), *fn = rnd_vec(nm * nh * D, 0.3f);
        float *base = rnd_vec(nm, 1.0f), *scale = rnd_vec(3, 1.0f);
        float *h[2], *post[2], *mix[2];
        for (int k = 0; k < 2; k++) {
            h[k] = calloc((size_t)(n * D), sizeof(float));
            post[k] = calloc((size_t)(n * nh), sizeof(float));
            mix[k] = calloc((size_t)(n * nh * nh), sizeof(float));
        }
        di_v4_hc_params p = {.n_tokens = n,
                             .n_hc = nh,
                             .dim = D,
                             .x = x,
                             .fn = fn,
                             .base = base,
                             .scale = scale,
                             .iters = iters,
                             .eps = 1e-6f,
                             .hc_eps = 1e-6f,
                             .h = h[0],
                             .post = post[0],
                             .mix = mix[0]};
        di_cpu_v4_hc_pre_ref(&p);
        p.h = h[1], p.post = post[1], p.mix = mix[1];
        di_cpu_v4_hc_pre(g_pool2, &p);
        CHECK(memcmp(h[0], h[1], (size_t)(n * D) * sizeof(float)) == 0);
        if (iters) {
            CHECK(memcmp(mix[0], mix[1], (size_t)(n * nh * nh) * sizeof(float)) == 0);
            /* Sinkhorn ends on a column normalisation: every column sums to ~1. */
            for (int64_t t = 0; t < n; t++)
                for (int64_t k = 0; k < nh; k++) {
                    double s = 0;
                    for (int64_t j = 0; j < nh; j++)
                        s += mix[0][(t * nh + j) * nh + k];
                    CHECK_NEAR(s, 1.0, 1e-4);
                }
            /* Stream update against its definition. */
            float *y = rnd_vec(n * D, 1.0f), *out = malloc((size_t)(n * nh * D) * sizeof(float));
            di_cpu_v4_hc_post(g_pool2, n, nh, D, x, y, post[0], mix[0], out);
            float *want = malloc((size_t)(n * nh * D) * sizeof(float));
            for (int64_t t = 0; t < n; t++)
                for (int64_t k = 0; k < nh; k++)
                    for (int64_t d = 0; d < D; d++) {
                        double s = post[0][t * nh + k] * y[t * D + d];
                        for (int64_t j = 0; j < nh; j++)
                            s += mix[0][(t * nh + j) * nh + k] * x[(t * nh + j) * D + d];
                        want[(t * nh + k) * D + d] = (float)s;
                    }
            CHECK(nerr(out, want, n * nh * D) <= 1e-6);
            free(y), free(out), free(want);
        }
        free(x), free(fn), free(base), free(scale);
        for (int k = 0; k < 2; k++)
            free(h[k]), free(post[k]), free(mix[k]);
    }
}

TEST(sink_attention) {
    for (int iter = 0; iter < 20; iter++) {
        int64_t n = rnd_int(1, 9), H = rnd_int(1, 6), d = rnd_int(1, 80), nk = rnd_int(1, 40);
        /* scratch rows: one per token (token-parallel) or more (per-worker head split) */
        int64_t MK = nk + 3;
        float *kv = rnd_vec(nk * d, 1.0f), *q = rnd_vec(n * H * d, 2.0f);
        float *sinks = rnd_vec(H, 2.0f);
        const float **keys = malloc((size_t)(n * MK) * sizeof *keys);
        int32_t *cnt = malloc((size_t)n * sizeof *cnt);
        for (int64_t t = 0; t < n; t++) {
            cnt[t] = (int32_t)rnd_int(1, nk);
            for (int64_t j = 0; j < cnt[t]; j++)
                keys[t * MK + j] = kv + rnd_int(0, nk - 1) * d;
        }
        float *o_ref = calloc((size_t)(n * H * d), sizeof(float));
        float *o1 = calloc((size_t)(n * H * d), sizeof(float));
        float *o2 = calloc((size_t)(n * H * d), sizeof(float));
        float *scr = malloc((size_t)(n * MK) * sizeof(float));
        di_v4_attn_params p = {.n_tokens = n,
                               .n_heads = H,
                               .dim = d,
                               .scale = 0.2f,
                               .q = q,
                               .q_tstride = H * d,
                               .sinks = sinks,
                               .keys = keys,
                               .n_keys = cnt,
                               .max_keys = MK,
                               .out = o_ref,
                               .out_tstride = H * d,
                               .scratch = scr,
                               .scratch_rows = n};
        di_cpu_v4_attention_ref(&p);
        p.out = o1;
        di_cpu_v4_attention(g_pool1, &p);
        p.out = o2;
        di_cpu_v4_attention(g_pool2, &p);
        CHECK(nerr(o1, o_ref, n * H * d) <= 1e-5);
        CHECK(memcmp(o1, o2, (size_t)(n * H * d) * sizeof(float)) == 0);
        /* Direct definition for token 0, head 0 (double). */
        double l[64], mx = sinks[0], den = 0;
        for (int64_t j = 0; j < cnt[0]; j++) {
            double s = 0;
            for (int64_t i = 0; i < d; i++)
                s += (double)q[i] * keys[j][i];
            l[j] = 0.2 * s;
            mx = fmax(mx, l[j]);
        }
        for (int64_t j = 0; j < cnt[0]; j++)
            den += exp(l[j] - mx);
        den += exp(sinks[0] - mx);
        for (int64_t i = 0; i < d; i++) {
            double o = 0;
            for (int64_t j = 0; j < cnt[0]; j++)
                o += exp(l[j] - mx) / den * keys[j][i];
            CHECK_NEAR(o_ref[i], o, 1e-5);
        }
        free(kv), free(q), free(sinks), free(keys), free(cnt), free(o_ref), free(o1), free(o2),
            free(scr);
    }
}

TEST(index_scores_pool_swiglu) {
    int64_t n = 7, nh = 12, d = 24, ne = 30;
    float *q = rnd_vec(n * nh * d, 1.0f), *w = rnd_vec(n * nh, 1.0f), *k = rnd_vec(ne * d, 1.0f);
    int64_t vis[7] = {0, 1, 5, 12, 30, 30, 17};
    float *s_ref = calloc((size_t)(n * ne), sizeof(float)), *s1 = calloc((size_t)(n * ne), 4);
    di_v4_index_params p = {.n_tokens = n,
                            .n_heads = nh,
                            .dim = d,
                            .scale = 0.1f,
                            .q = q,
                            .weights = w,
                            .keys = k,
                            .n_visible = vis,
                            .out = s_ref,
                            .out_stride = ne};
    di_cpu_v4_index_scores_ref(&p);
    p.out = s1;
    di_cpu_v4_index_scores(g_pool2, &p);
    CHECK(nerr(s1, s_ref, n * ne) <= 1e-5);
    float *s2 = calloc((size_t)(n * ne), sizeof(float));
    p.out = s2;
    di_cpu_v4_index_scores(g_pool1, &p);
    CHECK(memcmp(s1, s2, (size_t)(n * ne) * sizeof(float)) == 0); /* thread invariance */
    free(s2);
    double s = 0; /* token 6, entry 3 by definition */
    for (int64_t h = 0; h < nh; h++) {
        double dot = 0;
        for (int64_t i = 0; i < d; i++)
            dot += (double)q[(6 * nh + h) * d + i] * k[3 * d + i];
        s += w[6 * nh + h] * fmax(dot, 0.0);
    }
    CHECK_NEAR(s_ref[6 * ne + 3], 0.1 * s, 1e-5);

    /* Pooling: per-channel softmax of z weighting c. */
    float *c = rnd_vec(5 * 9, 2.0f), *z = rnd_vec(5 * 9, 3.0f), out[9];
    const float *cp[5], *zp[5];
    for (int i = 0; i < 5; i++)
        cp[i] = c + i * 9, zp[i] = z + i * 9;
    di_v4_pool_params pp = {.n_slots = 5, .width = 9, .c = cp, .z = zp, .out = out};
    di_cpu_v4_pool(g_pool1, &pp);
    for (int ch = 0; ch < 9; ch++) {
        double num = 0, den = 0;
        for (int i = 0; i < 5; i++)
            num += exp(z[i * 9 + ch]) * c[i * 9 + ch], den += exp(z[i * 9 + ch]);
        CHECK_NEAR(out[ch], num / den, 1e-5);
    }

    float g[3] = {5.0f, -1.0f, 0.5f}, u[3] = {-7.0f, 3.0f, 0.25f}, a[3];
    di_cpu_v4_swiglu(g_pool1, g, u, 3, 1.5f, a);
    CHECK_NEAR(a[0], 1.5 / (1 + exp(-1.5)) * -1.5, 1e-6); /* gate max-clamped, up both ways */
    CHECK_NEAR(a[1], -1.0 / (1 + exp(1.0)) * 1.5, 1e-6);
    CHECK_NEAR(a[2], 0.5 / (1 + exp(-0.5)) * 0.25, 1e-6);
    free(q), free(w), free(k), free(s_ref), free(s1), free(c), free(z);
}

/* Hash routing through moe_route (V4's first layers): each token's experts are its row of
 * the table, in slot order (repeats allowed), weighted by the definition -- transformers'
 * DeepseekV4 hash gate: sqrt(softplus) scores of the given experts (rounded to float),
 * divided by their sum + 1e-20, times routed_scaling_factor -- and grouped by expert
 * (tokens in order inside an expert). */
TEST(moe_route_hash) {
    di_backend cpu;
    CHECK(di_backend_cpu_init(&cpu, g_pool1, 16) == DI_OK);
    for (int iter = 0; iter < 12; iter++) {
        di_router_params r = test_router_config(3);
        r.n_experts = rnd_int(2, 300), r.top_k = rnd_int(1, DI_MIN(8, r.n_experts));
        const int64_t E = r.n_experts, K = r.top_k, V = 50, n = rnd_int(1, 40), nk = n * K;
        int32_t *table = malloc((size_t)(V * K) * sizeof *table), *tok = malloc((size_t)n * 4);
        for (int64_t i = 0; i < V * K; i++) /* every third row repeats its first expert */
            table[i] = i / K % 3 == 0 && i % K ? table[i - i % K] : rnd_int(0, (int)E - 1);
        for (int64_t t = 0; t < n; t++)
            tok[t] = rnd_int(0, V - 1);
        float *lg = rnd_vec(n * E, 4.0f);
        route_bufs b = route_host_alloc(E, nk);
        route_run_hash(&cpu, &r, n, lg, table, tok, &b);
        int64_t bad = 0, prev_g = -1;
        for (int64_t t = 0; t < n; t++) {
            double s[8], sum = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const double x = lg[t * E + table[tok[t] * K + k]];
                s[k] = (float)sqrt(x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x)));
                sum += s[k];
            }
            for (int64_t k = 0; k < K; k++) {
                const int64_t i = t * K + k, g = b.rows[i], e = table[tok[t] * K + k];
                const float want = (float)(s[k] / (sum + 1e-20) * r.routed_scaling_factor);
                bad += b.w[i] != want || g < b.off[e] || g >= b.off[e + 1] || b.src[g] != t;
            }
        }
        int64_t a = 0;
        for (int64_t e = 0; e < E; e++) { /* offsets ascending, active = nonempty */
            if (b.off[e + 1] > b.off[e]) bad += b.act[1 + a++] != e;
            bad += b.off[e + 1] < b.off[e];
            for (int64_t g = b.off[e] + 1; g < b.off[e + 1]; g++)
                bad += b.src[g] < b.src[g - 1]; /* tokens in order inside an expert */
            prev_g = b.off[e + 1];
        }
        bad += b.act[0] != a || b.off[0] != 0;
        /* each expert's rows as many as the table's uses of it; rows_of one-to-one */
        int64_t *uses = calloc((size_t)E, sizeof *uses), *hits = calloc((size_t)nk, sizeof *hits);
        for (int64_t t = 0; t < n; t++)
            for (int64_t k = 0; k < K; k++)
                uses[table[tok[t] * K + k]]++;
        for (int64_t e = 0; e < E; e++)
            bad += b.off[e + 1] - b.off[e] != uses[e];
        for (int64_t i = 0; i < nk; i++)
            if (b.rows[i] >= 0 && b.rows[i] < nk) bad += hits[b.rows[i]]++ != 0;
        free(uses), free(hits);
        CHECK_MSG(bad == 0 && prev_g == nk, "hash routing E=%lld K=%lld n=%lld: %lld mismatches",
                  (long long)E, (long long)K, (long long)n, (long long)bad);
        route_host_free(&b);
        free(table), free(tok), free(lg);
    }
    di_backend_free(&cpu);
}

TEST(vtable) {
    di_backend be;
    CHECK(di_backend_cpu_init(&be, g_pool2, 64) == DI_OK);
    CHECK(be.ops->matmul_fp4 && be.ops->v4_hc_pre && be.ops->v4_hc_post && be.ops->v4_attention &&
          be.ops->v4_pool && be.ops->v4_index_scores && be.ops->v4_swiglu);
    di_backend_free(&be);
}

int main(void) {
    g_pool1 = di_pool_create(1);
    g_pool2 = di_pool_create(2);
    RUN(matmul_fp4);
    RUN(matmul_fp4_levels);
    RUN(matmul_fp4_e8m0_edges);
    RUN(hc_pre_post);
    RUN(sink_attention);
    RUN(index_scores_pool_swiglu);
    RUN(moe_route_hash);
    RUN(vtable);
    di_pool_free(g_pool1);
    di_pool_free(g_pool2);
    return test_summary();
}
