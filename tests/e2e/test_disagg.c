/*
 * test_disagg.c -- the disaggregated engine (separate prefill and decode workers) against the
 * unified engine on the tiny goldens and the bundled V4 model:
 *   - a mixed batch of long and short prompts, greedy and sampled (seeded, logprobs 5; one
 *     with prompt logprobs, one with n = 2), arriving over several steps: every request's
 *     tokens, logprobs (chosen and top-5) and prompt logprobs
 *     are bitwise those of the unified engine, which test_engine / test_determinism tie to
 *     the single-sequence context; also with a tiny KV pool (preemptions) and with one
 *     thread per worker or an uneven split;
 *   - a long prompt arriving while short requests decode: its chunks run on the prefill
 *     worker (step counts), and every decode step of the decode worker carries all the
 *     decoding requests (they produce their tokens in the same records, never one behind);
 *   - aborts of requests on either side, and parameter errors.
 * No assertion depends on timing: which worker finishes first varies from run to run, and the
 * outputs must not.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine_util.h"

#include <math.h>

#define MINI(a, b) ((a) < (b) ? (a) : (b))
#define MAXI(a, b) ((a) > (b) ? (a) : (b))

#define BUNDLED_V4 DI_SOURCE_DIR "/models/deepseek-v4-tiny"

static uint32_t g_rng = 99;
static int32_t rnd(int32_t n) {
    g_rng = g_rng * 1664525u + 1013904223u;
    return (int32_t)((g_rng >> 8) % (uint32_t)n);
}

static di_engine_params params(void) {
    di_engine_params ep = eu_small_params();
    ep.max_model_len = 256;
    ep.max_prefill_tokens = 32;
    ep.n_threads = 2;
    return ep;
}

#define N_MIX 12

typedef struct mix {
    int32_t prompts[N_MIX][200];
    eu_req reqs[N_MIX];
} mix;

/* Long (100-180 tokens) and short (3-20) prompts, greedy and sampled, staggered arrivals. */
static void make_mix(mix *x, int32_t vocab) {
    memset(x, 0, sizeof *x);
    for (int i = 0; i < N_MIX; i++) {
        int64_t np = i % 3 == 0 ? 100 + rnd(80) : 3 + rnd(18);
        for (int64_t k = 0; k < np; k++)
            x->prompts[i][k] = 2 + rnd(vocab - 2);
        di_sampling_params sp = di_sampling_default_params();
        sp.ignore_eos = true;
        sp.max_tokens = 4 + rnd(20);
        if (i % 2) {
            sp.temperature = 0.8f;
            sp.top_p = 0.9f;
            sp.seed = 1000 + i;
            sp.logprobs = 5;
        } else {
            sp.temperature = 0.0f;
        }
        if (i == 1) sp.prompt_logprobs = 3; /* logits rows of every prompt position */
        if (i == 5) sp.n = 2;               /* a second completion joins after the prefill */
        x->reqs[i] = (eu_req){.prompt = x->prompts[i],
                              .n_prompt = np,
                              .sp = sp,
                              .arrive = i < 4 ? 0 : rnd(10),
                              .abort_at = -1,
                              .res = NULL};
    }
}

/* Runs the mix on a fresh engine; results in res[2 * N_MIX] (zeroed first), two per request
 * (for n = 2). */
static bool run_mix(di_model *m, const di_engine_params *ep, mix *x, eu_result *res,
                    di_engine_stats *stats) {
    di_engine *e = NULL;
    di_status st = di_engine_create(m, ep, &e);
    CHECK_MSG(st == DI_OK, "%s", di_last_error());
    if (st) return false;
    memset(res, 0, 2 * N_MIX * sizeof *res);
    for (int i = 0; i < N_MIX; i++)
        x->reqs[i].res = &res[2 * i];
    int steps = eu_run(e, x->reqs, N_MIX);
    di_engine_get_stats(e, stats);
    CHECK(stats->kv_blocks_used == 0);
    di_engine_free(e);
    return steps > 0;
}

