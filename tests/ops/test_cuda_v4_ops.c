/*
 * test_cuda_v4_ops.c -- the CUDA backend's DeepSeek-V4 ops (cuda_v4.cu) against the CPU
 * references (cpu_v4_ops.c) on random shapes, test-backend-ops style: normalised error
 * max|gpu - ref| / max|ref| under a per-op tolerance, outputs poisoned with NaN before each
 * run so that an unwritten element fails.
 *
 * Beyond accuracy it checks batch invariance bitwise: a token's results are the same when it
 * runs alone as inside a batch (the first, a middle and the last token), and FP4 experts'
 * grouped rows (matmul_experts) are the same as each expert's rows through matmul_fp4.
 *
 * Pointer lists (v4_attention's keys, v4_pool's c / z) are device arrays of device row
 * pointers on this backend (cuda_backend.h); the helpers below build them from the host.
 *
 * On a machine without a CUDA device (or a build without CUDA) it prints why and counts as
 * skipped (exit status 0).
 */
#include "backend/backend.h"
#include "backend/cpu/cpu_v4_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "core/core.h"
#include "test.h"
#define TEST_RAND_SEED 0x2545f4914f6cdd1dull
#include "test_rand.h"
#include "test_cuda_util.h"
#include "test_fp4_util.h"

/* A host array of n NaNs (CPU-reference outputs, so that unwritten elements show). */
static float *nan_vec(int64_t n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        h[i] = NAN;
    return h;
}

/* A device array of device pointers: dev_base + (host[i] - host_base) for each i. */
static const float **dev_ptr_list(const float *const *host, int64_t n, const float *host_base,
                                  const float *dev_base) {
    const float **h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    for (int64_t i = 0; i < n; i++)
        h[i] = host[i] ? dev_base + (host[i] - host_base) : NULL;
    const float **d = dev_from(h, (size_t)n * sizeof *h);
    free(h);
    return d;
}

static bool same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* ---------------------------------------------------------------------------------------- */
/* FP4 matmul                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static float *gpu_fp4(const di_weight *dw, const float *x, int64_t n) {
    float *dx = dev_floats(x, n * dw->cols), *dy = dev_poison(n * dw->rows);
    g_be.ops->matmul_fp4(g_be.ctx, dw, dx, n, dy);
    float *y = host_floats(dy, n * dw->rows);
    dfree(dx), dfree(dy);
    return y;
}

static void check_fp4(int64_t rows, int64_t cols, int64_t extra, int64_t bc, int64_t n, int lo_e,
                      int hi_e) {
    fp4_weight t = make_fp4(rows, cols, extra, bc, lo_e, hi_e);
    float *x = rnd_vec(n * cols, 2.0f), *ref = malloc((size_t)(n * rows) * sizeof(float));
    di_cpu_matmul_fp4_ref(&t.w, x, n, ref);
    di_weight dw;
    di_status st = di_cuda_weight_upload(&g_be, &t.w, &dw);
    CHECK_MSG(st == DI_OK, "upload: %s", di_last_error());
    float *y = gpu_fp4(&dw, x, n);
    const double e = nerr(y, ref, n * rows);
    CHECK_MSG(e <= 1e-5, "rows=%lld cols=%lld bc=%lld n=%lld: error %.3g", (long long)rows,
              (long long)cols, (long long)bc, (long long)n, e);
    const int64_t probes[3] = {0, n / 2, n - 1};
    for (int k = 0; k < 3 && n > 1; k++) {
        float *y1 = gpu_fp4(&dw, x + probes[k] * cols, 1);
        CHECK_MSG(same_bits(y1, y + probes[k] * rows, rows),
                  "rows=%lld cols=%lld n=%lld: token %lld alone differs", (long long)rows,
                  (long long)cols, (long long)n, (long long)probes[k]);
        free(y1);
    }
    di_cuda_weight_free(&g_be, &dw);
    free(x), free(ref), free(y), free(t.q), free(t.sc);
}

TEST(matmul_fp4) {
    if (!g_have_gpu) SKIP("no CUDA device");
    static const int64_t ns[] = {1, 2, 3, 4, 5, 9, 17};
    for (int it = 0; it < 16; it++)
        check_fp4(rnd_int(1, 300), 32 * rnd_int(1, 40), it % 3 ? 0 : 32 * rnd_int(1, 3), 32,
                  ns[rnd_u32() % DI_ARRAY_LEN(ns)], 127 - 8, 127 + 2);
    /* odd widths (a partial last segment, element-wise loads), other block widths (16: the
     * per-element scale path; 64 and 96: one scale per segment) */
    check_fp4(37, 77, 3, 32, 3, 120, 130);
    check_fp4(50, 200, 0, 16, 2, 120, 130);
    check_fp4(21, 1000, 10, 48, 5, 120, 130);
    check_fp4(64, 640, 0, 64, 4, 120, 130);
    check_fp4(9, 960, 0, 96, 1, 120, 130);
    /* V4-Flash expert shapes */
    check_fp4(2048, 4096, 0, 32, 3, 127 - 8, 127 + 2);
    check_fp4(4096, 2048, 0, 32, 1, 127 - 8, 127 + 2);
    /* rows of >= 128 segments split over 4 warps: odd row counts, up to 8 tokens per
     * group and more groups, a partial last segment, the per-element scale path */
    check_fp4(37, 4160, 0, 32, 17, 127 - 8, 127 + 2);
    check_fp4(6, 8192, 64, 32, 8, 127 - 8, 127 + 2);
    check_fp4(9, 4101, 5, 16, 5, 120, 130);
}

