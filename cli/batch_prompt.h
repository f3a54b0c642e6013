/*
 * batch_prompt.h -- turns a parsed batch request into the token ids the engine runs, and
 * applies the checks that need the model: the chat template (with the generation prompt),
 * tokenizing text prompts, ids within the vocabulary, the default max_tokens and the
 * context limit (vLLM's rule: prompt + max_tokens <= max_model_len).
 *
 * Text is tokenized here rather than by the engine so that an over-long prompt becomes an
 * error line with the lengths in it before anything is queued. Completions text gets the
 * tokenizer's special tokens (BOS) as `deepinfer generate --prompt` and vLLM add them; a
 * rendered chat prompt does not (the template writes BOS itself).
 */
#ifndef DI_CLI_BATCH_PROMPT_H
#define DI_CLI_BATCH_PROMPT_H

#include "batch/batch_parse.h"
#include "deepinfer.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct batch_prompts {
    const char *model_dir;
    const char *tokenizer_path; /* --tokenizer, or NULL: the model folder */
    di_tokenizer *tok;          /* NULL when none could be loaded (tok_error says why) */
    char tok_error[256];
    di_chat_template *tmpl; /* loaded on the first chat request */
    bool tmpl_tried;
    char tmpl_error[256];
    int64_t vocab_size;
    int64_t max_model_len;
} batch_prompts;

void batch_prompts_init(batch_prompts *bp, const char *model_dir, const char *tokenizer_path,
                        int64_t vocab_size, int64_t max_model_len);
void batch_prompts_free(batch_prompts *bp);

/* The ids of every prompt of r (ids[i] malloc'ed, [n_ids[i]]), with r->sampling.max_tokens
 * resolved. On failure fills *err (nothing to free) and returns false. */
bool batch_prompts_resolve(batch_prompts *bp, di_batch_request *r, int32_t **ids, int64_t *n_ids,
                           di_batch_error *err);

#endif /* DI_CLI_BATCH_PROMPT_H */
