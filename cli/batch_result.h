/*
 * batch_result.h -- what one input line of `deepinfer batch` collects while its engine
 * requests run, and the output line made from it (OpenAI Batch API format):
 *
 *   {"id": "batch_req_<hash>", "custom_id": "r1",
 *    "response": {"status_code": 200, "request_id": "req_<hash>", "body": <completion>},
 *    "error": null}
 *   {"id": "batch_req_<hash>", "custom_id": "r2", "response": null,
 *    "error": {"code": "invalid_parameter", "message": "body.top_p must be ..."}}
 *
 * <completion> is a "text_completion" or a "chat.completion" object as vLLM's OpenAI server
 * returns it; each choice also carries "token_ids" (the generated ids). Ids are derived
 * from the custom_id (FNV-1a), not drawn at random, so a resumed run writes the same lines
 * as an uninterrupted one (only "created" differs). Lines without a custom_id of their own
 * (none given, or a repeated one) get "batch_req_line<N>", N the input line number, which is
 * also how a later run recognises them (batch_out.h).
 */
#ifndef DI_CLI_BATCH_RESULT_H
#define DI_CLI_BATCH_RESULT_H

#include "batch/batch_parse.h"
#include "deepinfer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One token's logprobs, copied out of an engine output. */
typedef struct batch_lp {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top_ids[DI_SAMPLING_MAX_LOGPROBS];
    float top_logprobs[DI_SAMPLING_MAX_LOGPROBS];
} batch_lp;

/* One choice: one sample of one prompt. */
typedef struct batch_choice {
    int32_t *ids; /* [n_ids] generated ids, owned */
    int64_t n_ids, cap_ids;
    char *text; /* [text_len] UTF-8, owned; NULL when the engine has no tokenizer */
    size_t text_len, text_cap;
    batch_lp *lps; /* [n_lps] when logprobs were asked, owned */
    int64_t n_lps, cap_lps;
    di_engine_finish finish;
    bool finished;
} batch_choice;

/* One input line in flight. Choice index = prompt * n + sample (as vLLM numbers them). */
typedef struct batch_entry {
    int64_t line;    /* 1-based input line number */
    bool line_keyed; /* the result is keyed by the line (a repeated custom_id) */
    di_batch_request req;
    int32_t n_prompts, n;
    batch_choice *choices;  /* [n_prompts * n], owned */
    int64_t *prompt_tokens; /* [n_prompts] */
    int64_t *cached_tokens; /* [n_prompts] */
    batch_lp **prompt_lps;  /* [n_prompts] -> [n_prompt_lps[i]] (prompt_logprobs), owned */
    int64_t *n_prompt_lps;
    int32_t n_open; /* samples not finished yet */
    bool failed;    /* an engine error: the line becomes an error line */
    di_batch_error error;
} batch_entry;

/* Allocates the per-choice state for n_prompts * n choices; false on OOM. */
bool batch_entry_init(batch_entry *e, int32_t n_prompts, int32_t n);
void batch_entry_free(batch_entry *e);

/* Adds what one engine output record reports for prompt index `prompt`. false on OOM. */
bool batch_entry_add_output(batch_entry *e, int32_t prompt, const di_engine_output *o);

/* What the output lines need besides the entry. */
typedef struct batch_result_ctx {
    const di_tokenizer *tok; /* token strings in logprobs; NULL: "token_id:<id>" */
    const char *model_name;  /* when the body has no "model" */
    int64_t created;         /* unix time */
} batch_result_ctx;

/* The success line of a finished entry (malloc'ed, no newline), or NULL on OOM. */
char *batch_result_line(const batch_entry *e, const batch_result_ctx *ctx);

/* Replaces the bytes of s that are not valid UTF-8 with '?', in place. */
void batch_utf8_sanitize(char *s);

/* An error line. custom_id may be NULL; line_keyed: id is "batch_req_line<line>". The
 * message is made valid UTF-8 first. */
char *batch_error_line(int64_t line, const char *custom_id, bool line_keyed, const char *code,
                       const char *message);

#endif /* DI_CLI_BATCH_RESULT_H */
