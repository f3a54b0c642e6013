/*
 * batch_parse.c -- parses and checks one OpenAI Batch API input line (see batch_parse.h).
 *
 * Field names, types and defaults follow the OpenAI API and vLLM's extra sampling fields;
 * null means "the default" for every optional field, as both servers accept. Everything
 * is checked before anything is kept, so a refused line leaves nothing behind but the
 * error (and the custom_id, to name the line).
 */
#include "batch/batch_parse.h"
#include "constrain/gbnf_text.h"

#include "core/core.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Errors and small helpers                                                                   */
/* ---------------------------------------------------------------------------------------- */

static di_status fail(di_batch_error *err, const char *code, const char *fmt, ...) DI_PRINTF(3, 4);
static di_status fail(di_batch_error *err, const char *code, const char *fmt, ...) {
    snprintf(err->code, sizeof err->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return DI_ERR_INVALID_ARG;
}

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* A copy of a JSON string (which jansson guarantees is UTF-8 without NUL). */
static char *dup_string(const json_t *s) {
    size_t n = json_string_length(s);
    char *c = di_malloc(n + 1);
    if (c) {
        memcpy(c, json_string_value(s), n);
        c[n] = '\0';
    }
    return c;
}

static di_status oom(di_batch_error *err) {
    return fail(err, "internal_error", "out of memory");
}

/* Integer field in [lo, hi]; *set tells whether it was present (not null). */
static di_status get_int(const json_t *body, const char *key, int64_t lo, int64_t hi, int64_t *out,
                         bool *set, di_batch_error *err) {
    const json_t *v = json_object_get(body, key);
    if (set) *set = false;
    if (!v || json_is_null(v)) return DI_OK;
    if (!json_is_integer(v))
        return fail(err, "invalid_parameter", "body.%s must be an integer, got %s", key,
                    type_name(v));
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return fail(err, "invalid_parameter", "body.%s must be in [%lld, %lld], got %lld", key,
                    (long long)lo, (long long)hi, (long long)x);
    *out = (int64_t)x;
    if (set) *set = true;
    return DI_OK;
}

/* Number field (integer or real); range checks are di_sampling_params_validate's. */
static di_status get_float(const json_t *body, const char *key, float *out, di_batch_error *err) {
    const json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return DI_OK;
    if (!json_is_number(v))
        return fail(err, "invalid_parameter", "body.%s must be a number, got %s", key,
                    type_name(v));
    *out = (float)json_number_value(v);
    return DI_OK;
}

static di_status get_bool(const json_t *body, const char *key, bool *out, di_batch_error *err) {
    const json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return DI_OK;
    if (!json_is_boolean(v))
        return fail(err, "invalid_parameter", "body.%s must be a boolean, got %s", key,
                    type_name(v));
    *out = json_is_true(v);
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Known fields                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* Fields both endpoints accept (OpenAI's and vLLM's sampling extras). */
static const char *const k_common_fields[] = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "stream",
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "prompt_logprobs",
    "logprobs",
    "structured_outputs",
    "guided_grammar",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "response_format",
};
static const char *const k_completion_fields[] = {"prompt"};
static const char *const k_chat_fields[] = {"messages", "max_completion_tokens", "top_logprobs",
                                            "chat_template_kwargs"};

static bool in_list(const char *key, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, list[i])) return true;
    return false;
}

static di_status check_fields(const json_t *body, di_batch_endpoint ep, const char *url,
                              di_batch_error *err) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)body, key, v) {
        (void)v;
        if (in_list(key, k_common_fields, DI_ARRAY_LEN(k_common_fields))) continue;
        if (ep == DI_BATCH_COMPLETIONS &&
            in_list(key, k_completion_fields, DI_ARRAY_LEN(k_completion_fields)))
            continue;
        if (ep == DI_BATCH_CHAT && in_list(key, k_chat_fields, DI_ARRAY_LEN(k_chat_fields)))
            continue;
        return fail(err, "unknown_parameter", "body: unknown field \"%s\" for %s", key, url);
    }
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Prompts and messages                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* A JSON array of token ids into p. where names it in messages ("prompt", "prompt[2]"). */
static di_status parse_ids(const json_t *a, const char *where, di_batch_prompt *p,
                           di_batch_error *err) {
    size_t n = json_array_size(a);
    if (n == 0) return fail(err, "invalid_prompt", "body.%s is an empty list of token ids", where);
    p->ids = di_malloc(n * sizeof(int32_t));
    if (!p->ids) return oom(err);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return fail(err, "invalid_prompt",
                        "body.%s[%zu] is not a token id (expected an integer >= 0)", where, i);
        p->ids[i] = (int32_t)json_integer_value(v);
    }
    p->n_ids = (int64_t)n;
    return DI_OK;
}

