/*
 * test_determinism.c -- the determinism matrix: one sampled request (temperature 0.8,
 * top_p 0.9, seed 1234, logprobs 5) run alone and inside batches of 3, 17 and 64 mixed
 * requests (other prompts, lengths, arrival steps, sampling settings), with 1 and 2 threads,
 * with prefill chunks of 512 and 7 tokens, and with the overlap loop, must give identical
 * tokens and bitwise-identical logprobs (chosen and top-5) every time.
 *
 * Why it holds: the forward computes each row independently of the other rows (batch
 * invariance), and the sampler's random numbers are keyed by (seed, sample index, position).
 *
 * With batch_invariant = false the kernels may depend on the batch, so only closeness is
 * checked: the same tokens, and logprobs within NONINV_LP_TOL of the invariant run's.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine_util.h"

#include <math.h>

#define TARGET_TOKENS 24
#define NONINV_LP_TOL 1e-3

static bool g_invariant = true; /* the engines' batch_invariant */

static uint32_t g_rng;
static int32_t rnd(int32_t n) {
    g_rng = g_rng * 1664525u + 1013904223u;
    return (int32_t)((g_rng >> 8) % (uint32_t)n);
}

static int32_t g_target_prompt[40];

static di_sampling_params target_params(void) {
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = 0.8f;
    sp.top_p = 0.9f;
    sp.seed = 1234;
    sp.max_tokens = TARGET_TOKENS;
    sp.ignore_eos = true;
    sp.logprobs = 5;
    return sp;
}

/* Runs the target inside a batch of n_batch requests; returns its result in *out. */
static bool run_config(di_model *m, int n_batch, int n_threads, int64_t chunk, bool overlap,
                       eu_result *out) {
    di_engine_params ep = di_engine_default_params();
    ep.n_threads = n_threads;
    ep.max_model_len = 128;
    ep.max_running = 64;
    ep.max_batch_tokens = 256;
    ep.max_prefill_tokens = chunk;
    ep.block_size = 8;
    ep.overlap = overlap;
    ep.batch_invariant = g_invariant;
    di_engine *e = NULL;
    if (di_engine_create(m, &ep, &e)) {
        printf("  engine: %s\n", di_last_error());
        return false;
    }
    g_rng = 99u + (uint32_t)n_batch; /* the other requests differ between batch sizes */
    eu_req *reqs = calloc((size_t)n_batch, sizeof *reqs);
    int32_t(*prompts)[64] = calloc((size_t)n_batch, sizeof *prompts);
    int target = n_batch / 2;
    for (int i = 0; i < n_batch; i++) {
        eu_req *q = &reqs[i];
        q->res = calloc(1, sizeof(eu_result));
        q->abort_at = -1;
        if (i == target) {
            q->prompt = g_target_prompt;
            q->n_prompt = 40;
            q->sp = target_params();
            q->arrive = n_batch > 1 ? 2 : 0;
            continue;
        }
        q->n_prompt = 1 + rnd(60);
        for (int64_t k = 0; k < q->n_prompt; k++)
            prompts[i][k] = 2 + rnd(300);
        q->prompt = prompts[i];
        q->sp = di_sampling_default_params();
        q->sp.temperature = (float)rnd(3) * 0.5f;
        q->sp.top_k = rnd(2) ? 20 : -1;
        q->sp.max_tokens = 1 + rnd(20);
        q->sp.logprobs = rnd(2) ? 3 : -1;
        q->arrive = rnd(6);
    }
    bool ok = eu_run(e, reqs, n_batch) > 0;
    *out = *reqs[target].res;
    for (int i = 0; i < n_batch; i++)
        free(reqs[i].res);
    free(reqs);
    free(prompts);
    di_engine_free(e);
    return ok;
}

static bool same_result(const eu_result *a, const eu_result *b) {
    if (a->n != b->n || memcmp(a->tokens, b->tokens, (size_t)a->n * sizeof(int32_t))) return false;
    if (memcmp(a->lp, b->lp, (size_t)a->n * sizeof(float))) return false;
    for (int64_t t = 0; t < a->n; t++)
        if (memcmp(a->top_ids[t], b->top_ids[t], 5 * sizeof(int32_t)) ||
            memcmp(a->top_lp[t], b->top_lp[t], 5 * sizeof(float)))
            return false;
    return true;
}

/* Same tokens and top ids, logprobs within tol; *max_diff gets the largest difference. */
static bool close_result(const eu_result *a, const eu_result *b, double tol, double *max_diff) {
    *max_diff = 0;
    if (a->n != b->n || memcmp(a->tokens, b->tokens, (size_t)a->n * sizeof(int32_t))) return false;
    for (int64_t t = 0; t < a->n; t++) {
        *max_diff = fmax(*max_diff, fabs((double)a->lp[t] - (double)b->lp[t]));
        for (int k = 0; k < 5; k++)
            *max_diff = fmax(*max_diff, fabs((double)a->top_lp[t][k] - (double)b->top_lp[t][k]));
    }
    return *max_diff <= tol;
}

static void matrix(const char *model_name) {
    di_model *m = NULL;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", DATA_DIR, model_name);
    di_model_params mp = di_model_default_params();
    mp.n_threads = 2;
    if (di_model_load(dir, &mp, &m)) {
        CHECK_MSG(false, "%s", di_last_error());
        return;
    }
    g_rng = 7;
    for (int k = 0; k < 40; k++)
        g_target_prompt[k] = 2 + rnd(300);
    eu_result *base = calloc(1, sizeof *base), *r = calloc(1, sizeof *r);
    CHECK(run_config(m, 1, 1, 512, false, base));
    CHECK(base->n == TARGET_TOKENS);
    const int batches[] = {1, 3, 17, 64};
    const int threads[] = {1, 2};
    const int64_t chunks[] = {512, 7};
    int runs = 0;
    for (size_t bi = 0; bi < 4; bi++)
        for (size_t ti = 0; ti < 2; ti++)
            for (size_t ci = 0; ci < 2; ci++) {
                bool overlap = (bi + ti + ci) % 2 == 1;
                memset(r, 0, sizeof *r);
                CHECK(run_config(m, batches[bi], threads[ti], chunks[ci], overlap, r));
                CHECK_MSG(same_result(base, r),
                          "%s: batch %d, %d threads, chunk %lld, overlap %d differs from alone",
                          model_name, batches[bi], threads[ti], (long long)chunks[ci], overlap);
                runs++;
            }
    CHECK(runs == 16);
    /* Batch invariance off: within tolerance of the invariant result, alone and in batches. */
    g_invariant = false;
    for (size_t bi = 0; bi < 4; bi++) {
        double diff;
        memset(r, 0, sizeof *r);
        CHECK(run_config(m, batches[bi], 2, 512, false, r));
        CHECK_MSG(close_result(base, r, NONINV_LP_TOL, &diff),
                  "%s: batch_invariant off, batch %d: tokens differ or logprob diff %g > %g",
                  model_name, batches[bi], diff, NONINV_LP_TOL);
        printf("  %s, batch_invariant off, batch %d: max logprob diff %.3g\n", model_name,
               batches[bi], diff);
    }
    g_invariant = true;
    free(base);
    free(r);
    di_model_free(m);
}

TEST(determinism_v3_fp8) {
    matrix("v3_fp8");
}

TEST(determinism_v4) {
    matrix("v4_hc3_plain");
}

int main(void) {
    RUN(determinism_v3_fp8);
    RUN(determinism_v4);
    return test_summary();
}
