/*
 * sampler.c -- the sampler's pipeline (see sampler.h for the order and the guarantees):
 * input checks, raw logprobs, the sparse logits processors (logit_bias, min_tokens,
 * penalties), greedy, and the seeded draw through sample_filter.c.
 *
 * Design stance: the processors touch only the few ids they name, so the row is copied into
 * scratch only when one of them is active; greedy and unpenalised sampling read the caller's
 * row in place. Nothing is allocated; the scratch is carved into fixed [vocab] arrays. Passes
 * over the whole row are sample_vec.h's kernels (vectorised, bit-identical to the scalar
 * ones), so a token never depends on the machine's SIMD level.
 */
#include "sample/sampler.h"
#include "core/core.h"
#include "sample/philox.h"
#include "sample/sample_filter.h"
#include "sample/sample_mass.h"
#include "sample/sample_vec.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define PHILOX_LANE_TOKEN 0u /* the Philox lane of the token draw */

/* The scratch, carved as keys | tmp | row | w | ids (the 8-byte arrays first). */
typedef struct scratch_view {
    uint64_t *keys, *tmp;
    float *row;
    float *w;
    int32_t *ids;
} scratch_view;

size_t di_sampler_scratch_size(int64_t vocab) {
    return (size_t)vocab * (2 * sizeof(uint64_t) + 2 * sizeof(float) + sizeof(int32_t));
}

static scratch_view carve(void *scratch, int64_t vocab) {
    scratch_view v;
    v.keys = scratch;
    v.tmp = v.keys + vocab;
    v.row = (float *)(v.tmp + vocab);
    v.w = v.row + vocab;
    v.ids = (int32_t *)(v.w + vocab);
    return v;
}

/* ---------------------------------------------------------------------------------------- */
/* Checks                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static di_status check_id(int32_t id, int64_t vocab, const char *what, int64_t i) {
    if (id < 0 || id >= vocab)
        return di_error(DI_ERR_RANGE,
                        "sampler: %s[%lld] = token %d is outside the vocabulary "
                        "[0, %lld)",
                        what, (long long)i, id, (long long)vocab);
    return DI_OK;
}

/* The token ids the params and the history name must lie in the vocabulary. */
static bool ids_valid(const di_sampling_params *p, const di_sample_input *in) {
    for (int64_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].id < 0 || p->logit_bias[i].id >= in->vocab) return false;
    for (int64_t i = 0; i < p->n_stop_token_ids; i++)
        if (p->stop_token_ids[i] < 0 || p->stop_token_ids[i] >= in->vocab) return false;
    const di_token_counts *h = in->history;
    for (int64_t i = 0; h && i < h->n; i++)
        if (h->ids[i] < 0 || h->ids[i] >= in->vocab) return false;
    return true;
}

/* Everything that depends on the vocabulary size, which params validation cannot know. */
static di_status check_input(const di_sampling_params *p, const di_sample_input *in) {
    if (!p || !in || !in->logits || in->vocab <= 0 || in->vocab > INT32_MAX)
        return di_error(DI_ERR_INVALID_ARG,
                        "sampler: need params, a logits row and a vocab "
                        "size in [1, 2^31), got vocab %lld",
                        in ? (long long)in->vocab : 0LL);
    if (ds_filtered(p->top_k, p->top_p, in->vocab) && in->vocab > DI_SAMPLE_MASS_MAX_VOCAB)
        return di_error(DI_ERR_INVALID_ARG,
                        "sampler: top_k / top_p take a vocab of at most %d ids, got %lld",
                        DI_SAMPLE_MASS_MAX_VOCAB, (long long)in->vocab);
    if (ids_valid(p, in)) return DI_OK;
    di_status st = DI_OK;
    for (int64_t i = 0; st == DI_OK && i < p->n_logit_bias; i++)
        st = check_id(p->logit_bias[i].id, in->vocab, "logit_bias", i);
    for (int64_t i = 0; st == DI_OK && i < p->n_stop_token_ids; i++)
        st = check_id(p->stop_token_ids[i], in->vocab, "stop_token_ids", i);
    const di_token_counts *h = in->history;
    for (int64_t i = 0; st == DI_OK && h && i < h->n; i++)
        st = check_id(h->ids[i], in->vocab, "history ids", i);
    return st;
}