/* One prompt: a string, or a list of token ids. */
static di_status parse_one_prompt(const json_t *v, const char *where, di_batch_prompt *p,
                                  di_batch_error *err) {
    if (json_is_string(v)) {
        p->text = dup_string(v);
        return p->text ? DI_OK : oom(err);
    }
    if (json_is_array(v)) return parse_ids(v, where, p, err);
    return fail(err, "invalid_parameter", "body.%s must be a string or a list of token ids, got %s",
                where, type_name(v));
}

/* "prompt": a string, a list of ids, a list of strings, or a list of lists of ids. */
static di_status parse_prompts(const json_t *body, di_batch_request *r, di_batch_error *err) {
    const json_t *v = json_object_get(body, "prompt");
    if (!v || json_is_null(v))
        return fail(err, "missing_required_parameter", "body.prompt is missing");
    bool many = json_is_array(v) && json_array_size(v) > 0 &&
                (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0)));
    size_t n = many ? json_array_size(v) : 1;
    if (n > DI_BATCH_MAX_PROMPTS)
        return fail(err, "invalid_parameter", "body.prompt has %zu prompts; at most %d", n,
                    DI_BATCH_MAX_PROMPTS);
    r->prompts = di_calloc(n, sizeof *r->prompts);
    if (!r->prompts) return oom(err);
    r->n_prompts = (int32_t)n;
    if (!many) return parse_one_prompt(v, "prompt", &r->prompts[0], err);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        char where[32];
        snprintf(where, sizeof where, "prompt[%zu]", i);
        if (!json_is_string(e) && !json_is_array(e))
            return fail(err, "invalid_parameter",
                        "body.%s must be a string or a list of token ids, got %s", where,
                        type_name(e));
        di_status st = parse_one_prompt(e, where, &r->prompts[i], err);
        if (st != DI_OK) return st;
    }
    return DI_OK;
}