static bool same(const eu_result *a, const eu_result *b, bool logprobs) {
    if (a->n != b->n || !a->finished || !b->finished || a->reason != b->reason ||
        memcmp(a->tokens, b->tokens, (size_t)a->n * sizeof(int32_t)))
        return false;
    if (a->n_plp != b->n_plp || a->plp_records != b->plp_records ||
        memcmp(a->plp, b->plp, (size_t)a->n_plp * sizeof(float)) ||
        memcmp(a->plp_top_ids, b->plp_top_ids, (size_t)a->n_plp * sizeof a->plp_top_ids[0]) ||
        memcmp(a->plp_top_lp, b->plp_top_lp, (size_t)a->n_plp * sizeof a->plp_top_lp[0]))
        return false;
    if (!logprobs) return true;
    return memcmp(a->lp, b->lp, (size_t)a->n * sizeof(float)) == 0 &&
           memcmp(a->top_ids, b->top_ids, (size_t)a->n * sizeof a->top_ids[0]) == 0 &&
           memcmp(a->top_lp, b->top_lp, (size_t)a->n * sizeof a->top_lp[0]) == 0;
}

/* Unified vs disaggregated (and its variants) on one model. */
static void equal_outputs(const char *model_name, bool tiny_kv) {
    di_model *m = NULL;
    if (!eu_load(model_name, 2, &m)) {
        CHECK_MSG(false, "%s: %s", model_name, di_last_error());
        return;
    }
    di_model_info info;
    di_model_get_info(m, &info);
    mix *x = malloc(sizeof *x);
    make_mix(x, (int32_t)MINI(info.vocab_size, 4000));
    di_engine_params ep = params();
    if (tiny_kv) { /* one sequence of max_model_len: requests preempt each other */
        int64_t bs = strstr(model_name, "v4") ? 128 : ep.block_size;
        ep.kv_memory_bytes = info.kv_bytes_per_token * bs * ((ep.max_model_len + bs - 1) / bs);
    }
    eu_result *ref = calloc(2 * N_MIX, sizeof *ref), *got = calloc(2 * N_MIX, sizeof *got);
    di_engine_stats su, sd;
    CHECK(run_mix(m, &ep, x, ref, &su));
    CHECK(su.n_prefill_steps == 0 && su.n_decode_steps == 0);
    if (tiny_kv) CHECK_MSG(su.n_preemptions > 0, "%s: the tiny pool did not preempt", model_name);
    struct {
        int32_t threads, prefill;
    } splits[] = {{2, 0}, {2, 1}, {3, 2}};
    for (size_t v = 0; v < sizeof splits / sizeof splits[0]; v++) {
        di_engine_params dp = ep;
        dp.disaggregate = true;
        dp.n_threads = splits[v].threads;
        dp.prefill_threads = splits[v].prefill;
        CHECK(run_mix(m, &dp, x, got, &sd));
        CHECK(ref[2].n_plp == x->reqs[1].n_prompt - 1 && ref[2].plp_records == 1);
        CHECK(ref[11].n == x->reqs[5].sp.max_tokens); /* request 5's second completion */
        CHECK(same(&ref[11], &got[11], true));
        for (int i = 0; i < N_MIX; i++) {
            CHECK(ref[2 * i].n == x->reqs[i].sp.max_tokens);
            CHECK_MSG(same(&ref[2 * i], &got[2 * i], x->reqs[i].sp.logprobs > 0),
                      "%s (tiny kv %d, %d threads, %d prefill): request %d (prompt %lld) "
                      "differs from the unified engine",
                      model_name, tiny_kv, splits[v].threads, splits[v].prefill, i,
                      (long long)x->reqs[i].n_prompt);
        }
        /* Which worker ran what: every prompt token on the prefill worker (at most 32 per
         * step), every other token on the decode worker. */
        int64_t prompt_tokens = 0, decode_tokens = 0, longest = 0;
        for (int i = 0; i < N_MIX; i++) {
            prompt_tokens += x->reqs[i].n_prompt;
            decode_tokens += x->reqs[i].sp.max_tokens - 1;
            longest = MAXI(longest, x->reqs[i].sp.max_tokens - 1);
        }
        if (sd.n_preemptions == 0 && su.n_preemptions == 0) /* no recompute in either */
            CHECK(sd.n_prompt_tokens == su.n_prompt_tokens);
        CHECK(sd.n_prefill_steps >= (prompt_tokens - 1 + 31) / 32);
        CHECK(sd.n_decode_steps >= longest && sd.n_decode_steps <= decode_tokens);
        CHECK(sd.n_generated_tokens == su.n_generated_tokens);
        CHECK(sd.time_prefill_busy_s > 0 && sd.time_decode_busy_s > 0);
        printf("  %s%s, %d+%d threads: %lld prefill / %lld decode steps, %lld preemptions "
               "(unified: %lld steps)\n",
               model_name, tiny_kv ? " (tiny kv)" : "",
               splits[v].prefill ? splits[v].prefill : splits[v].threads / 2,
               splits[v].threads - (splits[v].prefill ? splits[v].prefill : splits[v].threads / 2),
               (long long)sd.n_prefill_steps, (long long)sd.n_decode_steps,
               (long long)sd.n_preemptions, (long long)su.n_steps);
    }
    free(ref);
    free(got);
    free(x);
    di_model_free(m);
}

