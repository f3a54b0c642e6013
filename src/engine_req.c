/*
 * engine_req.c -- the engine's requests: submission through the locked inbox, the caller-id
 * map, per-row sampling, and turning the scheduler's results into outputs (new tokens,
 * logprobs, streamed text, stop strings, finish reasons, usage).
 *
 * Design stance:
 *   - di_engine_add_request does all the work that can fail (validation, tokenizing,
 *     copying, the seed draw) on the caller's thread, then links the finished request into
 *     the inbox under the lock; the step only moves it into the scheduler.
 *   - n > 1 follows vLLM v1: each completion is its own scheduler request over the same
 *     prompt. Completions 1.. are added once completion 0 has sampled its first token, i.e.
 *     once the prompt's full blocks are registered in the prefix cache, so they share the
 *     prompt's KV blocks (refcounted) instead of computing it again.
 *   - Sampling is keyed by (seed, sample index, position) only, and a row's history is a
 *     function of its position, so a token never depends on the batch, the step or the
 *     preemptions before it.
 *
 * What the scheduler's results become (tokens, text, stop strings, outputs) is in
 * engine_output.c.
 */
#include "engine_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Caller-id map                                                                              */
/* ---------------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

di_status eng_map_init(eng_map *m) {
    m->cap = 64;
    m->keys = di_calloc((size_t)m->cap, sizeof *m->keys);
    m->vals = di_calloc((size_t)m->cap, sizeof *m->vals);
    m->state = di_calloc((size_t)m->cap, 1);
    m->n = m->used = 0;
    if (!m->keys || !m->vals || !m->state)
        return di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory");
    return DI_OK;
}

void eng_map_free(eng_map *m) {
    di_free(m->keys);
    di_free(m->vals);
    di_free(m->state);
    memset(m, 0, sizeof *m);
}

/* Slot of the id, or -1. */
static int64_t map_find(const eng_map *m, uint64_t id) {
    for (int64_t i = (int64_t)(mix64(id) & (uint64_t)(m->cap - 1)), k = 0; k < m->cap;
         k++, i = (i + 1) & (m->cap - 1)) {
        if (m->state[i] == SLOT_EMPTY) return -1;
        if (m->state[i] == SLOT_FULL && m->keys[i] == id) return i;
    }
    return -1;
}

eng_req *eng_map_get(const eng_map *m, uint64_t id) {
    int64_t i = map_find(m, id);
    return i < 0 ? NULL : m->vals[i];
}

static void map_insert_raw(eng_map *m, uint64_t id, eng_req *r) {
    int64_t i = (int64_t)(mix64(id) & (uint64_t)(m->cap - 1));
    while (m->state[i] == SLOT_FULL)
        i = (i + 1) & (m->cap - 1);
    if (m->state[i] == SLOT_EMPTY) m->used++;
    m->state[i] = SLOT_FULL;
    m->keys[i] = id;
    m->vals[i] = r;
    m->n++;
}

di_status eng_map_put(eng_map *m, uint64_t id, eng_req *r) {
    if ((m->used + 1) * 2 > m->cap) { /* grow, or just drop the tombstones */
        eng_map old = *m;
        int64_t cap = old.n * 4 > old.cap ? old.cap * 2 : old.cap;
        m->keys = di_calloc((size_t)cap, sizeof *m->keys);
        m->vals = di_calloc((size_t)cap, sizeof *m->vals);
        m->state = di_calloc((size_t)cap, 1);
        if (!m->keys || !m->vals || !m->state) {
            di_free(m->keys);
            di_free(m->vals);
            di_free(m->state);
            *m = old;
            return di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory");
        }
        m->cap = cap;
        m->n = m->used = 0;
        for (int64_t i = 0; i < old.cap; i++)
            if (old.state[i] == SLOT_FULL) map_insert_raw(m, old.keys[i], old.vals[i]);
        eng_map_free(&old);
    }
    map_insert_raw(m, id, r);
    return DI_OK;
}

