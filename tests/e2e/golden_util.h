/*
 * golden_util.h -- the golden cases' reader (tests/data/<case>/ref.json + reference logits)
 * and a prompt evaluator, shared by test_goldens.c (CPU) and test_cuda_model.c (CUDA).
 */
#ifndef DI_TEST_GOLDEN_UTIL_H
#define DI_TEST_GOLDEN_UTIL_H

#include "deepinfer.h"
#include "test.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define DATA_DIR          DI_SOURCE_DIR "/tests/data"
#define DI_TEST_MIN(a, b) ((a) < (b) ? (a) : (b))

typedef struct golden {
    char dir[512];
    int32_t *prompt, *greedy;
    int64_t n_prompt, n_greedy, vocab;
    double *ref; /* [n_prompt][vocab] */
} golden;

static inline int32_t *read_ids(json_t *arr, int64_t *n) {
    *n = (int64_t)json_array_size(arr);
    int32_t *ids = malloc((size_t)(*n ? *n : 1) * sizeof *ids);
    for (int64_t i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

static inline bool golden_load(const char *dir, golden *g) {
    memset(g, 0, sizeof *g);
    snprintf(g->dir, sizeof g->dir, "%s", dir);
    char path[1024];
    snprintf(path, sizeof path, "%s/ref.json", dir);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) return false;
    g->prompt = read_ids(json_object_get(root, "prompt_ids"), &g->n_prompt);
    g->greedy = read_ids(json_object_get(root, "greedy_ids"), &g->n_greedy);
    g->vocab = json_integer_value(json_object_get(root, "vocab_size"));
    const char *lf = json_string_value(json_object_get(root, "logits_file"));
    snprintf(path, sizeof path, "%s/%s", dir, lf ? lf : "ref_logits.f64");
    json_decref(root);
    size_t n = (size_t)(g->n_prompt * g->vocab);
    g->ref = malloc(n * sizeof(double));
    FILE *f = fopen(path, "rb");
    bool ok = f && fread(g->ref, sizeof(double), n, f) == n; /* little-endian hosts */
    if (f) fclose(f);
    return ok && g->n_prompt > 0 && g->vocab > 0;
}

static inline void golden_free(golden *g) {
    free(g->prompt);
    free(g->greedy);
    free(g->ref);
}

static inline int64_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Evaluates the prompt in chunks of `chunk` tokens (0: one call) with n_threads; returns
 * logits [n_prompt][vocab] (malloc'd) or NULL. */
static inline float *eval_prompt(di_model *m, const golden *g, int64_t chunk, int32_t n_threads) {
    di_context_params cp = di_context_default_params();
    cp.max_tokens = g->n_prompt + g->n_greedy + 1;
    cp.n_threads = n_threads;
    di_context *ctx;
    if (di_context_create(m, &cp, &ctx) != DI_OK) {
        printf("  context: %s\n", di_last_error());
        return NULL;
    }
    float *lg = malloc((size_t)(g->n_prompt * g->vocab) * sizeof(float));
    if (chunk <= 0) chunk = g->n_prompt;
    for (int64_t i = 0; i < g->n_prompt; i += chunk) {
        int64_t n = DI_TEST_MIN(chunk, g->n_prompt - i);
        if (di_context_eval(ctx, g->prompt + i, n, lg + i * g->vocab, n) != DI_OK) {
            printf("  eval: %s\n", di_last_error());
            free(lg);
            lg = NULL;
            break;
        }
    }
    di_context_free(ctx);
    return lg;
}

/* Largest per-position max|a - b| / max|b| over n rows of V. */
static inline double worst_ratio_f(const float *a, const float *b, int64_t n, int64_t V) {
    double worst = 0.0;
    for (int64_t t = 0; t < n; t++) {
        double mx = 0.0, err = 0.0;
        for (int64_t v = 0; v < V; v++) {
            mx = fmax(mx, fabs((double)b[t * V + v]));
            err = fmax(err, fabs((double)a[t * V + v] - (double)b[t * V + v]));
        }
        worst = fmax(worst, mx > 0 ? err / mx : err);
    }
    return worst;
}

/* Every position of the prompt's logits lg within 1e-3 * max|ref logit| of the reference
 * (checked per position); returns the largest ratio. */
static inline double check_vs_reference(const char *label, const golden *g, const float *lg) {
    const int64_t V = g->vocab;
    double worst = 0.0;
    for (int64_t t = 0; t < g->n_prompt; t++) {
        double mx = 0.0, err = 0.0;
        for (int64_t v = 0; v < V; v++) {
            mx = fmax(mx, fabs(g->ref[t * V + v]));
            err = fmax(err, fabs((double)lg[t * V + v] - g->ref[t * V + v]));
        }
        double ratio = mx > 0 ? err / mx : err;
        worst = fmax(worst, ratio);
        CHECK_MSG(ratio <= 1e-3, "%s: position %lld: max error %.3g vs max |logit| %.3g", label,
                  (long long)t, err, mx);
    }
    return worst;
}

/* Greedy generation after the prompt, one token at a time: how many of the golden ids come
 * out in order (checked to be all of them). */
static inline int64_t check_greedy(const char *label, di_model *m, const golden *g) {
    const int64_t V = g->vocab;
    int64_t matched = 0;
    di_context_params cp = di_context_default_params();
    cp.max_tokens = g->n_prompt + g->n_greedy + 1;
    di_context *ctx = NULL;
    CHECK(di_context_create(m, &cp, &ctx) == DI_OK);
    float *row = malloc((size_t)V * sizeof(float));
    if (ctx && di_context_eval(ctx, g->prompt, g->n_prompt, row, 1) == DI_OK) {
        for (int64_t i = 0; i < g->n_greedy; i++) {
            int32_t next = (int32_t)argmax(row, V);
            if (next != g->greedy[i]) break;
            matched++;
            if (di_context_eval(ctx, &next, 1, row, 1) != DI_OK) break;
        }
    }
    CHECK_MSG(matched == g->n_greedy, "%s: greedy ids match for %lld of %lld tokens", label,
              (long long)matched, (long long)g->n_greedy);
    free(row);
    di_context_free(ctx);
    return matched;
}

/* The prompt in chunks of 1, 3 and 7 against the one-call logits lg: within 1e-5 relative
 * (checked); returns the largest ratio. */
static inline double check_chunked(const char *label, di_model *m, const golden *g,
                                   const float *lg) {
    double worst = 0.0;
    static const int64_t chunks[] = {1, 3, 7};
    for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
        float *lc = eval_prompt(m, g, chunks[ci], 2);
        CHECK(lc != NULL);
        if (!lc) continue;
        worst = fmax(worst, worst_ratio_f(lc, lg, g->n_prompt, g->vocab));
        free(lc);
    }
    CHECK_MSG(worst <= 1e-5, "%s: chunked prefill differs by %.3g (relative)", label, worst);
    return worst;
}

/* 300 tokens (more than the model's internal chunk of 128 rows) in one call give bitwise the
 * logits of the same tokens in calls of 50 (checked). */
static inline void check_long_input(const char *label, di_model *m, const golden *g) {
    const int64_t V = g->vocab;
    golden l2 = *g;
    l2.n_prompt = 300;
    l2.n_greedy = 0;
    int32_t *ids = malloc(300 * sizeof *ids);
    for (int64_t i = 0; i < 300; i++) {
        ids[i] = g->prompt[i % g->n_prompt] ^ (int32_t)(i / g->n_prompt);
        ids[i] = ids[i] < V ? ids[i] : (int32_t)(i % V);
    }
    l2.prompt = ids;
    float *a = eval_prompt(m, &l2, 0, 2), *b = eval_prompt(m, &l2, 50, 2);
    CHECK_MSG(a && b && memcmp(a, b, (size_t)(300 * V) * sizeof(float)) == 0,
              "%s: 300 tokens in one call differ from calls of 50", label);
    free(a), free(b), free(ids);
}

#endif /* DI_TEST_GOLDEN_UTIL_H */
