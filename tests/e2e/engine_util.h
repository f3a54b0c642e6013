/*
 * engine_util.h -- helpers shared by the engine tests: a reference greedy loop through
 * di_context, and a driver that feeds requests to an engine at given steps and collects
 * each (request, sample)'s tokens, logprobs, text and final record.
 */
#ifndef DI_TEST_ENGINE_UTIL_H
#define DI_TEST_ENGINE_UTIL_H

#include "deepinfer.h"
#include "test.h"

#define DATA_DIR   DI_SOURCE_DIR "/tests/data"
#define EU_MAX_TOK 256
#define EU_TOP     DI_SAMPLING_MAX_LOGPROBS

/* What one sample produced. */
typedef struct eu_result {
    int32_t tokens[EU_MAX_TOK];
    float lp[EU_MAX_TOK];
    int32_t top_ids[EU_MAX_TOK][EU_TOP];
    float top_lp[EU_MAX_TOK][EU_TOP];
    int64_t n;
    char text[4096];
    int64_t text_len;
    bool finished;
    int n_final; /* finished records seen (must be 1) */
    di_engine_finish reason;
    di_engine_usage usage;
    int64_t seed;
    /* Prompt logprobs (positions 1 .. n_plp), from the records that carried them. */
    int32_t plp_tok[EU_MAX_TOK];
    float plp[EU_MAX_TOK];
    int32_t plp_n_top[EU_MAX_TOK];
    int32_t plp_top_ids[EU_MAX_TOK][EU_TOP];
    float plp_top_lp[EU_MAX_TOK][EU_TOP];
    int64_t n_plp;
    int plp_records; /* records with prompt_logprobs != NULL (must be 1 when asked) */
} eu_result;

/* One request to feed: added before the given step. res has sp.n entries. */
typedef struct eu_req {
    const int32_t *prompt;
    int64_t n_prompt;
    const char *text;
    di_sampling_params sp;
    int arrive;   /* step index before which it is added */
    int abort_at; /* step index before which it is aborted; -1: never */
    eu_result *res;
} eu_req;

/* Loads tests/data/<name>, or the folder `name` when it is an absolute path. */
static inline bool eu_load(const char *name, int n_threads, di_model **m) {
    char dir[512];
    if (name[0] == '/')
        snprintf(dir, sizeof dir, "%s", name);
    else
        snprintf(dir, sizeof dir, "%s/%s", DATA_DIR, name);
    di_model_params mp = di_model_default_params();
    mp.n_threads = n_threads;
    return di_model_load(dir, &mp, m) == DI_OK;
}

/* Engine parameters sized for the tiny test models: short contexts, small batches and
 * blocks, so that chunking and preemption happen. */
static inline di_engine_params eu_small_params(void) {
    di_engine_params ep = di_engine_default_params();
    ep.max_model_len = 128;
    ep.max_batch_tokens = 64;
    ep.max_prefill_tokens = 24;
    ep.max_running = 8;
    ep.block_size = 8;
    return ep;
}

/* Loads tests/data/<name> and creates an engine on it with ep (both checked); false, with
 * nothing held, when either fails. */
static inline bool eu_open(const char *name, int n_threads, const di_engine_params *ep,
                           di_model **m, di_engine **e) {
    *m = NULL;
    *e = NULL;
    CHECK_MSG(eu_load(name, n_threads, m), "%s: %s", name, di_last_error());
    if (!*m) return false;
    CHECK_MSG(di_engine_create(*m, ep, e) == DI_OK, "%s: %s", name, di_last_error());
    if (*e) return true;
    di_model_free(*m);
    *m = NULL;
    return false;
}

/* Greedy tokens of a prompt through a single-sequence context (ignores EOS). */
static inline void eu_ref_greedy(di_model *m, const int32_t *prompt, int64_t n_prompt,
                                 int64_t n_gen, int32_t *out) {
    di_model_info info;
    di_model_get_info(m, &info);
    di_context_params cp = di_context_default_params();
    cp.max_tokens = n_prompt + n_gen + 1;
    di_context *c = NULL;
    if (di_context_create(m, &cp, &c)) return;
    float *lg = malloc((size_t)info.vocab_size * sizeof(float));
    di_context_eval(c, prompt, n_prompt, lg, 1);
    for (int64_t k = 0; k < n_gen; k++) {
        int32_t best = 0;
        for (int32_t v = 1; v < info.vocab_size; v++)
            if (lg[v] > lg[best]) best = v;
        out[k] = best;
        if (k + 1 < n_gen) di_context_eval(c, &best, 1, lg, 1);
    }
    free(lg);
    di_context_free(c);
}

