/*
 * router.h -- DeepSeekMoE expert selection for one token, plain C over a float row.
 *
 * Scoring: softmax (V2), sigmoid (V3), sqrt(softplus) (V4). Selection: plain top-k
 * (greedy), V2's group-limited greedy (group score = max score in the group) or V3's
 * noaux_tc (scores + e_score_correction_bias choose; group score = sum of the group's two
 * best biased scores; only the topk_group best groups compete). Weights are the unbiased
 * scores of the chosen experts, optionally renormalised to sum 1 (norm_topk_prob), times
 * routed_scaling_factor.
 */
#ifndef DI_ROUTER_H
#define DI_ROUTER_H

#include "io/config.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct di_router_params {
    int64_t n_experts;
    int64_t top_k;
    int64_t n_group, topk_group; /* 1, 1 = no grouping */
    di_score_func score;
    di_topk_method method;
    bool norm_topk_prob;
    float routed_scaling_factor;
    const float *bias; /* [n_experts] e_score_correction_bias, or NULL */
} di_router_params;

/* Fills the router parameters of hp (bias left NULL; the model sets it per layer). */
di_router_params di_router_params_from_hparams(const di_hparams *hp);

/* Selects experts for one token. logits: [n_experts] router logits (x @ gate^T, fp32).
 * Writes ids[top_k] and weights[top_k], ordered by decreasing selection score (ties: lower
 * id first). scratch: at least 3 * n_experts floats. */
void di_router_select(const di_router_params *p, const float *logits, int32_t *ids,
                      float *weights, float *scratch);

/* Hash routing (DeepSeek-V4): the experts are given (ids[top_k], e.g. a token's row of
 * tid2eid); writes their weights exactly as di_router_select weights a selection (scores
 * from logits, renormalised when norm_topk_prob, scaled). scratch: n_experts floats. */
void di_router_hash(const di_router_params *p, const float *logits, const int32_t *ids,
                    float *weights, float *scratch);

#endif /* DI_ROUTER_H */