TEST(disagg_equals_unified) {
    equal_outputs("v2_lite", false);
    equal_outputs("v3_fp8", false);
    equal_outputs("v4_hc3_plain", false);
    equal_outputs(BUNDLED_V4, false);
}

TEST(disagg_equals_unified_with_preemption) {
    equal_outputs("v3_grouped", true);
    equal_outputs("v4_mix_yarn", true);
}

/* A long prompt arrives while three short requests decode. */
TEST(long_prompt_does_not_stall_decodes) {
    di_model *m = NULL;
    if (!eu_load("v2_lite", 2, &m)) {
        CHECK(false);
        return;
    }
    di_engine_params ep = params();
    ep.disaggregate = true;
    ep.max_prefill_tokens = 16;
    di_engine *e = NULL;
    CHECK(di_engine_create(m, &ep, &e) == DI_OK);
    if (!e) {
        di_model_free(m);
        return;
    }
    int32_t shorts[3][5], longp[200];
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 5; k++)
            shorts[i][k] = 2 + rnd(300);
    for (int k = 0; k < 200; k++)
        longp[k] = 2 + rnd(300);
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = 0.0f;
    sp.ignore_eos = true;
    sp.max_tokens = 40;
    for (int i = 0; i < 3; i++) {
        di_engine_request rq = {
            .prompt_ids = shorts[i], .n_prompt_ids = 5, .sampling = &sp, .id = (uint64_t)i};
        CHECK(di_engine_add_request(e, &rq) == DI_OK);
    }
    di_sampling_params lp = sp;
    lp.max_tokens = 3;
    int64_t n_short[3] = {0}, n_long = 0;
    int32_t toks[3][40];
    int64_t steps_with_short = 0, short_during_long_prefill = 0;
    bool long_added = false;
    di_engine_output out[16];
    for (int guard = 0; guard < 100000 && di_engine_has_unfinished(e); guard++) {
        if (!long_added && n_short[0] >= 2) { /* the shorts are decoding */
            di_engine_request rq = {
                .prompt_ids = longp, .n_prompt_ids = 200, .sampling = &lp, .id = 7};
            CHECK(di_engine_add_request(e, &rq) == DI_OK);
            long_added = true;
        }
        int64_t n = 0;
        CHECK(di_engine_step(e, out, 16, &n) == DI_OK);
        int shorts_here = 0;
        for (int64_t k = 0; k < n; k++) {
            if (out[k].id == 7) {
                n_long += out[k].n_tokens;
                continue;
            }
            int i = (int)out[k].id;
            CHECK(out[k].n_tokens <= 1); /* one decode step, one token */
            for (int64_t t = 0; t < out[k].n_tokens && n_short[i] < 40; t++)
                toks[i][n_short[i]++] = out[k].tokens[t];
            shorts_here += out[k].n_tokens > 0;
        }
        /* A decode step carries every decoding request: never one of them left behind. */
        CHECK(shorts_here == 0 || shorts_here == 3);
        CHECK(n_short[0] == n_short[1] && n_short[1] == n_short[2]);
        steps_with_short += shorts_here > 0;
        if (long_added && n_long == 0 && shorts_here) short_during_long_prefill++;
    }
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    CHECK(n_long == 3);
    for (int i = 0; i < 3; i++) {
        int32_t ref[40];
        eu_ref_greedy(m, shorts[i], 5, 40, ref);
        CHECK(n_short[i] == 40 && memcmp(toks[i], ref, sizeof ref) == 0);
    }
    /* The shorts' prompts (15 tokens) ran in one prefill step and the long prompt in 13
     * chunks of at most 16 tokens, on the prefill worker; the shorts' 39 decode tokens took
     * 39 decode steps, all three in each (plus the long one's 2, which may share them). */
    CHECK(st.n_prefill_steps >= 1 + 13);
    CHECK(st.n_decode_steps >= 39 && st.n_decode_steps <= 39 + 2);
    CHECK(steps_with_short == 1 + 39);
    printf("  %lld prefill steps, %lld decode steps; %lld decode steps ran while the long "
           "prompt was in prefill (timing-dependent, not asserted)\n",
           (long long)st.n_prefill_steps, (long long)st.n_decode_steps,
           (long long)short_during_long_prefill);
    di_engine_free(e);
    di_model_free(m);
}

