/*
 * sample_params.c -- di_sampling_params: vLLM's defaults and the checks a request's sampling
 * parameters must pass before the engine accepts it.
 *
 * Design stance: validate once, at the entry point, with a message that names the field and
 * the value, so that the sampler itself can rely on the ranges documented in deepinfer.h.
 * Ranges that depend on the model (token ids < vocab) are checked by the sampler.
 */
#include "core/core.h"

#include <math.h>
#include <stdio.h>

di_sampling_params di_sampling_default_params(void) {
    di_sampling_params p = {0};
    p.temperature = 1.0f;
    p.top_k = -1;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.max_tokens = 16;
    p.n = 1;
    p.logprobs = -1;
    p.prompt_logprobs = -1;
    p.seed = -1;
    return p;
}

/* Formats the failure into err (if given) and the thread's last error. */
static di_status fail(char *err, size_t errlen, const char *fmt, ...) DI_PRINTF(3, 4);
static di_status fail(char *err, size_t errlen, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (err && errlen > 0) snprintf(err, errlen, "%s", msg);
    return di_error(DI_ERR_INVALID_ARG, "sampling params: %s", msg);
}

static bool in_closed(float v, float lo, float hi) {
    return v >= lo && v <= hi; /* false for NaN */
}

/* The float-valued knobs. */
static di_status check_floats(const di_sampling_params *p, char *err, size_t errlen) {
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return fail(err, errlen, "temperature must be finite and >= 0, got %g",
                    (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return fail(err, errlen, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!in_closed(p->min_p, 0.0f, 1.0f))
        return fail(err, errlen, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
        return fail(err, errlen, "repetition_penalty must be finite and > 0, got %g",
                    (double)p->repetition_penalty);
    if (!in_closed(p->presence_penalty, -2.0f, 2.0f))
        return fail(err, errlen, "presence_penalty must be in [-2, 2], got %g",
                    (double)p->presence_penalty);
    if (!in_closed(p->frequency_penalty, -2.0f, 2.0f))
        return fail(err, errlen, "frequency_penalty must be in [-2, 2], got %g",
                    (double)p->frequency_penalty);
    return DI_OK;
}

/* Counts, lengths and the logprob requests. */
static di_status check_counts(const di_sampling_params *p, char *err, size_t errlen) {
    if (p->top_k < -1)
        return fail(err, errlen, "top_k must be -1 (off), 0 (off) or >= 1, got %d", p->top_k);
    if (p->n < 1) return fail(err, errlen, "n must be >= 1, got %d", p->n);
    if (p->max_tokens < 1)
        return fail(err, errlen, "max_tokens must be >= 1, got %lld", (long long)p->max_tokens);
    if (p->min_tokens < 0)
        return fail(err, errlen, "min_tokens must be >= 0, got %lld", (long long)p->min_tokens);
    if (p->min_tokens > p->max_tokens)
        return fail(err, errlen, "min_tokens (%lld) must be <= max_tokens (%lld)",
                    (long long)p->min_tokens, (long long)p->max_tokens);
    if (p->logprobs < -1 || p->logprobs > DI_SAMPLING_MAX_LOGPROBS)
        return fail(err, errlen, "logprobs must be -1 (none) or in [0, %d], got %d",
                    DI_SAMPLING_MAX_LOGPROBS, p->logprobs);
    if (p->prompt_logprobs < -1 || p->prompt_logprobs > DI_SAMPLING_MAX_LOGPROBS)
        return fail(err, errlen, "prompt_logprobs must be -1 (none) or in [0, %d], got %d",
                    DI_SAMPLING_MAX_LOGPROBS, p->prompt_logprobs);
    if (p->seed < -1)
        return fail(err, errlen, "seed must be -1 (none) or >= 0, got %lld", (long long)p->seed);
    return DI_OK;
}

/* The borrowed arrays: logit_bias, stop strings, stop_token_ids. */
static di_status check_arrays(const di_sampling_params *p, char *err, size_t errlen) {
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return fail(err, errlen, "logit_bias: %lld entries but no array",
                    (long long)p->n_logit_bias);
    for (int64_t i = 0; i < p->n_logit_bias; i++) {
        const di_logit_bias *b = &p->logit_bias[i];
        if (b->id < 0)
            return fail(err, errlen, "logit_bias[%lld]: token id %d is negative", (long long)i,
                        b->id);
        if (!isfinite(b->bias))
            return fail(err, errlen, "logit_bias[%lld]: bias of token %d must be finite",
                        (long long)i, b->id);
    }
    if (p->n_stop < 0 || (p->n_stop > 0 && !p->stop))
        return fail(err, errlen, "stop: %lld strings but no array", (long long)p->n_stop);
    for (int64_t i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0])
            return fail(err, errlen, "stop[%lld] is %s", (long long)i,
                        p->stop[i] ? "empty" : "NULL");
    if (p->n_stop_token_ids < 0 || (p->n_stop_token_ids > 0 && !p->stop_token_ids))
        return fail(err, errlen, "stop_token_ids: %lld ids but no array",
                    (long long)p->n_stop_token_ids);
    for (int64_t i = 0; i < p->n_stop_token_ids; i++)
        if (p->stop_token_ids[i] < 0)
            return fail(err, errlen, "stop_token_ids[%lld]: token id %d is negative", (long long)i,
                        p->stop_token_ids[i]);
    return DI_OK;
}

di_status di_sampling_params_validate(const di_sampling_params *p, char *err, size_t errlen) {
    if (err && errlen > 0) err[0] = '\0';
    if (!p) return fail(err, errlen, "params is NULL");
    di_status st = check_floats(p, err, errlen);
    if (st == DI_OK) st = check_counts(p, err, errlen);
    if (st == DI_OK) st = check_arrays(p, err, errlen);
    return st;
}
