/*
 * batch_parse.h -- one line of an OpenAI Batch API input file ("/v1/completions" or
 * "/v1/chat/completions"), parsed and checked into a request the engine can take.
 *
 * Input line:
 *   {"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": {...}}
 *
 * Design stance:
 *   - Everything that can be checked without the model is checked here, once: JSON, UTF-8,
 *     the envelope, the type and range of every body field (di_sampling_params_validate for
 *     the sampling values). An unknown body field is an error naming it: a silently ignored
 *     typo would change results without notice. Checks that need the model (prompt length
 *     against the context, ids within the vocabulary) belong to the caller.
 *   - A failure never stops the batch: it yields a code and a message for that line's
 *     error record. The custom_id is still extracted when the line has one, so the error
 *     line can name it.
 *   - The parsed request owns all its memory (di_batch_request_free); the sampling params'
 *     arrays point into it.
 *
 * Internal to the library and the `deepinfer batch` command (and its fuzz target).
 */
#ifndef DI_BATCH_PARSE_H
#define DI_BATCH_PARSE_H

#include "deepinfer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Most prompts in one completions request, stop strings, stop ids and logit_bias entries. */
#define DI_BATCH_MAX_PROMPTS 1024
#define DI_BATCH_MAX_STOP    64
#define DI_BATCH_MAX_LIST    4096

typedef enum {
    DI_BATCH_COMPLETIONS, /* POST /v1/completions */
    DI_BATCH_CHAT,        /* POST /v1/chat/completions */
} di_batch_endpoint;

/* One prompt of a completions request: text, or token ids. */
typedef struct di_batch_prompt {
    char *text;   /* NUL-terminated UTF-8 (no NUL inside), or NULL when ids are given */
    int32_t *ids; /* [n_ids] token ids >= 0, or NULL when text is given */
    int64_t n_ids;
} di_batch_prompt;

typedef struct di_batch_request {
    char *custom_id; /* NULL when the line has no usable custom_id */
    di_batch_endpoint endpoint;
    char *model; /* body "model" (reported back, not used to choose a model), or NULL */

    /* completions: [n_prompts] prompts (a list of prompts gives several) */
    di_batch_prompt *prompts;
    int32_t n_prompts;

    /* chat: the messages as a JSON array (content parts flattened to a string), and the
     * chat_template_kwargs object as JSON (or NULL) */
    char *messages_json;
    char *template_kwargs_json;

    /* Sampling. max_tokens_set is false when the body gave neither max_tokens nor
     * max_completion_tokens: the caller picks the default (16 for completions, the rest of
     * the context for chat). The arrays below are owned and referenced by sampling. */
    di_sampling_params sampling;
    bool max_tokens_set;
    bool chat_logprobs; /* chat: "logprobs": true (sampling.logprobs = top_logprobs) */
    char **stop;        /* [sampling.n_stop] */
    int32_t *stop_token_ids;
    di_logit_bias *logit_bias;
    /* Constrained generation (owned; sampling.grammar / json_schema / regex point at them;
     * the engine compiles them): vLLM's "structured_outputs" {"grammar" | "json" | "regex" |
     * "choice"}, its older "guided_grammar" / "guided_json" / "guided_regex" /
     * "guided_choice", or OpenAI's "response_format" (json_object, json_schema). A choice
     * list becomes a grammar of its strings. */
    char *grammar, *json_schema, *regex;
} di_batch_request;

/* Why a line was refused: code is a short machine-readable word (see below), message a
 * sentence a user can act on. */
typedef struct di_batch_error {
    char code[40];
    char message[320];
} di_batch_error;

/* Error codes written by the parser (and by the batch command for the later checks):
 *   invalid_json_line           not JSON, not an object, or a NUL byte in it
 *   invalid_utf8                the line is not valid UTF-8
 *   missing_required_parameter  custom_id, method, url, body, prompt or messages is missing
 *   invalid_method              method is not "POST"
 *   invalid_url                 url is not one of the two endpoints
 *   unknown_parameter           a field the endpoint does not have
 *   invalid_parameter           a field of the wrong type or out of range
 *   duplicate_custom_id, context_length_exceeded, invalid_prompt, engine_error: the command */

/* Parses one line (len bytes, need not be NUL-terminated; a trailing "\r" is allowed). On
 * success fills *out and returns DI_OK; otherwise fills *err and returns
 * DI_ERR_INVALID_ARG, with out->custom_id set when it could be read. In both cases *out must
 * be freed with di_batch_request_free. */
di_status di_batch_parse_line(const char *line, size_t len, di_batch_request *out,
                              di_batch_error *err);

void di_batch_request_free(di_batch_request *r);

/* The custom_id of a line alone (for the first pass over an input file): a new string
 * (di_free) or NULL when the line has no string custom_id. */
char *di_batch_line_custom_id(const char *line, size_t len);

#endif /* DI_BATCH_PARSE_H */