/* Aborts land on both sides (in flight or not); the other requests are unaffected. */
TEST(aborts_and_errors) {
    di_model *m = NULL;
    if (!eu_load("v3_fp8", 2, &m)) {
        CHECK(false);
        return;
    }
    di_model_info info;
    di_model_get_info(m, &info);
    mix *x = malloc(sizeof *x);
    make_mix(x, (int32_t)info.vocab_size);
    di_engine_params ep = params();
    ep.disaggregate = true;
    ep.max_prefill_tokens = 8; /* long prompts stay on the prefill side for many steps */
    eu_result *res = calloc(2 * N_MIX, sizeof *res), *ref = calloc(2 * N_MIX, sizeof *ref);
    di_engine_stats sd;
    CHECK(run_mix(m, &ep, x, ref, &sd)); /* without aborts */
    for (int i = 0; i < N_MIX; i += 2)
        x->reqs[i].abort_at = x->reqs[i].arrive + 1 + i; /* early: prefill; late: decode */
    CHECK(run_mix(m, &ep, x, res, &sd));
    int aborted = 0;
    for (int i = 0; i < N_MIX; i++) {
        const eu_result *r = &res[2 * i], *f = &ref[2 * i];
        CHECK(r->finished && r->n_final == 1);
        if (r->reason == DI_ENGINE_FINISH_ABORT) {
            CHECK(i % 2 == 0);
            /* what it produced before the abort is a prefix of its full output */
            CHECK(r->n < f->n && memcmp(r->tokens, f->tokens, (size_t)r->n * sizeof(int32_t)) == 0);
            aborted++;
        } else {
            CHECK(same(r, f, x->reqs[i].sp.logprobs > 0));
        }
    }
    CHECK(aborted >= 3);
    /* Parameters: overlap and disaggregate exclude each other. */
    di_engine_params bad = ep;
    bad.overlap = true;
    di_engine *e = NULL;
    CHECK(di_engine_create(m, &bad, &e) == DI_ERR_INVALID_ARG && !e);
    CHECK(strstr(di_last_error(), "disaggregate") != NULL);
    free(res);
    free(ref);
    free(x);
    di_model_free(m);
}

int main(void) {
    RUN(disagg_equals_unified);
    RUN(disagg_equals_unified_with_preemption);
    RUN(long_prompt_does_not_stall_decodes);
    RUN(aborts_and_errors);
    return test_summary();
}
