/*
 * batch_prompt.c -- prompts of `deepinfer batch` requests to token ids (see batch_prompt.h).
 */
#include "batch_prompt.h"
#include "ids.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool fail(di_batch_error *err, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static bool fail(di_batch_error *err, const char *code, const char *fmt, ...) {
    snprintf(err->code, sizeof err->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return false;
}

static int64_t nonneg(int64_t x) {
    return x > 0 ? x : 0;
}

static const char *last_error(di_status st) {
    const char *m = di_last_error();
    return m && *m ? m : di_status_str(st);
}

void batch_prompts_init(batch_prompts *bp, const char *model_dir, const char *tokenizer_path,
                        int64_t vocab_size, int64_t max_model_len) {
    memset(bp, 0, sizeof *bp);
    bp->model_dir = model_dir;
    bp->tokenizer_path = tokenizer_path;
    bp->vocab_size = vocab_size;
    bp->max_model_len = max_model_len;
    di_status st = di_tokenizer_load(tokenizer_path ? tokenizer_path : model_dir, &bp->tok);
    if (st != DI_OK) {
        bp->tok = NULL;
        snprintf(bp->tok_error, sizeof bp->tok_error, "%s", last_error(st));
    }
}

void batch_prompts_free(batch_prompts *bp) {
    di_tokenizer_free(bp->tok);
    di_chat_template_free(bp->tmpl);
    memset(bp, 0, sizeof *bp);
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The chat template of the tokenizer folder (when --tokenizer is one) or the model folder. */
static di_chat_template *chat_template(batch_prompts *bp) {
    if (!bp->tmpl_tried) {
        bp->tmpl_tried = true;
        const char *dir =
            bp->tokenizer_path && is_dir(bp->tokenizer_path) ? bp->tokenizer_path : bp->model_dir;
        di_status st = di_chat_template_load(dir, &bp->tmpl);
        if (st != DI_OK) {
            bp->tmpl = NULL;
            snprintf(bp->tmpl_error, sizeof bp->tmpl_error, "%s", last_error(st));
        }
    }
    return bp->tmpl;
}

/* Tokenizes text into a new array. */
static bool encode(batch_prompts *bp, const char *text, bool add_special, int32_t **ids, int64_t *n,
                   di_batch_error *err) {
    if (!bp->tok)
        return fail(err, "invalid_prompt", "text prompts need a tokenizer, and none loaded: %s",
                    bp->tok_error);
    cli_ids out;
    di_status st = cli_ids_encode(bp->tok, text, strlen(text), add_special, &out);
    if (st == DI_ERR_OUT_OF_MEMORY) return fail(err, "internal_error", "out of memory");
    if (st != DI_OK)
        return fail(err, "invalid_prompt", "cannot tokenize the prompt: %s",
                    last_error(DI_ERR_INVALID_ARG));
    *ids = out.v;
    *n = out.n;
    return true;
}

/* One prompt's ids: a copy of the given ids, the tokenized text, or the rendered chat. */
static bool prompt_ids(batch_prompts *bp, const di_batch_request *r, int32_t i, int32_t **ids,
                       int64_t *n, di_batch_error *err) {
    if (r->endpoint == DI_BATCH_CHAT) {
        di_chat_template *tmpl = chat_template(bp);
        if (!tmpl)
            return fail(err, "invalid_prompt", "chat requests need a chat template: %s",
                        bp->tmpl_error);
        di_chat_render_params rp = {.messages_json = r->messages_json,
                                    .extra_json = r->template_kwargs_json,
                                    .add_generation_prompt = true};
        char *text = NULL;
        di_status st = di_chat_template_render_ex(tmpl, &rp, &text);
        if (st != DI_OK) return fail(err, "invalid_prompt", "chat template: %s", last_error(st));
        bool ok = encode(bp, text, false, ids, n, err);
        di_free(text);
        return ok;
    }
    const di_batch_prompt *p = &r->prompts[i];
    if (p->text) return encode(bp, p->text, true, ids, n, err);
    *ids = malloc((size_t)p->n_ids * sizeof(int32_t));
    if (!*ids) return fail(err, "internal_error", "out of memory");
    memcpy(*ids, p->ids, (size_t)p->n_ids * sizeof(int32_t));
    *n = p->n_ids;
    return true;
}

/* Ids in the vocabulary, the default max_tokens, prompt + max_tokens within the context. */
static bool check_prompt(const batch_prompts *bp, di_batch_request *r, int32_t i,
                         const int32_t *ids, int64_t n, di_batch_error *err) {
    const char *what = r->n_prompts > 1 ? "prompt " : "prompt";
    char where[24] = "";
    if (r->n_prompts > 1) snprintf(where, sizeof where, "%d", (int)i);
    if (n == 0) return fail(err, "invalid_prompt", "%s%s has no tokens", what, where);
    for (int64_t k = 0; k < n; k++)
        if (ids[k] >= bp->vocab_size)
            return fail(err, "invalid_prompt",
                        "%s%s: token id %d at position %lld is outside the vocabulary (%lld ids)",
                        what, where, (int)ids[k], (long long)k, (long long)bp->vocab_size);
    int64_t max_len = bp->max_model_len;
    if (!r->max_tokens_set)
        r->sampling.max_tokens = r->endpoint == DI_BATCH_CHAT ? max_len - n : 16;
    if (n >= max_len || n + r->sampling.max_tokens > max_len)
        return fail(err, "context_length_exceeded",
                    "This model's maximum context length is %lld tokens. However, you requested "
                    "%lld tokens (%lld in the prompt, %lld for the completion). Please reduce the "
                    "length of the prompt or max_tokens.",
                    (long long)max_len, (long long)(n + nonneg(r->sampling.max_tokens)),
                    (long long)n, (long long)nonneg(r->sampling.max_tokens));
    if (r->sampling.min_tokens > r->sampling.max_tokens)
        return fail(err, "invalid_parameter", "min_tokens (%lld) must be <= max_tokens (%lld)",
                    (long long)r->sampling.min_tokens, (long long)r->sampling.max_tokens);
    return true;
}

bool batch_prompts_resolve(batch_prompts *bp, di_batch_request *r, int32_t **ids, int64_t *n_ids,
                           di_batch_error *err) {
    int32_t np = r->endpoint == DI_BATCH_CHAT ? 1 : r->n_prompts;
    for (int32_t i = 0; i < np; i++) {
        ids[i] = NULL;
        bool ok = prompt_ids(bp, r, i, &ids[i], &n_ids[i], err) &&
                  check_prompt(bp, r, i, ids[i], n_ids[i], err);
        if (!ok) {
            for (int32_t k = 0; k <= i; k++) {
                free(ids[k]);
                ids[k] = NULL;
            }
            return false;
        }
    }
    return true;
}
