/*
 * golden_util.h -- the golden cases' reader (tests/data/<case>/ref.json + reference logits)
 * and a prompt evaluator, shared by test_goldens.c (CPU) and test_cuda_model.c (CUDA).
 */
#ifndef DI_TEST_GOLDEN_UTIL_H
#define DI_TEST_GOLDEN_UTIL_H

#include "deepinfer.h"
#include "test.h"

#include <jansson.h>
#include <stdbool.h>

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

#endif /* DI_TEST_GOLDEN_UTIL_H */
