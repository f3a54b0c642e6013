/*
 * test_engine.c -- the engine (continuous batching over the paged KV pool) against the
 * single-sequence context, on the tiny golden checkpoints:
 *   - mixed batches (prompt lengths, arrival steps, max_tokens) give every request the
 *     greedy tokens it gets alone through di_context (V2, V3, V3-fp8, V4), with and without
 *     the overlap loop;
 *   - a tiny KV budget forces preemptions; outputs are unchanged (V3 and V4: V4 resumes from
 *     its blocks still cached and replays its window state, which must reproduce the
 *     uninterrupted run);
 *   - prefix reuse: a second request sharing a long prefix reports cached tokens and the
 *     same output as alone;
 *   - prompt logprobs equal the log-softmax of the context's logits of the whole prompt, and
 *     are bitwise the same alone, inside a batch (behind a cached prefix they must not use),
 *     with chunked prefill, with the logits-row budget binding, with the overlap loop and
 *     with preemptions;
 *   - n > 1 (children share the prompt blocks), stop strings across token boundaries, text
 *     prompts, abort, finish reasons and usage.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine_util.h"
#include "engine_internal.h"

#include <math.h>
#include <pthread.h>
#include <time.h>

#define TOKENIZER DATA_DIR "/tokenizer/variants/split_removed_invert.json"

static uint32_t g_rng = 12345;
static int32_t rnd(int32_t n) {
    g_rng = g_rng * 1664525u + 1013904223u;
    return (int32_t)((g_rng >> 8) % (uint32_t)n);
}

static di_sampling_params greedy(int64_t max_tokens) {
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = 0.0f;
    sp.ignore_eos = true;
    sp.max_tokens = max_tokens;
    return sp;
}

/* Mixed greedy requests vs the context, with the given engine params. */
static void check_mixed_len(const char *model_name, di_engine_params ep, int n_reqs,
                            bool expect_preempt, int64_t plen_base) {
    di_model *m = NULL;
    if (!eu_load(model_name, 2, &m)) {
        CHECK_MSG(false, "%s: %s", model_name, di_last_error());
        return;
    }
    di_model_info info;
    di_model_get_info(m, &info);
    di_engine *e = NULL;
    di_status st = di_engine_create(m, &ep, &e);
    CHECK_MSG(st == DI_OK, "%s: %s", model_name, di_last_error());
    if (st) {
        di_model_free(m);
        return;
    }
    eu_req *reqs = calloc((size_t)n_reqs, sizeof *reqs);
    int32_t(*prompts)[256] = calloc((size_t)n_reqs, sizeof *prompts);
    for (int i = 0; i < n_reqs; i++) {
        int64_t np = plen_base + 1 + rnd(i % 3 == 0 ? 70 : 20);
        for (int64_t k = 0; k < np; k++)
            prompts[i][k] = 2 + rnd((int32_t)info.vocab_size - 2);
        reqs[i] = (eu_req){.prompt = prompts[i],
                           .n_prompt = np,
                           .sp = greedy(2 + rnd(14)),
                           .arrive = i < 3 ? 0 : rnd(8),
                           .abort_at = -1,
                           .res = calloc(1, sizeof(eu_result))};
    }
    CHECK(eu_run(e, reqs, n_reqs) > 0);
    di_engine_stats stats;
    di_engine_get_stats(e, &stats);
    if (expect_preempt) CHECK_MSG(stats.n_preemptions > 0, "%s: no preemption", model_name);
    CHECK(stats.kv_blocks_used == 0);
    for (int i = 0; i < n_reqs; i++) {
        int32_t ref[EU_MAX_TOK];
        eu_ref_greedy(m, reqs[i].prompt, reqs[i].n_prompt, reqs[i].sp.max_tokens, ref);
        const eu_result *r = reqs[i].res;
        CHECK_MSG(r->n == reqs[i].sp.max_tokens && r->finished && r->n_final == 1 &&
                      r->reason == DI_ENGINE_FINISH_LENGTH,
                  "%s req %d: %lld tokens, finished %d reason %d", model_name, i, (long long)r->n,
                  r->finished, r->reason);
        bool same = r->n == reqs[i].sp.max_tokens &&
                    memcmp(r->tokens, ref, (size_t)r->n * sizeof(int32_t)) == 0;
        CHECK_MSG(same, "%s req %d (prompt %lld, overlap %d): differs from the context", model_name,
                  i, (long long)reqs[i].n_prompt, ep.overlap);
        CHECK(r->usage.prompt_tokens == reqs[i].n_prompt);
        CHECK(r->usage.completion_tokens == reqs[i].sp.max_tokens);
        free(reqs[i].res);
    }
    free(reqs);
    free(prompts);
    di_engine_free(e);
    di_model_free(m);
}

