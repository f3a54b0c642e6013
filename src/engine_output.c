/*
 * engine_output.c -- turns the scheduler's results into the engine's outputs: appended
 * tokens with their logprobs, the penalty history, streamed text with stop strings, finish
 * reasons and usage; then returns them to the caller and frees what was returned.
 *
 * Design stance:
 *   - The scheduler's token array is the truth: after each postprocess the engine appends
 *     whatever the scheduler appended (di_sched_get), so preemption, recompute and the
 *     overlap loop's dropped rows need no special cases here.
 *   - Stop strings are matched on the detokenized text across token boundaries: text that
 *     could be the start of a stop string is held back until it cannot be (whole UTF-8
 *     characters only); a match cuts the text before the stop string (vLLM's
 *     include_stop_str_in_output = false) and finishes the request with reason "stop".
 *   - Output records point into the samples' own arrays, which live until the next step, so
 *     returning them copies nothing.
 *   - A finished scheduler request is released only once no pending batch can still hold a
 *     row of it (two generations of the release list: the overlap loop has one batch in
 *     flight).
 */
#include "engine_internal.h"

#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Results -> outputs                                                                         */
/* ---------------------------------------------------------------------------------------- */

static bool text_reserve(eng_sample *s, int64_t extra) {
    if (s->text_len + extra <= s->text_cap) return true;
    int64_t cap = DI_MAX(2 * s->text_cap, s->text_len + extra + 64);
    char *t = di_realloc(s->text, (size_t)cap);
    if (!t) return false;
    s->text = t, s->text_cap = cap;
    return true;
}

static void text_append_detok(eng_sample *s, int32_t id, bool flush) {
    if (!s->detok) return;
    for (int64_t want = 64;;) {
        if (!text_reserve(s, want)) return;
        int64_t n =
            flush ? di_detok_flush(s->detok, s->text + s->text_len, s->text_cap - s->text_len)
                  : di_detok_push(s->detok, id, s->text + s->text_len, s->text_cap - s->text_len);
        if (n == DI_TOK_ERROR) return;
        if (n >= 0) {
            s->text_len += n;
            return;
        }
        want = -n;
    }
}

void eng_finish_sample(di_engine *e, eng_sample *s, di_engine_finish reason, const char *err) {
    if (s->finished) return;
    s->finished = true;
    s->reason = reason;
    snprintf(s->error, sizeof s->error, "%s", err ? err : "");
    if (!s->cut) text_append_detok(s, 0, true); /* not cut by a stop string: flush */
    s->emit = s->text_len;
    eng_mark_dirty(e, s);
}

/* Looks for a stop string ending in the text appended after `from`; cuts the text there. */
static bool match_stop(eng_sample *s, int64_t from) {
    const eng_req *r = s->req;
    int64_t start = DI_MAX(0, from - (r->max_stop_len - 1)), best = -1;
    for (int64_t k = 0; k < r->sp.n_stop; k++) {
        size_t L = strlen(r->stop[k]);
        if (L == 0) continue;
        for (int64_t i = start; i + (int64_t)L <= s->text_len; i++)
            if (memcmp(s->text + i, r->stop[k], L) == 0) {
                if (best < 0 || i < best) best = i;
                break;
            }
    }
    if (best < 0) return false;
    s->text_len = best;
    s->emit = best;
    s->cut = true;
    return true;
}

/* A stop string matched, or the grammar is complete: the sample ends with "stop". */
static void finish_stop(di_engine *e, eng_sample *s) {
    di_sched_finish(e->sched, s->sched_id, DI_FINISH_STOP);
    eng_finish_sample(e, s, DI_ENGINE_FINISH_STOP, "");
}

