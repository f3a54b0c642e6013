/*
 * test_v4_backend_memory.c -- the DeepSeek-V4 runner on a backend whose memory is not host
 * memory, checked without a GPU.
 *
 * The "separate memory" backend (sep_backend.h) is the CPU backend with host_memory = false.
 * The ops are the CPU ones, so the arithmetic is the CPU path's, and the only difference is
 * the data movement the runner does for a device backend (deepseek_v4_attn.c): host mirrors
 * for key lists, indexer scores, router logits, visible counts, rope tables, pooling slots;
 * row copies as ops. A missing upload leaves a
 * stale device buffer, a missing download a stale host mirror, so the logits must be
 * BITWISE those of the CPU model:
 *   - a context: 300 tokens in one call and in calls of 37;
 *   - the batched runner: three sequences of different lengths in one forward over a
 *     paged pool with scattered block tables, then one decode step each.
 *   - the engine (continuous batching, chunked prefill, slots reused) with the model's
 *     weights and states in separate memory: every request's tokens and logprobs bitwise
 *     those of the CPU model's engine (10 mixed greedy requests).
 * Cases: v4_mix_yarn (CSA, HCA, hash routing, YaRN), v4_upstream_fp8 (FP8 + E8M0 + FP4
 * experts) and the bundled model (window 128, CSA m=4, HCA m=128; not in the engine check).
 */
#define _POSIX_C_SOURCE 200809L
#include "api_internal.h"
#include "core/core.h"
#include "engine_util.h"
#include "sep_backend.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

/* ---- checks --------------------------------------------------------------------------------- */

#define N_TOK 300

static void make_ids(int32_t *ids, int64_t n, int64_t V, int32_t salt) {
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 7919 + 13 + salt * 31) % (V - 2)) + 1;
}

/* Logits of N_TOK tokens through a context state, in calls of `step`. */
static void run_context(const di_arch_vtable *arch, const void *w, const di_backend *be,
                        const int32_t *ids, int64_t step, int64_t V, float *out) {
    void *st = NULL;
    CHECK(arch->state_create(w, 512, &st) == DI_OK);
    if (!st) return;
    for (int64_t off = 0; off < N_TOK; off += step) {
        int64_t k = DI_MIN(step, N_TOK - off);
        di_forward_args a = {
            .ids = ids + off, .n = k, .pos0 = off, .logits = out + off * V, .n_logits = k};
        arch->forward(w, st, be, &a);
    }
    arch->state_free(st);
}

/* Three sequences (lengths 150, 61, 97) prefilled in one batch, then one decode step each;
 * logits of every prefill token and of the steps. */
static void run_batch(const di_arch_vtable *arch, const void *w, const di_backend *be, int64_t bs,
                      const int32_t *ids, int64_t V, float *out) {
    const int64_t len[3] = {150, 61, 97};
    const int64_t nb = (151 + bs - 1) / bs;
    di_batch_config cfg = {.n_blocks = 3 * nb + 2,
                           .block_size = bs,
                           .n_slots = 3,
                           .max_model_len = 256,
                           .max_batch_tokens = 128};
    void *st = NULL;
    CHECK(arch->batch_state_create(w, &cfg, &st) == DI_OK);
    if (!st) return;
    /* Scattered tables: sequence s takes blocks s + 3 j (reversed for s = 1). */
    int32_t table[3][64];
    for (int s = 0; s < 3; s++)
        for (int64_t j = 0; j < nb && j < 64; j++)
            table[s][j] = (int32_t)(s == 1 ? 3 * (nb - 1 - j) + 1 : s + 3 * j);
    di_batch_seq q[3];
    for (int s = 0; s < 3; s++)
        q[s] = (di_batch_seq){.ids = ids + s * 200,
                              .n = len[s],
                              .pos0 = 0,
                              .block_table = table[s],
                              .slot = s,
                              .reset_state = true,
                              .n_logits = len[s]};
    arch->forward_batch(w, st, be, &(di_batch_args){.seqs = q, .n_seqs = 3, .logits = out});
    float *o = out + (len[0] + len[1] + len[2]) * V;
    for (int s = 0; s < 3; s++)
        q[s] = (di_batch_seq){.ids = ids + s * 200 + len[s],
                              .n = 1,
                              .pos0 = len[s],
                              .block_table = table[s],
                              .slot = s,
                              .n_logits = 1};
    arch->forward_batch(w, st, be, &(di_batch_args){.seqs = q, .n_seqs = 3, .logits = o});
    arch->batch_state_free(st);
}