static void check_mixed(const char *model_name, di_engine_params ep, int n_reqs,
                        bool expect_preempt) {
    check_mixed_len(model_name, ep, n_reqs, expect_preempt, 0);
}

/* The default KV pool: what max_running sequences need, capped at 1 GiB on the host and at
 * half the device's free memory on a GPU, never below one sequence. */
TEST(default_kv_budget) {
    const int64_t G = (int64_t)1 << 30, one = 100 << 20;
    CHECK(eng_default_kv_bytes(10 * G, one, -1) == G);           /* host: 1 GiB */
    CHECK(eng_default_kv_bytes(G / 2, one, -1) == G / 2);        /* host: what is needed */
    CHECK(eng_default_kv_bytes(10 * G, one, 100 * G) == 10 * G); /* device: what is needed */
    CHECK(eng_default_kv_bytes(10 * G, one, 8 * G) == 4 * G);    /* device: half its free */
    CHECK(eng_default_kv_bytes(10 * G, one, 0) == one);          /* never below one sequence */
    CHECK(eng_default_kv_bytes(10 * G, 2 * G, -1) == 2 * G);
}

TEST(mixed_batches) {
    const char *models[] = {"v2_lite", "v3_grouped", "v3_fp8", "v4_hc3_plain", "v4_mix_yarn"};
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        di_engine_params ep = eu_small_params();
        check_mixed(models[k], ep, 10, false);
        ep.overlap = true;
        check_mixed(models[k], ep, 10, false);
    }
}

/* A KV pool of one sequence's worth: requests preempt each other and resume. */
static di_engine_params tiny_kv(const char *model_name) {
    di_engine_params ep = eu_small_params();
    di_model *m = NULL;
    if (eu_load(model_name, 1, &m)) {
        di_model_info info;
        di_model_get_info(m, &info);
        /* V4 blocks are a multiple of its compression ratios: count in 128 tokens */
        int64_t bs = strncmp(model_name, "v4", 2) == 0 ? 128 : ep.block_size;
        ep.kv_memory_bytes = info.kv_bytes_per_token * bs * ((ep.max_model_len + bs - 1) / bs);
        di_model_free(m);
    }
    return ep;
}

TEST(preemption) {
    check_mixed("v3_fp8", tiny_kv("v3_fp8"), 8, true);
    di_engine_params ep = tiny_kv("v2_lite");
    ep.overlap = true;
    check_mixed("v2_lite", ep, 8, true);
    /* V4 (v4_hc3_plain: blocks of 16 tokens, the multiple of its ratios 4 and 16): a pool
     * of 256 tokens and prompts of 100 to 170; a preempted sequence resumes from its blocks
     * still cached and replays its window state, which must give the uninterrupted tokens. */
    ep = eu_small_params();
    ep.max_model_len = 256;
    ep.max_prefill_tokens = 64;
    {
        di_model *m = NULL;
        if (eu_load("v4_hc3_plain", 1, &m)) {
            di_model_info info;
            di_model_get_info(m, &info);
            ep.kv_memory_bytes = info.kv_bytes_per_token * 256;
            di_model_free(m);
        }
    }
    check_mixed_len("v4_hc3_plain", ep, 5, true, 100);
    ep.overlap = true;
    check_mixed_len("v4_hc3_plain", ep, 5, true, 100);
}