/* E8M0 edge bytes: 0 is 2^-127, 0xff is NaN (dtype.h's definition). */
TEST(matmul_fp4_e8m0_edges) {
    if (!g_have_gpu) SKIP("no CUDA device");
    fp4_weight t = make_fp4(6, 64, 0, 32, 127, 127);
    for (int64_t i = 0; i < 6 * 32; i++)
        t.q[i] = 0x22;          /* every weight 1.0 */
    t.sc[0] = 0, t.sc[1] = 0;   /* row 0: 2^-127 */
    t.sc[2] = 0xff;             /* row 1: NaN */
    t.sc[4] = 200, t.sc[5] = 1; /* row 2: 2^73 and 2^-126 */
    float x[64], yr[6];
    for (int i = 0; i < 64; i++)
        x[i] = 1.0f;
    di_cpu_matmul_fp4_ref(&t.w, x, 1, yr);
    di_weight dw;
    CHECK(di_cuda_weight_upload(&g_be, &t.w, &dw) == DI_OK);
    float *y = gpu_fp4(&dw, x, 1);
    CHECK(y[0] == yr[0]);
    CHECK(isnan(y[1]));
    CHECK(y[2] == yr[2]);
    CHECK(same_bits(y + 3, yr + 3, 3));
    di_cuda_weight_free(&g_be, &dw);
    free(y), free(t.q), free(t.sc);
}

/* The op forwards other dtypes to the plain matmul (backend.h). */
TEST(matmul_fp4_forwards) {
    if (!g_have_gpu) SKIP("no CUDA device");
    const int64_t rows = 33, cols = 70, n = 3;
    float *wf = rnd_vec(rows * cols, 1.0f), *x = rnd_vec(n * cols, 1.0f);
    di_weight w = {
        .dtype = DI_DTYPE_F32, .rows = rows, .cols = cols, .row_stride = cols, .data = wf};
    di_weight dw;
    CHECK(di_cuda_weight_upload(&g_be, &w, &dw) == DI_OK);
    float *ref = malloc((size_t)(n * rows) * sizeof(float));
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0;
            for (int64_t c = 0; c < cols; c++)
                s += (double)wf[r * cols + c] * x[t * cols + c];
            ref[t * rows + r] = (float)s;
        }
    float *y = gpu_fp4(&dw, x, n);
    CHECK(nerr(y, ref, n * rows) <= 1e-5);
    di_cuda_weight_free(&g_be, &dw);
    free(wf), free(x), free(ref), free(y);
}

/* ---------------------------------------------------------------------------------------- */
/* FP4 experts (matmul_experts)                                                               */
/* ---------------------------------------------------------------------------------------- */

/* E random [rows][cols] FP4 experts (block_cols 32, E8M0 bytes in [119, 129]), each uploaded
 * with weight_upload, and their table from expert_table. */
