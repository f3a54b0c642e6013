/*
 * test_router.c -- expert selection (src/moe/router.c): hand-computed cases for every score
 * function and selection method, then a randomized comparison against a brute-force
 * reference written the obvious way (sort the groups, sort the candidates).
 */
#include "moe/router.h"
#include "test.h"

#define MAX_EXPERTS 64
#define MAX_K       16

/* Logit whose sigmoid is p. */
static float logit_of(double p) {
    return (float)log(p / (1.0 - p));
}

static di_router_params params(int64_t n, int64_t k, di_score_func score, di_topk_method m) {
    di_router_params p = {0};
    p.n_experts = n;
    p.top_k = k;
    p.n_group = 1;
    p.topk_group = 1;
    p.score = score;
    p.method = m;
    p.routed_scaling_factor = 1.0f;
    return p;
}

static void run(const di_router_params *p, const float *logits, int32_t *ids, float *w) {
    float scratch[3 * MAX_EXPERTS];
    di_router_select(p, logits, ids, w, scratch);
}

/* ---------------------------------------------------------------------------------------- */
/* Hand-computed cases                                                                        */
/* ---------------------------------------------------------------------------------------- */

/* softmax of [0, ln 2, ln 4, 0] = [1, 2, 4, 1] / 8. */
TEST(softmax_greedy_scaled) {
    float logits[4] = {0.0f, (float)log(2.0), (float)log(4.0), 0.0f};
    di_router_params p = params(4, 3, DI_SCORE_SOFTMAX, DI_TOPK_GREEDY);
    p.routed_scaling_factor = 2.0f;
    int32_t ids[3];
    float w[3];
    run(&p, logits, ids, w);
    CHECK_EQ_INT(ids[0], 2);
    CHECK_EQ_INT(ids[1], 1);
    CHECK_EQ_INT(ids[2], 0); /* experts 0 and 3 tie at 1/8: the lower id wins */
    CHECK_NEAR(w[0], 1.0, 1e-6);
    CHECK_NEAR(w[1], 0.5, 1e-6);
    CHECK_NEAR(w[2], 0.25, 1e-6);
}

/* Softmax scores = [.3 .05 | .25 .2 | .1 .1] (they sum to 1, so logits = ln score). Greedy
 * takes experts 0 and 2; with one group allowed, group 0 (max .3) wins and expert 2, the
 * global second best, is excluded. */
TEST(group_limited_greedy) {
    const double s[6] = {0.3, 0.05, 0.25, 0.2, 0.1, 0.1};
    float logits[6];
    for (int i = 0; i < 6; i++)
        logits[i] = (float)log(s[i]);
    di_router_params p = params(6, 2, DI_SCORE_SOFTMAX, DI_TOPK_GROUP_LIMITED_GREEDY);
    p.n_group = 3;
    p.topk_group = 1;
    int32_t ids[2];
    float w[2];
    run(&p, logits, ids, w);
    CHECK_EQ_INT(ids[0], 0);
    CHECK_EQ_INT(ids[1], 1);
    CHECK_NEAR(w[0], 0.3, 1e-6);
    CHECK_NEAR(w[1], 0.05, 1e-6);

    p.topk_group = 2; /* groups 0 and 1 */
    run(&p, logits, ids, w);
    CHECK_EQ_INT(ids[0], 0);
    CHECK_EQ_INT(ids[1], 2);

    p.method = DI_TOPK_GREEDY; /* groups ignored */
    p.topk_group = 1;
    run(&p, logits, ids, w);
    CHECK_EQ_INT(ids[0], 0);
    CHECK_EQ_INT(ids[1], 2);
}

/* Sigmoid scores [.95 .05 | .62 .58 | .6 .5 | .1 .1]: group scores (sum of top 2) are
 * 1.0, 1.2, 1.1, 0.2, so groups 1 and 2 survive and the global best expert 0 is excluded. */
TEST(noaux_tc_excludes_global_top) {
    const double s[8] = {0.95, 0.05, 0.62, 0.58, 0.6, 0.5, 0.1, 0.1};
    float logits[8];
    for (int i = 0; i < 8; i++)
        logits[i] = logit_of(s[i]);
    di_router_params p = params(8, 2, DI_SCORE_SIGMOID, DI_TOPK_NOAUX_TC);
    p.n_group = 4;
    p.topk_group = 2;
    int32_t ids[2];
    float w[2];
    run(&p, logits, ids, w);
    CHECK_EQ_INT(ids[0], 2);
    CHECK_EQ_INT(ids[1], 4);
    CHECK_NEAR(w[0], 0.62, 1e-6);
    CHECK_NEAR(w[1], 0.60, 1e-6);

    p.norm_topk_prob = true;
    p.routed_scaling_factor = 2.5f;
    run(&p, logits, ids, w);
    CHECK_NEAR(w[0], 2.5 * 0.62 / 1.22, 1e-6);
    CHECK_NEAR(w[1], 2.5 * 0.60 / 1.22, 1e-6);
    CHECK_NEAR(w[0] + w[1], 2.5, 1e-6);
}

