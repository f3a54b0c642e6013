/*
 * test_cpu_ops.c -- the CPU backend's non-matmul ops (cpu_nn.h) against their scalar
 * references on random shapes, test-backend-ops style: normalised error
 * max|fast - ref| / max|ref| under a per-op tolerance. Ops whose fast path does the same
 * arithmetic as the reference (RMSNorm, RoPE, SwiGLU) must match bitwise; the attention
 * (SIMD dot products) within 1e-5. Thread invariance (1 vs 2 threads) is checked bitwise,
 * and the backend vtable is checked to forward to the same kernels; the memory slots and the
 * MoE data-movement ops (copy_rows, moe_combine) against direct loops.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu_nn.h"
#include "backend/cpu/cpu_ops.h"
#include "core/core.h"
#include "test.h"
#define TEST_RAND_SEED 0x2545f4914f6cdd1dull
#include "test_rand.h"

static float *copy_vec(const float *x, int64_t n) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof(float));
    memcpy(v, x, (size_t)n * sizeof(float));
    return v;
}

static di_pool *g_pool1, *g_pool2;

TEST(rmsnorm) {
    for (int iter = 0; iter < 30; iter++) {
        int64_t n = rnd_int(1, 40), dim = rnd_int(1, 700), xs = dim + rnd_int(0, 9);
        float *x = rnd_vec(n * xs, 3.0f), *w = rnd_vec(dim, 1.0f);
        float *yr = calloc((size_t)(n * dim), sizeof(float));
        float *y1 = calloc((size_t)(n * dim), sizeof(float));
        float *y2 = calloc((size_t)(n * dim), sizeof(float));
        di_cpu_rmsnorm_ref(x, xs, w, n, dim, 1e-6f, yr, dim);
        di_cpu_rmsnorm(g_pool1, x, xs, w, n, dim, 1e-6f, y1, dim);
        di_cpu_rmsnorm(g_pool2, x, xs, w, n, dim, 1e-6f, y2, dim);
        CHECK(memcmp(yr, y1, (size_t)(n * dim) * sizeof(float)) == 0);
        CHECK(memcmp(y1, y2, (size_t)(n * dim) * sizeof(float)) == 0);
        /* against a double-precision definition */
        for (int64_t t = 0; t < n; t++) {
            double ss = 0;
            for (int64_t i = 0; i < dim; i++)
                ss += (double)x[t * xs + i] * x[t * xs + i];
            double r = 1.0 / sqrt(ss / (double)dim + 1e-6);
            for (int64_t i = 0; i < dim; i++)
                CHECK_NEAR(yr[t * dim + i], w[i] * x[t * xs + i] * r,
                           1e-5 * (1 + fabs(yr[t * dim + i])));
        }
        free(x), free(w), free(yr), free(y1), free(y2);
    }
}

TEST(rope) {
    for (int iter = 0; iter < 30; iter++) {
        int64_t n = rnd_int(1, 20), nh = rnd_int(1, 6), dr = 2 * rnd_int(1, 40);
        int64_t hs = dr + rnd_int(0, 8), ts = nh * hs + rnd_int(0, 5), half = dr / 2;
        float *x = rnd_vec(n * ts, 1.0f), *cs = rnd_vec(n * half, 1.0f),
              *sn = rnd_vec(n * half, 1.0f);
        bool il = iter % 2 == 0;
        float *xr = copy_vec(x, n * ts), *xf = copy_vec(x, n * ts);
        di_rope_op_params p = {.x = xr,
                               .n_tokens = n,
                               .n_heads = nh,
                               .rope_dim = dr,
                               .tstride = ts,
                               .hstride = hs,
                               .cos = cs,
                               .sin = sn,
                               .interleaved = il};
        di_cpu_rope_ref(&p);
        p.x = xf;
        di_cpu_rope(g_pool2, &p);
        CHECK(memcmp(xr, xf, (size_t)(n * ts) * sizeof(float)) == 0);
        /* the definition: pair i of head h is rotated by (cos, sin)[t][i] */
        for (int64_t t = 0; t < n; t++)
            for (int64_t h = 0; h < nh; h++)
                for (int64_t i = 0; i < half; i++) {
                    int64_t a = t * ts + h * hs + (il ? 2 * i : i), b = a + (il ? 1 : half);
                    float c = cs[t * half + i], s = sn[t * half + i];
                    CHECK_NEAR(xr[a], x[a] * c - x[b] * s, 1e-6);
                    CHECK_NEAR(xr[b], x[b] * c + x[a] * s, 1e-6);
                }
        free(x), free(cs), free(sn), free(xr), free(xf);
    }
}