typedef struct {
    fp4_weight *host;
    di_weight *dw;
    di_expert_weights ew;
} fp4_experts;

static fp4_experts make_fp4_experts(int64_t E, int64_t rows, int64_t cols) {
    fp4_experts x;
    x.host = malloc((size_t)E * sizeof *x.host);
    x.dw = malloc((size_t)E * sizeof *x.dw);
    for (int64_t e = 0; e < E; e++) {
        x.host[e] = make_fp4(rows, cols, 0, 32, 127 - 8, 127 + 2);
        CHECK_MSG(g_be.ops->weight_upload(g_be.ctx, &x.host[e].w, &x.dw[e]) == DI_OK, "%s",
                  di_last_error());
    }
    void *tab = NULL;
    CHECK_MSG(g_be.ops->expert_table(g_be.ctx, x.dw, E, &tab) == DI_OK, "%s", di_last_error());
    x.ew = (di_expert_weights){.w = x.dw, .n_experts = E, .table = tab};
    return x;
}

static void free_fp4_experts(fp4_experts *x) {
    for (int64_t e = 0; e < x->ew.n_experts; e++) {
        g_be.ops->weight_free(g_be.ctx, &x->dw[e]);
        free_fp4(&x->host[e]);
    }
    g_be.ops->buf_free(g_be.ctx, (void *)x->ew.table);
    free(x->host), free(x->dw);
}

/* A grouping of n tokens' K distinct experts each (backend.h's moe_route outputs offsets and
 * active), made on the host: hot >= 0 is every token's first expert (an expert with n rows),
 * the others random, so experts with no rows are common where n K < E. */
static void make_grouping(int64_t E, int64_t K, int64_t n, int64_t hot, int32_t *off,
                          int32_t *act) {
    int32_t *cnt = calloc((size_t)E, sizeof *cnt);
    bool *used = malloc((size_t)E);
    for (int64_t t = 0; t < n; t++) {
        memset(used, 0, (size_t)E);
        for (int64_t k = 0; k < K; k++) {
            int64_t e = k == 0 && hot >= 0 ? hot : rnd_int(0, E - 1);
            while (used[e])
                e = (e + 1) % E;
            used[e] = true;
            cnt[e]++;
        }
    }
    off[0] = 0, act[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        off[e + 1] = off[e] + cnt[e];
        if (cnt[e]) act[1 + act[0]++] = (int32_t)e;
    }
    free(cnt), free(used);
}

/* matmul_experts over FP4 experts: each expert's grouped rows bitwise matmul_fp4 of those
 * rows alone (same device), and nothing written past the last expert's rows. */
static void check_experts_fp4(int64_t E, int64_t K, int64_t n, int64_t rows, int64_t cols,
                              int64_t hot) {
    const int64_t nk = n * K, pad = 8; /* poisoned rows past the grouped rows */
    fp4_experts xs = make_fp4_experts(E, rows, cols);
    int32_t *off = malloc((size_t)(E + 1) * sizeof *off), *act = malloc((size_t)(E + 1) * 4);
    make_grouping(E, K, n, hot, off, act);
    int32_t *doff = dev_from(off, (size_t)(E + 1) * 4), *dact = dev_from(act, (size_t)(E + 1) * 4);
    float *x = rnd_vec(nk * cols, 2.0f), *dx = dev_floats(x, nk * cols);
    float *dy = dev_poison((nk + pad) * rows);
    g_be.ops->matmul_experts(g_be.ctx, &xs.ew, doff, dact, DI_MIN(E, nk), nk, dx, dy);
    float *y = host_floats(dy, (nk + pad) * rows);
    for (int64_t e = 0; e < E; e++) {
        const int64_t g0 = off[e], ne = off[e + 1] - g0;
        if (ne == 0) continue;
        float *y1 = gpu_fp4(&xs.dw[e], x + g0 * cols, ne);
        CHECK_MSG(same_bits(y1, y + g0 * rows, ne * rows),
                  "E=%lld K=%lld n=%lld %lldx%lld: expert %lld (%lld rows) differs from "
                  "matmul_fp4",
                  (long long)E, (long long)K, (long long)n, (long long)rows, (long long)cols,
                  (long long)e, (long long)ne);
        free(y1);
    }
    bool tail = true;
    for (int64_t i = nk * rows; i < (nk + pad) * rows; i++)
        tail = tail && isnan(y[i]);
    CHECK_MSG(tail, "E=%lld K=%lld n=%lld %lldx%lld: written past the grouped rows", (long long)E,
              (long long)K, (long long)n, (long long)rows, (long long)cols);
    free_fp4_experts(&xs);
    dfree(doff), dfree(dact), dfree(dx), dfree(dy);
    free(off), free(act), free(x), free(y);
}