/* The bias moves expert 1 ahead (.5 + .2 > .6) but its weight is its unbiased score. */
TEST(bias_changes_choice_not_weight) {
    const double s[4] = {0.6, 0.5, 0.4, 0.3};
    const float bias[4] = {0.0f, 0.2f, 0.0f, 0.0f};
    float logits[4];
    for (int i = 0; i < 4; i++)
        logits[i] = logit_of(s[i]);
    di_router_params p = params(4, 1, DI_SCORE_SIGMOID, DI_TOPK_NOAUX_TC);
    int32_t ids[2];
    float w[2];
    run(&p, logits, ids, w);
    CHECK_EQ_INT(ids[0], 0);
    CHECK_NEAR(w[0], 0.6, 1e-6);

    p.bias = bias;
    run(&p, logits, ids, w);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_NEAR(w[0], 0.5, 1e-6);

    p.norm_topk_prob = true; /* one expert: normalised weight 1 */
    run(&p, logits, ids, w);
    CHECK_NEAR(w[0], 1.0, 1e-6);

    p.top_k = 2; /* order follows the biased key: 1 (.7), then 0 (.6) */
    p.norm_topk_prob = false;
    run(&p, logits, ids, w);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], 0);
    CHECK_NEAR(w[0], 0.5, 1e-6);
    CHECK_NEAR(w[1], 0.6, 1e-6);
}

/* Equal logits: every tie, expert and group, goes to the lower id. */
TEST(ties_lower_id) {
    float logits[8] = {0};
    int32_t ids[3];
    float w[3];
    di_router_params p = params(8, 3, DI_SCORE_SIGMOID, DI_TOPK_NOAUX_TC);
    p.n_group = 4;
    p.topk_group = 2;
    run(&p, logits, ids, w);
    CHECK_EQ_INT(ids[0], 0);
    CHECK_EQ_INT(ids[1], 1);
    CHECK_EQ_INT(ids[2], 2);
    CHECK_NEAR(w[0], 0.5, 1e-7);

    /* Tied groups 1 and 3 compete for the second place: group 1 wins. */
    const float up[8] = {0, 0, 1, 1, 0, 0, 1, 1};
    const float first[8] = {2, 2, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 8; i++)
        logits[i] = up[i] + first[i];
    p.top_k = 3;
    run(&p, logits, ids, w);
    CHECK_EQ_INT(ids[0], 0);
    CHECK_EQ_INT(ids[1], 1);
    CHECK_EQ_INT(ids[2], 2);

    p = params(8, 2, DI_SCORE_SOFTMAX, DI_TOPK_GROUP_LIMITED_GREEDY);
    p.n_group = 4;
    p.topk_group = 1;
    for (int i = 0; i < 8; i++)
        logits[i] = up[i];
    run(&p, logits, ids, w);
    CHECK_EQ_INT(ids[0], 2);
    CHECK_EQ_INT(ids[1], 3);
}

/* sqrt(softplus(x)) of [0, 1, -1, 2]: the best two are 3 and 1. */
TEST(sqrt_softplus) {
    float logits[4] = {0.0f, 1.0f, -1.0f, 2.0f};
    di_router_params p = params(4, 2, DI_SCORE_SQRTSOFTPLUS, DI_TOPK_GREEDY);
    p.norm_topk_prob = true;
    p.routed_scaling_factor = 1.5f;
    int32_t ids[2];
    float w[2];
    run(&p, logits, ids, w);
    double s3 = sqrt(log(1.0 + exp(2.0))), s1 = sqrt(log(1.0 + exp(1.0)));
    CHECK_EQ_INT(ids[0], 3);
    CHECK_EQ_INT(ids[1], 1);
    CHECK_NEAR(w[0], 1.5 * s3 / (s3 + s1), 1e-6);
    CHECK_NEAR(w[1], 1.5 * s1 / (s3 + s1), 1e-6);

    /* Large |x| stays finite: softplus(100) = 100, softplus(-100) ~ e^-100. */
    float big[4] = {100.0f, -100.0f, 0.0f, 0.0f};
    p.norm_topk_prob = false;
    p.routed_scaling_factor = 1.0f;
    run(&p, big, ids, w);
    CHECK_EQ_INT(ids[0], 0);
    CHECK_NEAR(w[0], 10.0, 1e-5);
}