void eng_map_del(eng_map *m, uint64_t id) {
    int64_t i = map_find(m, id);
    if (i < 0) return;
    m->state[i] = SLOT_TOMB;
    m->vals[i] = NULL;
    m->n--;
}

/* ---------------------------------------------------------------------------------------- */
/* Requests                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static void sample_free_buffers(eng_sample *s) {
    di_free(s->out);
    di_free(s->lp);
    di_free(s->lp_ids);
    di_free(s->lp_vals);
    di_free(s->h_ids);
    di_free(s->h_cnt);
    di_free(s->h_index);
    di_free(s->text);
    if (s->detok) di_detok_free(s->detok);
    di_matcher_free(s->matcher);
    di_free(s->allowed);
    memset(s, 0, sizeof *s);
}

void eng_req_free(eng_req *r) {
    if (!r) return;
    for (int32_t i = 0; r->samples && i < r->sp.n; i++)
        sample_free_buffers(&r->samples[i]);
    di_free(r->samples);
    di_grammar_free(r->grammar);
    di_free(r->grammar_text);
    di_free(r->plp);
    di_free(r->plp_ids);
    di_free(r->plp_vals);
    for (int64_t i = 0; r->stop && i < r->sp.n_stop; i++)
        di_free(r->stop[i]);
    di_free(r->stop);
    di_free(r->stop_ids);
    di_free(r->bias);
    di_free(r->prompt);
    di_free(r->id_str);
    di_free(r);
}

static bool penalties_on(const di_sampling_params *p) {
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

/* Adds id to the penalty history (count += counted); no-op without penalties. */
void eng_history_add(eng_sample *s, int32_t id, int32_t counted) {
    if (!s->h_index) return;
    int32_t k = s->h_index[id];
    if (k < 0) {
        k = (int32_t)s->h_n++;
        s->h_index[id] = k;
        s->h_ids[k] = id;
        s->h_cnt[k] = 0;
    }
    s->h_cnt[k] += counted;
}

static di_status sample_init(di_engine *e, eng_req *r, eng_sample *s, int32_t index) {
    s->req = r;
    s->index = index;
    s->sched_id = -1;
    s->cap = DI_MAX(DI_MIN(r->sp.max_tokens, e->max_model_len), 1);
    s->out = di_malloc((size_t)s->cap * sizeof(int32_t));
    bool ok = s->out != NULL;
    if (ok && r->sp.logprobs >= 0) {
        int64_t N = DI_MAX(r->sp.logprobs, 1);
        s->lp = di_calloc((size_t)s->cap, sizeof *s->lp);
        s->lp_ids = di_malloc((size_t)(s->cap * N) * sizeof(int32_t));
        s->lp_vals = di_malloc((size_t)(s->cap * N) * sizeof(float));
        ok = s->lp && s->lp_ids && s->lp_vals;
    }
    if (ok && penalties_on(&r->sp)) {
        int64_t hn = r->n_prompt + s->cap;
        s->h_ids = di_malloc((size_t)hn * sizeof(int32_t));
        s->h_cnt = di_malloc((size_t)hn * sizeof(int32_t));
        s->h_index = di_malloc((size_t)e->vocab * sizeof(int32_t));
        ok = s->h_ids && s->h_cnt && s->h_index;
        if (ok) {
            memset(s->h_index, 0xff, (size_t)e->vocab * sizeof(int32_t));
            for (int64_t i = 0; i < r->n_prompt; i++)
                eng_history_add(s, r->prompt[i], 0);
        }
    }
    if (ok && r->grammar) {
        ok = di_matcher_create(r->grammar, &s->matcher) == DI_OK;
        if (ok)
            ok =
                (s->allowed = di_malloc((size_t)((e->vocab + 31) / 32) * sizeof(uint32_t))) != NULL;
    }
    if (!ok) return di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory for a request");
    return DI_OK;
}

