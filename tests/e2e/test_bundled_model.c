/*
 * test_bundled_model.c -- the bundled trained model (models/deepseek-v4-tiny) against the
 * float64 references that tools/train/make_reference.py computed with transformers on real
 * prompts (models/deepseek-v4-tiny/ref/<case>/).
 *
 * Per case: our tokenizer gives the reference's prompt ids for the prompt text; the logits
 * at the recorded prompt positions are within 1e-3 of the largest reference logit; the
 * greedy continuation is identical, and so is its text. (The MTP logits in the references
 * are for the speculative-decoding work; the plain forward pass does not run the MTP.)
 *
 * The same checks run with the model on CUDA (di_model_params.device = "cuda") when a device
 * is present; without one that test is skipped with the reason.
 */
#include "backend/backend.h"
#include "deepinfer.h"
#include "test.h"

#include <dirent.h>
#include <jansson.h>

#define MODEL_DIR DI_SOURCE_DIR "/models/deepseek-v4-tiny"

static int64_t json_ids(json_t *arr, int32_t **out) {
    size_t n = json_array_size(arr);
    *out = malloc((n ? n : 1) * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        (*out)[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return (int64_t)n;
}

static double *read_f64(const char *path, size_t count) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    double *v = malloc(count * sizeof(double));
    size_t got = fread(v, sizeof(double), count, f);
    fclose(f);
    if (got != count) {
        free(v);
        return NULL;
    }
    return v;
}

/* Checks one reference case; returns the worst error ratio seen. */
static double check_case(di_model *model, di_tokenizer *tok, const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/ref.json", dir);
    json_error_t jerr;
    json_t *ref = json_load_file(path, 0, &jerr);
    CHECK_MSG(ref != NULL, "%s: %s", path, jerr.text);
    if (!ref) return 1e9;
    const char *text = json_string_value(json_object_get(ref, "prompt_text"));
    int32_t *prompt, *greedy;
    int64_t n_prompt = json_ids(json_object_get(ref, "prompt_ids"), &prompt);
    int64_t n_greedy = json_ids(json_object_get(ref, "greedy_ids"), &greedy);
    int64_t vocab = json_integer_value(json_object_get(ref, "vocab_size"));
    json_t *rows = json_object_get(ref, "logits_positions");

    /* Tokenizer: the prompt text gives the reference ids (BOS included). */
    int32_t *ids = malloc((size_t)(n_prompt + 64) * sizeof(int32_t));
    int64_t n_ids = di_tokenizer_encode(tok, text, strlen(text), true, ids, n_prompt + 64);
    CHECK_EQ_INT(n_ids, n_prompt);
    CHECK(n_ids == n_prompt && memcmp(ids, prompt, (size_t)n_prompt * sizeof(int32_t)) == 0);

    /* Prefill logits at the recorded positions. */
    di_context_params cp = di_context_default_params();
    cp.max_tokens = n_prompt + n_greedy;
    di_context *ctx = NULL;
    CHECK(di_context_create(model, &cp, &ctx) == DI_OK);
    float *logits = malloc((size_t)(n_prompt * vocab) * sizeof(float));
    CHECK(di_context_eval(ctx, prompt, n_prompt, logits, n_prompt) == DI_OK);
    size_t n_rows = json_array_size(rows);
    snprintf(path, sizeof path, "%s/ref_logits.f64", dir);
    double *refl = read_f64(path, n_rows * (size_t)vocab);
    CHECK_MSG(refl != NULL, "%s: cannot read", path);
    double worst = 0.0;
    for (size_t r = 0; refl && r < n_rows; r++) {
        int64_t pos = json_integer_value(json_array_get(rows, r));
        const double *want = refl + r * (size_t)vocab;
        const float *got = logits + pos * vocab;
        double max_ref = 0.0, max_err = 0.0;
        for (int64_t v = 0; v < vocab; v++) {
            max_ref = fmax(max_ref, fabs(want[v]));
            max_err = fmax(max_err, fabs((double)got[v] - want[v]));
        }
        worst = fmax(worst, max_err / max_ref);
    }
    CHECK_MSG(worst <= 1e-3, "%s: error ratio %.3g", name, worst);

    /* Greedy continuation, token by token. */
    const float *last = logits + (n_prompt - 1) * vocab;
    int64_t matched = 0;
    float *step = malloc((size_t)vocab * sizeof(float));
    for (int64_t i = 0; i < n_greedy; i++) {
        int32_t best = 0;
        for (int32_t v = 1; v < vocab; v++)
            if (last[v] > last[best]) best = v;
        if (best != greedy[i]) break;
        matched++;
        if (di_context_eval(ctx, &best, 1, step, 1) != DI_OK) break;
        last = step;
    }
    CHECK_MSG(matched == n_greedy, "%s: greedy matched %lld of %lld", name, (long long)matched,
              (long long)n_greedy);
    char out[4096];
    int64_t len = di_tokenizer_decode(tok, greedy, n_greedy, true, out, sizeof out - 1);
    const char *want_text = json_string_value(json_object_get(ref, "greedy_text"));
    CHECK(len >= 0 && want_text && (size_t)len == strlen(want_text) &&
          memcmp(out, want_text, (size_t)len) == 0);
    printf("  %-14s %4lld prompt tokens, max error ratio %.2e, greedy %lld/%lld\n", name,
           (long long)n_prompt, worst, (long long)matched, (long long)n_greedy);
    free(step);
    free(refl);
    free(logits);
    free(ids);
    free(prompt);
    free(greedy);
    di_context_free(ctx);
    json_decref(ref);
    return worst;
}

/* Every reference case with the model on `device`. */
static void check_all(const char *device) {
    di_model *model = NULL;
    di_model_params mp = di_model_default_params();
    mp.device = device;
    di_status st = di_model_load(MODEL_DIR, &mp, &model);
    CHECK_MSG(st == DI_OK, "%s", di_last_error());
    di_tokenizer *tok = NULL;
    CHECK(di_tokenizer_load(MODEL_DIR, &tok) == DI_OK);
    if (!model || !tok) {
        di_tokenizer_free(tok);
        di_model_free(model);
        return;
    }
    DIR *d = opendir(MODEL_DIR "/ref");
    CHECK(d != NULL);
    int n_cases = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/ref/%s", MODEL_DIR, e->d_name);
        check_case(model, tok, dir, e->d_name);
        n_cases++;
    }
    if (d) closedir(d);
    CHECK(n_cases >= 1);
    di_tokenizer_free(tok);
    di_model_free(model);
}

TEST(bundled_model_matches_reference) {
    check_all("cpu");
}

TEST(bundled_model_matches_reference_cuda) {
    di_backend be;
    if (di_backend_cuda_init(&be, 0, 16) != DI_OK) SKIP("%s", di_last_error());
    di_backend_free(&be);
    check_all("cuda");
}

int main(void) {
    RUN(bundled_model_matches_reference);
    RUN(bundled_model_matches_reference_cuda);
    return test_summary();
}