TEST(prefix_reuse) {
    di_engine_params ep = eu_small_params();
    di_model *m;
    di_engine *e;
    if (!eu_open("v2_lite", 2, &ep, &m, &e)) return;
    int32_t a[70], b[75];
    for (int k = 0; k < 70; k++)
        a[k] = b[k] = 2 + rnd(390);
    for (int k = 70; k < 75; k++)
        b[k] = 2 + rnd(390);
    eu_result ra = {0}, rb = {0};
    eu_req reqs[2] = {
        {.prompt = a, .n_prompt = 70, .sp = greedy(6), .arrive = 0, .abort_at = -1, .res = &ra},
        {.prompt = b, .n_prompt = 75, .sp = greedy(6), .arrive = 12, .abort_at = -1, .res = &rb}};
    CHECK(eu_run(e, reqs, 2) > 0);
    CHECK_MSG(rb.usage.cached_tokens >= 64, "cached %lld", (long long)rb.usage.cached_tokens);
    CHECK(ra.usage.cached_tokens == 0);
    int32_t ref[8];
    eu_ref_greedy(m, b, 75, 6, ref);
    CHECK(rb.n == 6 && memcmp(rb.tokens, ref, sizeof(int32_t) * 6) == 0);
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    CHECK(st.prefix_cache_hit_tokens >= 64);
    di_engine_free(e);
    di_model_free(m);
}

/* ---- Experts read per step (di_engine_stats.n_expert_loads) ------------------------------ */

/* tests/data/v2_lite/config.json: 3 layers, the first dense (first_k_dense_replace 1), so 2 MoE
 * layers; 8 routed experts, top-2. A decode step of one sequence reads exactly its top-2
 * experts in each MoE layer; a step of B tokens reads between 2 and min(8, 2 B) per layer. */
#define EL_MOE_LAYERS 2
#define EL_E          8
#define EL_K          2

TEST(expert_loads) {
    di_engine_params ep = eu_small_params();
    di_model *m;
    di_engine *e;
    if (!eu_open("v2_lite", 2, &ep, &m, &e)) return;
    di_sampling_params sp = greedy(6);
    int32_t prompt[3][12];
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 12; k++)
            prompt[r][k] = 2 + rnd(390);
    di_engine_output outs[8];
    int64_t prev = 0, n_checked = 0;
    /* One request alone, then three together. */
    for (int round = 0; round < 2; round++) {
        const int n_req = round == 0 ? 1 : 3;
        for (int r = 0; r < n_req; r++) {
            di_engine_request q = {.prompt_ids = prompt[r],
                                   .n_prompt_ids = 12,
                                   .sampling = &sp,
                                   .id = (uint64_t)(10 * round + r)};
            CHECK(di_engine_add_request(e, &q) == DI_OK);
        }
        for (int done = 0, guard = 0; done < n_req && guard < 100; guard++) {
            di_engine_stats before;
            di_engine_get_stats(e, &before);
            int64_t n = 0;
            CHECK(di_engine_step(e, outs, 8, &n) == DI_OK);
            di_engine_stats st;
            di_engine_get_stats(e, &st);
            const int64_t loads = st.n_expert_loads - prev, rows = st.n_prompt_tokens -
                                                                   before.n_prompt_tokens;
            prev = st.n_expert_loads;
            int64_t gen = 0;
            for (int64_t i = 0; i < n; i++) {
                gen += outs[i].n_tokens;
                done += outs[i].finished;
            }
            if (rows == 0 && gen > 0) { /* a pure decode step of `gen` sequences */
                const int64_t lo = EL_MOE_LAYERS * EL_K;
                const int64_t hi = EL_MOE_LAYERS * (EL_K * gen < EL_E ? EL_K * gen : EL_E);
                if (gen == 1) CHECK_EQ_INT(loads, lo);
                CHECK_MSG(loads >= lo && loads <= hi, "batch %lld: %lld loads", (long long)gen,
                          (long long)loads);
                n_checked++;
            }
        }
    }
    CHECK_MSG(n_checked >= 8, "%lld decode steps checked", (long long)n_checked);
    di_engine_free(e);
    di_model_free(m);
}

