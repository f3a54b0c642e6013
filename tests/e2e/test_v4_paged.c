/*
 * test_v4_paged.c -- DeepSeek-V4 in the engine on the bundled model (models/deepseek-v4-tiny:
 * sliding window 128, CSA m=4, HCA m=128, 6 layers): compressed rows and indexer keys in the
 * paged pool, prefix reuse with bounded window replay, preemption, batching.
 *
 * The reference is one sampled request (temperature 0.8, seed, logprobs 5) with a prompt of
 * 1,000 tokens run alone in a fresh engine; its greedy twin is also checked against the
 * single-sequence context (an independent path: one block, chunks of 128). Every other run
 * must give exactly the same tokens and bitwise the same logprobs:
 *   - served from a prefix-cache hit of 896 tokens (7 blocks) left by an earlier request:
 *     the runner replays the window state from H - replay_tokens without writing the
 *     shared rows, and usage reports the cached tokens;
 *   - the same while the earlier request is still running and holds the shared blocks (a
 *     replay that wrote its inexact early rows into them would change both outputs);
 *   - preempted at position 896 in a pool of 10 blocks and resumed from a prefix-cache hit
 *     of its own 7 blocks (with the plain and the overlap loop);
 *   - inside a mixed batch of 12 requests, with the overlap loop.
 * And at the runner level: a second runner state sharing the first one's pool and slots
 * (v4_batch_state_create_shared) replays 762 tokens over blocks the first one wrote, without
 * changing a byte of the pool, and gives the first one's logits bitwise.
 */
#define _POSIX_C_SOURCE 200809L
#include "api_internal.h"
#include "engine_util.h"
#include "model/deepseek_v4.h"

#define MODEL_DIR DI_SOURCE_DIR "/models/deepseek-v4-tiny"
#define N_PROMPT  1000
#define N_GEN     24
#define BLOCK     128
#define MAX_LEN   1280

static uint32_t g_rng = 777u;
static int32_t rnd(int32_t n) {
    g_rng = g_rng * 1664525u + 1013904223u;
    return (int32_t)((g_rng >> 8) % (uint32_t)n);
}

static di_model *g_model;
static int64_t g_vocab;
static int32_t g_prompt[N_PROMPT];        /* the target's prompt */
static int32_t g_other[4][N_PROMPT + 40]; /* [0], [1]: share the target's first 1,024 tokens */

static di_sampling_params sampled(int64_t max_tokens, int64_t seed) {
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = 0.8f;
    sp.seed = seed;
    sp.max_tokens = max_tokens;
    sp.ignore_eos = true;
    sp.logprobs = 5;
    return sp;
}

static di_engine_params base_params(void) {
    di_engine_params ep = di_engine_default_params();
    ep.n_threads = 2;
    ep.max_model_len = MAX_LEN;
    ep.max_running = 16;
    ep.max_batch_tokens = 512;
    ep.max_prefill_tokens = 256;
    ep.block_size = BLOCK;
    return ep;
}

static eu_req target_req(int arrive, eu_result *res) {
    return (eu_req){.prompt = g_prompt,
                    .n_prompt = N_PROMPT,
                    .sp = sampled(N_GEN, 4242),
                    .arrive = arrive,
                    .abort_at = -1,
                    .res = res};
}

static bool run(di_engine_params ep, eu_req *reqs, int n, di_engine_stats *stats) {
    di_engine *e = NULL;
    if (di_engine_create(g_model, &ep, &e)) {
        printf("  engine: %s\n", di_last_error());
        return false;
    }
    bool ok = eu_run(e, reqs, n) > 0;
    di_engine_get_stats(e, stats);
    CHECK(stats->kv_blocks_used == 0);
    di_engine_free(e);
    return ok;
}

static bool same(const eu_result *a, const eu_result *b) {
    if (a->n != b->n || !a->finished || !b->finished) return false;
    if (memcmp(a->tokens, b->tokens, (size_t)a->n * sizeof(int32_t))) return false;
    if (memcmp(a->lp, b->lp, (size_t)a->n * sizeof(float))) return false;
    return memcmp(a->top_lp, b->top_lp, (size_t)a->n * sizeof a->top_lp[0]) == 0 &&
           memcmp(a->top_ids, b->top_ids, (size_t)a->n * sizeof a->top_ids[0]) == 0;
}

static eu_result g_ref, g_ref_other[2];

