/*
 * batch_result.c -- collecting engine outputs per input line and writing the result line
 * (see batch_result.h).
 *
 * Logprobs follow vLLM's OpenAI server: completions {"tokens", "token_logprobs",
 * "top_logprobs", "text_offset"}, chat {"content": [{"token", "logprob", "bytes",
 * "top_logprobs"}]}; -inf becomes -9999.0 (JSON has no infinity), as vLLM writes it.
 */
#include "batch_result.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Collecting outputs                                                                         */
/* ---------------------------------------------------------------------------------------- */

bool batch_entry_init(batch_entry *e, int32_t n_prompts, int32_t n) {
    e->n_prompts = n_prompts;
    e->n = n;
    size_t nc = (size_t)n_prompts * (size_t)n;
    e->choices = calloc(nc, sizeof *e->choices);
    e->prompt_tokens = calloc((size_t)n_prompts, sizeof(int64_t));
    e->cached_tokens = calloc((size_t)n_prompts, sizeof(int64_t));
    e->prompt_lps = calloc((size_t)n_prompts, sizeof(batch_lp *));
    e->n_prompt_lps = calloc((size_t)n_prompts, sizeof(int64_t));
    e->n_open = (int32_t)nc;
    return e->choices && e->prompt_tokens && e->cached_tokens && e->prompt_lps && e->n_prompt_lps;
}

void batch_entry_free(batch_entry *e) {
    if (e->choices)
        for (int64_t i = 0; i < (int64_t)e->n_prompts * e->n; i++) {
            free(e->choices[i].ids);
            free(e->choices[i].text);
            free(e->choices[i].lps);
        }
    if (e->prompt_lps)
        for (int32_t i = 0; i < e->n_prompts; i++)
            free(e->prompt_lps[i]);
    free(e->choices);
    free(e->prompt_tokens);
    free(e->cached_tokens);
    free(e->prompt_lps);
    free(e->n_prompt_lps);
    di_batch_request_free(&e->req);
    memset(e, 0, sizeof *e);
}

/* Grows *p (elements of size sz) to hold need; false on OOM. */
static bool reserve(void **p, int64_t *cap, int64_t need, size_t sz) {
    if (need <= *cap) return true;
    int64_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * sz);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static void copy_lp(batch_lp *d, const di_engine_logprobs *s) {
    d->token = s->token;
    d->logprob = s->logprob;
    d->n_top = s->n_top < DI_SAMPLING_MAX_LOGPROBS ? s->n_top : DI_SAMPLING_MAX_LOGPROBS;
    for (int32_t k = 0; k < d->n_top; k++) {
        d->top_ids[k] = s->top_ids[k];
        d->top_logprobs[k] = s->top_logprobs[k];
    }
}

