/*
 * test_moe_ops.c -- the CPU backend's ops for batched decode: the MoE ops (backend.h: moe_route,
 * matmul_experts) and the attention's decode-batch form (per-query positions and block
 * tables, q_pos) against independent references: the routing against di_router_select per token and
 * a grouping checked from its definition (every entry once, experts ascending, tokens in order
 * inside an expert, offsets / active list / gather list consistent); matmul_experts against one
 * matmul per expert over its rows, bitwise (FP4 experts: one matmul_fp4 per expert). Router
 * configurations of V2 (softmax, greedy and group-limited), V3 (sigmoid + bias, noaux_tc,
 * renormalised, scaled) and V4 (sqrt softplus), with logits drawn from a few levels so that
 * ties occur. The decode-batch attention: each query bitwise equal to the scalar reference
 * over its own sequence alone.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu_nn.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_v4_ops.h"
#include "core/core.h"
#include "moe/router.h"
#include "test.h"
#include "test_route_util.h"

#include <math.h>
#define TEST_RAND_SEED 0x9e3779b97f4a7c15ull
#include "test_rand.h"
#include "test_fp4_util.h"

static di_pool *g_pool;
static di_backend g_cpu;

/* Logits on a few levels (ties) or continuous. */
static float *route_logits(int64_t n, int64_t E, bool ties) {
    float *l = rnd_vec(n * E, 4.0f);
    if (ties)
        for (int64_t i = 0; i < n * E; i++)
            l[i] = (float)rnd_int(-3, 3) * 0.5f;
    return l;
}

TEST(moe_route_cpu) {
    for (int iter = 0; iter < 40; iter++) {
        di_router_params r = test_router_config(iter % 4);
        const int64_t E = r.n_experts, K = r.top_k, n = rnd_int(1, 70), nk = n * K;
        float *bias = rnd_vec(E, 0.5f);
        if (r.score == DI_SCORE_SIGMOID) r.bias = bias;
        float *lg = route_logits(n, E, iter % 3 == 0);
        route_bufs b = route_host_alloc(E, nk);
        route_run(&g_cpu, &r, n, lg, &b);
        int32_t *off = b.off, *act = b.act, *src = b.src, *rows = b.rows;
        float *w = b.w, *scr = b.scr;
        /* Selection: di_router_select per token. */
        int32_t *ids = malloc((size_t)nk * 4);
        float *wr = malloc((size_t)nk * 4);
        for (int64_t t = 0; t < n; t++)
            di_router_select(&r, lg + t * E, ids + t * K, wr + t * K, scr);
        CHECK(memcmp(w, wr, (size_t)nk * 4) == 0);
        /* Grouping, from its definition. */
        CHECK(off[0] == 0 && off[E] == nk);
        int64_t na = 0;
        for (int64_t e = 0; e < E; e++) {
            CHECK(off[e] <= off[e + 1]);
            if (off[e + 1] > off[e]) CHECK(act[1 + na++] == e);
        }
        CHECK(act[0] == na);
        int32_t *seen = calloc((size_t)nk, 4);
        for (int64_t i = 0; i < nk; i++) {
            const int32_t g = rows[i], e = ids[i];
            CHECK(g >= off[e] && g < off[e + 1]);
            CHECK(src[g] == i / K);
            seen[g]++;
        }
        for (int64_t g = 0; g < nk; g++)
            CHECK(seen[g] == 1);
        for (int64_t e = 0; e < E; e++) /* tokens ascending inside an expert */
            for (int64_t g = off[e] + 1; g < off[e + 1]; g++)
                CHECK(src[g - 1] < src[g]);
        route_host_free(&b);
        free(seen), free(ids), free(wr), free(lg), free(bias);
    }
}

