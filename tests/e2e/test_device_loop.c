/*
 * test_device_loop.c -- the engine's device loop (engine.c step_device) without a GPU.
 *
 * Engines here run on the separate-memory CPU backend (sep_backend.h), whose fences hand a
 * deferred step's downloads over only at fence_wait and whose resolve_ids reads the previous
 * step's tokens from backend memory: with overlap on, such an engine takes the device loop, as
 * on CUDA, and the V2/V3 runner defers its decode steps. The weights are loaded onto that
 * backend and the engine gets it through di_backend_init_override. The arithmetic is the CPU
 * path's, so the device loop must give the plain loop's results bitwise:
 *   - device_loop_same_results: greedy requests arriving over several steps, then seeded
 *     temperature draws with top_p, top_k and min_p requests (drawn on the "device" too) and
 *     a logprobs request (its steps are not deferred) -- the same tokens and logprobs, and
 *     steps were deferred;
 *   - device_loop_stops: requests ending on a stop token (their third token in a plain run)
 *     while the next step is already queued -- the same tokens and finish reasons;
 *   - device_loop_abort: a request aborted while steps are in flight ends with "abort" and
 *     its tokens are a prefix of its tokens without the abort; the others are unchanged.
 */
#define _POSIX_C_SOURCE 200809L
#include "api_internal.h"
#include "engine_util.h"
#include "sep_backend.h"
#include "test.h"

#include <string.h>

#define N_REQ 8

static di_status sep_backend_init(const di_model *m, di_pool *pool, int64_t max_ctx,
                                  di_backend *out) {
    (void)m;
    sep_init(out, pool, max_ctx);
    return DI_OK;
}

/* The model in tests/data/<name> with its weights on the separate-memory backend: a copy of
 * the CPU model's struct whose weights are the backend's (arch->free them, never
 * di_model_free the copy). */
typedef struct sep_model {
    di_model *cpu; /* owns the checkpoint, hparams, pool */
    di_model m;    /* the copy the engines use */
    di_backend be; /* the weights' backend */
} sep_model;

static bool sep_model_open(const char *name, sep_model *sm) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", DATA_DIR, name);
    memset(sm, 0, sizeof *sm);
    sm->cpu = sep_model_load(dir);
    if (!sm->cpu) return false;
    sep_init(&sm->be, sm->cpu->pool, 512);
    void *ws = NULL;
    di_status st = sm->cpu->arch->load(&sm->cpu->hp, sm->cpu->st, dir, &sm->be, &ws);
    CHECK_MSG(st == DI_OK && ws, "%s: %s", dir, di_last_error());
    if (st != DI_OK || !ws) {
        di_backend_free(&sm->be);
        di_model_free(sm->cpu);
        return false;
    }
    sm->m = *sm->cpu;
    sm->m.weights = ws;
    sm->m.be = sm->be;
    di_backend_init_override = sep_backend_init;
    return true;
}

static void sep_model_close(sep_model *sm) {
    di_backend_init_override = NULL;
    sm->cpu->arch->free(sm->m.weights);
    di_backend_free(&sm->be);
    di_model_free(sm->cpu);
}

static uint32_t g_rng = 77;
static int32_t rnd(int32_t n) {
    g_rng = g_rng * 1664525u + 1013904223u;
    return (int32_t)((g_rng >> 8) % (uint32_t)n);
}

/* N_REQ requests: prompts of 1-40 tokens arriving at steps 0-5, 2-13 new tokens; `sampled`:
 * most at temperature 0.6-1.3 (seeded), request 3 with top_p, 5 with top_k and min_p, and 6
 * with logprobs (from step 0 for 3 tokens: the steps it runs in are not deferred, later ones
 * are). */
static void make_requests(int64_t vocab, int32_t (*prompts)[48], eu_req *reqs, eu_result *res,
                          bool sampled) {
    g_rng = 77;
    for (int i = 0; i < N_REQ; i++) {
        const int64_t np = 1 + rnd(40);
        for (int64_t k = 0; k < np; k++)
            prompts[i][k] = 2 + rnd((int32_t)vocab - 2);
        di_sampling_params sp = di_sampling_default_params();
        sp.temperature = sampled && i % 4 != 0 ? 0.6f + 0.1f * (float)i : 0.0f;
        sp.top_p = sampled && i == 3 ? 0.9f : 1.0f;
        sp.top_k = sampled && i == 5 ? 30 : 0;
        sp.min_p = sampled && i == 5 ? 0.02f : 0.0f;
        if (sampled && i == 6) sp.logprobs = 3; /* the default (-1): none */
        sp.seed = 40 + i;
        sp.max_tokens = 2 + rnd(12);
        sp.ignore_eos = true;
        memset(&res[i], 0, sizeof res[i]);
        reqs[i] = (eu_req){.prompt = prompts[i],
                           .n_prompt = np,
                           .sp = sp,
                           .arrive = i < 2 ? 0 : rnd(6),
                           .abort_at = -1,
                           .res = &res[i]};
        if (sp.logprobs > 0) { /* early and short: later steps defer */
            reqs[i].arrive = 0;
            reqs[i].sp.max_tokens = 3;
        }
    }
}

/* Runs reqs through a fresh engine on m, plain loop or overlap; the fences it made. */
static int64_t run(di_model *m, eu_req *reqs, bool overlap) {
    di_engine_params ep = eu_small_params();
    ep.overlap = overlap;
    const int64_t fences = g_n_fences;
    CHECK(eu_run_fresh(m, &ep, reqs, N_REQ));
    return g_n_fences - fences;
}

