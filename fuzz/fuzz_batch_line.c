/*
 * fuzz_batch_line.c -- libFuzzer target: the input is one line of an OpenAI Batch API file.
 *
 * di_batch_parse_line must return a status for any bytes. On success the request must be
 * one the engine can take as is: a known endpoint, prompts or messages present, sampling
 * params that pass di_sampling_params_validate (with the caller's max_tokens default), and
 * arrays whose counts match. On failure the error must carry a code and a message. Both
 * paths must free everything (the sanitizers check).
 */
#include "batch/batch_parse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_ok(const di_batch_request *r) {
    if (r->endpoint != DI_BATCH_COMPLETIONS && r->endpoint != DI_BATCH_CHAT) abort();
    if (!r->custom_id || !*r->custom_id) abort();
    if (r->endpoint == DI_BATCH_COMPLETIONS) {
        if (r->n_prompts < 1 || r->n_prompts > DI_BATCH_MAX_PROMPTS) abort();
        for (int32_t i = 0; i < r->n_prompts; i++) {
            const di_batch_prompt *p = &r->prompts[i];
            if (!p->text == !p->ids) abort();
            if (p->ids && p->n_ids < 1) abort();
            for (int64_t k = 0; p->ids && k < p->n_ids; k++)
                if (p->ids[k] < 0) abort();
        }
    } else if (!r->messages_json || r->messages_json[0] != '[') {
        abort();
    }
    di_sampling_params p = r->sampling;
    if (!r->max_tokens_set) p.max_tokens = p.min_tokens > 16 ? p.min_tokens : 16;
    if (di_sampling_params_validate(&p, NULL, 0) != DI_OK) abort();
    for (int64_t i = 0; i < p.n_stop; i++)
        if (!p.stop[i] || !p.stop[i][0]) abort();
    if ((p.n_logit_bias > 0) != (p.logit_bias != NULL)) abort();
    if ((p.n_stop_token_ids > 0) != (p.stop_token_ids != NULL)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    di_batch_request r;
    di_batch_error err;
    if (di_batch_parse_line((const char *)data, size, &r, &err) == DI_OK)
        check_ok(&r);
    else if (!err.code[0] || !err.message[0] || !memchr(err.message, '\0', sizeof err.message))
        abort();
    di_batch_request_free(&r);
    char *id = di_batch_line_custom_id((const char *)data, size);
    di_free(id);
    return 0;
}