/* ---- Prompt logprobs --------------------------------------------------------------------- */

#define PLP_LEN 110 /* > the engine's 64 prompt-logits rows per step */
#define PLP_N   5

/* Runs `reqs` through a fresh engine; the caller's results are filled. */
static bool plp_run(di_model *m, di_engine_params ep, eu_req *reqs, int n, int64_t *n_preempt) {
    di_engine *e = NULL;
    if (di_engine_create(m, &ep, &e) != DI_OK) return false;
    bool ok = eu_run(e, reqs, n) > 0;
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    ok = ok && st.kv_blocks_used == 0;
    if (n_preempt) *n_preempt = st.n_preemptions;
    di_engine_free(e);
    return ok;
}

static bool plp_same(const eu_result *a, const eu_result *b) {
    if (a->n_plp != b->n_plp || a->plp_records != 1 || b->plp_records != 1) return false;
    for (int64_t i = 0; i < a->n_plp; i++)
        if (a->plp_tok[i] != b->plp_tok[i] || memcmp(&a->plp[i], &b->plp[i], sizeof(float)) ||
            a->plp_n_top[i] != b->plp_n_top[i] ||
            memcmp(a->plp_top_ids[i], b->plp_top_ids[i], (size_t)a->plp_n_top[i] * 4) ||
            memcmp(a->plp_top_lp[i], b->plp_top_lp[i], (size_t)a->plp_n_top[i] * 4))
            return false;
    return a->n == b->n && memcmp(a->tokens, b->tokens, (size_t)a->n * sizeof(int32_t)) == 0;
}

