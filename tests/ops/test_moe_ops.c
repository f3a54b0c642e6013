/*
 * test_moe_ops.c -- the CPU backend's MoE ops (backend.h: moe_route, matmul_experts) against
 * independent references: the routing against di_router_select per token and a grouping
 * checked from its definition (every entry once, experts ascending, tokens in order inside an
 * expert, offsets / active list / gather list consistent); matmul_experts against one matmul
 * per expert over its rows, bitwise. Router configurations of V2 (softmax, greedy and
 * group-limited), V3 (sigmoid + bias, noaux_tc, renormalised, scaled) and V4 (sqrt softplus),
 * with logits drawn from a few levels so that ties occur.
 */
#include "backend/backend.h"
#include "core/core.h"
#include "moe/router.h"
#include "test.h"
#define TEST_RAND_SEED 0x9e3779b97f4a7c15ull
#include "test_rand.h"

static di_pool *g_pool;
static di_backend g_cpu;

static di_router_params config(int which) {
    di_router_params r = {.n_experts = 64,
                          .top_k = 6,
                          .n_group = 1,
                          .topk_group = 1,
                          .score = DI_SCORE_SOFTMAX,
                          .method = DI_TOPK_GREEDY,
                          .routed_scaling_factor = 1.0f};
    switch (which) {
    case 1: /* V2: group-limited greedy */
        r.n_experts = 160, r.n_group = 8, r.topk_group = 3;
        r.method = DI_TOPK_GROUP_LIMITED_GREEDY, r.routed_scaling_factor = 16.0f;
        break;
    case 2: /* V3: sigmoid, bias, noaux_tc, renormalised and scaled */
        r.n_experts = 256, r.top_k = 8, r.n_group = 8, r.topk_group = 4;
        r.score = DI_SCORE_SIGMOID, r.method = DI_TOPK_NOAUX_TC, r.norm_topk_prob = true;
        r.routed_scaling_factor = 2.5f;
        break;
    case 3: /* V4-like: sqrt(softplus), plain top-k, renormalised */
        r.n_experts = 16, r.top_k = 2, r.score = DI_SCORE_SQRTSOFTPLUS;
        r.method = DI_TOPK_NOAUX_TC, r.norm_topk_prob = true, r.routed_scaling_factor = 1.5f;
        break;
    default:
        break;
    }
    return r;
}

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
        di_router_params r = config(iter % 4);
        const int64_t E = r.n_experts, K = r.top_k, n = rnd_int(1, 70), nk = n * K;
        float *bias = rnd_vec(E, 0.5f);
        if (r.score == DI_SCORE_SIGMOID) r.bias = bias;
        float *lg = route_logits(n, E, iter % 3 == 0);
        int32_t *off = malloc((size_t)(E + 1) * 4), *act = malloc((size_t)(E + 1) * 4);
        int32_t *src = malloc((size_t)nk * 4), *rows = malloc((size_t)nk * 4);
        float *w = malloc((size_t)nk * 4), *scr = malloc((size_t)(3 * E) * 4);
        di_moe_route_params p = {.router = r,
                                 .n = n,
                                 .logits = lg,
                                 .scratch = scr,
                                 .offsets = off,
                                 .active = act,
                                 .src = src,
                                 .rows_of = rows,
                                 .w = w};
        g_cpu.ops->moe_route(g_cpu.ctx, &p);
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
        free(seen), free(ids), free(wr), free(off), free(act), free(src), free(rows), free(w);
        free(scr), free(lg), free(bias);
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
        di_router_params r = {.n_experts = E,
                              .top_k = K,
                              .n_group = 1,
                              .topk_group = 1,
                              .score = DI_SCORE_SOFTMAX,
                              .method = DI_TOPK_GREEDY,
                              .routed_scaling_factor = 1.0f};
        float *lg = route_logits(n, E, false);
        int32_t *off = malloc((size_t)(E + 1) * 4), *act = malloc((size_t)(E + 1) * 4);
        int32_t *src = malloc((size_t)nk * 4), *rws = malloc((size_t)nk * 4);
        float *w = malloc((size_t)nk * 4), *scr = malloc((size_t)(3 * E) * 4);
        di_moe_route_params p = {.router = r,
                                 .n = n,
                                 .logits = lg,
                                 .scratch = scr,
                                 .offsets = off,
                                 .active = act,
                                 .src = src,
                                 .rows_of = rws,
                                 .w = w};
        g_cpu.ops->moe_route(g_cpu.ctx, &p);
        void *tab = (void *)1;
        CHECK(g_cpu.ops->expert_table(g_cpu.ctx, ws, E, &tab) == DI_OK && tab == NULL);
        di_expert_weights ew = {.w = ws, .n_experts = E, .table = NULL};
        float *x = rnd_vec(nk * cols, 1.0f);
        float *y = malloc((size_t)(nk * rows) * 4), *yr = malloc((size_t)(nk * rows) * 4);
        g_cpu.ops->matmul_experts(g_cpu.ctx, &ew, off, act, DI_MIN(E, nk), n, x, y);
        for (int64_t e = 0; e < E; e++)
            if (off[e + 1] > off[e])
                g_cpu.ops->matmul(g_cpu.ctx, &ws[e], x + off[e] * cols, off[e + 1] - off[e],
                                  yr + off[e] * rows);
        CHECK(memcmp(y, yr, (size_t)(nk * rows) * 4) == 0);
        free(data), free(ws), free(lg), free(off), free(act), free(src), free(rws), free(w);
        free(scr), free(x), free(y), free(yr);
    }
}

int main(void) {
    g_pool = di_pool_create(2);
    CHECK(di_backend_cpu_init(&g_cpu, g_pool, 16) == DI_OK);
    RUN(moe_route_cpu);
    RUN(matmul_experts_cpu);
    di_backend_free(&g_cpu);
    di_pool_free(g_pool);
    return test_summary();
}
