/*
 * sampler.h -- chooses one token from one row of logits: vLLM's logits processors, then
 * greedy or seeded random sampling, plus the logprobs a request asked for. Plain C over a
 * float row; it touches no tensors and allocates nothing.
 *
 * Order (vLLM v1's Sampler):
 *   1. logprobs, when requested, from the log-softmax of the RAW logits (vLLM's default
 *      logprobs_mode "raw_logprobs": what the model said, before any processing);
 *   2. logit_bias; the grammar's mask (tokens it does not allow -> -inf); min_tokens (EOS
 *      and stop_token_ids -> -inf while fewer than min_tokens tokens have been generated);
 *   3. penalties: repetition (tokens of prompt + output: positive logits divided by it,
 *      negative ones multiplied), then frequency (times the output count) and presence
 *      (once per token present in the output), both subtracted;
 *   4. temperature < 1e-5: greedy, argmax of the processed row, lowest id on ties;
 *   5. otherwise temperature, then min_p (drop p < min_p * p_max), then top_k, then top_p
 *      (on the distribution renormalised over what top_k kept), then one inverse-CDF draw.
 *
 * Determinism: the uniform comes from Philox keyed by (seed, sample_index, position) only;
 * ranking ties are broken by the lower token id; weights come from one exponential made of
 * plain float operations; without top_k and top_p the inverse CDF sums them in a fixed order
 * (by blocks of ids over the full row: sample_vec.h), with either the cut and the draw use
 * exact integer masses (sample_mass.h), so the same at every SIMD level and on a GPU
 * (backend.h's sample_rows). So a row gives the same token on every call, in any call order,
 * on any machine.
 *
 * Rows: -inf marks a banned token. A row holding NaN or +inf, or one where every token ends
 * up banned, fails with DI_ERR_RANGE (and out->token = -1); it never yields a NaN.
 */
#ifndef DI_SAMPLER_H
#define DI_SAMPLER_H

#include "deepinfer.h"

#include <stddef.h>
#include <stdint.h>

/* Below this temperature sampling is greedy (vLLM's _SAMPLING_EPS). */
#define DI_SAMPLING_GREEDY_EPS 1e-5f

/* What a request has produced so far, in the form the penalties need. Owned by the engine. */
typedef struct di_token_counts {
    const int32_t *ids;          /* [n] distinct token ids seen in the prompt or the output */
    const int32_t *output_count; /* [n] occurrences of ids[i] in the output (0: prompt only) */
    int64_t n;
    int64_t n_output; /* tokens generated so far (for min_tokens) */
} di_token_counts;

/* One row to sample from, and the key of its random number. */
typedef struct di_sample_input {
    const float *logits; /* [vocab] raw logits */
    int64_t vocab;
    const di_token_counts *history; /* NULL: nothing generated yet, no penalties */
    int32_t eos_token_id;           /* -1: none */
    int64_t seed;                   /* the request's resolved seed */
    int32_t sample_index;           /* which of the request's n completions */
    int64_t position;               /* sequence position of the token being chosen */
    /* NULL, or [(vocab + 31) / 32] bits: only tokens whose bit is set may be chosen
     * (constrained generation's mask; applied with logit_bias, before the penalties) */
    const uint32_t *allowed;
} di_sample_input;

typedef struct di_sample_result {
    int32_t token;                             /* the chosen token, -1 on failure */
    float logprob;                             /* its raw logprob; 0 unless params->logprobs >= 0 */
    int32_t n_top;                             /* entries below: max(params->logprobs, 0) */
    int32_t top_ids[DI_SAMPLING_MAX_LOGPROBS]; /* by decreasing raw logprob, ties: lower id */
    float top_logprobs[DI_SAMPLING_MAX_LOGPROBS];
} di_sample_result;

/* Bytes of scratch di_sampler_sample and di_sampler_probs need for a vocabulary. */
size_t di_sampler_scratch_size(int64_t vocab);

/* Chooses a token. params must have passed di_sampling_params_validate; token ids it holds
 * must be < vocab (else DI_ERR_RANGE). scratch: di_sampler_scratch_size(vocab) bytes. */
di_status di_sampler_sample(const di_sampling_params *params, const di_sample_input *in,
                            void *scratch, di_sample_result *out);

/* Whether di_sampler_sample's token for this input is one a device can find from its own
 * copy of the row: greedy (the first index of the row's maximum), the full-row draw of
 * sample_full_row.h (temperature, min_p) or the filtered draw of sample_mass.h (top_k,
 * top_p) -- with no logit processor active, no logprobs wanted, the ids valid and a vocabulary
 * of at most DI_SAMPLE_DEVICE_MAX_VOCAB. The device then also checks the row for NaN and +inf
 * (and a row of -inf only), which are errors here. in->logits is not read. */
bool di_sampler_device_draw(const di_sampling_params *params, const di_sample_input *in);

/* Raw logprobs of a given token (prompt logprobs): out->logprob of `token` and the n_top
 * best entries, computed exactly as di_sampler_sample's step 1; out->token = token. The row
 * must hold no NaN or +inf (else DI_ERR_RANGE). n_top in [0, DI_SAMPLING_MAX_LOGPROBS]. */
di_status di_sampler_token_logprobs(const float *logits, int64_t vocab, int32_t token,
                                    int32_t n_top, void *scratch, di_sample_result *out);

/* Steps 2-3 alone: writes the processed row to row[vocab] (for tests and diagnostics). */
di_status di_sampler_process(const di_sampling_params *params, const di_sample_input *in,
                             float *row);

/* The distribution a random draw samples from (steps 2-5): probs[vocab], zero for dropped
 * tokens, one-hot at the argmax when greedy. For tests; the sampler never builds it. */
di_status di_sampler_probs(const di_sampling_params *params, const di_sample_input *in,
                           void *scratch, double *probs);

#endif /* DI_SAMPLER_H */