/* Decode batches of n = 1 .. 64 tokens with K = 6 of 16 .. 64 experts (means of 1, 2, 3 and
 * 24 rows per active-expert slot: TB 1, 2, 4 and 8), an expert that every token picks (8 and 64
 * rows: several passes), V4-Flash's widths (4096: 4 warps per row group; 2048: one) and row counts
 * that end inside a row group or a block. */
TEST(matmul_experts_fp4) {
    if (!g_have_gpu) SKIP("no CUDA device");
    static const int64_t ns[] = {1, 2, 4, 5, 8, 8, 64}, Es[] = {16, 32, 16, 64, 16, 48, 16};
    static const int64_t shapes[][2] = {{2048, 4096}, {2050, 4096}, {2048, 2048}, {1001, 2048}};
    for (size_t i = 0; i < DI_ARRAY_LEN(ns); i++)
        for (size_t s = 0; s < DI_ARRAY_LEN(shapes); s++)
            check_experts_fp4(Es[i], 6, ns[i], shapes[s][0], shapes[s][1],
                              ns[i] >= 8 && s % 2 == 0 ? 3 : -1);
    check_experts_fp4(8, 2, 3, 37, 320, -1); /* small: partial row groups, few segments */
}

/* Misuse: the fused SwiGLU form notes an error on FP4 experts (and writes nothing), and a
 * table refuses FP4 experts without their E8M0 bytes. */
TEST(matmul_experts_fp4_misuse) {
    if (!g_have_gpu) SKIP("no CUDA device");
    const int64_t E = 4, K = 2, n = 3, nk = n * K, rows = 40, cols = 256;
    fp4_experts xs = make_fp4_experts(E, rows, cols);
    int32_t off[5], act[5];
    make_grouping(E, K, n, -1, off, act);
    int32_t *doff = dev_from(off, sizeof off), *dact = dev_from(act, sizeof act);
    float *dx = dev_poison(nk * cols), *dy = dev_poison(nk * rows);
    CHECK(di_backend_cuda_sync(&g_be) == DI_OK);
    g_be.ops->matmul_experts_glu(g_be.ctx, &xs.ew, &xs.ew, doff, dact, DI_MIN(E, nk), nk, dx, NULL,
                                 NULL, dy);
    CHECK(di_backend_cuda_sync(&g_be) != DI_OK);
    float *y = host_floats(dy, nk * rows); /* the sync inside finds no error left */
    bool untouched = true;
    for (int64_t i = 0; i < nk * rows; i++)
        untouched = untouched && isnan(y[i]);
    CHECK(untouched);
    di_weight bad[2] = {xs.dw[0], xs.dw[1]};
    bad[0].scale_e8m0 = bad[1].scale_e8m0 = NULL;
    void *tab = (void *)1;
    CHECK(g_be.ops->expert_table(g_be.ctx, bad, 2, &tab) == DI_ERR_INVALID_ARG && tab == NULL);
    bad[0] = xs.dw[0]; /* expert 1 differs from expert 0 */
    CHECK(g_be.ops->expert_table(g_be.ctx, bad, 2, &tab) == DI_ERR_INVALID_ARG && tab == NULL);
    free_fp4_experts(&xs);
    dfree(doff), dfree(dact), dfree(dx), dfree(dy);
    free(y);
}

/* ---------------------------------------------------------------------------------------- */
/* mHC                                                                                        */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    float *h, *post, *mix;
} hc_out;