TEST(matmul_experts_cpu) {
    static const di_dtype dts[] = {DI_DTYPE_F32, DI_DTYPE_BF16};
    for (int iter = 0; iter < 12; iter++) {
        const di_dtype dt = dts[iter % 2];
        const int64_t E = rnd_int(1, 12), K = rnd_int(1, DI_MIN(E, 4)), n = rnd_int(1, 20);
        const int64_t rows = rnd_int(1, 70), cols = rnd_int(1, 300), nk = n * K;
        const size_t esz = dt == DI_DTYPE_F32 ? 4 : 2;
        void *data = malloc((size_t)(E * rows * cols) * esz);
        di_weight *ws = malloc((size_t)E * sizeof *ws);
        for (int64_t i = 0; i < E * rows * cols; i++) {
            if (dt == DI_DTYPE_F32)
                ((float *)data)[i] = rnd_f();
            else
                ((uint16_t *)data)[i] = di_f32_to_bf16(rnd_f());
        }
        for (int64_t e = 0; e < E; e++)
            ws[e] = (di_weight){.dtype = dt,
                                .rows = rows,
                                .cols = cols,
                                .row_stride = cols,
                                .data = (char *)data + (size_t)(e * rows * cols) * esz};
        const di_router_params r = test_router_plain(E, K);
        float *lg = route_logits(n, E, false);
        route_bufs b = route_host_alloc(E, nk);
        route_run(&g_cpu, &r, n, lg, &b);
        const int32_t *off = b.off, *act = b.act;
        void *tab = (void *)1;
        CHECK(g_cpu.ops->expert_table(g_cpu.ctx, ws, E, &tab) == DI_OK && tab == NULL);
        di_expert_weights ew = {.w = ws, .n_experts = E, .table = NULL};
        float *x = rnd_vec(nk * cols, 1.0f);
        float *y = malloc((size_t)(nk * rows) * 4), *yr = malloc((size_t)(nk * rows) * 4);
        g_cpu.ops->matmul_experts(g_cpu.ctx, &ew, off, act, DI_MIN(E, nk), nk, x, y);
        for (int64_t e = 0; e < E; e++)
            if (off[e + 1] > off[e])
                g_cpu.ops->matmul(g_cpu.ctx, &ws[e], x + off[e] * cols, off[e + 1] - off[e],
                                  yr + off[e] * rows);
        CHECK(memcmp(y, yr, (size_t)(nk * rows) * 4) == 0);
        route_host_free(&b);
        free(data), free(ws), free(lg), free(x), free(y), free(yr);
    }
}

/* matmul_experts over FP4 experts, routed by moe_route: each expert's grouped rows bitwise
 * matmul_fp4 of those rows alone, and near the scalar reference. hot >= 0: that expert's
 * logit raised so that every token picks it (an expert with n rows). */
static void check_experts_fp4(int64_t E, int64_t K, int64_t n, int64_t rows, int64_t cols,
                              int64_t hot) {
    const int64_t nk = n * K;
    fp4_weight *xs = malloc((size_t)E * sizeof *xs);
    di_weight *ws = malloc((size_t)E * sizeof *ws);
    for (int64_t e = 0; e < E; e++) /* scales 2^(e - 127), e in [119, 129] */
        xs[e] = make_fp4(rows, cols, 0, 32, 127 - 8, 127 + 2), ws[e] = xs[e].w;
    const di_router_params r = test_router_plain(E, K);
    float *lg = route_logits(n, E, false);
    for (int64_t t = 0; hot >= 0 && t < n; t++)
        lg[t * E + hot] += 100.0f;
    route_bufs b = route_host_alloc(E, nk);
    route_run(&g_cpu, &r, n, lg, &b);
    const int32_t *off = b.off, *act = b.act;
    CHECK(hot < 0 || off[hot + 1] - off[hot] == n);
    di_expert_weights ew = {.w = ws, .n_experts = E, .table = NULL};
    float *x = rnd_vec(nk * cols, 1.0f);
    float *y = malloc((size_t)(nk * rows) * 4), *y1 = malloc((size_t)(nk * rows) * 4);
    float *ref = malloc((size_t)(nk * rows) * 4);
    g_cpu.ops->matmul_experts(g_cpu.ctx, &ew, off, act, DI_MIN(E, nk), nk, x, y);
    for (int64_t e = 0; e < E; e++) {
        const int64_t g0 = off[e], ne = off[e + 1] - g0;
        if (ne == 0) continue;
        g_cpu.ops->matmul_fp4(g_cpu.ctx, &ws[e], x + g0 * cols, ne, y1 + g0 * rows);
        di_cpu_matmul_fp4_ref(&ws[e], x + g0 * cols, ne, ref + g0 * rows);
        CHECK_MSG(memcmp(y + g0 * rows, y1 + g0 * rows, (size_t)(ne * rows) * 4) == 0,
                  "E=%lld K=%lld n=%lld %lldx%lld: expert %lld (%lld rows) differs from "
                  "matmul_fp4",
                  (long long)E, (long long)K, (long long)n, (long long)rows, (long long)cols,
                  (long long)e, (long long)ne);
    }
    CHECK_MSG(nerr(y, ref, nk * rows) <= 1e-5, "E=%lld K=%lld n=%lld %lldx%lld: error %.3g",
              (long long)E, (long long)K, (long long)n, (long long)rows, (long long)cols,
              nerr(y, ref, nk * rows));
    route_host_free(&b);
    for (int64_t e = 0; e < E; e++)
        free_fp4(&xs[e]);
    free(xs), free(ws), free(lg), free(x), free(y), free(y1), free(ref);
}

/* Random shapes (experts with no rows wherever n K < E), V4-Flash-like widths (4096: the SIMD
 * kernels' token blocks of 4; 2048), an expert that every token picks (40 rows, a product
 * large enough for the pool), widths that are not whole 32-column groups (the scalar rows),
 * and the scalar level. */