TEST(silu_mul) {
    for (int iter = 0; iter < 10; iter++) {
        int64_t n = iter < 5 ? rnd_int(1, 1000) : rnd_int(40000, 90000);
        float *g = rnd_vec(n, 8.0f), *u = rnd_vec(n, 2.0f);
        float *yr = calloc((size_t)n, sizeof(float)), *y2 = copy_vec(g, n);
        di_cpu_silu_mul_ref(g, u, n, yr);
        di_cpu_silu_mul(g_pool2, y2, u, n, y2); /* in place */
        CHECK(memcmp(yr, y2, (size_t)n * sizeof(float)) == 0);
        for (int64_t i = 0; i < n; i += 97)
            CHECK_NEAR(yr[i], g[i] / (1.0 + exp(-(double)g[i])) * u[i], 1e-5 * (1 + fabs(yr[i])));
        free(g), free(u), free(yr), free(y2);
    }
}

TEST(vec_helpers) {
    for (int iter = 0; iter < 50; iter++) {
        int64_t n = rnd_int(0, 600);
        float *a = rnd_vec(n, 1.0f), *b = rnd_vec(n, 1.0f);
        double ref = 0;
        for (int64_t i = 0; i < n; i++)
            ref += (double)a[i] * b[i];
        CHECK_NEAR(di_cpu_vec_dot(a, b, n), ref, 1e-5 * (1 + sqrt((double)n)));
        float *y = copy_vec(b, n);
        di_cpu_vec_axpy(0.37f, a, n, y);
        for (int64_t i = 0; i < n; i++)
            CHECK_NEAR(y[i], b[i] + 0.37 * a[i], 1e-6);
        free(a), free(b), free(y);
    }
}