static hc_out gpu_hc_pre(const di_v4_hc_params *hp) {
    const int64_t n = hp->n_tokens, nh = hp->n_hc, D = hp->dim;
    const int64_t nm = hp->iters ? (2 + nh) * nh : nh;
    di_v4_hc_params p = *hp;
    float *dx = dev_floats(hp->x, n * nh * D), *dfn = dev_floats(hp->fn, nm * nh * D);
    float *dbase = dev_floats(hp->base, nm), *dscale = dev_floats(hp->scale, 3);
    float *dh = dev_poison(n * D), *dpost = dev_poison(n * nh), *dmix = dev_poison(n * nh * nh);
    p.x = dx, p.fn = dfn, p.base = dbase, p.scale = dscale, p.h = dh, p.post = dpost, p.mix = dmix;
    g_be.ops->v4_hc_pre(g_be.ctx, &p);
    hc_out o = {host_floats(dh, n * D), host_floats(dpost, n * nh), host_floats(dmix, n * nh * nh)};
    dfree(dx), dfree(dfn), dfree(dbase), dfree(dscale), dfree(dh), dfree(dpost), dfree(dmix);
    return o;
}

static void free_hc(hc_out *o) {
    free(o->h), free(o->post), free(o->mix);
}

static void check_hc(int64_t n, int64_t nh, int64_t D, int64_t iters) {
    const int64_t nm = iters ? (2 + nh) * nh : nh;
    float *x = rnd_vec(n * nh * D, 2.0f), *fn = rnd_vec(nm * nh * D, 0.3f);
    float *base = rnd_vec(nm, 1.0f), *scale = rnd_vec(3, 1.0f);
    hc_out r = {nan_vec(n * D), nan_vec(n * nh), nan_vec(n * nh * nh)};
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
                         .h = r.h,
                         .post = r.post,
                         .mix = r.mix};
    di_cpu_v4_hc_pre_ref(&p);
    hc_out g = gpu_hc_pre(&p);
    CHECK_MSG(nerr(g.h, r.h, n * D) <= 1e-5, "h n=%lld nh=%lld D=%lld iters=%lld: error %.3g",
              (long long)n, (long long)nh, (long long)D, (long long)iters, nerr(g.h, r.h, n * D));
    if (iters) {
        CHECK_MSG(nerr(g.post, r.post, n * nh) <= 1e-5, "post: error %.3g",
                  nerr(g.post, r.post, n * nh));
        CHECK_MSG(nerr(g.mix, r.mix, n * nh * nh) <= 1e-5, "mix: error %.3g",
                  nerr(g.mix, r.mix, n * nh * nh));

        /* the stream update on the GPU's outputs, against the CPU's */
        float *y = rnd_vec(n * D, 1.0f), *want = malloc((size_t)(n * nh * D) * sizeof(float));
        di_cpu_v4_hc_post(NULL, n, nh, D, x, y, g.post, g.mix, want);
        float *dx = dev_floats(x, n * nh * D), *dy = dev_floats(y, n * D);
        float *dpost = dev_floats(g.post, n * nh), *dmix = dev_floats(g.mix, n * nh * nh);
        float *dout = dev_poison(n * nh * D);
        g_be.ops->v4_hc_post(g_be.ctx, n, nh, D, dx, dy, dpost, dmix, dout);
        float *out = host_floats(dout, n * nh * D);
        CHECK_MSG(nerr(out, want, n * nh * D) <= 1e-6, "hc_post: error %.3g",
                  nerr(out, want, n * nh * D));
        /* the last token alone */
        const int64_t t = n - 1;
        float *dout1 = dev_poison(nh * D);
        g_be.ops->v4_hc_post(g_be.ctx, 1, nh, D, dx + t * nh * D, dy + t * D, dpost + t * nh,
                             dmix + t * nh * nh, dout1);
        float *out1 = host_floats(dout1, nh * D);
        CHECK(same_bits(out1, out + t * nh * D, nh * D));
        dfree(dx), dfree(dy), dfree(dpost), dfree(dmix), dfree(dout), dfree(dout1);
        free(y), free(want), free(out), free(out1);
    }
    /* batch invariance: the first, a middle and the last token alone */
    const int64_t probes[3] = {0, n / 2, n - 1};
    for (int k = 0; k < 3 && n > 1; k++) {
        const int64_t t = probes[k];
        di_v4_hc_params p1 = p;
        p1.n_tokens = 1;
        p1.x = x + t * nh * D;
        hc_out g1 = gpu_hc_pre(&p1);
        CHECK_MSG(same_bits(g1.h, g.h + t * D, D), "hc_pre token %lld alone differs", (long long)t);
        if (iters) {
            CHECK(same_bits(g1.post, g.post + t * nh, nh));
            CHECK(same_bits(g1.mix, g.mix + t * nh * nh, nh * nh));
        }
        free_hc(&g1);
    }
    free_hc(&r), free_hc(&g);
    free(x), free(fn), free(base), free(scale);
}