/* Content parts [{"type": "text", "text": ...}] joined with "\n", as vLLM does. */
static json_t *flatten_parts(const json_t *parts, size_t im, di_batch_error *err) {
    size_t total = 0;
    for (size_t i = 0; i < json_array_size(parts); i++) {
        const json_t *p = json_array_get(parts, i);
        const json_t *type = json_object_get(p, "type");
        const json_t *text = json_object_get(p, "text");
        if (!json_is_object(p) || !json_is_string(type) ||
            strcmp(json_string_value(type), "text") || !json_is_string(text)) {
            fail(err, "invalid_parameter",
                 "body.messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": ...} "
                 "parts are supported",
                 im, i);
            return NULL;
        }
        total += json_string_length(text) + 1;
    }
    char *buf = di_malloc(total + 1);
    if (!buf) return NULL;
    size_t at = 0;
    for (size_t i = 0; i < json_array_size(parts); i++) {
        const json_t *text = json_object_get(json_array_get(parts, i), "text");
        if (i) buf[at++] = '\n';
        memcpy(buf + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    json_t *s = json_stringn(buf, at);
    di_free(buf);
    if (!s) oom(err);
    return s;
}

/* "messages": a non-empty list of {"role": string, "content": string | parts | null, ...};
 * kept as JSON for the chat template. */
static di_status parse_messages(const json_t *body, di_batch_request *r, di_batch_error *err) {
    const json_t *v = json_object_get(body, "messages");
    if (!v || json_is_null(v))
        return fail(err, "missing_required_parameter", "body.messages is missing");
    if (!json_is_array(v) || json_array_size(v) == 0)
        return fail(err, "invalid_parameter", "body.messages must be a non-empty list");
    json_t *copy = json_deep_copy(v);
    if (!copy) return oom(err);
    di_status st = DI_OK;
    for (size_t i = 0; i < json_array_size(copy) && st == DI_OK; i++) {
        json_t *m = json_array_get(copy, i);
        if (!json_is_object(m)) {
            st = fail(err, "invalid_parameter", "body.messages[%zu] must be an object, got %s", i,
                      type_name(m));
        } else if (!json_is_string(json_object_get(m, "role"))) {
            st = fail(err, "invalid_parameter", "body.messages[%zu].role must be a string", i);
        } else {
            json_t *c = json_object_get(m, "content");
            if (json_is_array(c)) {
                json_t *flat = flatten_parts(c, i, err);
                if (!flat)
                    st = DI_ERR_INVALID_ARG;
                else
                    json_object_set_new(m, "content", flat);
            } else if (c && !json_is_string(c) && !json_is_null(c)) {
                st = fail(err, "invalid_parameter",
                          "body.messages[%zu].content must be a string, a list of text parts "
                          "or null, got %s",
                          i, type_name(c));
            }
        }
    }
    if (st == DI_OK) {
        char *text = json_dumps(copy, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (text) r->messages_json = di_strdup(text);
        free(text);
        if (!r->messages_json) st = oom(err);
    }
    json_decref(copy);
    if (st != DI_OK) return st;
    const json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return fail(err, "invalid_parameter",
                        "body.chat_template_kwargs must be an object, got %s", type_name(kw));
        char *text = json_dumps(kw, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (text) r->template_kwargs_json = di_strdup(text);
        free(text);
        if (!r->template_kwargs_json) return oom(err);
    }
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Sampling fields                                                                            */
/* ---------------------------------------------------------------------------------------- */

static di_status parse_stop(const json_t *body, di_batch_request *r, di_batch_error *err) {
    const json_t *v = json_object_get(body, "stop");
    if (!v || json_is_null(v)) return DI_OK;
    bool one = json_is_string(v);
    if (!one && !json_is_array(v))
        return fail(err, "invalid_parameter",
                    "body.stop must be a string or a list of strings, got %s", type_name(v));
    size_t n = one ? 1 : json_array_size(v);
    if (n > DI_BATCH_MAX_STOP)
        return fail(err, "invalid_parameter", "body.stop has %zu strings; at most %d", n,
                    DI_BATCH_MAX_STOP);
    if (n == 0) return DI_OK;
    r->stop = di_calloc(n, sizeof(char *));
    if (!r->stop) return oom(err);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = one ? v : json_array_get(v, i);
        if (!json_is_string(s) || json_string_length(s) == 0)
            return fail(err, "invalid_parameter", "body.stop[%zu] must be a non-empty string", i);
        if (!(r->stop[i] = dup_string(s))) return oom(err);
        r->sampling.n_stop = (int64_t)i + 1;
    }
    r->sampling.stop = (const char *const *)r->stop;
    return DI_OK;
}

static di_status parse_stop_ids(const json_t *body, di_batch_request *r, di_batch_error *err) {
    const json_t *v = json_object_get(body, "stop_token_ids");
    if (!v || json_is_null(v)) return DI_OK;
    if (!json_is_array(v))
        return fail(err, "invalid_parameter", "body.stop_token_ids must be a list, got %s",
                    type_name(v));
    size_t n = json_array_size(v);
    if (n > DI_BATCH_MAX_LIST)
        return fail(err, "invalid_parameter", "body.stop_token_ids has %zu ids; at most %d", n,
                    DI_BATCH_MAX_LIST);
    if (n == 0) return DI_OK;
    if (!(r->stop_token_ids = di_malloc(n * sizeof(int32_t)))) return oom(err);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return fail(err, "invalid_parameter",
                        "body.stop_token_ids[%zu] is not a token id (expected an integer >= 0)", i);
        r->stop_token_ids[i] = (int32_t)json_integer_value(e);
    }
    r->sampling.stop_token_ids = r->stop_token_ids;
    r->sampling.n_stop_token_ids = (int64_t)n;
    return DI_OK;
}

/* A choice list as GBNF: root ::= "a" | "b" | ... (each string a GBNF literal). */
static char *choice_gbnf(const json_t *list) {
    gt_buf g = {0};
    gt_puts(&g, "root ::= ");
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *c = json_array_get(list, i);
        gt_puts(&g, i ? " | \"" : "\"");
        gt_literal(&g, json_string_value(c), json_string_length(c));
        gt_puts(&g, "\"");
    }
    gt_puts(&g, "\n");
    if (g.oom) gt_free(&g);
    return g.s;
}