/* Appends one token the scheduler accepted: logprobs, penalty history, text, stop strings. */
static void append_token(di_engine *e, eng_sample *s, int32_t tok, const di_sample_result *res) {
    if (s->n_out >= s->cap) return;
    const eng_req *r = s->req;
    int64_t k = s->n_out;
    s->out[k] = tok;
    if (s->lp) {
        int64_t N = DI_MAX(r->sp.logprobs, 1);
        di_engine_logprobs *l = &s->lp[k];
        l->token = tok;
        l->logprob = res ? res->logprob : 0.0f;
        l->n_top = res ? res->n_top : 0;
        l->top_ids = s->lp_ids + k * N;
        l->top_logprobs = s->lp_vals + k * N;
        for (int32_t j = 0; j < l->n_top; j++) {
            s->lp_ids[k * N + j] = res->top_ids[j];
            s->lp_vals[k * N + j] = res->top_logprobs[j];
        }
    }
    s->n_out++;
    eng_history_add(s, tok, 1);
    e->stats.n_generated_tokens++;
    eng_mark_dirty(e, s);
    if (s->matcher && tok != e->eos) { /* the grammar moves on by the token's bytes */
        size_t n = 0;
        const char *bytes = di_tokenizer_id_bytes(e->tok, tok, &n); /* a matcher has e->tok */
        if (!bytes || !di_matcher_accept(s->matcher, bytes, n)) {   /* the mask allowed it: OOM */
            di_sched_finish(e->sched, s->sched_id, DI_FINISH_ERROR);
            eng_finish_sample(e, s, DI_ENGINE_FINISH_ERROR,
                              "grammar: the matcher could not take the sampled token");
            return;
        }
    }
    if (s->detok) {
        int64_t before = s->text_len;
        text_append_detok(s, tok, false);
        if (r->sp.n_stop > 0 && s->n_out >= r->sp.min_tokens && match_stop(s, before)) {
            finish_stop(e, s);
            return;
        }
    }
    if (s->matcher && di_matcher_done(s->matcher)) { /* nothing can follow */
        finish_stop(e, s);
        return;
    }
    if (!s->detok) return;
    /* Hold back what could still become a stop string; release whole characters only. */
    int64_t emit = r->sp.n_stop > 0 ? s->text_len - (r->max_stop_len - 1) : s->text_len;
    while (emit > s->emit && emit < s->text_len && ((unsigned char)s->text[emit] & 0xC0) == 0x80)
        emit--;
    if (emit > s->emit) s->emit = emit;
}

static di_engine_finish map_reason(di_finish_reason r) {
    switch (r) {
    case DI_FINISH_STOP:
        return DI_ENGINE_FINISH_STOP;
    case DI_FINISH_LENGTH:
        return DI_ENGINE_FINISH_LENGTH;
    case DI_FINISH_ABORT:
        return DI_ENGINE_FINISH_ABORT;
    case DI_FINISH_ERROR:
        return DI_ENGINE_FINISH_ERROR;
    default:
        return DI_ENGINE_FINISH_NONE;
    }
}

static void queue_release(di_engine *e, int64_t sid) {
    if (e->n_rel_new == e->cap_rel) {
        int64_t cap = e->cap_rel ? 2 * e->cap_rel : 64;
        int64_t *a = di_realloc(e->rel_old, (size_t)cap * sizeof *a);
        if (a) e->rel_old = a;
        int64_t *b = a ? di_realloc(e->rel_new, (size_t)cap * sizeof *b) : NULL;
        if (b) e->rel_new = b;
        if (!a || !b) return; /* the request stays in the scheduler: a leak, not an error */
        e->cap_rel = cap;
    }
    e->rel_new[e->n_rel_new++] = sid;
}