static void check_prompt_logprobs(const char *model_name) {
    di_model *m = NULL;
    if (!eu_load(model_name, 2, &m)) {
        CHECK_MSG(false, "%s: %s", model_name, di_last_error());
        return;
    }
    di_model_info info;
    di_model_get_info(m, &info);
    const int64_t V = info.vocab_size;
    int32_t p[PLP_LEN], other[3][PLP_LEN], one = 7;
    for (int k = 0; k < PLP_LEN; k++) {
        p[k] = 2 + rnd((int32_t)V - 2);
        for (int j = 0; j < 3; j++)
            other[j][k] = j == 0 && k < 96 ? p[k] : 2 + rnd((int32_t)V - 2); /* 0: p's prefix */
    }

    /* Reference: the context's logits of every prompt position, log-softmax in double. */
    di_context_params cp = di_context_default_params();
    cp.max_tokens = PLP_LEN + 1;
    di_context *c = NULL;
    CHECK(di_context_create(m, &cp, &c) == DI_OK);
    float *lg = malloc((size_t)(PLP_LEN * V) * sizeof(float));
    CHECK(c && lg && di_context_eval(c, p, PLP_LEN, lg, PLP_LEN) == DI_OK);
    di_context_free(c);

    di_sampling_params sp = greedy(4);
    sp.prompt_logprobs = PLP_N;
    eu_result *alone = calloc(1, sizeof *alone);
    eu_req ra = {.prompt = p, .n_prompt = PLP_LEN, .sp = sp, .abort_at = -1, .res = alone};
    di_engine_params ep = eu_small_params();
    ep.max_model_len = 256;
    ep.max_batch_tokens = ep.max_prefill_tokens = 128;
    CHECK(plp_run(m, ep, &ra, 1, NULL));
    CHECK_MSG(alone->plp_records == 1 && alone->n_plp == PLP_LEN - 1, "%s: %d records, %lld",
              model_name, alone->plp_records, (long long)alone->n_plp);
    double worst = 0;
    for (int64_t i = 0; i < alone->n_plp && i < PLP_LEN - 1; i++) {
        const float *x = lg + i * V; /* position i gives prompt token i + 1 */
        float mx = x[0];
        for (int64_t v = 1; v < V; v++)
            mx = x[v] > mx ? x[v] : mx;
        double s = 0;
        for (int64_t v = 0; v < V; v++)
            s += exp((double)x[v] - mx);
        double lse = mx + log(s);
        CHECK(alone->plp_tok[i] == p[i + 1] && alone->plp_n_top[i] == PLP_N);
        worst = fmax(worst, fabs(alone->plp[i] - (x[p[i + 1]] - lse)));
        for (int32_t j = 0; j < PLP_N; j++) {
            int32_t id = alone->plp_top_ids[i][j];
            int64_t better = 0; /* the reference rank: higher logits, ties to the lower id */
            for (int64_t v = 0; v < V; v++)
                better += x[v] > x[id] || (x[v] == x[id] && v < id);
            CHECK_MSG(better == j, "%s pos %lld top %d: id %d has rank %lld", model_name,
                      (long long)i, j, id, (long long)better);
            worst = fmax(worst, fabs(alone->plp_top_lp[i][j] - (x[id] - lse)));
        }
    }
    CHECK_MSG(worst <= 1e-6, "%s: prompt logprobs differ from the context by %g", model_name,
              worst);
    int32_t ref[4];
    eu_ref_greedy(m, p, PLP_LEN, 4, ref);
    CHECK(alone->n == 4 && memcmp(alone->tokens, ref, sizeof ref) == 0);

    /* Inside a batch: a request sharing p's first 96 tokens finishes first, so p's prefix is
     * cached -- and must not be used (cached positions have no logits). n = 2: both samples'
     * first records carry the same prompt logprobs. */
    for (int variant = 0; variant < 4; variant++) {
        eu_result *res = calloc(6, sizeof *res);
        di_sampling_params sp2 = sp;
        sp2.n = 2;
        eu_req reqs[5] = {
            {.prompt = other[0],
             .n_prompt = PLP_LEN,
             .sp = greedy(3),
             .abort_at = -1,
             .res = &res[0]},
            {.prompt = other[1],
             .n_prompt = 50,
             .sp = greedy(9),
             .arrive = 6,
             .abort_at = -1,
             .res = &res[1]},
            {.prompt = p,
             .n_prompt = PLP_LEN,
             .sp = sp2,
             .arrive = 6,
             .abort_at = -1,
             .res = &res[2]},
            {.prompt = other[2],
             .n_prompt = 30,
             .sp = sp,
             .arrive = 7,
             .abort_at = -1,
             .res = &res[4]},
            {.prompt = &one, .n_prompt = 1, .sp = sp, .arrive = 7, .abort_at = -1, .res = &res[5]}};
        di_engine_params eb = eu_small_params();
        eb.max_model_len = 256;
        if (variant == 1) eb.max_prefill_tokens = 7; /* chunked prefill */
        if (variant == 2) eb.overlap = true;
        if (variant == 3) { /* a KV pool of one sequence: preemptions, recompute */
            int64_t bs = strncmp(model_name, "v4", 2) == 0 ? 128 : eb.block_size;
            eb.max_model_len = 128;
            eb.kv_memory_bytes = info.kv_bytes_per_token * bs * ((eb.max_model_len + bs - 1) / bs);
        }
        int64_t n_preempt = 0;
        CHECK(plp_run(m, eb, reqs, 5, &n_preempt));
        if (variant == 3) CHECK_MSG(n_preempt > 0, "%s: no preemption", model_name);
        CHECK_MSG(plp_same(alone, &res[2]) && plp_same(alone, &res[3]),
                  "%s variant %d: prompt logprobs differ from the request alone", model_name,
                  variant);
        CHECK(res[2].usage.cached_tokens == 0 && res[0].plp_records == 0);
        CHECK(res[4].plp_records == 1 && res[4].n_plp == 29);
        CHECK(res[5].plp_records == 1 && res[5].n_plp == 0 && res[5].n == 4);
        free(res);
    }
    free(alone);
    free(lg);
    di_model_free(m);
}