/* One constraint kind's value: kind is "grammar", "json", "regex" or "choice"; where names
 * the field for errors. */
static di_status set_constraint(di_batch_request *r, const char *kind, const json_t *v,
                                const char *where, di_batch_error *err) {
    if (r->grammar || r->json_schema || r->regex)
        return fail(err, "invalid_parameter",
                    "body.%s: only one structured output constraint "
                    "may be given",
                    where);
    if (!strcmp(kind, "json")) {
        if (!json_is_object(v) && !json_is_string(v) && !json_is_boolean(v))
            return fail(err, "invalid_parameter",
                        "body.%s must be a JSON Schema (an object or "
                        "its text), got %s",
                        where, type_name(v));
        r->json_schema = json_is_string(v) ? di_strdup(json_string_value(v)) : NULL;
        if (!json_is_string(v)) {
            char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
            r->json_schema = t ? di_strdup(t) : NULL;
            free(t);
        }
        if (!r->json_schema) return oom(err);
        r->sampling.json_schema = r->json_schema;
        return DI_OK;
    }
    if (!strcmp(kind, "choice")) {
        bool ok = json_is_array(v) && json_array_size(v) > 0;
        for (size_t i = 0; ok && i < json_array_size(v); i++)
            ok = json_is_string(json_array_get(v, i));
        if (!ok)
            return fail(err, "invalid_parameter", "body.%s must be a non-empty list of strings",
                        where);
        if (!(r->grammar = choice_gbnf(v))) return oom(err);
        r->sampling.grammar = r->grammar;
        return DI_OK;
    }
    if (!json_is_string(v))
        return fail(err, "invalid_parameter", "body.%s must be a string, got %s", where,
                    type_name(v));
    char *t = di_strdup(json_string_value(v));
    if (!t) return oom(err);
    if (!strcmp(kind, "regex"))
        r->regex = t, r->sampling.regex = t;
    else
        r->grammar = t, r->sampling.grammar = t;
    return DI_OK;
}

/* Constrained generation, as vLLM's OpenAI server and OpenAI take it (batch_parse.h). Other
 * structured-output kinds (structural_tag, ...) are refused by name. */