static bool same_result(const eu_result *a, const eu_result *b) {
    const size_t k = (size_t)a->n;
    return a->n == b->n && a->n > 0 && a->finished && b->finished && a->reason == b->reason &&
           memcmp(a->tokens, b->tokens, k * sizeof a->tokens[0]) == 0 &&
           memcmp(a->lp, b->lp, k * sizeof a->lp[0]) == 0 &&
           memcmp(a->top_ids, b->top_ids, k * sizeof a->top_ids[0]) == 0 &&
           memcmp(a->top_lp, b->top_lp, k * sizeof a->top_lp[0]) == 0;
}

/* The plain loop's and the device loop's results of the same requests; returns how many
 * steps the device loop deferred. */
static int64_t compare_loops(const char *what, di_model *m, eu_req *rp, eu_result *resp) {
    static eu_req ro[N_REQ];
    static eu_result reso[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        memset(&resp[i], 0, sizeof resp[i]);
        memset(&reso[i], 0, sizeof reso[i]);
        ro[i] = rp[i];
        ro[i].res = &reso[i];
    }
    CHECK(run(m, rp, false) == 0);
    const int64_t deferred = run(m, ro, true);
    for (int i = 0; i < N_REQ; i++)
        CHECK_MSG(same_result(&resp[i], &reso[i]), "%s req %d: the device loop's results differ",
                  what, i);
    return deferred;
}

TEST(device_loop_same_results) {
    sep_model sm;
    if (!sep_model_open("v3_fp8", &sm)) return;
    static int32_t prompts[N_REQ][48];
    static eu_req reqs[N_REQ];
    static eu_result res[N_REQ];
    int64_t deferred[2];
    for (int pass = 0; pass < 2; pass++) {
        make_requests(sm.m.hp.vocab_size, prompts, reqs, res, pass == 1);
        deferred[pass] = compare_loops(pass ? "sampled" : "greedy", &sm.m, reqs, res);
        CHECK_MSG(deferred[pass] > 0, "pass %d: the device loop deferred no step", pass);
    }
    printf("  v3_fp8 %d greedy, %d sampled requests: the plain loop's results; %lld and %lld "
           "steps deferred\n",
           N_REQ, N_REQ, (long long)deferred[0], (long long)deferred[1]);
    sep_model_close(&sm);
}

TEST(device_loop_stops) {
    sep_model sm;
    if (!sep_model_open("v3_fp8", &sm)) return;
    static int32_t prompts[N_REQ][48], stops[N_REQ];
    static eu_req reqs[N_REQ];
    static eu_result res[N_REQ];
    make_requests(sm.m.hp.vocab_size, prompts, reqs, res, false);
    CHECK(run(&sm.m, reqs, false) == 0);
    int want = 0;
    for (int i = 0; i < N_REQ; i++) {
        if (res[i].n < 5) continue;
        stops[i] = res[i].tokens[2];
        reqs[i].sp.stop_token_ids = &stops[i];
        reqs[i].sp.n_stop_token_ids = 1;
        want++;
    }
    compare_loops("stops", &sm.m, reqs, res);
    int stopped = 0;
    for (int i = 0; i < N_REQ; i++)
        stopped += res[i].reason == DI_ENGINE_FINISH_STOP && res[i].n < reqs[i].sp.max_tokens;
    CHECK_MSG(want > 0 && stopped == want, "%d requests ended on their stop token, want %d",
              stopped, want);
    printf("  %d requests ended on a stop token with the next step queued: the same results\n",
           stopped);
    sep_model_close(&sm);
}

TEST(device_loop_abort) {
    sep_model sm;
    if (!sep_model_open("v3_fp8", &sm)) return;
    static int32_t prompts[N_REQ][48];
    static eu_req full[N_REQ], cut[N_REQ];
    static eu_result rf[N_REQ], rc[N_REQ];
    make_requests(sm.m.hp.vocab_size, prompts, full, rf, false);
    make_requests(sm.m.hp.vocab_size, prompts, cut, rc, false);
    int victim = 0; /* the longest request, aborted a few steps after it arrives */
    for (int i = 1; i < N_REQ; i++)
        if (full[i].sp.max_tokens > full[victim].sp.max_tokens) victim = i;
    cut[victim].abort_at = cut[victim].arrive + 5;
    CHECK(run(&sm.m, full, true) > 0);
    CHECK(run(&sm.m, cut, true) > 0);
    const eu_result *a = &rc[victim], *f = &rf[victim];
    CHECK_MSG(a->finished && a->reason == DI_ENGINE_FINISH_ABORT && a->n < f->n,
              "the aborted request: finished %d, reason %s, %lld of %lld tokens", a->finished,
              di_engine_finish_str(a->reason), (long long)a->n, (long long)f->n);
    CHECK(memcmp(a->tokens, f->tokens, (size_t)a->n * sizeof a->tokens[0]) == 0);
    for (int i = 0; i < N_REQ; i++)
        if (i != victim)
            CHECK_MSG(same_result(&rf[i], &rc[i]), "req %d changed by another's abort", i);
    printf("  request %d aborted in flight after %lld of %lld tokens; the others unchanged\n",
           victim, (long long)a->n, (long long)f->n);
    sep_model_close(&sm);
}

int main(void) {
    RUN(device_loop_same_results);
    RUN(device_loop_stops);
    RUN(device_loop_abort);
    return test_summary();
}