TEST(matmul_experts_fp4_cpu) {
    for (int iter = 0; iter < 12; iter++) {
        const int64_t E = rnd_int(1, 16), K = rnd_int(1, DI_MIN(E, 6)), n = rnd_int(1, 20);
        check_experts_fp4(E, K, n, rnd_int(1, 70), 32 * rnd_int(1, 24), -1);
    }
    check_experts_fp4(16, 6, 1, 64, 4096, -1);
    check_experts_fp4(64, 6, 5, 96, 2048, -1);
    check_experts_fp4(8, 2, 40, 100, 4096, 3);
    check_experts_fp4(12, 3, 17, 33, 2048, 0);
    check_experts_fp4(6, 2, 9, 21, 48, 5);
    CHECK(di_cpu_simd_force("scalar") == 0);
    check_experts_fp4(10, 3, 7, 37, 320, 2);
    check_experts_fp4(5, 2, 6, 19, 112, -1);
    CHECK(di_cpu_simd_force(NULL) == 0);
}

/* n sequences of different lengths in one paged pool (block size 4, blocks dealt out of
 * order), one query each at its last position: the q_pos call against each query alone
 * through the scalar reference. */
TEST(mla_attention_decode_batch) {
    const int64_t nh = 3, R = 16, dr = 8, bs = 4, n = 5, max_blocks = 8, pool = n * max_blocks;
    float *ckv = rnd_vec(pool * bs * R, 1.0f), *kr = rnd_vec(pool * bs * dr, 1.0f);
    float *ql = rnd_vec(nh * n * R, 1.0f), *qr = rnd_vec(n * nh * dr, 1.0f);
    int32_t pos[5], toff[5], tables[5 * 8];
    for (int64_t t = 0; t < n; t++) {
        pos[t] = (int32_t)rnd_int(0, max_blocks * bs - 1);
        toff[t] = (int32_t)(t * max_blocks);
        for (int64_t b = 0; b < max_blocks; b++) /* sequence t owns blocks b * n + t */
            tables[t * max_blocks + b] = (int32_t)(b * n + (n - 1 - t));
    }
    float *out = malloc((size_t)(nh * n * R) * 4), *ref = malloc((size_t)(nh * R) * 4);
    di_mla_attn_params p = {.n_tokens = n,
                            .n_heads = nh,
                            .pos0 = 999,
                            .kv_lora_rank = R,
                            .rope_dim = dr,
                            .scale = 0.3f,
                            .q_lat = ql,
                            .q_rope = qr,
                            .q_rope_tstride = nh * dr,
                            .q_rope_hstride = dr,
                            .c_kv = ckv,
                            .k_rope = kr,
                            .out = out,
                            .block_size = bs,
                            .q_pos = pos,
                            .q_tables = tables,
                            .q_table_off = toff};
    g_cpu.ops->mla_attention(g_cpu.ctx, &p);
    for (int64_t t = 0; t < n; t++) {
        float *q1 = malloc((size_t)(nh * R) * 4);
        for (int64_t h = 0; h < nh; h++)
            memcpy(q1 + h * R, ql + (h * n + t) * R, (size_t)R * 4);
        di_mla_attn_params a = {.n_tokens = 1,
                                .n_heads = nh,
                                .pos0 = pos[t],
                                .kv_lora_rank = R,
                                .rope_dim = dr,
                                .scale = 0.3f,
                                .q_lat = q1,
                                .q_rope = qr + t * nh * dr,
                                .q_rope_tstride = nh * dr,
                                .q_rope_hstride = dr,
                                .c_kv = ckv,
                                .k_rope = kr,
                                .out = ref,
                                .block_table = tables + t * max_blocks,
                                .block_size = bs};
        float *fast = malloc((size_t)(nh * R) * 4);
        a.out = fast;
        g_cpu.ops->mla_attention(g_cpu.ctx, &a);
        for (int64_t h = 0; h < nh; h++)
            CHECK_MSG(memcmp(out + (h * n + t) * R, fast + h * R, (size_t)R * 4) == 0,
                      "query %lld head %lld: differs from the query alone", (long long)t,
                      (long long)h);
        a.out = ref;
        di_cpu_mla_attention_ref(&a);
        double err = 0, mx = 0;
        for (int64_t i = 0; i < nh * R; i++) {
            err = fmax(err, fabs((double)fast[i] - ref[i]));
            mx = fmax(mx, fabs((double)ref[i]));
        }
        CHECK_MSG(err <= 1e-5 * mx, "query %lld: %.3g from the reference", (long long)t, err);
        free(q1), free(fast);
    }
    free(ckv), free(kr), free(ql), free(qr), free(out), free(ref);
}

int main(void) {
    g_pool = di_pool_create(2);
    CHECK(di_backend_cpu_init(&g_cpu, g_pool, 64) == DI_OK); /* max_ctx: the attention test */
    RUN(moe_route_cpu);
    RUN(matmul_experts_cpu);
    RUN(mla_attention_decode_batch);
    RUN(matmul_experts_fp4_cpu);
    di_backend_free(&g_cpu);
    di_pool_free(g_pool);
    return test_summary();
}