/* The raw row may hold -inf (banned) but no NaN or +inf. */
static di_status row_error(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (isnan(x[i]) || x[i] == INFINITY)
            return di_error(DI_ERR_RANGE, "sampler: logit of token %lld is %s", (long long)i,
                            isnan(x[i]) ? "NaN" : "+inf");
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Raw logprobs                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* log(sum(exp(x))) of the raw row whose maximum is m, summed in block order;
 * block_sum[ceil(n / DI_SAMPLE_BLOCK)] is scratch. */
static double log_sum_exp(const float *x, int64_t n, float m, double *block_sum) {
    if (m == -INFINITY) return -INFINITY;
    double s = di_sample_kernels_active()->weights(x, n, m, 1.0f, -FLT_MAX, NULL, block_sum);
    return (double)m + log(s);
}

/* The n_top highest raw logits, best first (ties: lower id), by insertion into a short list.
 * Scanning in increasing id, a token displaces the worst entry only if strictly higher; the
 * vector search skips the tokens that cannot enter. */
static void raw_top(const float *x, int64_t n, int32_t n_top, double lse, di_sample_result *out) {
    const di_sample_kernels *kern = di_sample_kernels_active();
    int32_t c = 0;
    for (int64_t i = 0; n_top > 0; i++) {
        float thr = c < n_top ? -FLT_MAX : nextafterf(x[out->top_ids[c - 1]], INFINITY);
        if ((i = kern->next_at_least(x, i, n, thr)) >= n) break;
        int32_t j = c < n_top ? c++ : c - 1;
        while (j > 0 && x[i] > x[out->top_ids[j - 1]]) {
            out->top_ids[j] = out->top_ids[j - 1];
            j--;
        }
        out->top_ids[j] = (int32_t)i;
    }
    out->n_top = c;
    for (int32_t j = 0; j < c; j++)
        out->top_logprobs[j] = (float)(x[out->top_ids[j]] - lse);
}

/* ---------------------------------------------------------------------------------------- */
/* Logits processors                                                                          */
/* ---------------------------------------------------------------------------------------- */

static bool min_tokens_active(const di_sampling_params *p, const di_sample_input *in) {
    int64_t done = in->history ? in->history->n_output : 0;
    return done < p->min_tokens;
}

static bool penalties_active(const di_sampling_params *p, const di_sample_input *in) {
    if (!in->history || in->history->n == 0) return false;
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

static bool processing_needed(const di_sampling_params *p, const di_sample_input *in) {
    return p->n_logit_bias > 0 || in->allowed || min_tokens_active(p, in) ||
           penalties_active(p, in);
}

/* Keeps a processed logit finite or -inf: a huge penalty may overflow, but never to +inf. */
static float clamp_logit(float v) {
    return v > FLT_MAX ? FLT_MAX : v;
}

static void apply_logit_bias(const di_sampling_params *p, float *row) {
    for (int64_t i = 0; i < p->n_logit_bias; i++) {
        int32_t id = p->logit_bias[i].id;
        row[id] = clamp_logit(row[id] + p->logit_bias[i].bias);
    }
}

/* Tokens the grammar does not allow -> -inf (a 32-bit word of the mask at a time). */
static void apply_allowed(const di_sample_input *in, float *row) {
    if (!in->allowed) return;
    for (int64_t w = 0; w * 32 < in->vocab; w++) {
        uint32_t bits = in->allowed[w];
        if (bits == 0xFFFFFFFFu) continue;
        int64_t end = DI_MIN(in->vocab, (w + 1) * 32);
        for (int64_t i = w * 32; i < end; i++)
            if (!(bits >> (i & 31) & 1u)) row[i] = -INFINITY;
    }
}

/* EOS (unless ignore_eos) and the stop ids are banned until min_tokens have been generated. */
static void apply_min_tokens(const di_sampling_params *p, const di_sample_input *in, float *row) {
    if (!min_tokens_active(p, in)) return;
    if (in->eos_token_id >= 0 && in->eos_token_id < in->vocab && !p->ignore_eos)
        row[in->eos_token_id] = -INFINITY;
    for (int64_t i = 0; i < p->n_stop_token_ids; i++)
        row[p->stop_token_ids[i]] = -INFINITY;
}

static void apply_penalties(const di_sampling_params *p, const di_token_counts *h, float *row) {
    if (!h) return;
    const float rep = p->repetition_penalty;
    for (int64_t i = 0; i < h->n; i++) {
        float v = row[h->ids[i]];
        if (rep != 1.0f) v = v > 0.0f ? v / rep : v * rep;
        int32_t count = h->output_count[i];
        if (count > 0) v -= p->frequency_penalty * (float)count + p->presence_penalty;
        row[h->ids[i]] = clamp_logit(v);
    }
}

/* The processed row: the caller's row itself when no processor is active, else a copy. */
static const float *process(const di_sampling_params *p, const di_sample_input *in, float *row) {
    if (!processing_needed(p, in)) return in->logits;
    memcpy(row, in->logits, sizeof(float) * (size_t)in->vocab);
    apply_logit_bias(p, row);
    apply_allowed(in, row);
    apply_min_tokens(p, in, row);
    apply_penalties(p, in->history, row);
    return row;
}

/* ---------------------------------------------------------------------------------------- */
/* The pipeline                                                                               */
/* ---------------------------------------------------------------------------------------- */

static bool is_greedy(const di_sampling_params *p) {
    return p->temperature < DI_SAMPLING_GREEDY_EPS;
}

/* Checks and processing shared by sample and probs: the processed row, its argmax (the
 * first index holding its maximum) and the raw row's maximum. */
static di_status prepare(const di_sampling_params *p, const di_sample_input *in, float *row,
                         const float **x, int32_t *best, float *raw_max) {
    di_status st = check_input(p, in);
    if (st != DI_OK) return st;
    const di_sample_kernels *kern = di_sample_kernels_active();
    bool bad;
    int64_t first;
    float max = kern->scan(in->logits, in->vocab, &bad, &first);
    if (bad) return row_error(in->logits, in->vocab);
    *raw_max = max;
    *x = process(p, in, row);
    if (*x != in->logits) max = kern->scan(*x, in->vocab, &bad, &first);
    if (max == -INFINITY)
        return di_error(DI_ERR_RANGE, "sampler: every token is masked (all logits -inf after "
                                      "logit_bias, the grammar, min_tokens and penalties)");
    *best = (int32_t)first;
    return DI_OK;
}

bool di_sampler_device_draw(const di_sampling_params *p, const di_sample_input *in) {
    if (!p || !in || in->vocab <= 0 || in->vocab > DI_SAMPLE_DEVICE_MAX_VOCAB) return false;
    return p->logprobs < 0 && !processing_needed(p, in) && ids_valid(p, in);
}

di_status di_sampler_process(const di_sampling_params *p, const di_sample_input *in, float *row) {
    di_status st = check_input(p, in);
    if (st != DI_OK) return st;
    if (process(p, in, row) == in->logits)
        memcpy(row, in->logits, sizeof(float) * (size_t)in->vocab);
    return DI_OK;
}

di_status di_sampler_sample(const di_sampling_params *p, const di_sample_input *in, void *scratch,
                            di_sample_result *out) {
    memset(out, 0, sizeof *out);
    out->token = -1;
    scratch_view s = carve(scratch, in ? in->vocab : 0);
    const float *x;
    int32_t best;
    float raw_max;
    di_status st = prepare(p, in, s.row, &x, &best, &raw_max);
    if (st != DI_OK) return st;
    if (is_greedy(p)) {
        out->token = best;
    } else {
        di_filter_work work = {s.w, s.keys, s.tmp, s.ids};
        di_sample_dist dist;
        di_sample_filter(p, x, in->vocab, x[best], &work, &dist);
        double u = di_philox_uniform(in->seed, in->sample_index, in->position, PHILOX_LANE_TOKEN);
        out->token = di_sample_draw(&dist, u);
    }
    if (p->logprobs >= 0) {
        /* The draw is done: its weights and block sums are free for the raw softmax. */
        double lse = log_sum_exp(in->logits, in->vocab, raw_max, (double *)s.keys);
        out->logprob = (float)(in->logits[out->token] - lse);
        raw_top(in->logits, in->vocab, p->logprobs, lse, out);
    }
    return DI_OK;
}

di_status di_sampler_token_logprobs(const float *logits, int64_t vocab, int32_t token,
                                    int32_t n_top, void *scratch, di_sample_result *out) {
    out->token = -1;
    out->logprob = 0.0f;
    out->n_top = 0;
    if (token < 0 || token >= vocab || n_top < 0 || n_top > DI_SAMPLING_MAX_LOGPROBS)
        return di_error(DI_ERR_RANGE, "prompt logprobs: token %d or n_top %d out of range",
                        (int)token, (int)n_top);
    di_status st = row_error(logits, vocab);
    if (st != DI_OK) return st;
    float m = -INFINITY;
    for (int64_t i = 0; i < vocab; i++)
        m = logits[i] > m ? logits[i] : m;
    double lse = log_sum_exp(logits, vocab, m, (double *)carve(scratch, vocab).keys);
    out->token = token;
    out->logprob = (float)(logits[token] - lse);
    raw_top(logits, vocab, n_top, lse, out);
    return DI_OK;
}

di_status di_sampler_probs(const di_sampling_params *p, const di_sample_input *in, void *scratch,
                           double *probs) {
    scratch_view s = carve(scratch, in ? in->vocab : 0);
    const float *x;
    int32_t best;
    float raw_max;
    di_status st = prepare(p, in, s.row, &x, &best, &raw_max);
    if (st != DI_OK) return st;
    memset(probs, 0, sizeof(double) * (size_t)in->vocab);
    if (is_greedy(p)) {
        probs[best] = 1.0;
        return DI_OK;
    }
    di_filter_work work = {s.w, s.keys, s.tmp, s.ids};
    di_sample_dist dist;
    di_sample_filter(p, x, in->vocab, x[best], &work, &dist);
    const float *w = dist.w;
    if (!w) { /* a full row: its weights were not stored */
        di_sample_dist_weights(&dist, s.w);
        w = s.w;
    }
    for (int64_t j = 0; j < dist.n; j++) {
        int32_t id = dist.ids ? dist.ids[j] : (int32_t)j;
        probs[id] = dist.ids ? (double)ds_mass(w[id]) / ds_u128_double(dist.mass_total)
                             : w[id] / dist.total;
    }
    return DI_OK;
}