static di_status parse_constraints(const json_t *body, di_batch_request *r, di_batch_error *err) {
    static const char *kinds[] = {"grammar", "json", "regex", "choice"};
    di_status st = DI_OK;
    const json_t *so = json_object_get(body, "structured_outputs");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return fail(err, "invalid_parameter",
                        "body.structured_outputs must be an object, got %s", type_name(so));
        const char *key;
        const json_t *val;
        json_object_foreach((json_t *)so, key, val) {
            if (json_is_null(val)) continue;
            size_t k = 0;
            while (k < 4 && strcmp(key, kinds[k]) != 0)
                k++;
            if (k == 4)
                return fail(err, "invalid_parameter",
                            "body.structured_outputs.%.40s is not supported (grammar, json, "
                            "regex or choice)",
                            key);
            char where[64];
            snprintf(where, sizeof where, "structured_outputs.%s", key);
            if ((st = set_constraint(r, kinds[k], val, where, err))) return st;
        }
    }
    for (size_t k = 0; k < 4; k++) { /* vLLM's older guided_* fields */
        char field[32];
        snprintf(field, sizeof field, "guided_%s", kinds[k]);
        const json_t *v = json_object_get(body, field);
        if (v && !json_is_null(v) && (st = set_constraint(r, kinds[k], v, field, err))) return st;
    }
    const json_t *rf = json_object_get(body, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        if (!json_is_object(rf) || !type)
            return fail(err, "invalid_parameter",
                        "body.response_format must be an object with a \"type\"");
        if (!strcmp(type, "json_object")) {
            json_t *any = json_pack("{s:s}", "type", "object");
            st = any ? set_constraint(r, "json", any, "response_format", err) : oom(err);
            json_decref(any);
        } else if (!strcmp(type, "json_schema")) {
            const json_t *schema = json_object_get(json_object_get(rf, "json_schema"), "schema");
            if (!schema)
                return fail(err, "invalid_parameter",
                            "body.response_format.json_schema.schema is missing");
            st = set_constraint(r, "json", schema, "response_format.json_schema.schema", err);
        } else if (strcmp(type, "text") != 0) {
            return fail(err, "invalid_parameter",
                        "body.response_format.type \"%.40s\" is not supported (text, "
                        "json_object, json_schema)",
                        type);
        }
    }
    return st;
}

/* "logit_bias": {"<token id>": bias in [-100, 100], ...} as OpenAI defines it. */
static di_status parse_logit_bias(const json_t *body, di_batch_request *r, di_batch_error *err) {
    const json_t *v = json_object_get(body, "logit_bias");
    if (!v || json_is_null(v)) return DI_OK;
    if (!json_is_object(v))
        return fail(err, "invalid_parameter", "body.logit_bias must be an object, got %s",
                    type_name(v));
    size_t n = json_object_size(v);
    if (n > DI_BATCH_MAX_LIST)
        return fail(err, "invalid_parameter", "body.logit_bias has %zu entries; at most %d", n,
                    DI_BATCH_MAX_LIST);
    if (n == 0) return DI_OK;
    if (!(r->logit_bias = di_malloc(n * sizeof(di_logit_bias)))) return oom(err);
    const char *key;
    const json_t *b;
    size_t i = 0;
    json_object_foreach((json_t *)v, key, b) {
        char *end = NULL;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || key[0] == '-' || key[0] == '+' || key[0] == ' ' || id < 0 ||
            id > INT32_MAX)
            return fail(err, "invalid_parameter",
                        "body.logit_bias: key \"%.40s\" is not a token id", key);
        if (!json_is_number(b) || json_number_value(b) < -100 || json_number_value(b) > 100)
            return fail(err, "invalid_parameter",
                        "body.logit_bias[\"%s\"] must be a number in [-100, 100]", key);
        r->logit_bias[i].id = (int32_t)id;
        r->logit_bias[i].bias = (float)json_number_value(b);
        i++;
    }
    r->sampling.logit_bias = r->logit_bias;
    r->sampling.n_logit_bias = (int64_t)n;
    return DI_OK;
}

/* logprobs: completions "logprobs": N; chat "logprobs": bool + "top_logprobs": N. */
static di_status parse_logprobs(const json_t *body, di_batch_request *r, di_batch_error *err) {
    int64_t x = -1;
    bool set = false;
    di_status st;
    if (r->endpoint == DI_BATCH_COMPLETIONS) {
        st = get_int(body, "logprobs", 0, DI_SAMPLING_MAX_LOGPROBS, &x, &set, err);
        if (st == DI_OK && set) r->sampling.logprobs = (int32_t)x;
        return st;
    }
    st = get_bool(body, "logprobs", &r->chat_logprobs, err);
    if (st == DI_OK) st = get_int(body, "top_logprobs", 0, DI_SAMPLING_MAX_LOGPROBS, &x, &set, err);
    if (st != DI_OK) return st;
    if (set && !r->chat_logprobs)
        return fail(err, "invalid_parameter", "body.top_logprobs needs body.logprobs = true");
    if (r->chat_logprobs) r->sampling.logprobs = set ? (int32_t)x : 0;
    return DI_OK;
}