/* Runs the requests to completion. Returns the number of steps, or -1 on an API failure. */
static inline int eu_run(di_engine *e, eu_req *reqs, int n_reqs) {
    int64_t cap = 512;
    di_engine_output *out = calloc((size_t)cap, sizeof *out);
    int step = 0, added = 0;
    for (; step < 100000; step++) {
        for (int i = 0; i < n_reqs; i++) {
            if (reqs[i].arrive == step) {
                di_engine_request rq = {.prompt_ids = reqs[i].prompt,
                                        .n_prompt_ids = reqs[i].n_prompt,
                                        .prompt_text = reqs[i].text,
                                        .sampling = &reqs[i].sp,
                                        .id = (uint64_t)i + 1000};
                if (di_engine_add_request(e, &rq) != DI_OK) {
                    printf("  add %d: %s\n", i, di_last_error());
                    free(out);
                    return -1;
                }
                added++;
            }
            if (reqs[i].abort_at == step) di_engine_abort(e, (uint64_t)i + 1000);
        }
        if (added == n_reqs && !di_engine_has_unfinished(e)) break;
        int64_t n = 0;
        if (di_engine_step(e, out, cap, &n) != DI_OK) {
            printf("  step: %s\n", di_last_error());
            free(out);
            return -1;
        }
        for (int64_t k = 0; k < n; k++) {
            const di_engine_output *o = &out[k];
            eu_result *r = &reqs[o->id - 1000].res[o->sample_index];
            for (int64_t t = 0; t < o->n_tokens && r->n < EU_MAX_TOK; t++, r->n++) {
                r->tokens[r->n] = o->tokens[t];
                if (o->logprobs) {
                    r->lp[r->n] = o->logprobs[t].logprob;
                    for (int32_t j = 0; j < o->logprobs[t].n_top && j < EU_TOP; j++) {
                        r->top_ids[r->n][j] = o->logprobs[t].top_ids[j];
                        r->top_lp[r->n][j] = o->logprobs[t].top_logprobs[j];
                    }
                }
            }
            if (o->text && r->text_len + o->text_len < (int64_t)sizeof r->text) {
                memcpy(r->text + r->text_len, o->text, (size_t)o->text_len);
                r->text_len += o->text_len;
                r->text[r->text_len] = 0;
            }
            if (o->prompt_logprobs) {
                r->plp_records++;
                for (int64_t i = 0; i < o->n_prompt_logprobs && i < EU_MAX_TOK; i++) {
                    const di_engine_logprobs *l = &o->prompt_logprobs[i];
                    r->plp_tok[i] = l->token;
                    r->plp[i] = l->logprob;
                    r->plp_n_top[i] = l->n_top;
                    for (int32_t j = 0; j < l->n_top && j < EU_TOP; j++) {
                        r->plp_top_ids[i][j] = l->top_ids[j];
                        r->plp_top_lp[i][j] = l->top_logprobs[j];
                    }
                }
                r->n_plp = o->n_prompt_logprobs;
            }
            r->usage = o->usage;
            r->seed = o->seed;
            if (o->finished) {
                r->finished = true;
                r->n_final++;
                r->reason = o->finish_reason;
            }
        }
    }
    free(out);
    return step;
}

/* Runs the requests through a fresh engine on m with ep; false on an API failure. */
static inline bool eu_run_fresh(di_model *m, const di_engine_params *ep, eu_req *reqs, int n) {
    di_engine *e = NULL;
    if (di_engine_create(m, ep, &e) != DI_OK) {
        printf("  engine: %s\n", di_last_error());
        return false;
    }
    bool ok = eu_run(e, reqs, n) > 0;
    di_engine_free(e);
    return ok;
}

#endif /* DI_TEST_ENGINE_UTIL_H */