TEST(hc_pre_post) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int iter = 0; iter < 16; iter++)
        check_hc(rnd_int(1, 9), rnd_int(1, 5), rnd_int(1, 300), iter % 4 == 0 ? 0 : rnd_int(1, 20));
    check_hc(3, 4, 4096, 20); /* V4-Flash: 4 streams of 4096, 20 Sinkhorn iterations */
    check_hc(2, 4, 4096, 0);  /* the head's collapse */
    /* the most streams: mix, pre and M fill 33 KB of shared memory, and 17 tokens take two
     * launch pairs (the backend's mixing-row scratch holds 15 tokens' rows at 64 streams) */
    check_hc(17, 64, 8, 3);
}

/* ---------------------------------------------------------------------------------------- */
/* Sink attention                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* GPU run of host problem hp whose key pointers point into kv (nkv floats). */
static float *gpu_v4_attn(const di_v4_attn_params *hp, const float *kv, int64_t nkv) {
    const int64_t n = hp->n_tokens, H = hp->n_heads, d = hp->dim;
    di_v4_attn_params p = *hp;
    float *dkv = dev_floats(kv, nkv);
    const float **dkeys = dev_ptr_list(hp->keys, n * hp->max_keys, kv, dkv);
    int32_t *dcnt = dev_from(hp->n_keys, (size_t)n * sizeof(int32_t));
    float *dq = dev_floats(hp->q, (n - 1) * hp->q_tstride + H * d);
    float *ds = dev_floats(hp->sinks, H);
    float *dout = dev_poison((n - 1) * hp->out_tstride + H * d);
    p.q = dq, p.sinks = ds, p.keys = dkeys, p.n_keys = dcnt, p.out = dout;
    p.scratch = NULL, p.scratch_rows = 0;
    g_be.ops->v4_attention(g_be.ctx, &p);
    float *out = host_floats(dout, (n - 1) * hp->out_tstride + H * d);
    dfree(dkv), dfree((void *)dkeys), dfree(dcnt), dfree(dq), dfree(ds), dfree(dout);
    return out;
}

static void check_v4_attn(int64_t n, int64_t H, int64_t d, int64_t nkv) {
    const int64_t MK = nkv + 3, ot = H * d + 5;
    float *kv = rnd_vec(nkv * d, 1.0f), *q = rnd_vec(n * H * d, 2.0f), *sinks = rnd_vec(H, 2.0f);
    const float **keys = calloc((size_t)(n * MK), sizeof *keys);
    int32_t *cnt = malloc((size_t)n * sizeof *cnt);
    for (int64_t t = 0; t < n; t++) {
        cnt[t] = (int32_t)(t == 0 ? 0 : rnd_int(1, MK)); /* token 0: the sink alone */
        if (n == 1) cnt[t] = (int32_t)rnd_int(1, MK);
        for (int64_t j = 0; j < cnt[t]; j++)
            keys[t * MK + j] = kv + rnd_int(0, nkv - 1) * d;
    }
    float *ref = nan_vec(n * ot), *scr = malloc((size_t)(n * MK) * sizeof(float));
    for (int64_t t = 0; t < n; t++) /* the gaps between rows stay NaN on both sides */
        memset(ref + t * ot, 0, (size_t)(H * d) * sizeof(float));
    di_v4_attn_params p = {.n_tokens = n,
                           .n_heads = H,
                           .dim = d,
                           .scale = 0.5f / sqrtf((float)d),
                           .q = q,
                           .q_tstride = H * d,
                           .sinks = sinks,
                           .keys = keys,
                           .n_keys = cnt,
                           .max_keys = MK,
                           .out = ref,
                           .out_tstride = ot,
                           .scratch = scr,
                           .scratch_rows = n};
    di_cpu_v4_attention_ref(&p);
    float *out = gpu_v4_attn(&p, kv, nkv * d);
    const int64_t nout = (n - 1) * ot + H * d;
    CHECK_MSG(nerr(out, ref, nout) <= 1e-5, "n=%lld H=%lld d=%lld keys<=%lld: error %.3g",
              (long long)n, (long long)H, (long long)d, (long long)MK, nerr(out, ref, nout));
    const int64_t probes[3] = {0, n / 2, n - 1};
    for (int k = 0; k < 3 && n > 1; k++) {
        const int64_t t = probes[k];
        di_v4_attn_params p1 = p;
        p1.n_tokens = 1;
        p1.q = q + t * H * d;
        p1.keys = keys + t * MK;
        p1.n_keys = cnt + t;
        float *o1 = gpu_v4_attn(&p1, kv, nkv * d);
        CHECK_MSG(same_bits(o1, out + t * ot, H * d), "token %lld alone differs", (long long)t);
        free(o1);
    }
    free(kv), free(q), free(sinks), free(keys), free(cnt), free(ref), free(scr), free(out);
}