di_status eng_after_postprocess(di_engine *e, const eng_batch *b) {
    const di_sched_batch *sb = b ? b->sb : NULL;
    for (int32_t i = 0; sb && i < sb->n_seqs; i++) {
        const di_sched_seq *q = &sb->seqs[i];
        if (q->n_logits != 1) continue;
        eng_sample *s = q->req_id < e->n_sid ? e->by_sid[q->req_id] : NULL;
        if (!s || s->finished) continue;
        di_sched_req_info info;
        if (di_sched_get(e->sched, s->sched_id, &info)) continue;
        s->cached_tokens = info.n_cached_tokens;
        if (info.n_output > s->n_out && !e->row_ok[i]) {
            di_sched_finish(e->sched, s->sched_id, DI_FINISH_ERROR);
            eng_finish_sample(e, s, DI_ENGINE_FINISH_ERROR,
                              s->row_error ? s->row_error
                                           : "the model produced logits the sampler cannot use "
                                             "(NaN or +inf)");
            continue;
        }
        while (s->n_out < info.n_output && !s->finished)
            append_token(e, s, info.output[s->n_out],
                         s->n_out + 1 == info.n_output ? &e->results[i] : NULL);
        if (s->index == 0) eng_maybe_add_children(e, s->req);
    }

    /* Finished scheduler requests (stop, length, abort, error, or never runnable). */
    int64_t n = di_sched_finished(e->sched, e->fin_ids, e->cap_fin);
    if (n < 0) {
        int64_t cap = DI_MAX(-n, 2 * e->cap_fin);
        int64_t *f = di_realloc(e->fin_ids, (size_t)cap * sizeof *f);
        if (!f) return di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory");
        e->fin_ids = f, e->cap_fin = cap;
        n = di_sched_finished(e->sched, e->fin_ids, e->cap_fin);
    }
    for (int64_t k = 0; k < n; k++) {
        int64_t sid = e->fin_ids[k];
        eng_sample *s = sid < e->n_sid ? e->by_sid[sid] : NULL;
        if (s && s->sched_done) continue;
        if (s) {
            di_sched_req_info info;
            if (!di_sched_get(e->sched, sid, &info)) {
                while (s->n_out < info.n_output && !s->finished)
                    append_token(e, s, info.output[s->n_out], NULL);
                s->cached_tokens = info.n_cached_tokens;
                eng_finish_sample(e, s, map_reason(info.finish_reason), info.error);
            }
            s->sched_done = true;
            if (s->index == 0) eng_maybe_add_children(e, s->req);
        }
        queue_release(e, sid);
    }
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Delivery and release                                                                       */
/* ---------------------------------------------------------------------------------------- */

int64_t eng_deliver(di_engine *e, di_engine_output *out, int64_t cap) {
    int64_t k = 0;
    while (e->dirty_head < e->n_dirty && k < cap) {
        eng_sample *s = e->dirty[e->dirty_head++];
        const eng_req *r = s->req;
        di_engine_output *o = &out[k++];
        memset(o, 0, sizeof *o);
        o->id = r->id;
        o->id_str = r->id_str;
        o->sample_index = s->index;
        o->seed = r->sp.seed;
        o->tokens = s->out + s->delivered;
        o->n_tokens = s->n_out - s->delivered;
        if (s->detok) {
            o->text = s->text ? s->text + s->text_delivered : "";
            o->text_len = s->emit - s->text_delivered;
            s->text_delivered = s->emit;
        }
        o->logprobs = s->lp ? s->lp + s->delivered : NULL;
        if (r->plp && !s->plp_sent) { /* complete unless the request ended before its prefill */
            s->plp_sent = true;
            if (r->plp_filled >= r->n_prompt - 1) {
                o->prompt_logprobs = r->plp;
                o->n_prompt_logprobs = r->n_prompt - 1;
            }
        }
        o->finished = s->finished;
        o->finish_reason = s->finished ? s->reason : DI_ENGINE_FINISH_NONE;
        o->error = s->reason == DI_ENGINE_FINISH_ERROR ? s->error : "";
        o->usage.prompt_tokens = r->n_prompt;
        o->usage.completion_tokens = s->n_out;
        o->usage.cached_tokens = s->cached_tokens;
        s->delivered = s->n_out;
        s->dirty = false;
        if (s->finished && !s->final_delivered) {
            s->final_delivered = true;
            e->n_live_samples--;
            if (++s->req->n_final == s->req->sp.n) { /* the caller may reuse the id now */
                pthread_mutex_lock(&e->lock);
                eng_map_del(&e->map, r->id);
                pthread_mutex_unlock(&e->lock);
            }
            if (e->n_release == e->cap_release) {
                int64_t c = e->cap_release ? 2 * e->cap_release : 64;
                eng_sample **a = di_realloc(e->to_release, (size_t)c * sizeof *a);
                if (a) e->to_release = a, e->cap_release = c;
            }
            if (e->n_release < e->cap_release) e->to_release[e->n_release++] = s;
        }
    }
    if (e->dirty_head == e->n_dirty) e->dirty_head = e->n_dirty = 0;
    return k;
}

void eng_release_delivered(di_engine *e) {
    for (int64_t i = 0; i < e->n_release; i++) {
        eng_sample *s = e->to_release[i];
        eng_req *r = s->req;
        if (s->sched_id >= 0 && s->sched_id < e->n_sid) e->by_sid[s->sched_id] = NULL;
        if (++r->n_released == r->sp.n) eng_req_free(r);
    }
    e->n_release = 0;
}
