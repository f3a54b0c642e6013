/*
 * test_route_util.h -- what the MoE op tests share: the router configurations of the DeepSeek
 * families, and the buffers and call of one moe_route (backend.h) on any backend.
 */
#ifndef DI_TEST_ROUTE_UTIL_H
#define DI_TEST_ROUTE_UTIL_H

#include "backend/backend.h"

#include <stdlib.h>

/* Router configurations: 0 plain softmax greedy (64 experts, top-6), 1 V2's group-limited
 * greedy, 2 V3's sigmoid + bias noaux_tc (renormalised, scaled), 3 a V4-like sqrt-softplus
 * top-k. */
static inline di_router_params test_router_config(int which) {
    di_router_params r = {.n_experts = 64,
                          .top_k = 6,
                          .n_group = 1,
                          .topk_group = 1,
                          .score = DI_SCORE_SOFTMAX,
                          .method = DI_TOPK_GREEDY,
                          .routed_scaling_factor = 1.0f};
    if (which == 1) {
        r.n_experts = 160, r.n_group = 8, r.topk_group = 3;
        r.method = DI_TOPK_GROUP_LIMITED_GREEDY, r.routed_scaling_factor = 16.0f;
    } else if (which == 2) {
        r.n_experts = 256, r.top_k = 8, r.n_group = 8, r.topk_group = 4;
        r.score = DI_SCORE_SIGMOID, r.method = DI_TOPK_NOAUX_TC, r.norm_topk_prob = true;
        r.routed_scaling_factor = 2.5f;
    } else if (which == 3) {
        r.n_experts = 16, r.top_k = 2, r.score = DI_SCORE_SQRTSOFTPLUS;
        r.method = DI_TOPK_NOAUX_TC, r.norm_topk_prob = true, r.routed_scaling_factor = 1.5f;
    }
    return r;
}

/* A plain softmax top-k router over E experts. */
static inline di_router_params test_router_plain(int64_t E, int64_t K) {
    di_router_params r = test_router_config(0);
    r.n_experts = E;
    r.top_k = K;
    return r;
}

/* The output buffers of one routing call (backend.h's di_moe_route_params). */
typedef struct {
    int32_t *off, *act, *src, *rows;
    float *w, *scr;
} route_bufs;

static inline route_bufs route_host_alloc(int64_t E, int64_t nk) {
    const size_t e4 = (size_t)(E + 1) * 4, k4 = (size_t)nk * 4, s4 = (size_t)(3 * E) * 4;
    route_bufs b = {.off = malloc(e4),
                    .act = malloc(e4),
                    .src = malloc(k4),
                    .rows = malloc(k4),
                    .w = malloc(k4),
                    .scr = malloc(s4)};
    return b;
}

static inline void route_host_free(route_bufs *b) {
    free(b->off), free(b->act), free(b->src), free(b->rows), free(b->w), free(b->scr);
}

/* Hash routing when table is set: token t's experts are table[tokens[t] K ..] (backend.h). */
static inline void route_run_hash(const di_backend *be, const di_router_params *r, int64_t n,
                                  const float *logits, const int32_t *table, const int32_t *tokens,
                                  route_bufs *b) {
    di_moe_route_params p = {.router = *r,
                             .n = n,
                             .logits = logits,
                             .scratch = b->scr,
                             .offsets = b->off,
                             .active = b->act,
                             .src = b->src,
                             .rows_of = b->rows,
                             .w = b->w,
                             .hash_table = table,
                             .tokens = tokens};
    be->ops->moe_route(be->ctx, &p);
}

static inline void route_run(const di_backend *be, const di_router_params *r, int64_t n,
                             const float *logits, route_bufs *b) {
    route_run_hash(be, r, n, logits, NULL, NULL, b);
}

#endif /* DI_TEST_ROUTE_UTIL_H */