/* Random MLA attention problem; the cache holds pos0 + n rows. */
TEST(mla_attention) {
    for (int iter = 0; iter < 25; iter++) {
        int64_t n = rnd_int(1, 9), nh = rnd_int(1, 5), R = rnd_int(1, 80), dr = 2 * rnd_int(1, 20);
        int64_t pos0 = iter % 3 == 0 ? 0 : rnd_int(0, 60), L = pos0 + n;
        int64_t ts = nh * (dr + 3), hs = dr + 3;
        float *ql = rnd_vec(nh * n * R, 1.0f), *qr = rnd_vec(n * ts, 1.0f);
        float *ckv = rnd_vec(L * R, 1.5f), *kr = rnd_vec(L * dr, 1.5f);
        float *o_ref = calloc((size_t)(nh * n * R), sizeof(float));
        float *o1 = calloc((size_t)(nh * n * R), sizeof(float));
        float *o2 = calloc((size_t)(nh * n * R), sizeof(float));
        float *scratch = malloc((size_t)(2 * L) * sizeof(float));
        di_mla_attn_params p = {.n_tokens = n,
                                .n_heads = nh,
                                .pos0 = pos0,
                                .kv_lora_rank = R,
                                .rope_dim = dr,
                                .scale = 0.3f,
                                .q_lat = ql,
                                .q_rope = qr,
                                .q_rope_tstride = ts,
                                .q_rope_hstride = hs,
                                .c_kv = ckv,
                                .k_rope = kr,
                                .out = o_ref};
        di_cpu_mla_attention_ref(&p);
        p.out = o1;
        di_cpu_mla_attention(g_pool1, &p, scratch, L);
        p.out = o2;
        di_cpu_mla_attention(g_pool2, &p, scratch, L);
        double e = nerr(o1, o_ref, nh * n * R);
        CHECK_MSG(e <= 1e-5, "n=%lld nh=%lld R=%lld dr=%lld pos0=%lld: error %.3g", (long long)n,
                  (long long)nh, (long long)R, (long long)dr, (long long)pos0, e);
        CHECK(memcmp(o1, o2, (size_t)(nh * n * R) * sizeof(float)) == 0);

        /* batch invariance: the last query alone gives the same row bitwise */
        float *o3 = calloc((size_t)(nh * R), sizeof(float));
        float *ql1 = malloc((size_t)(nh * R) * sizeof(float));
        for (int64_t h = 0; h < nh; h++)
            memcpy(ql1 + h * R, ql + (h * n + n - 1) * R, (size_t)R * sizeof(float));
        di_mla_attn_params p1 = p;
        p1.n_tokens = 1;
        p1.pos0 = pos0 + n - 1;
        p1.q_lat = ql1;
        p1.q_rope = qr + (n - 1) * ts;
        p1.out = o3;
        di_cpu_mla_attention(g_pool2, &p1, scratch, L);
        for (int64_t h = 0; h < nh; h++)
            CHECK(memcmp(o3 + h * R, o1 + (h * n + n - 1) * R, (size_t)R * sizeof(float)) == 0);

        /* the definition, in double, for one (head, query) */
        int64_t h = nh - 1, t = n - 1, Lt = pos0 + t + 1;
        double *s = malloc((size_t)Lt * sizeof(double)), mx = -1e300, sum = 0;
        for (int64_t j = 0; j < Lt; j++) {
            double acc = 0;
            for (int64_t i = 0; i < R; i++)
                acc += (double)ql[(h * n + t) * R + i] * ckv[j * R + i];
            for (int64_t i = 0; i < dr; i++)
                acc += (double)qr[t * ts + h * hs + i] * kr[j * dr + i];
            s[j] = acc * 0.3;
            mx = fmax(mx, s[j]);
        }
        for (int64_t j = 0; j < Lt; j++)
            sum += (s[j] = exp(s[j] - mx));
        for (int64_t i = 0; i < R; i++) {
            double o = 0;
            for (int64_t j = 0; j < Lt; j++)
                o += s[j] / sum * ckv[j * R + i];
            CHECK_NEAR(o1[(h * n + t) * R + i], o, 1e-5);
        }
        free(s), free(o3), free(ql1);
        free(ql), free(qr), free(ckv), free(kr), free(o_ref), free(o1), free(o2), free(scratch);
    }
}

/* Paged MLA attention: the same rows scattered over shuffled blocks give the contiguous
 * result bitwise (reference and fast version, 1 and 2 threads). */
