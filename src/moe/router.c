/*
 * router.c -- DeepSeekMoE expert selection for one token (see router.h).
 *
 * Reference: transformers 5.17, DeepseekV2TopkRouter (softmax; greedy or
 * group_limited_greedy) and DeepseekV3TopkRouter (sigmoid; noaux_tc with
 * e_score_correction_bias). V4's sqrt(softplus(x)) is one more score function.
 *
 * Numerics: every score is computed with double intermediates (exp, the softmax sum) and
 * stored rounded to float, which is what torch's float32 tensors hold (up to its own last-bit
 * error). Selection compares those floats, so two experts tie exactly when their float
 * scores do, and ties always go to the lower id (groups too) -- torch.topk leaves ties
 * unspecified; a fixed rule makes our choice reproducible. The norm_topk_prob sum and the
 * final scaling are done in double and rounded once.
 *
 * Scratch layout (3 * n_experts floats):
 *   score  [n_experts]  unbiased scores; the weights are taken from here
 *   key    [n_experts]  selection keys: score + bias; -inf for experts of dropped groups
 *   aux    [n_experts]  group scores [n_group] while grouping, then "taken" flags
 *
 * Preconditions (the config loader checks them): 1 <= top_k <= n_experts, n_group divides
 * n_experts, 1 <= topk_group <= n_group, topk_group * (n_experts / n_group) >= top_k.
 */
#include "moe/router.h"

#include <math.h>

/* ---------------------------------------------------------------------------------------- */
/* Parameters                                                                                 */
/* ---------------------------------------------------------------------------------------- */

di_router_params di_router_params_from_hparams(const di_hparams *hp) {
    di_router_params p = {0};
    p.n_experts = hp->n_routed_experts;
    p.top_k = hp->num_experts_per_tok;
    p.n_group = hp->n_group > 0 ? hp->n_group : 1;
    p.topk_group = hp->topk_group > 0 ? hp->topk_group : 1;
    p.score = hp->scoring_func;
    p.method = hp->topk_method;
    p.norm_topk_prob = hp->norm_topk_prob;
    p.routed_scaling_factor = (float)hp->routed_scaling_factor;
    p.bias = NULL;

    switch (hp->family) {
    case DI_FAMILY_DEEPSEEK_V2:
        /* transformers' DeepseekV2TopkRouter always uses softmax and never renormalises:
         * it ignores norm_topk_prob (false in every published V2 / V2-Lite config). */
        p.score = DI_SCORE_SOFTMAX;
        p.norm_topk_prob = false;
        if (p.method == DI_TOPK_NOAUX_TC) p.method = DI_TOPK_GREEDY;
        break;
    case DI_FAMILY_DEEPSEEK_V3:
    case DI_FAMILY_DEEPSEEK_V32:
        /* DeepseekV3TopkRouter is always sigmoid + noaux_tc, whatever the config says. */
        p.score = DI_SCORE_SIGMOID;
        p.method = DI_TOPK_NOAUX_TC;
        break;
    case DI_FAMILY_DEEPSEEK_V4:
        break; /* scoring_func / topk_method as configured (sqrtsoftplus, noaux_tc) */
    }
    if (p.method == DI_TOPK_GREEDY) p.n_group = p.topk_group = 1;
    return p;
}

/* ---------------------------------------------------------------------------------------- */
/* Scores                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static void score_softmax(const float *logits, int64_t n, float *score) {
    double mx = logits[0];
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += exp((double)logits[i] - mx);
    for (int64_t i = 0; i < n; i++)
        score[i] = (float)(exp((double)logits[i] - mx) / sum);
}

static void score_sigmoid(const float *logits, int64_t n, float *score) {
    for (int64_t i = 0; i < n; i++)
        score[i] = (float)(1.0 / (1.0 + exp(-(double)logits[i])));
}

/* sqrt(softplus(x)), softplus(x) = log(1 + e^x) written so that it cannot overflow. */
static void score_sqrt_softplus(const float *logits, int64_t n, float *score) {
    for (int64_t i = 0; i < n; i++) {
        double x = logits[i];
        double sp = x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x));
        score[i] = (float)sqrt(sp);
    }
}