TEST(params_from_hparams) {
    di_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.family = DI_FAMILY_DEEPSEEK_V3;
    hp.n_routed_experts = 256;
    hp.num_experts_per_tok = 8;
    hp.n_group = 8;
    hp.topk_group = 4;
    hp.norm_topk_prob = true;
    hp.routed_scaling_factor = 2.5;
    hp.scoring_func = DI_SCORE_SIGMOID;
    hp.topk_method = DI_TOPK_NOAUX_TC;
    di_router_params p = di_router_params_from_hparams(&hp);
    CHECK_EQ_INT(p.n_experts, 256);
    CHECK_EQ_INT(p.top_k, 8);
    CHECK_EQ_INT(p.n_group, 8);
    CHECK_EQ_INT(p.topk_group, 4);
    CHECK(p.norm_topk_prob);
    CHECK_NEAR(p.routed_scaling_factor, 2.5, 0);
    CHECK(p.score == DI_SCORE_SIGMOID && p.method == DI_TOPK_NOAUX_TC);
    CHECK(p.bias == NULL);

    /* V2-Lite: softmax, greedy; transformers' V2 router never renormalises. */
    memset(&hp, 0, sizeof hp);
    hp.family = DI_FAMILY_DEEPSEEK_V2;
    hp.n_routed_experts = 64;
    hp.num_experts_per_tok = 6;
    hp.n_group = 1;
    hp.topk_group = 1;
    hp.norm_topk_prob = true;
    hp.routed_scaling_factor = 1.0;
    hp.scoring_func = DI_SCORE_SOFTMAX;
    hp.topk_method = DI_TOPK_GREEDY;
    p = di_router_params_from_hparams(&hp);
    CHECK_EQ_INT(p.n_experts, 64);
    CHECK_EQ_INT(p.top_k, 6);
    CHECK(!p.norm_topk_prob);
    CHECK(p.score == DI_SCORE_SOFTMAX && p.method == DI_TOPK_GREEDY);

    hp.topk_method = DI_TOPK_GROUP_LIMITED_GREEDY; /* V2 full: 8 groups, 3 kept */
    hp.n_group = 8;
    hp.topk_group = 3;
    p = di_router_params_from_hparams(&hp);
    CHECK(p.method == DI_TOPK_GROUP_LIMITED_GREEDY);
    CHECK_EQ_INT(p.n_group, 8);
    CHECK_EQ_INT(p.topk_group, 3);

    hp.family = DI_FAMILY_DEEPSEEK_V4;
    hp.scoring_func = DI_SCORE_SQRTSOFTPLUS;
    hp.topk_method = DI_TOPK_NOAUX_TC;
    hp.norm_topk_prob = true;
    p = di_router_params_from_hparams(&hp);
    CHECK(p.score == DI_SCORE_SQRTSOFTPLUS && p.method == DI_TOPK_NOAUX_TC);
    CHECK(p.norm_topk_prob);
}

/* ---------------------------------------------------------------------------------------- */
/* Brute-force reference                                                                      */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    float key;
    int id;
} ranked;

/* Higher key first, then lower id. */
static int cmp_ranked(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return x->id - y->id;
}

static float ref_score(di_score_func f, const float *logits, int n, int i) {
    double x = logits[i];
    if (f == DI_SCORE_SIGMOID) return (float)(1.0 / (1.0 + exp(-x)));
    if (f == DI_SCORE_SQRTSOFTPLUS) return (float)sqrt(x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)));
    double mx = logits[0], sum = 0.0;
    for (int j = 1; j < n; j++)
        mx = logits[j] > mx ? logits[j] : mx;
    for (int j = 0; j < n; j++)
        sum += exp((double)logits[j] - mx);
    return (float)(exp(x - mx) / sum);
}

/* Score of one group: its members sorted, then the first (max) or first two (sum). */
static float ref_group_score(const di_router_params *p, const float *key, int g, int size) {
    ranked m[MAX_EXPERTS];
    for (int i = 0; i < size; i++)
        m[i] = (ranked){key[g * size + i], g * size + i};
    qsort(m, (size_t)size, sizeof m[0], cmp_ranked);
    if (p->method == DI_TOPK_NOAUX_TC && size >= 2) return m[0].key + m[1].key;
    return m[0].key;
}