TEST(mla_attention_paged) {
    for (int iter = 0; iter < 20; iter++) {
        int64_t n = rnd_int(1, 9), nh = rnd_int(1, 4), R = rnd_int(1, 64), dr = 2 * rnd_int(1, 16);
        int64_t pos0 = rnd_int(0, 70), L = pos0 + n, bs = rnd_int(1, 9);
        int64_t nb = (L + bs - 1) / bs, pool_blocks = nb + 3;
        int64_t ts = nh * dr, hs = dr;
        float *ql = rnd_vec(nh * n * R, 1.0f), *qr = rnd_vec(n * ts, 1.0f);
        float *ckv = rnd_vec(L * R, 1.5f), *kr = rnd_vec(L * dr, 1.5f);
        float *pckv = rnd_vec(pool_blocks * bs * R, 9.0f),
              *pkr = rnd_vec(pool_blocks * bs * dr, 9.0f);
        int32_t *table = malloc((size_t)nb * sizeof(int32_t));
        /* a permutation of the pool's blocks, so that logical and physical order differ */
        int32_t *perm = malloc((size_t)pool_blocks * sizeof(int32_t));
        for (int64_t b = 0; b < pool_blocks; b++)
            perm[b] = (int32_t)b;
        for (int64_t b = pool_blocks - 1; b > 0; b--) {
            int64_t k = rnd_int(0, (int)b);
            int32_t t = perm[b];
            perm[b] = perm[k], perm[k] = t;
        }
        for (int64_t b = 0; b < nb; b++)
            table[b] = perm[b];
        for (int64_t j = 0; j < L; j++) {
            int64_t row = (int64_t)table[j / bs] * bs + j % bs;
            memcpy(pckv + row * R, ckv + j * R, (size_t)R * sizeof(float));
            memcpy(pkr + row * dr, kr + j * dr, (size_t)dr * sizeof(float));
        }
        size_t osz = (size_t)(nh * n * R) * sizeof(float);
        float *o_c = malloc(osz), *o_p = malloc(osz), *o_r = malloc(osz), *o_pr = malloc(osz);
        float *scratch = malloc((size_t)(2 * L) * sizeof(float));
        di_mla_attn_params p = {.n_tokens = n,
                                .n_heads = nh,
                                .pos0 = pos0,
                                .kv_lora_rank = R,
                                .rope_dim = dr,
                                .scale = 0.25f,
                                .q_lat = ql,
                                .q_rope = qr,
                                .q_rope_tstride = ts,
                                .q_rope_hstride = hs,
                                .c_kv = ckv,
                                .k_rope = kr,
                                .out = o_c};
        di_cpu_mla_attention(g_pool2, &p, scratch, L);
        p.out = o_r;
        di_cpu_mla_attention_ref(&p);
        di_mla_attn_params pp = p;
        pp.c_kv = pckv, pp.k_rope = pkr, pp.block_table = table, pp.block_size = bs;
        pp.out = o_p;
        di_cpu_mla_attention(iter % 2 ? g_pool1 : g_pool2, &pp, scratch, L);
        pp.out = o_pr;
        di_cpu_mla_attention_ref(&pp);
        CHECK(memcmp(o_c, o_p, osz) == 0);
        CHECK(memcmp(o_r, o_pr, osz) == 0);

        /* head strides: the same queries inside a wider [nh][n + 3][R] buffer, at row 1 */
        int64_t qhs = (n + 3) * R;
        float *qw = calloc((size_t)(nh * qhs), sizeof(float));
        float *ow = calloc((size_t)(nh * qhs), sizeof(float));
        for (int64_t h = 0; h < nh; h++)
            memcpy(qw + h * qhs + R, ql + h * n * R, (size_t)(n * R) * sizeof(float));
        di_mla_attn_params ps = pp;
        ps.q_lat = qw + R, ps.out = ow + R, ps.q_lat_hstride = qhs, ps.out_hstride = qhs;
        di_cpu_mla_attention(g_pool2, &ps, scratch, L);
        for (int64_t h = 0; h < nh; h++)
            CHECK(memcmp(ow + h * qhs + R, o_c + h * n * R, (size_t)(n * R) * sizeof(float)) == 0);
        free(qw), free(ow);
        free(ql), free(qr), free(ckv), free(kr), free(pckv), free(pkr), free(table), free(perm);
        free(o_c), free(o_p), free(o_r), free(o_pr), free(scratch);
    }
}