/* The tokenizer, loaded on first need (caller holds e->lock). */
static di_tokenizer *get_tokenizer(di_engine *e) {
    if (!e->tok && !e->tok_tried) {
        e->tok_tried = true;
        const char *path = e->tokenizer_path ? e->tokenizer_path : e->model->dir;
        if (di_tokenizer_load(path, &e->tok)) e->tok = NULL;
    }
    return e->tok;
}

static uint64_t draw_seed(di_engine *e) {
    uint64_t t = (uint64_t)(di_time_now() * 1e9);
    return mix64(t ^ mix64(++e->seed_counter)) & (uint64_t)INT64_MAX;
}

di_status di_engine_add_request(di_engine *e, const di_engine_request *q) {
    if (!e || !q) return di_error(DI_ERR_INVALID_ARG, "di_engine_add_request: NULL argument");
    di_sampling_params sp = q->sampling ? *q->sampling : di_sampling_default_params();
    di_status st = di_sampling_params_validate(&sp, NULL, 0);
    if (st) return st;
    const bool constrained = sp.grammar || sp.json_schema || sp.regex;
    if ((sp.grammar != NULL) + (sp.json_schema != NULL) + (sp.regex != NULL) > 1)
        return di_error(DI_ERR_INVALID_ARG,
                        "request %llu: give at most one of grammar, json_schema and regex",
                        (unsigned long long)q->id);
    bool need_tok = (!q->prompt_ids && q->prompt_text) || sp.n_stop > 0 || constrained;
    di_tokenizer *tok = NULL;
    if (need_tok) {
        pthread_mutex_lock(&e->lock);
        tok = get_tokenizer(e);
        /* a grammar's token masks walk the vocabulary's byte trie: built once, here */
        if (tok && constrained && !e->vtrie)
            st = di_vocab_trie_build(tok, (int32_t)e->vocab, &e->vtrie);
        pthread_mutex_unlock(&e->lock);
        if (!tok)
            return di_error(DI_ERR_NOT_FOUND,
                            "request %llu: %s needs a tokenizer, and none could be loaded from "
                            "%s (set di_engine_params.tokenizer_path)",
                            (unsigned long long)q->id,
                            constrained     ? "a grammar, JSON schema or regex"
                            : sp.n_stop > 0 ? "stop strings"
                                            : "a text prompt",
                            e->tokenizer_path ? e->tokenizer_path : e->model->dir);
        if (st) return st;
    }

    eng_req *r = di_calloc(1, sizeof *r);
    if (!r) return di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory");
    r->id = q->id;
    if (q->prompt_ids) {
        if (q->n_prompt_ids <= 0) {
            eng_req_free(r);
            return di_error(DI_ERR_INVALID_ARG, "request %llu: empty prompt",
                            (unsigned long long)q->id);
        }
        r->n_prompt = q->n_prompt_ids;
        r->prompt = di_malloc((size_t)r->n_prompt * sizeof(int32_t));
        if (r->prompt) memcpy(r->prompt, q->prompt_ids, (size_t)r->n_prompt * sizeof(int32_t));
    } else if (q->prompt_text) {
        size_t len = strlen(q->prompt_text);
        int64_t n = di_tokenizer_encode(tok, q->prompt_text, len, q->add_special, NULL, 0);
        if (n == DI_TOK_ERROR) {
            eng_req_free(r);
            return DI_ERR_INVALID_ARG;
        }
        int64_t cap = n < 0 ? -n : n;
        r->prompt = di_malloc((size_t)DI_MAX(cap, 1) * sizeof(int32_t));
        if (r->prompt)
            r->n_prompt = di_tokenizer_encode(tok, q->prompt_text, len, q->add_special, r->prompt,
                                              DI_MAX(cap, 1));
        if (r->prompt && r->n_prompt <= 0) {
            eng_req_free(r);
            return di_error(DI_ERR_INVALID_ARG, "request %llu: the prompt text gives no tokens",
                            (unsigned long long)q->id);
        }
    } else {
        eng_req_free(r);
        return di_error(DI_ERR_INVALID_ARG, "request %llu: no prompt", (unsigned long long)q->id);
    }
    if (!r->prompt) {
        eng_req_free(r);
        return di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory");
    }
    for (int64_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->vocab) {
            di_status rs = di_error(DI_ERR_RANGE,
                                    "request %llu: prompt token %d at index %lld is outside the "
                                    "vocabulary [0, %lld)",
                                    (unsigned long long)q->id, r->prompt[i], (long long)i,
                                    (long long)e->vocab);
            eng_req_free(r);
            return rs;
        }

    /* Own copies of the borrowed arrays; the grammar compiled. */
    bool ok = true;
    if (q->id_str) ok = (r->id_str = di_strdup(q->id_str)) != NULL;
    if (ok && constrained) { /* JSON Schema and regex become GBNF first (gbnf_text.h) */
        if (sp.json_schema)
            st = di_json_schema_to_gbnf(sp.json_schema, strlen(sp.json_schema), &r->grammar_text);
        else if (sp.regex)
            st = di_regex_to_gbnf(sp.regex, strlen(sp.regex), &r->grammar_text);
        else
            st = (r->grammar_text = di_strdup(sp.grammar)) ? DI_OK : DI_ERR_OUT_OF_MEMORY;
        if (!st) st = di_grammar_from_gbnf(r->grammar_text, strlen(r->grammar_text), &r->grammar);
        if (st) {
            st = di_error_prefix(st, "request %llu", (unsigned long long)q->id);
            eng_req_free(r);
            return st;
        }
        /* the request keeps the grammar it runs (the caller's strings are borrowed) */
        sp.grammar = r->grammar_text, sp.json_schema = NULL, sp.regex = NULL;
    }
    if (ok && sp.n_stop > 0) {
        r->stop = di_calloc((size_t)sp.n_stop, sizeof *r->stop);
        ok = r->stop != NULL;
        for (int64_t i = 0; ok && i < sp.n_stop; i++) {
            ok = (r->stop[i] = di_strdup(sp.stop[i])) != NULL;
            if (ok) r->max_stop_len = DI_MAX(r->max_stop_len, (int64_t)strlen(sp.stop[i]));
        }
        sp.stop = (const char *const *)r->stop;
    }
    if (ok && sp.n_stop_token_ids > 0) {
        r->stop_ids = di_malloc((size_t)sp.n_stop_token_ids * sizeof(int32_t));
        ok = r->stop_ids != NULL;
        if (ok)
            memcpy(r->stop_ids, sp.stop_token_ids, (size_t)sp.n_stop_token_ids * sizeof(int32_t));
        sp.stop_token_ids = r->stop_ids;
    }
    if (ok && sp.n_logit_bias > 0) {
        r->bias = di_malloc((size_t)sp.n_logit_bias * sizeof *r->bias);
        ok = r->bias != NULL;
        if (ok) memcpy(r->bias, sp.logit_bias, (size_t)sp.n_logit_bias * sizeof *r->bias);
        sp.logit_bias = r->bias;
    }
    if (ok && sp.prompt_logprobs >= 0) {
        int64_t n = DI_MAX(r->n_prompt - 1, 1), N = DI_MAX(sp.prompt_logprobs, 1);
        r->plp = di_calloc((size_t)n, sizeof *r->plp);
        r->plp_ids = di_malloc((size_t)(n * N) * sizeof(int32_t));
        r->plp_vals = di_malloc((size_t)(n * N) * sizeof(float));
        ok = r->plp && r->plp_ids && r->plp_vals;
    }
    r->sp = sp;
    if (ok) ok = (r->samples = di_calloc((size_t)sp.n, sizeof *r->samples)) != NULL;
    st = ok ? DI_OK : di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory");
    for (int32_t i = 0; !st && i < sp.n; i++)
        st = sample_init(e, r, &r->samples[i], i);
    for (int64_t i = 0; !st && i < sp.n_stop_token_ids; i++)
        if (sp.stop_token_ids[i] < 0 || sp.stop_token_ids[i] >= e->vocab)
            st = di_error(DI_ERR_RANGE,
                          "request %llu: stop_token_ids[%lld] = %d is outside the "
                          "vocabulary",
                          (unsigned long long)q->id, (long long)i, sp.stop_token_ids[i]);
    if (st) {
        eng_req_free(r);
        return st;
    }

    pthread_mutex_lock(&e->lock);
    if (eng_map_get(&e->map, q->id)) {
        pthread_mutex_unlock(&e->lock);
        eng_req_free(r);
        return di_error(DI_ERR_INVALID_ARG, "request %llu: an unfinished request has that id",
                        (unsigned long long)q->id);
    }
    if (r->sp.seed < 0) r->sp.seed = (int64_t)draw_seed(e);
    st = eng_map_put(&e->map, q->id, r);
    if (!st) {
        if (e->inbox_tail)
            e->inbox_tail->next = r;
        else
            e->inbox_head = r;
        e->inbox_tail = r;
        e->n_inbox++;
    }
    pthread_mutex_unlock(&e->lock);
    if (st) eng_req_free(r);
    return st;
}