static void ref_select(const di_router_params *p, const float *logits, int32_t *ids, float *w) {
    int n = (int)p->n_experts, ng = (int)p->n_group, size = n / ng;
    float score[MAX_EXPERTS], key[MAX_EXPERTS];
    for (int i = 0; i < n; i++) {
        score[i] = ref_score(p->score, logits, n, i);
        key[i] = score[i] + (p->bias ? p->bias[i] : 0.0f);
    }
    /* Which groups are allowed: all for greedy, else the topk_group best after sorting. */
    int allowed[MAX_EXPERTS] = {0};
    ranked groups[MAX_EXPERTS];
    for (int g = 0; g < ng; g++)
        groups[g] = (ranked){ref_group_score(p, key, g, size), g};
    qsort(groups, (size_t)ng, sizeof groups[0], cmp_ranked);
    for (int r = 0; r < ng; r++)
        allowed[groups[r].id] = p->method == DI_TOPK_GREEDY || r < p->topk_group;
    /* Every allowed expert is a candidate; sort them, keep the first top_k. */
    ranked cand[MAX_EXPERTS];
    int nc = 0;
    for (int i = 0; i < n; i++)
        if (allowed[i / size]) cand[nc++] = (ranked){key[i], i};
    qsort(cand, (size_t)nc, sizeof cand[0], cmp_ranked);
    double sum = 0.0;
    for (int j = 0; j < p->top_k; j++)
        sum += score[cand[j].id];
    for (int j = 0; j < p->top_k; j++) {
        ids[j] = cand[j].id;
        double v = score[cand[j].id];
        if (p->norm_topk_prob) v /= sum + 1e-20;
        w[j] = (float)(v * p->routed_scaling_factor);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Randomized comparison                                                                      */
/* ---------------------------------------------------------------------------------------- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd_u32(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 33);
}

static int rnd_int(int lo, int hi) {
    return lo + (int)(rnd_u32() % (uint32_t)(hi - lo + 1));
}

static float rnd_float(float lo, float hi) {
    return lo + (hi - lo) * (float)(rnd_u32() & 0xFFFFFF) / (float)0x1000000;
}

/* A random valid configuration; coarse logits (steps of 0.5) in half the cases so that ties
 * between experts and between groups happen often. */
static di_router_params random_case(float *logits, float *bias) {
    static const int group_counts[4] = {1, 2, 4, 8};
    static const di_score_func funcs[3] = {DI_SCORE_SOFTMAX, DI_SCORE_SIGMOID,
                                           DI_SCORE_SQRTSOFTPLUS};
    static const di_topk_method methods[3] = {DI_TOPK_GREEDY, DI_TOPK_GROUP_LIMITED_GREEDY,
                                              DI_TOPK_NOAUX_TC};
    int ng = group_counts[rnd_int(0, 3)], size = rnd_int(2, 8), n = ng * size;
    int tg = rnd_int(1, ng), kmax = DI_MIN(tg * size, MAX_K);
    di_router_params p = params(n, rnd_int(1, kmax), funcs[rnd_int(0, 2)], methods[rnd_int(0, 2)]);
    p.n_group = ng;
    p.topk_group = tg;
    p.norm_topk_prob = rnd_int(0, 1);
    p.routed_scaling_factor = rnd_float(0.5f, 3.0f);
    bool coarse = rnd_int(0, 1);
    for (int i = 0; i < n; i++) {
        logits[i] = rnd_float(-4.0f, 4.0f);
        if (coarse) logits[i] = roundf(logits[i] * 2.0f) / 2.0f;
        bias[i] = coarse ? 0.25f * (float)rnd_int(-1, 1) : rnd_float(-0.1f, 0.1f);
    }
    p.bias = rnd_int(0, 1) ? bias : NULL;
    return p;
}

TEST(random_vs_brute_force) {
    float logits[MAX_EXPERTS], bias[MAX_EXPERTS], w[MAX_K], rw[MAX_K];
    int32_t ids[MAX_K], rids[MAX_K];
    for (int t = 0; t < 20000; t++) {
        di_router_params p = random_case(logits, bias);
        run(&p, logits, ids, w);
        ref_select(&p, logits, rids, rw);
        for (int j = 0; j < p.top_k; j++) {
            CHECK_MSG(ids[j] == rids[j], "case %d slot %d: id %d, reference %d", t, j, (int)ids[j],
                      (int)rids[j]);
            CHECK_MSG(fabsf(w[j] - rw[j]) <= 1e-6f * fabsf(rw[j]) + 1e-12f,
                      "case %d slot %d: weight %g, reference %g", t, j, w[j], rw[j]);
        }
        if (test_cur_failed) return;
    }
}

int main(void) {
    RUN(softmax_greedy_scaled);
    RUN(group_limited_greedy);
    RUN(noaux_tc_excludes_global_top);
    RUN(bias_changes_choice_not_weight);
    RUN(ties_lower_id);
    RUN(sqrt_softplus);
    RUN(params_from_hparams);
    RUN(random_vs_brute_force);
    return test_summary();
}