/* Per-head products, both directions, strided like the model uses them; BF16 weights. */
TEST(head_matmul) {
    for (int iter = 0; iter < 20; iter++) {
        bool tr = iter % 2 == 0;
        int64_t nh = rnd_int(1, 6), n = rnd_int(1, 7), rows = rnd_int(1, 70),
                cols = rnd_int(1, 300);
        if (iter >= 18) rows = 128, cols = 512, nh = 4; /* large enough to use the pool */
        int64_t in = tr ? rows : cols, out = tr ? cols : rows;
        uint16_t *data = malloc((size_t)(nh * rows * cols) * sizeof(uint16_t));
        for (int64_t i = 0; i < nh * rows * cols; i++)
            data[i] = di_f32_to_bf16(rnd_f());
        di_weight all = {.dtype = DI_DTYPE_BF16,
                         .rows = nh * rows,
                         .cols = cols,
                         .row_stride = cols,
                         .data = data};
        di_weight *w = malloc((size_t)nh * sizeof(di_weight));
        for (int64_t h = 0; h < nh; h++)
            w[h] = di_weight_rows(&all, h * rows, rows);
        /* x token-major [n][nh][in + 2], y head-major [nh][n][out] on odd iterations */
        bool xs = iter % 4 < 2;
        int64_t xh = xs ? in + 2 : n * in, xt = xs ? nh * (in + 2) : in;
        int64_t yh = xs ? n * out : out, yt = xs ? out : nh * out;
        float *x = rnd_vec(nh * n * (in + 2), 1.0f);
        float *yr = calloc((size_t)(nh * n * out), sizeof(float));
        float *y1 = calloc((size_t)(nh * n * out), sizeof(float));
        float *y2 = calloc((size_t)(nh * n * out), sizeof(float));
        di_head_matmul_params p = {.w = w,
                                   .transposed = tr,
                                   .n_heads = nh,
                                   .n_tokens = n,
                                   .x = x,
                                   .x_hstride = xh,
                                   .x_tstride = xt,
                                   .y = yr,
                                   .y_hstride = yh,
                                   .y_tstride = yt};
        di_cpu_head_matmul_ref(&p);
        p.y = y1;
        di_cpu_head_matmul(g_pool1, &p);
        p.y = y2;
        di_cpu_head_matmul(g_pool2, &p);
        CHECK_MSG(nerr(y1, yr, nh * n * out) <= 1e-5, "error %.3g", nerr(y1, yr, nh * n * out));
        CHECK(memcmp(y1, y2, (size_t)(nh * n * out) * sizeof(float)) == 0);
        /* spot-check the definition for one element */
        int64_t h = nh - 1, t = n - 1, o = out - 1;
        double acc = 0;
        for (int64_t i = 0; i < in; i++) {
            float wv = di_bf16_to_f32(tr ? data[(h * rows + i) * cols + o]
                                         : data[(h * rows + o) * cols + i]);
            acc += (double)wv * x[h * xh + t * xt + i];
        }
        CHECK_NEAR(yr[h * yh + t * yt + o], acc, 1e-4 * (1 + fabs(acc)));
        free(data), free(w), free(x), free(yr), free(y1), free(y2);
    }
}

TEST(backend_vtable) {
    di_backend be;
    CHECK(di_backend_cpu_init(&be, g_pool2, 64) == DI_OK);
    CHECK(be.ops->matmul && be.ops->matmul_t && be.ops->head_matmul && be.ops->embed &&
          be.ops->rmsnorm && be.ops->rope && be.ops->mla_attention && be.ops->silu_mul &&
          be.ops->axpy && be.ops->copy2d);
    /* embed: a BF16 table row gather equals the converted rows */
    const int64_t V = 11, D = 13;
    uint16_t *tab = malloc((size_t)(V * D) * sizeof(uint16_t));
    for (int64_t i = 0; i < V * D; i++)
        tab[i] = di_f32_to_bf16(rnd_f());
    di_weight w = {.dtype = DI_DTYPE_BF16, .rows = V, .cols = D, .row_stride = D, .data = tab};
    int32_t ids[3] = {4, 0, 10};
    float out[3 * 13];
    be.ops->embed(be.ctx, &w, ids, 3, out);
    for (int t = 0; t < 3; t++)
        for (int64_t i = 0; i < D; i++)
            CHECK(out[t * D + i] == di_bf16_to_f32(tab[ids[t] * D + i]));
    /* copy2d and axpy */
    float src[12], dst[12] = {0};
    for (int i = 0; i < 12; i++)
        src[i] = (float)i;
    be.ops->copy2d(be.ctx, dst, 4, src + 1, 6, 2, 3);
    CHECK(dst[0] == 1 && dst[2] == 3 && dst[4] == 7 && dst[6] == 9 && dst[3] == 0);
    be.ops->axpy(be.ctx, 2.0f, src, 12, dst);
    CHECK(dst[0] == 1 && dst[11] == 22);
    free(tab);
    di_backend_free(&be);
}