bool batch_entry_add_output(batch_entry *e, int32_t prompt, const di_engine_output *o) {
    if (prompt < 0 || prompt >= e->n_prompts || o->sample_index < 0 || o->sample_index >= e->n)
        return true; /* not ours: ignore */
    batch_choice *c = &e->choices[(int64_t)prompt * e->n + o->sample_index];
    if (c->finished) return true;
    if (o->n_tokens > 0) {
        if (!reserve((void **)&c->ids, &c->cap_ids, c->n_ids + o->n_tokens, sizeof(int32_t)))
            return false;
        memcpy(c->ids + c->n_ids, o->tokens, (size_t)o->n_tokens * sizeof(int32_t));
        c->n_ids += o->n_tokens;
    }
    if (o->logprobs && o->n_tokens > 0) {
        if (!reserve((void **)&c->lps, &c->cap_lps, c->n_lps + o->n_tokens, sizeof(batch_lp)))
            return false;
        for (int64_t i = 0; i < o->n_tokens; i++)
            copy_lp(&c->lps[c->n_lps++], &o->logprobs[i]);
    }
    if (o->text) {
        int64_t cap = (int64_t)c->text_cap;
        if (!reserve((void **)&c->text, &cap, (int64_t)c->text_len + o->text_len + 1, 1))
            return false;
        c->text_cap = (size_t)cap;
        memcpy(c->text + c->text_len, o->text, (size_t)o->text_len);
        c->text_len += (size_t)o->text_len;
        c->text[c->text_len] = '\0';
    }
    if (o->prompt_logprobs && o->n_prompt_logprobs > 0 && !e->prompt_lps[prompt]) {
        e->prompt_lps[prompt] = malloc((size_t)o->n_prompt_logprobs * sizeof(batch_lp));
        if (!e->prompt_lps[prompt]) return false;
        for (int64_t i = 0; i < o->n_prompt_logprobs; i++)
            copy_lp(&e->prompt_lps[prompt][i], &o->prompt_logprobs[i]);
        e->n_prompt_lps[prompt] = o->n_prompt_logprobs;
    }
    e->prompt_tokens[prompt] = o->usage.prompt_tokens;
    if (o->sample_index == 0) e->cached_tokens[prompt] = o->usage.cached_tokens;
    if (o->finished) {
        c->finished = true;
        c->finish = o->finish_reason;
        e->n_open--;
        if (o->finish_reason == DI_ENGINE_FINISH_ERROR && !e->failed) {
            e->failed = true;
            snprintf(e->error.code, sizeof e->error.code, "engine_error");
            snprintf(e->error.message, sizeof e->error.message, "%s",
                     o->error && *o->error ? o->error : "the engine could not run the request");
        }
    }
    return true;
}

/* ---------------------------------------------------------------------------------------- */
/* Ids                                                                                        */
/* ---------------------------------------------------------------------------------------- */

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* "<prefix><16 hex of the custom_id's hash>", or "<prefix>line<N>" when line-keyed. */
static void make_id(char *buf, size_t size, const char *prefix, int64_t line, const char *custom_id,
                    bool line_keyed) {
    if (line_keyed || !custom_id)
        snprintf(buf, size, "%sline%lld", prefix, (long long)line);
    else
        snprintf(buf, size, "%s%016llx", prefix, (unsigned long long)fnv1a(custom_id));
}

/* ---------------------------------------------------------------------------------------- */
/* Logprobs                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static double finite_lp(float lp) {
    return isfinite(lp) ? (double)lp : -9999.0;
}

/* The text of one token (special tokens included, as vLLM reports them). */
static json_t *token_str(const batch_result_ctx *ctx, int32_t id) {
    char buf[256];
    if (ctx->tok) {
        int64_t n = di_tokenizer_decode(ctx->tok, &id, 1, false, buf, sizeof buf);
        if (n >= 0) return json_stringn(buf, (size_t)n);
    }
    snprintf(buf, sizeof buf, "token_id:%d", (int)id);
    return json_string(buf);
}