static di_status parse_sampling(const json_t *body, di_batch_request *r, di_batch_error *err) {
    di_sampling_params *p = &r->sampling;
    int64_t x;
    bool set;
    di_status st = DI_OK;
    /* max_tokens; for chat, max_completion_tokens is the newer name and wins. */
    x = 0;
    if ((st = get_int(body, "max_tokens", INT64_MIN, INT64_MAX, &x, &set, err))) return st;
    if (set) p->max_tokens = x, r->max_tokens_set = true;
    if (r->endpoint == DI_BATCH_CHAT) {
        if ((st = get_int(body, "max_completion_tokens", INT64_MIN, INT64_MAX, &x, &set, err)))
            return st;
        if (set) p->max_tokens = x, r->max_tokens_set = true;
    }
    if (r->max_tokens_set && p->max_tokens < 1)
        return fail(err, "invalid_parameter", "body.max_tokens must be >= 1, got %lld",
                    (long long)p->max_tokens);
    if ((st = get_float(body, "temperature", &p->temperature, err)) ||
        (st = get_float(body, "top_p", &p->top_p, err)) ||
        (st = get_float(body, "min_p", &p->min_p, err)) ||
        (st = get_float(body, "repetition_penalty", &p->repetition_penalty, err)) ||
        (st = get_float(body, "presence_penalty", &p->presence_penalty, err)) ||
        (st = get_float(body, "frequency_penalty", &p->frequency_penalty, err)))
        return st;
    x = p->top_k;
    if ((st = get_int(body, "top_k", INT32_MIN, INT32_MAX, &x, NULL, err))) return st;
    p->top_k = (int32_t)x;
    x = p->n;
    if ((st = get_int(body, "n", 1, 128, &x, NULL, err))) return st;
    p->n = (int32_t)x;
    if ((st = get_int(body, "seed", 0, INT64_MAX, &p->seed, NULL, err))) return st;
    if ((st = get_int(body, "min_tokens", 0, INT64_MAX, &p->min_tokens, NULL, err))) return st;
    x = p->prompt_logprobs;
    if ((st = get_int(body, "prompt_logprobs", 0, DI_SAMPLING_MAX_LOGPROBS, &x, NULL, err)))
        return st;
    p->prompt_logprobs = (int32_t)x;
    if ((st = get_bool(body, "ignore_eos", &p->ignore_eos, err))) return st;
    bool stream = false;
    if ((st = get_bool(body, "stream", &stream, err))) return st;
    if (stream)
        return fail(err, "invalid_parameter", "body.stream = true is not supported in a batch");
    const json_t *user = json_object_get(body, "user");
    if (user && !json_is_null(user) && !json_is_string(user))
        return fail(err, "invalid_parameter", "body.user must be a string");
    if ((st = parse_logprobs(body, r, err)) || (st = parse_stop(body, r, err)) ||
        (st = parse_stop_ids(body, r, err)) || (st = parse_logit_bias(body, r, err)) ||
        (st = parse_constraints(body, r, err)))
        return st;
    /* The defaults of max_tokens are resolved by the caller; validate with a stand-in. */
    di_sampling_params check = *p;
    if (!r->max_tokens_set) {
        check.max_tokens = check.min_tokens > 0 ? check.min_tokens : 1;
    }
    char msg[256];
    if (di_sampling_params_validate(&check, msg, sizeof msg) != DI_OK)
        return fail(err, "invalid_parameter", "body: %s", msg);
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* The line                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Parses the JSON of a line; NULL with *err filled when it is not a JSON object. */
static json_t *load_line(const char *line, size_t len, di_batch_error *err) {
    if (len > 0 && line[len - 1] == '\r') len--;
    json_error_t jerr;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_invalid_utf8)
            fail(err, "invalid_utf8", "the line is not valid UTF-8 (byte %d)", jerr.position);
        else
            fail(err, "invalid_json_line", "not valid JSON: %s at column %d", jerr.text,
                 jerr.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        fail(err, "invalid_json_line", "a line must be a JSON object, got %s", type_name(root));
        json_decref(root);
        return NULL;
    }
    return root;
}