/* The memory slots and the two data-movement ops the model uses (copy_rows, moe_combine). */
TEST(memory_and_moe_ops) {
    di_backend be;
    CHECK(di_backend_cpu_init(&be, g_pool2, 64) == DI_OK);
    const di_backend_ops *o = be.ops;
    CHECK(o->host_memory && o->buf_alloc && o->buf_free && o->upload && o->download &&
          o->fill_zero && o->sync && !o->weight_upload && o->copy_rows && o->moe_combine);
    /* buf_alloc zero-fills; upload / download round trip; fill_zero */
    const int64_t n = 1000;
    float *buf = o->buf_alloc(be.ctx, (size_t)n * sizeof(float));
    CHECK(buf != NULL);
    int nonzero = 0;
    for (int64_t i = 0; i < n; i++)
        nonzero += buf[i] != 0.0f;
    CHECK_EQ_INT(nonzero, 0);
    float *h = rnd_vec(n, 1.0f), *back = malloc((size_t)n * sizeof(float));
    CHECK(o->upload(be.ctx, buf, h, (size_t)n * sizeof(float)) == DI_OK);
    CHECK(o->download(be.ctx, back, buf, (size_t)n * sizeof(float)) == DI_OK);
    CHECK(memcmp(back, h, (size_t)n * sizeof(float)) == 0);
    o->fill_zero(be.ctx, buf + 10, 5 * sizeof(float));
    CHECK(buf[9] == h[9] && buf[10] == 0.0f && buf[14] == 0.0f && buf[15] == h[15]);
    CHECK(o->sync(be.ctx) == DI_OK);
    o->buf_free(be.ctx, buf);

    /* copy_rows: a gather (strided source), then a scatter of the result */
    const int64_t rows = 9, cols = 7, ss = 10, ds = 8;
    float *src = rnd_vec(rows * ss, 1.0f), *g = calloc((size_t)(6 * cols), sizeof(float));
    int32_t gi[6] = {8, 0, 3, 3, 5, 1}, si[6] = {2, 7, 0, 4, 6, 1};
    o->copy_rows(be.ctx, g, cols, NULL, src + 1, ss, gi, 6, cols);
    int bad = 0;
    for (int64_t i = 0; i < 6; i++)
        for (int64_t c = 0; c < cols; c++)
            bad += g[i * cols + c] != src[gi[i] * ss + 1 + c];
    float *dst = calloc((size_t)(rows * ds), sizeof(float));
    o->copy_rows(be.ctx, dst, ds, si, g, cols, NULL, 6, cols);
    for (int64_t i = 0; i < 6; i++)
        for (int64_t c = 0; c < cols; c++)
            bad += dst[si[i] * ds + c] != g[i * cols + c];
    bad += dst[3 * ds] != 0.0f || dst[8 * ds] != 0.0f || dst[ds - 1] != 0.0f;
    CHECK_EQ_INT(bad, 0);

    /* moe_combine: bitwise the zero-then-axpy-per-slot sequence, close to a double sum */
    const int64_t T = 5, K = 3, D = 33, NR = T * K;
    float *er = rnd_vec(NR * D, 2.0f), *w = rnd_vec(T * K, 1.0f);
    int32_t pos[15];
    for (int64_t i = 0; i < NR; i++)
        pos[i] = (int32_t)((i * 7) % NR); /* a permutation: grouped rows in another order */
    float *out = malloc((size_t)(T * D) * sizeof(float)), *ref = calloc((size_t)(T * D), 4);
    o->moe_combine(be.ctx, er, pos, w, T, K, D, out);
    double worst = 0.0;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t k = 0; k < K; k++)
            di_cpu_axpy(NULL, w[t * K + k], er + pos[t * K + k] * D, D, ref + t * D);
        for (int64_t c = 0; c < D; c++) {
            double sum = 0.0;
            for (int64_t k = 0; k < K; k++)
                sum += (double)w[t * K + k] * er[pos[t * K + k] * D + c];
            worst = fmax(worst, fabs(sum - out[t * D + c]));
        }
    }
    CHECK(memcmp(out, ref, (size_t)(T * D) * sizeof(float)) == 0);
    CHECK_MSG(worst <= 1e-5, "moe_combine vs double: %.3g", worst);
    free(h), free(back), free(src), free(g), free(dst), free(er), free(w), free(out), free(ref);
    di_backend_free(&be);
}

int main(void) {
    g_pool1 = di_pool_create(1);
    g_pool2 = di_pool_create(2);
    RUN(rmsnorm);
    RUN(rope);
    RUN(silu_mul);
    RUN(vec_helpers);
    RUN(mla_attention);
    RUN(mla_attention_paged);
    RUN(head_matmul);
    RUN(backend_vtable);
    RUN(memory_and_moe_ops);
    di_pool_free(g_pool1);
    di_pool_free(g_pool2);
    return test_summary();
}