/* The target alone, and each sharing request alone. */
TEST(reference) {
    di_engine_stats st;
    eu_req r = target_req(0, &g_ref);
    CHECK(run(base_params(), &r, 1, &st));
    CHECK(g_ref.n == N_GEN && g_ref.usage.cached_tokens == 0);
    for (int i = 0; i < 2; i++) {
        eu_req o = {.prompt = g_other[i],
                    .n_prompt = N_PROMPT + 40,
                    .sp = sampled(40, 7 + i),
                    .arrive = 0,
                    .abort_at = -1,
                    .res = &g_ref_other[i]};
        CHECK(run(base_params(), &o, 1, &st));
    }

    /* Greedy through the engine == greedy through the single-sequence context. */
    eu_result g = {0};
    eu_req gr = target_req(0, &g);
    gr.sp.temperature = 0.0f;
    gr.sp.logprobs = -1;
    CHECK(run(base_params(), &gr, 1, &st));
    int32_t ctx_tokens[N_GEN];
    eu_ref_greedy(g_model, g_prompt, N_PROMPT, N_GEN, ctx_tokens);
    CHECK_MSG(g.n == N_GEN && memcmp(g.tokens, ctx_tokens, sizeof ctx_tokens) == 0,
              "greedy engine tokens differ from the context's");
}

/* A later request hits the prefix an earlier one left (finished, or still running). */
static void check_hit(bool concurrent, bool overlap) {
    eu_result ro = {0}, rt = {0};
    eu_req reqs[2] = {{.prompt = g_other[0],
                       .n_prompt = N_PROMPT + 40,
                       .sp = sampled(40, 7),
                       .arrive = 0,
                       .abort_at = -1,
                       .res = &ro},
                      target_req(concurrent ? 6 : 30, &rt)};
    di_engine_params ep = base_params();
    ep.overlap = overlap;
    di_engine_stats st;
    CHECK(run(ep, reqs, 2, &st));
    /* (n_prompt - 1) / block_size full blocks of the shared 1,024 tokens can be hit. */
    const int64_t hit = (N_PROMPT - 1) / BLOCK * BLOCK;
    CHECK_MSG(rt.usage.cached_tokens == hit, "concurrent %d: cached %lld, want %lld", concurrent,
              (long long)rt.usage.cached_tokens, (long long)hit);
    CHECK(ro.usage.cached_tokens == 0 && st.prefix_cache_hit_tokens >= hit);
    CHECK_MSG(same(&rt, &g_ref), "concurrent %d overlap %d: the hit request differs from alone",
              concurrent, overlap);
    CHECK_MSG(same(&ro, &g_ref_other[0]),
              "concurrent %d overlap %d: the request sharing its blocks differs from alone",
              concurrent, overlap);
}

TEST(prefix_hit_with_replay) {
    check_hit(false, false);
    check_hit(true, false);
    check_hit(true, true);
}

/* A pool of 10 blocks: an older request (250 + 60 tokens) holds 2 when the target (8 blocks)
 * is admitted; when it needs its third while decoding, the target (the newest) is
 * preempted, and resumes once the other finishes, from a prefix-cache hit of its own 7 full
 * blocks (replay from 896 - replay_tokens). */
TEST(preemption_resume) {
    di_engine_stats st;
    eu_result ra_ref = {0};
    eu_req ra_req = {.prompt = g_other[3],
                     .n_prompt = 250,
                     .sp = sampled(60, 9),
                     .arrive = 0,
                     .abort_at = -1,
                     .res = &ra_ref};
    CHECK(run(base_params(), &ra_req, 1, &st));
    for (int overlap = 0; overlap < 2; overlap++) {
        eu_result rt = {0}, ra = {0};
        eu_req reqs[2] = {ra_req, target_req(0, &rt)};
        reqs[0].res = &ra;
        di_engine_params ep = base_params();
        ep.overlap = overlap;
        di_model_info info;
        di_model_get_info(g_model, &info);
        ep.kv_memory_bytes = info.kv_bytes_per_token * BLOCK * (MAX_LEN / BLOCK);
        CHECK(run(ep, reqs, 2, &st));
        CHECK_MSG(st.n_preemptions > 0, "overlap %d: no preemption", overlap);
        CHECK_MSG(st.prefix_cache_hit_tokens >= 7 * BLOCK,
                  "overlap %d: resumed from %lld cached "
                  "tokens",
                  overlap, (long long)st.prefix_cache_hit_tokens);
        CHECK_MSG(same(&rt, &g_ref), "overlap %d: the preempted target differs from alone",
                  overlap);
        CHECK_MSG(same(&ra, &ra_ref), "overlap %d: the other request differs from alone", overlap);
        printf("  overlap %d: %lld preemptions, %lld tokens from the cache\n", overlap,
               (long long)st.n_preemptions, (long long)st.prefix_cache_hit_tokens);
    }
}

