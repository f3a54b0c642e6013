/*
 * test_sample_dist.c -- the sampler's random path (src/sample): the distribution it draws
 * from against a brute-force reference (a full sort, double precision), chi-square goodness
 * of fit of many seeded draws against that reference, and determinism of the draws.
 *
 * Independent draws come from varying the position, the only thing that changes the Philox
 * counter between two samples of one row. Seeds are fixed and the chi-square critical value
 * is taken at p = 1e-6, so these tests cannot flake: a build always passes or always fails.
 */
#include "sample/philox.h"
#include "sample/sample_mass.h"
#include "sample/sampler.h"
#include "test.h"

#define BIG_VOCAB 129280

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static double rnd01(void) { /* test-only xorshift, independent of the code under test */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}

static void random_row(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((rnd01() * 2.0 - 1.0) * scale);
}

static void *scratch_for(int64_t vocab) {
    static unsigned char *buf;
    static size_t cap;
    size_t need = di_sampler_scratch_size(vocab);
    if (need > cap) {
        free(buf);
        buf = malloc(need);
        cap = need;
    }
    return buf;
}

static di_sample_input input(const float *logits, int64_t vocab, int64_t seed) {
    di_sample_input in = {0};
    in.logits = logits;
    in.vocab = vocab;
    in.eos_token_id = -1;
    in.seed = seed;
    return in;
}

static di_sampling_params params(float t, int32_t k, float top_p, float min_p) {
    di_sampling_params p = di_sampling_default_params();
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    return p;
}

/* ---------------------------------------------------------------------------------------- */
/* The reference: vLLM's definitions written the obvious way                                  */
/* ---------------------------------------------------------------------------------------- */

static const float *g_sort_row;
static int by_logit_desc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = g_sort_row[i], y = g_sort_row[j];
    if (x != y) return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

/* probs[n] for processed row x: softmax(x / T); drop p < min_p * p_max; keep the top_k best;
 * renormalise; keep the best tokens while the mass before them is < top_p. */
static void reference_probs(const di_sampling_params *p, const float *x, int64_t n, double *probs) {
    int32_t *order = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        order[i] = (int32_t)i;
    g_sort_row = x;
    qsort(order, (size_t)n, sizeof *order, by_logit_desc);
    double m = x[order[0]], z = 0.0;
    int64_t rank = 0;
    for (int64_t r = 0; r < n; r++) {
        int32_t i = order[r];
        double w = exp(((double)x[i] - m) / p->temperature);
        bool keep = x[i] > -INFINITY && w >= p->min_p && (p->top_k <= 0 || rank < p->top_k);
        probs[i] = keep ? w : 0.0;
        rank += keep;
        z += probs[i];
    }
    double acc = 0.0, z2 = 0.0;
    for (int64_t r = 0; r < n; r++) {
        int32_t i = order[r];
        if (acc >= p->top_p * z) probs[i] = 0.0;
        acc += probs[i];
        z2 += probs[i];
    }
    for (int64_t i = 0; i < n; i++)
        probs[i] /= z2;
    free(order);
}

/* Max |sampler - reference| over the row; also counts kept-set disagreements. */
static double probs_error(const di_sampling_params *p, const float *x, int64_t n, int *n_diff) {
    double *got = malloc(sizeof(double) * (size_t)n), *want = malloc(sizeof(double) * (size_t)n);
    di_sample_input in = input(x, n, 1);
    double err = 1.0;
    *n_diff = 0;
    if (di_sampler_probs(p, &in, scratch_for(n), got) == DI_OK) {
        reference_probs(p, x, n, want);
        err = 0.0;
        for (int64_t i = 0; i < n; i++) {
            err = fmax(err, fabs(got[i] - want[i]));
            *n_diff += (got[i] > 0.0) != (want[i] > 0.0);
        }
    }
    free(got);
    free(want);
    return err;
}

/* ---------------------------------------------------------------------------------------- */
/* The distribution                                                                           */
/* ---------------------------------------------------------------------------------------- */