static void check_model(const char *dir) {
    di_model *m = sep_model_load(dir);
    if (!m) return;
    const di_arch_vtable *arch = m->arch;
    const int64_t V = m->hp.vocab_size;
    di_backend sep;
    sep_init(&sep, m->pool, 512);
    void *ws = NULL;
    CHECK_MSG(arch->load(&m->hp, m->st, dir, &sep, &ws) == DI_OK, "%s", di_last_error());
    if (!ws) {
        di_backend_free(&sep);
        di_model_free(m);
        return;
    }

    int32_t ids[600];
    make_ids(ids, 600, V, 0);
    const size_t ctx_bytes = (size_t)(N_TOK * V) * sizeof(float);
    float *ref = calloc(1, ctx_bytes), *got = calloc(1, ctx_bytes);
    int64_t up0 = g_n_up, down0 = g_n_down;
    run_context(arch, m->weights, &m->be, ids, N_TOK, V, ref);
    run_context(arch, ws, &sep, ids, N_TOK, V, got);
    CHECK_MSG(memcmp(ref, got, ctx_bytes) == 0, "%s: context logits differ (one call)", dir);
    run_context(arch, ws, &sep, ids, 37, V, got);
    CHECK_MSG(memcmp(ref, got, ctx_bytes) == 0, "%s: context logits differ (calls of 37)", dir);
    CHECK_MSG(g_n_up > up0 && g_n_down > down0, "%s: no data moved", dir);

    const int64_t bs = arch->block_multiple(m->weights) * 2;
    const size_t b_bytes = (size_t)((150 + 61 + 97 + 3) * V) * sizeof(float);
    float *bref = calloc(1, b_bytes), *bgot = calloc(1, b_bytes);
    make_ids(ids, 600, V, 5);
    run_batch(arch, m->weights, &m->be, bs, ids, V, bref);
    run_batch(arch, ws, &sep, bs, ids, V, bgot);
    CHECK_MSG(memcmp(bref, bgot, b_bytes) == 0, "%s: batched logits differ", dir);
    printf("  %-26s bitwise: context (1 call, calls of 37), batch of 3 + decode; %lld uploads, "
           "%lld downloads\n",
           strrchr(dir, '/') + 1, (long long)(g_n_up - up0), (long long)(g_n_down - down0));
    free(ref), free(got), free(bref), free(bgot);
    arch->free(ws);
    CHECK_MSG(g_n_bufs == 0, "%s: %lld backend buffers not freed", dir, (long long)g_n_bufs);
    di_backend_free(&sep);
    di_model_free(m);
}

/* ---- the engine over separate-memory weights and state -------------------------------------- */

#define N_REQ 10

static void engine_requests(int64_t V, int32_t (*prompts)[96], eu_req *reqs, eu_result *res) {
    uint32_t rng = 4321;
    for (int i = 0; i < N_REQ; i++) {
        rng = rng * 1664525u + 1013904223u;
        int64_t np = 1 + (int64_t)((rng >> 8) % (i % 3 == 0 ? 90u : 20u));
        for (int64_t k = 0; k < np; k++) {
            rng = rng * 1664525u + 1013904223u;
            prompts[i][k] = 2 + (int32_t)((rng >> 8) % (uint32_t)(V - 2));
        }
        di_sampling_params sp = di_sampling_default_params();
        sp.temperature = 0.0f;
        sp.max_tokens = 2 + i % 14;
        sp.ignore_eos = true;
        sp.logprobs = 5;
        reqs[i] = (eu_req){.prompt = prompts[i],
                           .n_prompt = np,
                           .sp = sp,
                           .arrive = i < 3 ? 0 : i % 8,
                           .abort_at = -1,
                           .res = &res[i]};
    }
}

static bool engine_run(di_model *m, eu_req *reqs, int n) {
    di_engine_params ep = eu_small_params();
    ep.n_threads = 2;
    return eu_run_fresh(m, &ep, reqs, n);
}

/* The engine's runner with the model's weights (and so its states) in separate memory: the
 * same tokens and bitwise the same logprobs as the CPU model's engine. */
static void check_engine(const char *dir) {
    di_model *m = sep_model_load(dir);
    if (!m) return;
    const int64_t V = m->hp.vocab_size;
    static int32_t prompts[N_REQ][96];
    static eu_req ra[N_REQ], rb[N_REQ];
    static eu_result resa[N_REQ], resb[N_REQ];
    memset(resa, 0, sizeof resa);
    memset(resb, 0, sizeof resb);
    engine_requests(V, prompts, ra, resa);
    engine_requests(V, prompts, rb, resb);
    CHECK(engine_run(m, ra, N_REQ));
    di_backend sep;
    sep_init(&sep, m->pool, 512);
    void *ws = NULL;
    CHECK_MSG(m->arch->load(&m->hp, m->st, dir, &sep, &ws) == DI_OK, "%s", di_last_error());
    if (ws) {
        void *wc = m->weights;
        m->weights = ws; /* the engine's states now allocate through `sep` */
        CHECK(engine_run(m, rb, N_REQ));
        m->weights = wc;
        int same = 0;
        for (int i = 0; i < N_REQ; i++) {
            bool eq = resa[i].n == ra[i].sp.max_tokens && resb[i].n == resa[i].n &&
                      memcmp(resa[i].tokens, resb[i].tokens, sizeof resa[i].tokens) == 0 &&
                      memcmp(resa[i].lp, resb[i].lp, sizeof resa[i].lp) == 0 &&
                      memcmp(resa[i].top_lp, resb[i].top_lp, sizeof resa[i].top_lp) == 0;
            CHECK_MSG(eq, "%s req %d: the engine over separate memory differs", dir, i);
            same += eq;
        }
        printf("  engine %-19s %d/%d requests bitwise (tokens, logprobs)\n", strrchr(dir, '/') + 1,
               same, N_REQ);
        m->arch->free(ws);
    }
    di_backend_free(&sep);
    di_model_free(m);
}

TEST(v4_separate_memory_engine) {
    check_engine(DI_SOURCE_DIR "/tests/data/v4_mix_yarn");
    check_engine(DI_SOURCE_DIR "/tests/data/v4_upstream_fp8");
}

TEST(v4_separate_memory_bitwise) {
    check_model(DI_SOURCE_DIR "/tests/data/v4_mix_yarn");
    check_model(DI_SOURCE_DIR "/tests/data/v4_upstream_fp8");
    check_model(DI_SOURCE_DIR "/models/deepseek-v4-tiny");
}

int main(void) {
    RUN(v4_separate_memory_bitwise);
    RUN(v4_separate_memory_engine);
    return test_summary();
}