TEST(prompt_logprobs) {
    check_prompt_logprobs("v2_lite");
    check_prompt_logprobs("v4_hc3_plain");
}

TEST(n_samples) {
    di_engine_params ep = eu_small_params();
    di_model *m;
    di_engine *e;
    if (!eu_open("v3_fp8", 2, &ep, &m, &e)) return;
    int32_t p[30];
    for (int k = 0; k < 30; k++)
        p[k] = 2 + rnd(300);
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = 0.9f;
    sp.max_tokens = 10;
    sp.ignore_eos = true;
    sp.n = 4;
    sp.seed = 77;
    sp.logprobs = 2;
    di_sampling_params sp1 = sp;
    sp1.n = 1;
    eu_result *r4 = calloc(4, sizeof *r4), *r1 = calloc(1, sizeof *r1);
    eu_req reqs[2] = {
        {.prompt = p, .n_prompt = 30, .sp = sp, .arrive = 0, .abort_at = -1, .res = r4},
        {.prompt = p, .n_prompt = 30, .sp = sp1, .arrive = 0, .abort_at = -1, .res = r1}};
    CHECK(eu_run(e, reqs, 2) > 0);
    bool all_same = true;
    for (int i = 0; i < 4; i++) {
        CHECK(r4[i].n == 10 && r4[i].finished && r4[i].n_final == 1 && r4[i].seed == 77);
        if (i > 0) {
            CHECK_MSG(r4[i].usage.cached_tokens >= 24, "sample %d cached %lld", i,
                      (long long)r4[i].usage.cached_tokens);
            all_same = all_same && memcmp(r4[i].tokens, r4[0].tokens, sizeof(int32_t) * 10) == 0;
        }
    }
    CHECK(!all_same); /* different sample indices draw different numbers */
    /* sample 0 is the n = 1 request: same seed, same index, same positions */
    CHECK(memcmp(r4[0].tokens, r1->tokens, sizeof(int32_t) * 10) == 0);
    CHECK(memcmp(r4[0].lp, r1->lp, sizeof(float) * 10) == 0);
    free(r4);
    free(r1);
    di_engine_free(e);
    di_model_free(m);
}