/* The target among 11 other requests of mixed lengths, arrival steps and settings. */
TEST(mixed_batch) {
    enum { N = 12 };
    static int32_t prompts[N][300];
    eu_req reqs[N];
    eu_result *res = calloc(N, sizeof *res);
    reqs[0] = target_req(3, &res[0]);
    for (int i = 1; i < N; i++) {
        int64_t np = 1 + rnd(i % 3 ? 40 : 300);
        for (int64_t k = 0; k < np; k++)
            prompts[i][k] = 2 + rnd((int32_t)g_vocab - 2);
        reqs[i] = (eu_req){.prompt = prompts[i],
                           .n_prompt = np,
                           .sp = sampled(1 + rnd(30), 100 + i),
                           .arrive = rnd(6),
                           .abort_at = -1,
                           .res = &res[i]};
        if (i % 4 == 0) reqs[i].sp.temperature = 0.0f;
    }
    for (int overlap = 0; overlap < 2; overlap++) {
        for (int i = 0; i < N; i++)
            memset(&res[i], 0, sizeof res[i]);
        di_engine_params ep = base_params();
        ep.overlap = overlap;
        di_engine_stats st;
        CHECK(run(ep, reqs, N, &st));
        CHECK_MSG(same(&res[0], &g_ref), "overlap %d: the target differs inside a batch", overlap);
    }
    free(res);
}

/* The runner directly: state A prefills 1,000 tokens into 8 scattered blocks; state B,
 * sharing A's storage, resumes the same sequence in another slot from a hit of 896 tokens
 * (replay 134 .. 895, then 896 .. 999) over the same blocks. */
TEST(shared_state_replay) {
    const di_arch_vtable *arch = g_model->arch;
    const void *w = g_model->weights;
    const int64_t R = arch->replay_tokens(w), H = 7 * BLOCK;
    CHECK_MSG(R == 6 * 127, "replay_tokens %lld, want 6 layers x (window 128 - 1)", (long long)R);
    CHECK(arch->prefix_cache_ok(w) && arch->block_multiple(w) == BLOCK);
    di_backend be;
    CHECK(di_backend_cpu_init(&be, g_model->pool, MAX_LEN) == DI_OK);
    di_batch_config cfg = {.n_blocks = 12,
                           .block_size = BLOCK,
                           .n_slots = 2,
                           .max_model_len = MAX_LEN,
                           .max_batch_tokens = 512};
    void *a = NULL, *b = NULL;
    CHECK(arch->batch_state_create(w, &cfg, &a) == DI_OK);
    CHECK(a && v4_batch_state_create_shared(w, a, &cfg, &b) == DI_OK);
    di_batch_config bad = cfg;
    bad.block_size = 256;
    void *c = NULL;
    CHECK(a && v4_batch_state_create_shared(w, a, &bad, &c) == DI_ERR_INVALID_ARG && !c);
    if (!a || !b) return;

    static const int32_t table[8] = {9, 2, 11, 0, 5, 7, 3, 10};
    float *lref = malloc((size_t)g_vocab * sizeof(float));
    float *lg = malloc((size_t)g_vocab * sizeof(float));
    di_batch_seq q = {.ids = g_prompt,
                      .n = N_PROMPT,
                      .block_table = table,
                      .slot = 0,
                      .reset_state = true,
                      .n_logits = 1};
    arch->forward_batch(w, a, &be, &(di_batch_args){.seqs = &q, .n_seqs = 1, .logits = lref});

    const v4_ctx *ca = a;
    const di_v4_pool *pool = &ca->kv->pool;
    void *before = malloc(pool->rows_bytes);
    memcpy(before, pool->rows, pool->rows_bytes);
    di_batch_seq r = {.ids = g_prompt + (H - R),
                      .n = N_PROMPT - (H - R),
                      .pos0 = H - R,
                      .n_replay = R,
                      .block_table = table,
                      .slot = 1,
                      .reset_state = true,
                      .n_logits = 1};
    arch->forward_batch(w, b, &be, &(di_batch_args){.seqs = &r, .n_seqs = 1, .logits = lg});
    CHECK_MSG(memcmp(lref, lg, (size_t)g_vocab * sizeof(float)) == 0,
              "the replayed sequence's logits differ from the uninterrupted run's");
    CHECK_MSG(memcmp(before, pool->rows, pool->rows_bytes) == 0, "the replay changed the pool");
    free(before);
    free(lref);
    free(lg);
    arch->batch_state_free(b);
    arch->batch_state_free(a);
    di_backend_free(&be);
}

int main(void) {
    di_model_params mp = di_model_default_params();
    mp.n_threads = 2;
    if (di_model_load(MODEL_DIR, &mp, &g_model) != DI_OK) {
        printf("cannot load %s: %s\n", MODEL_DIR, di_last_error());
        return 1;
    }
    di_model_info info;
    di_model_get_info(g_model, &info);
    g_vocab = info.vocab_size;
    for (int k = 0; k < N_PROMPT; k++)
        g_prompt[k] = 2 + rnd((int32_t)g_vocab - 2);
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < N_PROMPT + 40; k++)
            g_other[i][k] =
                i < 2 && k < 1024 ? g_prompt[k < N_PROMPT ? k : 0] : 2 + rnd((int32_t)g_vocab - 2);
    RUN(shared_state_replay);
    RUN(reference);
    RUN(prefix_hit_with_replay);
    RUN(preemption_resume);
    RUN(mixed_batch);
    di_model_free(g_model);
    return test_summary();
}