TEST(probs_match_reference) {
    static const struct {
        float t, top_p, min_p;
        int32_t k;
    } cases[] = {
        {1.0f, 1.0f, 0.0f, -1},   {0.7f, 1.0f, 0.0f, 0},    {1.3f, 1.0f, 0.0f, 50},
        {1.0f, 0.9f, 0.0f, -1},   {0.6f, 0.5f, 0.0f, -1},   {1.0f, 0.95f, 0.0f, 40},
        {0.8f, 1.0f, 0.05f, -1},  {1.0f, 0.8f, 0.1f, 100},  {2.0f, 0.99f, 0.0f, 1500},
        {1.0f, 1.0f, 0.0f, 3000}, {1.0f, 0.001f, 0.0f, -1}, {0.5f, 1.0f, 0.0f, 1},
    };
    static float x[8192];
    for (size_t c = 0; c < (sizeof cases / sizeof cases[0]); c++) {
        di_sampling_params p = params(cases[c].t, cases[c].k, cases[c].top_p, cases[c].min_p);
        for (int rep = 0; rep < 3; rep++) {
            int64_t n = rep == 0 ? 8192 : 777;
            random_row(x, n, rep == 2 ? 8.0 : 3.0);
            x[n / 3] = -INFINITY; /* a banned token */
            int n_diff;
            double err = probs_error(&p, x, n, &n_diff);
            CHECK_MSG(err < 1e-6 && n_diff == 0,
                      "case %zu rep %d: max err %g, %d kept-set "
                      "differences",
                      c, rep, err, n_diff);
        }
    }
}

/* At the full DeepSeek vocabulary, peaked like a real model's row. */
TEST(probs_match_reference_big_vocab) {
    float *x = malloc(sizeof(float) * BIG_VOCAB);
    random_row(x, BIG_VOCAB, 4.0);
    for (int i = 0; i < 300; i++)
        x[(int64_t)(rnd01() * BIG_VOCAB)] += 10.0f;
    const di_sampling_params ps[4] = {params(1.0f, -1, 0.9f, 0.0f), params(0.8f, 50, 1.0f, 0.0f),
                                      params(1.0f, 50, 0.9f, 0.02f),
                                      params(1.0f, 20000, 0.95f, 0.0f)};
    for (int c = 0; c < 4; c++) {
        int n_diff;
        double err = probs_error(&ps[c], x, BIG_VOCAB, &n_diff);
        CHECK_MSG(err < 1e-6 && n_diff == 0, "case %d: max err %g, %d kept-set differences", c, err,
                  n_diff);
    }
    /* Nearly flat, as a model with random weights gives: top_p keeps most of the vocabulary
     * (the radix sort of the candidates, the kept ids read from a bitmap), and a top_k of
     * thousands (its kept ids too). */
    random_row(x, BIG_VOCAB, 0.1);
    const di_sampling_params pf[3] = {params(1.0f, -1, 0.95f, 0.0f), params(0.7f, -1, 0.5f, 0.0f),
                                      params(1.0f, 9000, 0.9f, 0.0f)};
    for (int c = 0; c < 3; c++) {
        int n_diff;
        double err = probs_error(&pf[c], x, BIG_VOCAB, &n_diff);
        CHECK_MSG(err < 1e-6 && n_diff == 0, "flat case %d: max err %g, %d kept-set differences", c,
                  err, n_diff);
    }
    free(x);
}

/* top_p = 1 is no filter; a tiny top_p keeps only the argmax. */
TEST(top_p_edges) {
    static float x[1000];
    static double a[1000], b[1000];
    random_row(x, 1000, 2.0);
    di_sampling_params plain = params(1.0f, -1, 1.0f, 0.0f), tiny = params(1.0f, -1, 1e-6f, 0);
    di_sample_input in = input(x, 1000, 1);
    CHECK_EQ_INT(di_sampler_probs(&plain, &in, scratch_for(1000), a), DI_OK);
    double z = 0.0;
    for (int i = 0; i < 1000; i++)
        z += exp(x[i]);
    for (int i = 0; i < 1000; i++)
        CHECK_NEAR(a[i], exp(x[i]) / z, 1e-9);
    CHECK_EQ_INT(di_sampler_probs(&tiny, &in, scratch_for(1000), b), DI_OK);
    int32_t best = 0;
    for (int i = 1; i < 1000; i++)
        best = x[i] > x[best] ? i : best;
    CHECK(b[best] == 1.0);
}

/* ---------------------------------------------------------------------------------------- */
/* Chi-square goodness of fit                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* Upper 1e-6 quantile of chi-square(df), Wilson-Hilferty (z = 4.7534). */
static double chi2_critical(int64_t df) {
    double h = 2.0 / (9.0 * (double)df);
    double c = 1.0 - h + 4.7534 * sqrt(h);
    return (double)df * c * c * c;
}

/* Draws n_draws tokens (positions 0..n_draws-1) and tests them against the reference. Bins
 * expected to hold < 5 draws are pooled; a draw of a zero-probability token fails at once. */