di_status di_engine_abort(di_engine *e, uint64_t id) {
    if (!e) return di_error(DI_ERR_INVALID_ARG, "di_engine_abort: NULL engine");
    di_status st = DI_OK;
    pthread_mutex_lock(&e->lock);
    if (!eng_map_get(&e->map, id)) {
        st = di_error(DI_ERR_NOT_FOUND, "di_engine_abort: no unfinished request has id %llu",
                      (unsigned long long)id);
    } else {
        if (e->n_aborts == e->cap_aborts) {
            int64_t cap = e->cap_aborts ? 2 * e->cap_aborts : 16;
            uint64_t *a = di_realloc(e->aborts, (size_t)cap * sizeof *a);
            if (!a)
                st = di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory");
            else
                e->aborts = a, e->cap_aborts = cap;
        }
        if (!st) e->aborts[e->n_aborts++] = id;
    }
    pthread_mutex_unlock(&e->lock);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Into the scheduler                                                                         */
/* ---------------------------------------------------------------------------------------- */

void eng_mark_dirty(di_engine *e, eng_sample *s) {
    if (s->dirty) return;
    if (e->n_dirty == e->cap_dirty) {
        int64_t cap = e->cap_dirty ? 2 * e->cap_dirty : 64;
        eng_sample **d = di_realloc(e->dirty, (size_t)cap * sizeof *d);
        if (!d) return; /* reported at the next chance */
        e->dirty = d, e->cap_dirty = cap;
    }
    e->dirty[e->n_dirty++] = s;
    s->dirty = true;
}

/* Adds one sample to the scheduler under a fresh scheduler id. */
static void sched_add_sample(di_engine *e, eng_sample *s) {
    if (e->n_sid == e->cap_sid) {
        int64_t cap = e->cap_sid ? 2 * e->cap_sid : 256;
        eng_sample **b = di_realloc(e->by_sid, (size_t)cap * sizeof *b);
        if (!b) {
            eng_finish_sample(e, s, DI_ENGINE_FINISH_ERROR, "engine: out of memory");
            return;
        }
        e->by_sid = b, e->cap_sid = cap;
    }
    int64_t sid = e->n_sid;
    di_sched_req_params rp = di_sched_params_from_sampling(&s->req->sp);
    rp.max_tokens = s->cap;
    rp.prompt_logprobs = s->req->plp && s->index == 0; /* the others share sample 0's */
    di_status st = di_sched_add(e->sched, sid, s->req->prompt, s->req->n_prompt, &rp);
    if (st) {
        eng_finish_sample(e, s, DI_ENGINE_FINISH_ERROR, di_last_error());
        return;
    }
    e->by_sid[e->n_sid++] = s;
    s->sched_id = sid;
}

/* Completions 1.. join once completion 0's prompt blocks are in the prefix cache, and its
 * prompt logprobs (which every completion's first output carries) are complete. */
void eng_maybe_add_children(di_engine *e, eng_req *r) {
    if (r->children_added) return;
    eng_sample *s0 = &r->samples[0];
    bool wait = e->p.enable_prefix_cache || r->plp;
    if (wait && s0->n_out < 1 && !s0->finished) return;
    r->children_added = true;
    for (int32_t i = 1; i < r->sp.n; i++)
        if (!r->samples[i].finished) sched_add_sample(e, &r->samples[i]);
}

static void abort_req(di_engine *e, eng_req *r) {
    r->abort_requested = true;
    r->children_added = true; /* children not yet added never will be */
    for (int32_t i = 0; i < r->sp.n; i++) {
        eng_sample *s = &r->samples[i];
        if (s->finished) continue;
        if (s->sched_id >= 0)
            di_sched_abort(e->sched, s->sched_id);
        else
            eng_finish_sample(e, s, DI_ENGINE_FINISH_ABORT, "");
    }
}

di_status eng_drain_inbox(di_engine *e) {
    pthread_mutex_lock(&e->lock);
    eng_req *head = e->inbox_head;
    e->inbox_head = e->inbox_tail = NULL;
    e->n_inbox = 0;
    for (eng_req *r = head; r; r = r->next) {
        if (e->tok)
            for (int32_t i = 0; i < r->sp.n; i++)
                if (di_detok_create(e->tok, true, &r->samples[i].detok)) r->samples[i].detok = NULL;
        e->n_live_samples += r->sp.n;
    }
    /* Aborts resolve to requests under the lock (the map is shared with adders). */
    eng_req *ab[64];
    int64_t n_ab = 0;
    for (int64_t i = 0; i < e->n_aborts && n_ab < 64; i++) {
        eng_req *r = eng_map_get(&e->map, e->aborts[i]);
        if (r) ab[n_ab++] = r;
    }
    /* Aborts beyond 64 wait for the next step. */
    int64_t left = e->n_aborts - DI_MIN(e->n_aborts, 64);
    memmove(e->aborts, e->aborts + (e->n_aborts - left), (size_t)left * sizeof *e->aborts);
    e->n_aborts = left;
    pthread_mutex_unlock(&e->lock);

    for (eng_req *r = head, *next; r; r = next) {
        next = r->next;
        r->next = NULL;
        sched_add_sample(e, &r->samples[0]);
        eng_maybe_add_children(e, r);
    }
    for (int64_t i = 0; i < n_ab; i++)
        if (!ab[i]->abort_requested) abort_req(e, ab[i]);
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Sampling one row                                                                           */
/* ---------------------------------------------------------------------------------------- */

/* The sampler's input for seq q's sampled row (h receives the history view). */
static di_sample_input sample_input(const di_engine *e, const di_sched_seq *q, const eng_sample *s,
                                    const float *logits, di_token_counts *h) {
    const eng_req *r = s->req;
    int64_t position = q->start + q->n_tokens;
    *h = (di_token_counts){
        .ids = s->h_ids, .output_count = s->h_cnt, .n = s->h_n, .n_output = position - r->n_prompt};
    return (di_sample_input){.logits = logits,
                             .vocab = e->vocab,
                             .history = h,
                             .eos_token_id = e->eos,
                             .seed = r->sp.seed,
                             .sample_index = s->index,
                             .position = position};
}

void eng_device_sample(const di_engine *e, const di_sched_seq *q, di_batch_seq *bs) {
    bs->device_draw = false;
    eng_sample *s = q->req_id < e->n_sid ? e->by_sid[q->req_id] : NULL;
    if (!s || s->finished || q->n_logits != 1 || q->n_logit_rows != 1) return;
    if (s->matcher) return; /* the grammar's mask is applied on the host */
    di_token_counts h;
    di_sample_input in = sample_input(e, q, s, NULL, &h);
    bs->device_draw = di_sampler_device_draw(&s->req->sp, &in);
    bs->sample = di_sample_row_of(&s->req->sp, in.seed, in.sample_index, in.position);
}

void eng_sample_row(di_engine *e, const di_sched_seq *q, int32_t row, const float *logits,
                    int32_t token, void *scratch) {
    eng_sample *s = q->req_id < e->n_sid ? e->by_sid[q->req_id] : NULL;
    e->sampled[row] = 0;
    e->row_ok[row] = false;
    if (!s || s->finished) return; /* a row of a request that ended meanwhile */
    if (token >= 0) { /* the sampler's token for the row, found on the device (no logprobs) */
        memset(&e->results[row], 0, sizeof e->results[row]);
        e->results[row].token = token;
        e->sampled[row] = token;
        e->row_ok[row] = true;
        return;
    }
    di_token_counts h;
    di_sample_input in = sample_input(e, q, s, logits, &h);
    s->row_error = NULL;
    if (s->matcher) {
        if (di_matcher_mask(s->matcher, e->vtrie, e->eos, s->allowed, e->vocab) != DI_OK) {
            s->row_error = "grammar: out of memory computing the token mask";
            return;
        }
        in.allowed = s->allowed;
    }
    di_status st = di_sampler_sample(&s->req->sp, &in, scratch, &e->results[row]);
    if (st != DI_OK && s->matcher)
        s->row_error = "grammar: no token the grammar allows can follow here (every allowed "
                       "token is masked, e.g. EOS by min_tokens)";
    if (st == DI_OK && e->results[row].token >= 0) {
        e->sampled[row] = e->results[row].token;
        e->row_ok[row] = true;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Prompt logprobs                                                                            */
/* ---------------------------------------------------------------------------------------- */

/* The row of position p gives prompt token p + 1 its logprob (vLLM: from the raw logits, as
 * the sampler's logprobs). Rows past the prompt's last token have nothing to give. */
void eng_prompt_logprobs(di_engine *e, const di_sched_seq *q, const float *rows) {
    eng_sample *s = q->req_id < e->n_sid ? e->by_sid[q->req_id] : NULL;
    if (!s || s->finished || !s->req->plp) return;
    eng_req *r = s->req;
    int32_t n_top = r->sp.prompt_logprobs;
    int64_t N = DI_MAX(n_top, 1), first = q->start + q->n_tokens - q->n_logit_rows;
    for (int64_t j = 0; j < q->n_logit_rows; j++) {
        int64_t p = first + j;
        if (p + 1 >= r->n_prompt) break;
        di_sample_result res;
        di_engine_logprobs *l = &r->plp[p];
        l->token = r->prompt[p + 1];
        l->top_ids = r->plp_ids + p * N;
        l->top_logprobs = r->plp_vals + p * N;
        if (di_sampler_token_logprobs(rows + j * e->vocab, e->vocab, l->token, n_top, e->sscratch,
                                      &res) != DI_OK) {
            l->logprob = NAN; /* the row holds NaN or +inf */
            l->n_top = 0;
        } else {
            l->logprob = res.logprob;
            l->n_top = res.n_top;
            memcpy(r->plp_ids + p * N, res.top_ids, (size_t)res.n_top * sizeof(int32_t));
            memcpy(r->plp_vals + p * N, res.top_logprobs, (size_t)res.n_top * sizeof(float));
        }
        r->plp_filled = DI_MAX(r->plp_filled, p + 1);
    }
}