TEST(stop_strings_and_text) {
    di_engine_params ep = eu_small_params();
    ep.tokenizer_path = TOKENIZER;
    di_model *m;
    di_engine *e;
    if (!eu_open("v2_lite", 2, &ep, &m, &e)) return;
    /* Tokens below 256 (the tokenizer's ids) keep the text meaningful. */
    di_sampling_params sp = greedy(24);
    sp.logit_bias = NULL;
    int32_t p[12];
    for (int k = 0; k < 12; k++)
        p[k] = 40 + rnd(200);
    eu_result r0 = {0};
    eu_req q0 = {.prompt = p, .n_prompt = 12, .sp = sp, .arrive = 0, .abort_at = -1, .res = &r0};
    CHECK(eu_run(e, &q0, 1) > 0);
    CHECK_MSG(r0.text_len > 6, "text of %lld bytes", (long long)r0.text_len);
    if (r0.text_len > 6) {
        /* a stop string from the middle of the text, likely spanning tokens */
        char stop[8];
        int64_t at = r0.text_len / 2 - 2;
        memcpy(stop, r0.text + at, 4);
        stop[4] = 0;
        const char *first = strstr(r0.text, stop);
        int64_t cut = first ? first - r0.text : at;
        const char *stops[1] = {stop};
        di_sampling_params sps = sp;
        sps.stop = stops;
        sps.n_stop = 1;
        eu_result r1 = {0};
        eu_req q1 = {
            .prompt = p, .n_prompt = 12, .sp = sps, .arrive = 0, .abort_at = -1, .res = &r1};
        CHECK(eu_run(e, &q1, 1) > 0);
        CHECK(r1.reason == DI_ENGINE_FINISH_STOP && r1.n_final == 1);
        CHECK_MSG(r1.text_len == cut && memcmp(r1.text, r0.text, (size_t)cut) == 0,
                  "stop '%s': text of %lld bytes, expected %lld", stop, (long long)r1.text_len,
                  (long long)cut);
        CHECK(r1.n <= r0.n && memcmp(r1.tokens, r0.tokens, (size_t)r1.n * sizeof(int32_t)) == 0);
    }
    /* a text prompt gives the tokens of its ids */
    eu_result rt = {0}, ri = {0};
    int32_t ids[64];
    di_tokenizer *tok = NULL;
    CHECK(di_tokenizer_load(TOKENIZER, &tok) == DI_OK);
    int64_t n = tok ? di_tokenizer_encode(tok, "hello world", 11, false, ids, 64) : 0;
    CHECK(n > 0);
    eu_req qt[2] = {
        {.text = "hello world", .sp = greedy(5), .arrive = 0, .abort_at = -1, .res = &rt},
        {.prompt = ids, .n_prompt = n, .sp = greedy(5), .arrive = 0, .abort_at = -1, .res = &ri}};
    CHECK(eu_run(e, qt, 2) > 0);
    CHECK(rt.n == 5 && memcmp(rt.tokens, ri.tokens, 5 * sizeof(int32_t)) == 0);
    di_tokenizer_free(tok);
    di_engine_free(e);
    di_model_free(m);
}