static void chi_square(const di_sampling_params *p, const float *x, int64_t n, int64_t n_draws,
                       const char *what) {
    double *probs = malloc(sizeof(double) * (size_t)n);
    int64_t *count = calloc((size_t)n, sizeof *count);
    reference_probs(p, x, n, probs);
    di_sample_input in = input(x, n, 0x5eed);
    int64_t impossible = 0;
    for (int64_t pos = 0; pos < n_draws; pos++) {
        di_sample_result r;
        in.position = pos;
        if (di_sampler_sample(p, &in, scratch_for(n), &r) != DI_OK) {
            impossible++;
            continue;
        }
        count[r.token]++;
        impossible += probs[r.token] == 0.0;
    }
    double chi2 = 0.0, pool_e = 0.0, pool_o = 0.0;
    int64_t bins = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = probs[i] * (double)n_draws;
        if (e == 0.0) continue;
        if (e < 5.0) {
            pool_e += e, pool_o += (double)count[i];
            continue;
        }
        chi2 += (count[i] - e) * (count[i] - e) / e;
        bins++;
    }
    if (pool_e > 0.0) chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e, bins++;
    double crit = bins > 1 ? chi2_critical(bins - 1) : 0.0;
    CHECK_MSG(impossible == 0, "%s: %lld draws of dropped tokens", what, (long long)impossible);
    CHECK_MSG(bins <= 1 || chi2 < crit, "%s: chi2 %.1f over %lld bins, critical %.1f", what, chi2,
              (long long)bins, crit);
    free(probs);
    free(count);
}

TEST(chi_square_small_vocab) {
    static float x[48];
    random_row(x, 48, 2.5);
    x[7] = -INFINITY;
    const struct {
        di_sampling_params p;
        const char *what;
    } cases[] = {
        {params(1.0f, -1, 1.0f, 0.0f), "temperature 1"},
        {params(0.6f, -1, 1.0f, 0.0f), "temperature 0.6"},
        {params(1.8f, -1, 1.0f, 0.0f), "temperature 1.8"},
        {params(1.0f, 8, 1.0f, 0.0f), "top_k 8"},
        {params(1.0f, -1, 0.7f, 0.0f), "top_p 0.7"},
        {params(1.0f, -1, 1.0f, 0.1f), "min_p 0.1"},
        {params(0.9f, 12, 0.8f, 0.0f), "top_k 12 + top_p 0.8"},
        {params(1.2f, 20, 0.9f, 0.05f), "top_k 20 + top_p 0.9 + min_p 0.05"},
    };
    for (size_t c = 0; c < (sizeof cases / sizeof cases[0]); c++)
        chi_square(&cases[c].p, x, 48, 100000, cases[c].what);
}

/* The histogram path of top_p (no top_k), the heap path of top_k, and the block draw of a
 * full row (16 summation blocks) over a larger row. */
TEST(chi_square_larger_vocab) {
    static float x[4096];
    random_row(x, 4096, 3.0);
    for (int i = 0; i < 40; i++)
        x[(int64_t)(rnd01() * 4096)] += 6.0f;
    di_sampling_params a = params(1.0f, -1, 0.9f, 0.0f), b = params(0.8f, 30, 0.95f, 0.01f);
    chi_square(&a, x, 4096, 60000, "vocab 4096, top_p 0.9");
    chi_square(&b, x, 4096, 60000, "vocab 4096, top_k 30 + top_p 0.95 + min_p 0.01");
    di_sampling_params c = params(0.9f, -1, 1.0f, 0.001f);
    chi_square(&c, x, 4096, 60000, "vocab 4096, temperature 0.9 + min_p 0.001");
}

/* ---------------------------------------------------------------------------------------- */
/* Determinism                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* A token depends on (seed, sample index, position) and the row only: the same draws come
 * out forwards, backwards, and interleaved with other requests' calls. */