TEST(v4_attention) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int iter = 0; iter < 16; iter++)
        check_v4_attn(rnd_int(1, 7), rnd_int(1, 9), rnd_int(1, 200), rnd_int(1, 300));
    check_v4_attn(3, 64, 512, 640); /* V4-Flash: 64 heads of 512, window + top-k keys */
}

/* ---------------------------------------------------------------------------------------- */
/* Pooling, indexer, SwiGLU                                                                   */
/* ---------------------------------------------------------------------------------------- */

TEST(v4_pool) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int iter = 0; iter < 10; iter++) {
        const int64_t ns = rnd_int(1, 16), W = iter < 8 ? rnd_int(1, 3000) : 1024;
        float *c = rnd_vec(ns * W, 2.0f), *z = rnd_vec(ns * W, 4.0f);
        const float **cp = malloc((size_t)ns * sizeof *cp), **zp = malloc((size_t)ns * sizeof *zp);
        for (int64_t i = 0; i < ns; i++) /* slots in a shuffled order */
            cp[i] = c + ((i * 7) % ns) * W, zp[i] = z + ((i * 7) % ns) * W;
        float *ref = nan_vec(W);
        di_v4_pool_params p = {.n_slots = ns, .width = W, .c = cp, .z = zp, .out = ref};
        di_cpu_v4_pool(NULL, &p);
        float *dc = dev_floats(c, ns * W), *dz = dev_floats(z, ns * W), *dout = dev_poison(W);
        const float **dcp = dev_ptr_list(cp, ns, c, dc), **dzp = dev_ptr_list(zp, ns, z, dz);
        p.c = dcp, p.z = dzp, p.out = dout;
        g_be.ops->v4_pool(g_be.ctx, &p);
        float *out = host_floats(dout, W);
        CHECK_MSG(nerr(out, ref, W) <= 1e-6, "slots=%lld width=%lld: error %.3g", (long long)ns,
                  (long long)W, nerr(out, ref, W));
        dfree(dc), dfree(dz), dfree(dout), dfree((void *)dcp), dfree((void *)dzp);
        free(c), free(z), free(cp), free(zp), free(ref), free(out);
    }
}

static float *gpu_index(const di_v4_index_params *hp, int64_t nkeys) {
    const int64_t n = hp->n_tokens, nh = hp->n_heads, d = hp->dim;
    di_v4_index_params p = *hp;
    float *dq = dev_floats(hp->q, n * nh * d), *dw = dev_floats(hp->weights, n * nh);
    float *dk = dev_floats(hp->keys, nkeys * d);
    int64_t *dv = dev_from(hp->n_visible, (size_t)n * sizeof(int64_t));
    float *dout = dev_poison(n * hp->out_stride);
    p.q = dq, p.weights = dw, p.keys = dk, p.n_visible = dv, p.out = dout;
    g_be.ops->v4_index_scores(g_be.ctx, &p);
    float *out = host_floats(dout, n * hp->out_stride);
    dfree(dq), dfree(dw), dfree(dk), dfree(dv), dfree(dout);
    return out;
}