static json_t *completion_logprobs(const batch_choice *c, const batch_result_ctx *ctx) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    int64_t off = 0;
    for (int64_t i = 0; i < c->n_lps; i++) {
        const batch_lp *l = &c->lps[i];
        json_t *s = token_str(ctx, l->token);
        json_array_append_new(offs, json_integer(off));
        off += (int64_t)json_string_length(s);
        json_array_append_new(tokens, s);
        json_array_append_new(lps, json_real(finite_lp(l->logprob)));
        json_t *top = json_object();
        for (int32_t k = 0; k < l->n_top; k++) {
            json_t *ts = token_str(ctx, l->top_ids[k]);
            json_object_set_new(top, json_string_value(ts),
                                json_real(finite_lp(l->top_logprobs[k])));
            json_decref(ts);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

static json_t *utf8_bytes(const json_t *s) {
    json_t *a = json_array();
    const unsigned char *p = (const unsigned char *)json_string_value(s);
    for (size_t i = 0; i < json_string_length(s); i++)
        json_array_append_new(a, json_integer(p[i]));
    return a;
}

static json_t *chat_lp_item(const batch_result_ctx *ctx, int32_t id, float lp) {
    json_t *s = token_str(ctx, id);
    json_t *bytes = utf8_bytes(s);
    return json_pack("{s:o, s:f, s:o}", "token", s, "logprob", finite_lp(lp), "bytes", bytes);
}

static json_t *chat_logprobs(const batch_choice *c, const batch_result_ctx *ctx) {
    json_t *content = json_array();
    for (int64_t i = 0; i < c->n_lps; i++) {
        const batch_lp *l = &c->lps[i];
        json_t *item = chat_lp_item(ctx, l->token, l->logprob);
        json_t *top = json_array();
        for (int32_t k = 0; k < l->n_top; k++)
            json_array_append_new(top, chat_lp_item(ctx, l->top_ids[k], l->top_logprobs[k]));
        json_object_set_new(item, "top_logprobs", top);
        json_array_append_new(content, item);
    }
    return json_pack("{s:o}", "content", content);
}

/* vLLM's prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...]
 * (rank only for the top entries, 1-based). */
static json_t *prompt_logprobs(const batch_lp *lps, int64_t n, const batch_result_ctx *ctx) {
    json_t *a = json_array();
    json_array_append_new(a, json_null());
    for (int64_t i = 0; i < n; i++) {
        json_t *pos = json_object();
        char key[16];
        snprintf(key, sizeof key, "%d", (int)lps[i].token);
        json_object_set_new(pos, key,
                            json_pack("{s:f, s:o}", "logprob", finite_lp(lps[i].logprob),
                                      "decoded_token", token_str(ctx, lps[i].token)));
        for (int32_t k = 0; k < lps[i].n_top; k++) {
            snprintf(key, sizeof key, "%d", (int)lps[i].top_ids[k]);
            json_t *item =
                json_pack("{s:f, s:I, s:o}", "logprob", finite_lp(lps[i].top_logprobs[k]), "rank",
                          (json_int_t)(k + 1), "decoded_token", token_str(ctx, lps[i].top_ids[k]));
            json_object_set_new(pos, key, item); /* the given token's entry gains its rank */
        }
        json_array_append_new(a, pos);
    }
    return a;
}

/* ---------------------------------------------------------------------------------------- */
/* Lines                                                                                      */
/* ---------------------------------------------------------------------------------------- */

static const char *finish_str(di_engine_finish f) {
    return f == DI_ENGINE_FINISH_LENGTH ? "length" : f == DI_ENGINE_FINISH_ABORT ? "abort" : "stop";
}

/* The choice's text: the engine's (stop strings applied), else the ids decoded here (special
 * tokens skipped, as the engine's detokenizer does; an engine without a tokenizer has no
 * stop strings to apply), else "". */
static json_t *choice_text(const batch_choice *c, const batch_result_ctx *ctx) {
    if (c->text || !ctx->tok || c->n_ids == 0)
        return json_stringn(c->text ? c->text : "", c->text_len);
    int64_t need = di_tokenizer_decode(ctx->tok, c->ids, c->n_ids, true, NULL, 0);
    if (need == DI_TOK_ERROR) return json_string("");
    int64_t cap = need < 0 ? -need : need;
    char *buf = malloc((size_t)cap + 1);
    int64_t got = buf ? di_tokenizer_decode(ctx->tok, c->ids, c->n_ids, true, buf, cap) : -1;
    json_t *s = json_stringn(buf ? buf : "", got > 0 ? (size_t)got : 0);
    free(buf);
    return s;
}

static json_t *choice_json(const batch_entry *e, int32_t prompt, int32_t sample,
                           const batch_result_ctx *ctx) {
    int32_t index = prompt * e->n + sample;
    const batch_choice *c = &e->choices[index];
    bool chat = e->req.endpoint == DI_BATCH_CHAT;
    json_t *ids = json_array();
    for (int64_t i = 0; i < c->n_ids; i++)
        json_array_append_new(ids, json_integer(c->ids[i]));
    json_t *text = choice_text(c, ctx);
    json_t *lp = json_null();
    if (e->req.sampling.logprobs >= 0) {
        json_decref(lp);
        lp = chat ? chat_logprobs(c, ctx) : completion_logprobs(c, ctx);
    }
    json_t *ch;
    if (chat) {
        json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content", text);
        ch = json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", index, "message", msg, "logprobs", lp,
                       "finish_reason", finish_str(c->finish), "token_ids", ids);
    } else {
        ch = json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", index, "text", text, "logprobs", lp,
                       "finish_reason", finish_str(c->finish), "token_ids", ids);
        if (ch && e->req.sampling.prompt_logprobs >= 0 && sample == 0)
            json_object_set_new(
                ch, "prompt_logprobs",
                prompt_logprobs(e->prompt_lps[prompt], e->n_prompt_lps[prompt], ctx));
    }
    return ch;
}