TEST(draws_independent_of_call_order) {
    enum { N = 400, V = 1000 };
    static float x[V], other[V];
    static int32_t fwd[N], bwd[N], mixed[N], idx1[N];
    random_row(x, V, 3.0);
    random_row(other, V, 3.0);
    const int32_t hist_ids[3] = {5, 17, 600};
    const int32_t hist_cnt[3] = {2, 0, 1};
    di_token_counts h = {hist_ids, hist_cnt, 3, 3};
    di_sampling_params p = params(0.9f, 200, 0.95f, 0.01f);
    p.repetition_penalty = 1.2f;
    p.frequency_penalty = 0.3f;
    di_sample_input in = input(x, V, 77), in2 = input(other, V, 78);
    in.history = &h;
    di_sample_result r;
    for (int i = 0; i < N; i++) {
        in.position = i;
        di_sampler_sample(&p, &in, scratch_for(V), &r);
        fwd[i] = r.token;
    }
    for (int i = N - 1; i >= 0; i--) {
        in.position = i;
        di_sampler_sample(&p, &in, scratch_for(V), &r);
        bwd[i] = r.token;
    }
    for (int j = 0; j < N; j++) {
        int i = (int)((j * 7919) % N); /* a permutation: 7919 is prime, coprime with N */
        in2.position = j;
        di_sampler_sample(&p, &in2, scratch_for(V), &r);
        in.position = i;
        di_sampler_sample(&p, &in, scratch_for(V), &r);
        mixed[i] = r.token;
    }
    in.sample_index = 1;
    int same_as_idx0 = 0, distinct = 0;
    for (int i = 0; i < N; i++) {
        in.position = i;
        di_sampler_sample(&p, &in, scratch_for(V), &r);
        idx1[i] = r.token;
        same_as_idx0 += idx1[i] == fwd[i];
        distinct += i > 0 && fwd[i] != fwd[i - 1];
    }
    CHECK(memcmp(fwd, bwd, sizeof fwd) == 0);
    CHECK(memcmp(fwd, mixed, sizeof fwd) == 0);
    CHECK(same_as_idx0 < N / 2); /* another completion draws other tokens */
    CHECK(distinct > N / 2);     /* and the draws do vary with the position */
}

/* ---------------------------------------------------------------------------------------- */
/* The filtered draw against its definition                                                  */
/* ---------------------------------------------------------------------------------------- */

static int by_key(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* sample_mass.h's definition, by brute force: every token ranked by a full sort, the first
 * top_k of those at or above min_p's cutoff, then while the integer mass before a token is
 * below ceil(top_p x their mass), then the first kept id (increasing) whose running mass
 * passes floor(u x the kept mass). Shares with the sampler only the weight (ds_weight) and
 * sample_mass.h's helpers (their edge cases: mass_helpers), none of its heap, quickselect,
 * buckets or radix sort. */
static int32_t defined_draw(const di_sampling_params *p, const float *x, int64_t n, double u) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        max = x[i] > max ? x[i] : max;
    float cutoff = -FLT_MAX;
    if (p->min_p > 0.0f) cutoff = fmaxf(cutoff, max + p->temperature * logf(p->min_p));
    const float inv_t = 1.0f / p->temperature;
    uint64_t *keys = malloc((size_t)n * sizeof *keys);
    bool *kept = calloc((size_t)n, sizeof *kept);
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        if (x[i] >= cutoff) keys[c++] = ds_rank_key(x[i], (int32_t)i);
    qsort(keys, (size_t)c, sizeof *keys, by_key);
    if (p->top_k > 0 && p->top_k < c) c = p->top_k;
    ds_u128 total = 0;
    for (int64_t j = 0; j < c; j++)
        total += ds_mass(ds_weight(x[ds_key_id(keys[j])], max, inv_t, cutoff));
    const ds_u128 need = p->top_p < 1.0f ? ds_top_p_need(p->top_p, total) : total + 1;
    ds_u128 before = 0, kept_mass = 0;
    for (int64_t j = 0; j < c && before < need; j++) {
        const uint64_t m = ds_mass(ds_weight(x[ds_key_id(keys[j])], max, inv_t, cutoff));
        kept[ds_key_id(keys[j])] = true;
        before += m;
        kept_mass += m;
    }
    const ds_u128 t = ds_draw_target(u, kept_mass);
    ds_u128 acc = 0;
    int32_t tok = -1;
    for (int64_t i = 0; i < n && tok < 0; i++)
        if (kept[i] && (acc += ds_mass(ds_weight(x[i], max, inv_t, cutoff))) > t) tok = (int32_t)i;
    free(keys);
    free(kept);
    return tok;
}

/* The sampler's top_k / top_p tokens are the definition's, over peaked, flat and tied rows
 * (equal logits across the cuts), -0 and +0 tied at the top, banned (-inf) tokens, tokens of
 * zero mass (a logit 60 below the maximum) and candidates fewer than top_k; small and large
 * k (heap and quickselect), top_p with and without top_k (bucketed nucleus and sorted list),
 * min_p up to 1, and vocabularies of 20000 and 777 ids. */