TEST(abort_and_errors) {
    di_engine_params ep = eu_small_params();
    di_model *m;
    di_engine *e;
    if (!eu_open("v2_lite", 1, &ep, &m, &e)) return;
    int32_t p[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, longp[200];
    for (int k = 0; k < 200; k++)
        longp[k] = 3 + k;
    eu_result ra = {0}, rb = {0}, rc = {0}, rd = {0};
    di_sampling_params sn = greedy(3);
    sn.n = 2;
    eu_result rn[2];
    memset(rn, 0, sizeof rn);
    eu_req reqs[4] = {
        {.prompt = p, .n_prompt = 10, .sp = greedy(40), .arrive = 0, .abort_at = 3, .res = &ra},
        {.prompt = p, .n_prompt = 10, .sp = greedy(5), .arrive = 0, .abort_at = -1, .res = &rb},
        {.prompt = longp,
         .n_prompt = 200,
         .sp = greedy(5),
         .arrive = 1,
         .abort_at = -1,
         .res = &rc},
        {.prompt = p, .n_prompt = 10, .sp = sn, .arrive = 0, .abort_at = 0, .res = rn},
    };
    (void)rd;
    CHECK(eu_run(e, reqs, 4) > 0);
    CHECK(ra.reason == DI_ENGINE_FINISH_ABORT && ra.n_final == 1 && ra.n < 40);
    CHECK(rb.reason == DI_ENGINE_FINISH_LENGTH && rb.n == 5);
    CHECK(rc.reason == DI_ENGINE_FINISH_ERROR && rc.n == 0); /* prompt > max_model_len */
    CHECK(rn[0].reason == DI_ENGINE_FINISH_ABORT && rn[1].reason == DI_ENGINE_FINISH_ABORT);
    CHECK(rn[0].n_final == 1 && rn[1].n_final == 1);
    /* API errors leave the engine usable */
    di_engine_request bad = {.prompt_ids = p, .n_prompt_ids = 0, .id = 1};
    CHECK(di_engine_add_request(e, &bad) == DI_ERR_INVALID_ARG);
    int32_t oov = 400;
    bad.prompt_ids = &oov, bad.n_prompt_ids = 1;
    CHECK(di_engine_add_request(e, &bad) == DI_ERR_RANGE);
    bad.prompt_ids = NULL, bad.prompt_text = "x";
    CHECK(di_engine_add_request(e, &bad) == DI_ERR_NOT_FOUND); /* no tokenizer in the folder */
    CHECK(di_engine_abort(e, 999) == DI_ERR_NOT_FOUND);
    CHECK(!di_engine_has_unfinished(e));
    CHECK(strcmp(di_engine_finish_str(DI_ENGINE_FINISH_LENGTH), "length") == 0);
    di_engine_params bp = ep;
    bp.disaggregate = true;
    bp.overlap = true;
    di_engine *e2 = NULL;
    CHECK(di_engine_create(m, &bp, &e2) == DI_ERR_INVALID_ARG && !e2);
    bp = ep;
    bp.kv_memory_bytes = 100;
    CHECK(di_engine_create(m, &bp, &e2) == DI_ERR_INVALID_ARG && !e2);
    di_engine_free(e);
    di_model_free(m);
}

/* Requests added from another thread while the engine steps (the locked inbox). */
typedef struct producer {
    di_engine *e;
    int32_t prompts[12][16];
    di_sampling_params sp;
    int added;
} producer;

static void *produce(void *arg) {
    producer *p = arg;
    for (int i = 0; i < 12; i++) {
        di_engine_request rq = {.prompt_ids = p->prompts[i],
                                .n_prompt_ids = 4 + i,
                                .sampling = &p->sp,
                                .id = (uint64_t)i};
        if (di_engine_add_request(p->e, &rq) == DI_OK)
            __atomic_add_fetch(&p->added, 1, __ATOMIC_SEQ_CST);
        struct timespec ts = {0, 300000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

TEST(add_from_thread) {
    di_engine_params ep = eu_small_params();
    ep.overlap = true;
    di_model *m;
    di_engine *e;
    if (!eu_open("v3_fp8", 1, &ep, &m, &e)) return;
    producer *p = calloc(1, sizeof *p);
    p->e = e;
    p->sp = greedy(5);
    for (int i = 0; i < 12; i++)
        for (int k = 0; k < 16; k++)
            p->prompts[i][k] = 2 + rnd(300);
    pthread_t th;
    pthread_create(&th, NULL, produce, p);
    int32_t got[12][8];
    int n_got[12] = {0}, n_done = 0;
    di_engine_output out[64];
    for (int guard = 0; n_done < 12 && guard < 1000000; guard++) {
        int64_t n = 0;
        CHECK(di_engine_step(e, out, 64, &n) == DI_OK);
        for (int64_t k = 0; k < n; k++) {
            int i = (int)out[k].id;
            for (int64_t t = 0; t < out[k].n_tokens && n_got[i] < 8; t++)
                got[i][n_got[i]++] = out[k].tokens[t];
            if (out[k].finished) n_done++;
        }
    }
    pthread_join(th, NULL);
    CHECK(n_done == 12 && p->added == 12);
    for (int i = 0; i < 12; i++) {
        int32_t ref[8];
        eu_ref_greedy(m, p->prompts[i], 4 + i, 5, ref);
        CHECK(n_got[i] == 5 && memcmp(got[i], ref, 5 * sizeof(int32_t)) == 0);
    }
    CHECK(!di_engine_has_unfinished(e));
    free(p);
    di_engine_free(e);
    di_model_free(m);
}

int main(void) {
    RUN(default_kv_budget);
    RUN(mixed_batches);
    RUN(preemption);
    RUN(prefix_reuse);
    RUN(expert_loads);
    RUN(prompt_logprobs);
    RUN(n_samples);
    RUN(stop_strings_and_text);
    RUN(abort_and_errors);
    RUN(add_from_thread);
    return test_summary();
}