static json_t *body_json(const batch_entry *e, const batch_result_ctx *ctx) {
    bool chat = e->req.endpoint == DI_BATCH_CHAT;
    json_t *choices = json_array();
    int64_t n_prompt = 0, n_cached = 0, n_completion = 0;
    for (int32_t p = 0; p < e->n_prompts; p++) {
        n_prompt += e->prompt_tokens[p];
        n_cached += e->cached_tokens[p];
        for (int32_t s = 0; s < e->n; s++) {
            json_array_append_new(choices, choice_json(e, p, s, ctx));
            n_completion += e->choices[(int64_t)p * e->n + s].n_ids;
        }
    }
    json_t *usage = json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)n_prompt,
                              "completion_tokens", (json_int_t)n_completion, "total_tokens",
                              (json_int_t)(n_prompt + n_completion), "prompt_tokens_details",
                              "cached_tokens", (json_int_t)n_cached);
    char id[64];
    make_id(id, sizeof id, chat ? "chatcmpl-" : "cmpl-", e->line, e->req.custom_id, e->line_keyed);
    json_t *body = json_pack(
        "{s:s, s:s, s:I, s:s, s:o, s:o}", "id", id, "object",
        chat ? "chat.completion" : "text_completion", "created", (json_int_t)ctx->created, "model",
        e->req.model ? e->req.model : ctx->model_name, "choices", choices, "usage", usage);
    if (body && chat && e->req.sampling.prompt_logprobs >= 0)
        json_object_set_new(body, "prompt_logprobs",
                            prompt_logprobs(e->prompt_lps[0], e->n_prompt_lps[0], ctx));
    return body;
}

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    return s;
}

char *batch_result_line(const batch_entry *e, const batch_result_ctx *ctx) {
    char id[64], req_id[64];
    make_id(id, sizeof id, "batch_req_", e->line, e->req.custom_id, e->line_keyed);
    make_id(req_id, sizeof req_id, "req_", e->line, e->req.custom_id, e->line_keyed);
    json_t *body = body_json(e, ctx);
    if (!body) return NULL;
    json_t *line =
        json_pack("{s:s, s:s?, s:{s:i, s:s, s:o}, s:n}", "id", id, "custom_id", e->req.custom_id,
                  "response", "status_code", 200, "request_id", req_id, "body", body, "error");
    return dump(line);
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len = c < 0x80             ? 1
                 : (c & 0xE0) == 0xC0 ? 2
                 : (c & 0xF0) == 0xE0 ? 3
                 : (c & 0xF8) == 0xF0 ? 4
                                      : 0;
    if (len == 0 || len > n || (len == 2 && c < 0xC2) || (len == 4 && c > 0xF4)) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (len == 3 && ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0))) return 0;
    if (len == 4 && ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] >= 0x90))) return 0;
    return len;
}

void batch_utf8_sanitize(char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t len = utf8_seq((const unsigned char *)s + i, n - i);
        if (len == 0) {
            s[i++] = '?';
        } else {
            i += len;
        }
    }
}

char *batch_error_line(int64_t line, const char *custom_id, bool line_keyed, const char *code,
                       const char *message) {
    char id[64], msg[512];
    make_id(id, sizeof id, "batch_req_", line, custom_id, line_keyed);
    /* Messages quote input and may have cut a character in two: keep the line valid JSON. */
    snprintf(msg, sizeof msg, "%s", message);
    batch_utf8_sanitize(msg);
    json_t *o = json_pack("{s:s, s:s?, s:n, s:{s:s, s:s}}", "id", id, "custom_id", custom_id,
                          "response", "error", "code", code, "message", msg);
    return dump(o);
}