TEST(filtered_draw_matches_definition) {
    static const struct {
        float t, top_p, min_p;
        int32_t k;
    } cases[] = {
        {1.0f, 0.9f, 0.0f, -1},  {0.7f, 0.5f, 0.0f, -1},   {1.0f, 1.0f, 0.0f, 50},
        {0.8f, 0.95f, 0.0f, 40}, {1.0f, 0.8f, 0.05f, 100}, {1.3f, 0.99f, 0.0f, 3000},
        {1.0f, 0.3f, 0.01f, 7},  {2.0f, 1e-3f, 0.0f, -1},  {0.5f, 1.0f, 0.0f, 1},
        {1.0f, 0.9f, 1.0f, 5},   {0.9f, 1.0f, 0.0f, 2},    {1.0f, 0.99999994f, 0.0f, -1},
    };
    float *x = malloc((size_t)20000 * sizeof *x);
    int checked = 0;
    for (int row = 0; row < 7; row++) {
        const int64_t n = row == 6 ? 777 : 20000;
        random_row(x, n, row == 1 ? 0.05 : 4.0); /* row 1: nearly flat */
        if (row == 2)                            /* peaked */
            for (int i = 0; i < 50; i++)
                x[(int64_t)(rnd01() * (double)n)] += 9.0f;
        if (row == 3) /* ties: logits on a coarse grid, many equal at every cut */
            for (int64_t i = 0; i < n; i++)
                x[i] = roundf(x[i] * 2.0f) / 2.0f;
        if (row == 4) { /* -0 and +0 tied at the top, the rest below */
            for (int64_t i = 0; i < n; i++)
                x[i] = -fabsf(x[i]) - 0.5f;
            for (int i = 0; i < 6; i++)
                x[(int64_t)(rnd01() * (double)n)] = i % 2 ? 0.0f : -0.0f;
        }
        if (row == 5) /* banned tokens, tokens of zero mass; fewer candidates than some k */
            for (int64_t i = 0; i < n; i++)
                x[i] = i % 7 == 0 ? x[i] : i % 7 == 1 ? x[i] - 60.0f : -INFINITY;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            di_sampling_params p = params(cases[c].t, cases[c].k, cases[c].top_p, cases[c].min_p);
            di_sample_input in = input(x, n, 11 + (int64_t)c);
            for (int pos = 0; pos < 40; pos++) {
                in.position = pos;
                di_sample_result r;
                CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(n), &r), DI_OK);
                const double u = di_philox_uniform(in.seed, 0, pos, 0);
                const int32_t want = defined_draw(&p, x, n, u);
                CHECK_MSG(r.token == want, "row %d case %zu pos %d: sampler %d, definition %d", row,
                          c, pos, r.token, want);
                checked++;
            }
        }
    }
    printf("  %d draws checked\n", checked);
    free(x);
}

/* The exact helpers' edge cases: top_p's need is the ceiling of an exact product, even for
 * the smallest top_p; the draw's target stays below the total for u just below 1. */
TEST(mass_helpers) {
    const ds_u128 total = ((ds_u128)1 << 70) + 12345;
    CHECK(ds_top_p_need(1.0f, total) == total);
    CHECK(ds_top_p_need(0.5f, total) == (total + 1) / 2);
    CHECK(ds_top_p_need(0.25f, (ds_u128)4) == 1 && ds_top_p_need(0.25f, (ds_u128)5) == 2);
    CHECK(ds_top_p_need(1e-45f, total) == 1); /* the smallest subnormal: keeps the best token */
    CHECK(ds_mass(1.0f) == (uint64_t)1 << 52 && ds_mass(0.0f) == 0 && ds_mass(0x1p-53f) == 0);
    const double u_max = 9007199254740991.0 / 9007199254740992.0;
    CHECK(ds_draw_target(u_max, total) < total && ds_draw_target(0.0, total) == 0);
    CHECK(ds_rank_key(2.0f, 5) < ds_rank_key(1.0f, 0) &&
          ds_rank_key(1.0f, 3) < ds_rank_key(1.0f, 4));
    CHECK(ds_rank_key(-1.0f, 0) < ds_rank_key(-2.0f, 0));
}

int main(void) {
    RUN(probs_match_reference);
    RUN(probs_match_reference_big_vocab);
    RUN(top_p_edges);
    RUN(chi_square_small_vocab);
    RUN(chi_square_larger_vocab);
    RUN(draws_independent_of_call_order);
    RUN(filtered_draw_matches_definition);
    RUN(mass_helpers);
    return test_summary();
}