static di_status parse_envelope(const json_t *root, di_batch_request *r, const json_t **body,
                                di_batch_error *err) {
    const json_t *method = json_object_get(root, "method");
    const json_t *url = json_object_get(root, "url");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        (void)v;
        if (strcmp(key, "custom_id") && strcmp(key, "method") && strcmp(key, "url") &&
            strcmp(key, "body"))
            return fail(err, "unknown_parameter", "unknown field \"%s\" in the request line", key);
    }
    if (!r->custom_id)
        return fail(err, "missing_required_parameter", "%s",
                    json_object_get(root, "custom_id") ? "custom_id must be a non-empty string"
                                                       : "custom_id is missing");
    if (!method) return fail(err, "missing_required_parameter", "method is missing");
    if (!json_is_string(method) || strcmp(json_string_value(method), "POST"))
        return fail(err, "invalid_method", "method must be \"POST\"");
    if (!url) return fail(err, "missing_required_parameter", "url is missing");
    if (json_is_string(url) && !strcmp(json_string_value(url), "/v1/completions"))
        r->endpoint = DI_BATCH_COMPLETIONS;
    else if (json_is_string(url) && !strcmp(json_string_value(url), "/v1/chat/completions"))
        r->endpoint = DI_BATCH_CHAT;
    else
        return fail(err, "invalid_url",
                    "url must be \"/v1/completions\" or \"/v1/chat/completions\"");
    *body = json_object_get(root, "body");
    if (!*body || json_is_null(*body))
        return fail(err, "missing_required_parameter", "body is missing");
    if (!json_is_object(*body))
        return fail(err, "invalid_parameter", "body must be an object, got %s", type_name(*body));
    return check_fields(*body, r->endpoint, json_string_value(url), err);
}

static char *custom_id_of(const json_t *root) {
    const json_t *id = json_object_get(root, "custom_id");
    return json_is_string(id) && json_string_length(id) > 0 ? dup_string(id) : NULL;
}

di_status di_batch_parse_line(const char *line, size_t len, di_batch_request *out,
                              di_batch_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->sampling = di_sampling_default_params();
    json_t *root = load_line(line, len, err);
    if (!root) return DI_ERR_INVALID_ARG;
    out->custom_id = custom_id_of(root);
    const json_t *body = NULL;
    di_status st = parse_envelope(root, out, &body, err);
    if (st == DI_OK) {
        const json_t *model = json_object_get(body, "model");
        if (model && !json_is_null(model) && !json_is_string(model))
            st = fail(err, "invalid_parameter", "body.model must be a string");
        else if (json_is_string(model) && !(out->model = dup_string(model)))
            st = oom(err);
    }
    if (st == DI_OK)
        st = out->endpoint == DI_BATCH_COMPLETIONS ? parse_prompts(body, out, err)
                                                   : parse_messages(body, out, err);
    if (st == DI_OK) st = parse_sampling(body, out, err);
    json_decref(root);
    return st;
}

char *di_batch_line_custom_id(const char *line, size_t len) {
    if (len > 0 && line[len - 1] == '\r') len--;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
    char *id = json_is_object(root) ? custom_id_of(root) : NULL;
    json_decref(root);
    return id;
}

void di_batch_request_free(di_batch_request *r) {
    if (!r) return;
    for (int32_t i = 0; i < r->n_prompts; i++) {
        di_free(r->prompts[i].text);
        di_free(r->prompts[i].ids);
    }
    di_free(r->prompts);
    if (r->stop)
        for (int64_t i = 0; i < r->sampling.n_stop; i++)
            di_free(r->stop[i]);
    di_free(r->stop);
    di_free(r->stop_token_ids);
    di_free(r->logit_bias);
    di_free(r->grammar);
    di_free(r->json_schema);
    di_free(r->regex);
    di_free(r->custom_id);
    di_free(r->model);
    di_free(r->messages_json);
    di_free(r->template_kwargs_json);
    memset(r, 0, sizeof *r);
}