static void check_index(int64_t n, int64_t nh, int64_t d, int64_t ne) {
    float *q = rnd_vec(n * nh * d, 1.0f), *w = rnd_vec(n * nh, 1.0f), *k = rnd_vec(ne * d, 1.0f);
    int64_t *vis = malloc((size_t)n * sizeof *vis);
    for (int64_t t = 0; t < n; t++)
        vis[t] = t == 0 && n > 1 ? 0 : rnd_int(1, ne);
    const int64_t os = ne + 3;
    float *ref = nan_vec(n * os); /* entries past n_visible stay NaN on both sides */
    di_v4_index_params p = {.n_tokens = n,
                            .n_heads = nh,
                            .dim = d,
                            .scale = 0.1f,
                            .q = q,
                            .weights = w,
                            .keys = k,
                            .n_visible = vis,
                            .out = ref,
                            .out_stride = os};
    di_cpu_v4_index_scores_ref(&p);
    float *out = gpu_index(&p, ne);
    CHECK_MSG(nerr(out, ref, n * os) <= 1e-5, "n=%lld nh=%lld d=%lld ne=%lld: error %.3g",
              (long long)n, (long long)nh, (long long)d, (long long)ne, nerr(out, ref, n * os));
    const int64_t probes[3] = {0, n / 2, n - 1};
    for (int kk = 0; kk < 3 && n > 1; kk++) {
        const int64_t t = probes[kk];
        di_v4_index_params p1 = p;
        p1.n_tokens = 1;
        p1.q = q + t * nh * d;
        p1.weights = w + t * nh;
        p1.n_visible = vis + t;
        float *o1 = gpu_index(&p1, ne);
        CHECK_MSG(same_bits(o1, out + t * os, os), "token %lld alone differs", (long long)t);
        free(o1);
    }
    free(q), free(w), free(k), free(vis), free(ref), free(out);
}

TEST(v4_index_scores) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int iter = 0; iter < 12; iter++)
        check_index(rnd_int(1, 6), rnd_int(1, 70), rnd_int(1, 160), rnd_int(1, 700));
    check_index(2, 64, 128, 4000); /* V4-Flash's indexer: 64 heads of 128 */
}

TEST(v4_swiglu) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (int iter = 0; iter < 6; iter++) {
        const int64_t n = iter < 3 ? rnd_int(1, 1000) : rnd_int(40000, 200000);
        const float limit = iter % 2 ? 7.0f : 0.0f;
        float *g = rnd_vec(n, 12.0f), *u = rnd_vec(n, 12.0f), *ref = nan_vec(n);
        di_cpu_v4_swiglu(NULL, g, u, n, limit, ref);
        float *dg = dev_floats(g, n), *du = dev_floats(u, n);
        g_be.ops->v4_swiglu(g_be.ctx, dg, du, n, limit, dg); /* in place */
        float *out = host_floats(dg, n);
        CHECK_MSG(nerr(out, ref, n) <= 1e-6, "n=%lld limit=%g: error %.3g", (long long)n,
                  (double)limit, nerr(out, ref, n));
        dfree(dg), dfree(du);
        free(g), free(u), free(ref), free(out);
    }
}

TEST(vtable) {
    if (!g_have_gpu) SKIP("no CUDA device");
    CHECK(g_be.ops->matmul_fp4 && g_be.ops->v4_hc_pre && g_be.ops->v4_hc_post &&
          g_be.ops->v4_attention && g_be.ops->v4_pool && g_be.ops->v4_index_scores &&
          g_be.ops->v4_swiglu);
}

int main(void) {
    di_status st = di_backend_cuda_init(&g_be, 0, 4096);
    g_have_gpu = st == DI_OK;
    if (!g_have_gpu)
        printf("skip: %s\n", di_last_error());
    else
        printf("device: %s\n", di_backend_cuda_device_name(&g_be));
    RUN(vtable);
    RUN(matmul_fp4);
    RUN(matmul_fp4_e8m0_edges);
    RUN(matmul_fp4_forwards);
    RUN(matmul_experts_fp4);
    RUN(matmul_experts_fp4_misuse);
    RUN(hc_pre_post);
    RUN(v4_attention);
    RUN(v4_pool);
    RUN(v4_index_scores);
    RUN(v4_swiglu);
    if (g_have_gpu) di_backend_free(&g_be);
    return test_summary();
}