static void compute_scores(di_score_func f, const float *logits, int64_t n, float *score) {
    switch (f) {
    case DI_SCORE_SOFTMAX:
        score_softmax(logits, n, score);
        break;
    case DI_SCORE_SIGMOID:
        score_sigmoid(logits, n, score);
        break;
    case DI_SCORE_SQRTSOFTPLUS:
        score_sqrt_softplus(logits, n, score);
        break;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Group limiting                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* V2: the best key of the group. */
static float group_score_max(const float *key, int64_t size) {
    float best = key[0];
    for (int64_t i = 1; i < size; i++)
        if (key[i] > best) best = key[i];
    return best;
}

/* V3: the sum of the group's two best keys (the one key of a group of one). */
static float group_score_top2(const float *key, int64_t size) {
    if (size < 2) return key[0];
    float a = key[0] > key[1] ? key[0] : key[1]; /* best */
    float b = key[0] > key[1] ? key[1] : key[0]; /* second */
    for (int64_t i = 2; i < size; i++) {
        if (key[i] > a) {
            b = a;
            a = key[i];
        } else if (key[i] > b) {
            b = key[i];
        }
    }
    return a + b;
}

/* Rank of group g among all groups: how many rank ahead of it (higher score, or the same
 * score and a lower index). */
static int64_t group_rank(const float *gscore, int64_t n_group, int64_t g) {
    int64_t rank = 0;
    for (int64_t j = 0; j < n_group; j++)
        if (gscore[j] > gscore[g] || (gscore[j] == gscore[g] && j < g)) rank++;
    return rank;
}

/* Sets the keys of every expert outside the topk_group best groups to -inf. */
static void limit_groups(const di_router_params *p, float *key, float *gscore) {
    int64_t size = p->n_experts / p->n_group;
    for (int64_t g = 0; g < p->n_group; g++) {
        const float *k = key + g * size;
        gscore[g] =
            p->method == DI_TOPK_NOAUX_TC ? group_score_top2(k, size) : group_score_max(k, size);
    }
    for (int64_t g = 0; g < p->n_group; g++) {
        if (group_rank(gscore, p->n_group, g) < p->topk_group) continue;
        for (int64_t i = g * size; i < (g + 1) * size; i++)
            key[i] = -INFINITY;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Selection                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* The untaken expert with the highest key, lowest id on ties. `taken` is 0 / 1 per expert.
 * The first untaken expert is the starting candidate, so NaN keys cannot leave it unset. */
static int64_t argmax_untaken(const float *key, const float *taken, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++) {
        if (taken[i] != 0.0f) continue;
        if (best < 0 || key[i] > key[best]) best = i;
    }
    return best;
}

static void select_top_k(const di_router_params *p, const float *key, float *taken, int32_t *ids) {
    for (int64_t i = 0; i < p->n_experts; i++)
        taken[i] = 0.0f;
    for (int64_t j = 0; j < p->top_k; j++) {
        int64_t best = argmax_untaken(key, taken, p->n_experts);
        taken[best] = 1.0f;
        ids[j] = (int32_t)best;
    }
}

/* weights[j] = score[ids[j]], renormalised (+1e-20 as transformers does) and scaled. */
static void compute_weights(const di_router_params *p, const float *score, const int32_t *ids,
                            float *weights) {
    double denom = 1.0;
    if (p->norm_topk_prob) {
        double sum = 0.0;
        for (int64_t j = 0; j < p->top_k; j++)
            sum += score[ids[j]];
        denom = sum + 1e-20;
    }
    for (int64_t j = 0; j < p->top_k; j++)
        weights[j] = (float)((double)score[ids[j]] / denom * (double)p->routed_scaling_factor);
}

void di_router_select(const di_router_params *p, const float *logits, int32_t *ids, float *weights,
                      float *scratch) {
    int64_t n = p->n_experts;
    float *score = scratch;
    float *key = scratch + n;
    float *aux = scratch + 2 * n;

    compute_scores(p->score, logits, n, score);
    for (int64_t i = 0; i < n; i++)
        key[i] = score[i] + (p->bias ? p->bias[i] : 0.0f);

    bool grouped = p->method != DI_TOPK_GREEDY && p->n_group > 1 && p->topk_group < p->n_group;
    if (grouped) limit_groups(p, key, aux);

    select_top_k(p, key, aux, ids);
    compute_weights(p, score, ids, weights);
}

void di_router_hash(const di_router_params *p, const float *logits, const int32_t *ids,
                    float *weights, float *scratch) {
    compute_scores(p->score, logits, p->n_experts, scratch);
    compute_weights(p, scratch, ids, weights);
}
