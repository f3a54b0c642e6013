/*
 * sched.c -- request records and their life outside the batch decision: adding, the stop
 * checks of postprocess, abort, queries and the integrity check. The step's batch decision
 * and preemption live in sched_step.c.
 *
 * Requests are found by id with a linear scan of the live list; the engine keeps that list
 * short by releasing finished requests once their output is taken.
 */
#include "sched/sched_internal.h"

#include <stdio.h>
#include <string.h>

di_sched_config di_sched_default_config(void) {
    di_sched_config c = {0};
    c.block_size = 16;
    c.n_blocks = 1024;
    c.max_batch_tokens = 2048;
    c.max_prefill_tokens = 0;
    c.max_running = 64;
    c.max_model_len = 4096;
    c.eos_token_id = -1;
    c.enable_prefix_cache = true;
    c.replay_tokens = 0;
    c.max_prompt_logits = 64;
    return c;
}

const char *di_finish_reason_str(di_finish_reason r) {
    switch (r) {
    case DI_FINISH_NONE:
        return "none";
    case DI_FINISH_STOP:
        return "stop";
    case DI_FINISH_LENGTH:
        return "length";
    case DI_FINISH_ABORT:
        return "abort";
    case DI_FINISH_ERROR:
        return "error";
    }
    return "?";
}

/* ---------------------------------------------------------------------------------------- */
/* Small helpers shared with sched_step.c                                                     */
/* ---------------------------------------------------------------------------------------- */

int64_t di_sched_blocks_for(const di_sched *s, int64_t n_tokens) {
    return (n_tokens + s->cfg.block_size - 1) / s->cfg.block_size;
}

di_sched_req *di_sched_waiting_at(const di_sched *s, int64_t i) {
    return s->waiting[(s->wait_head + i) % s->wait_cap];
}

void di_sched_waiting_push_front(di_sched *s, di_sched_req *r) {
    s->wait_head = (s->wait_head + s->wait_cap - 1) % s->wait_cap;
    s->waiting[s->wait_head] = r;
    s->n_waiting++;
}

void di_sched_waiting_remove(di_sched *s, int64_t i) {
    for (int64_t j = i; j + 1 < s->n_waiting; j++)
        s->waiting[(s->wait_head + j) % s->wait_cap] = di_sched_waiting_at(s, j + 1);
    s->n_waiting--;
}

/* Frees the request's blocks, last first, so that the LRU list evicts a sequence's tail
 * before its head (heads are the blocks other requests are likely to share), and forgets
 * what it had in flight. */
void di_sched_release_blocks(di_sched *s, di_sched_req *r) {
    for (int64_t i = r->n_blocks - 1; i >= 0; i--)
        di_block_pool_unref(&s->pool, r->blocks[i]);
    r->n_blocks = 0;
    r->n_hit_blocks = 0;
    r->n_registered = 0;
    r->chain = di_prefix_chain_root();
    r->n_computed = 0;
    r->n_pending = 0;
    r->n_future = 0;
    r->epoch++; /* rows of batches still in flight no longer apply */
    r->replay_end = 0;
    if (r->slot >= 0) s->free_slots[s->n_free_slots++] = r->slot;
    r->slot = -1;
}

void di_sched_remove_running(di_sched *s, di_sched_req *r) {
    int32_t i = 0;
    while (i < s->n_running && s->running[i] != r)
        i++;
    if (i == s->n_running) return;
    memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof r);
    s->n_running--;
}

static di_sched_req *find_req(const di_sched *s, int64_t id) {
    for (int64_t i = 0; i < s->n_reqs; i++)
        if (s->reqs[i]->id == id) return s->reqs[i];
    return NULL;
}

static void req_free(di_sched_req *r) {
    if (!r) return;
    di_free(r->tokens);
    di_free(r->blocks);
    di_free(r->stop_ids);
    di_free(r);
}

/* ---------------------------------------------------------------------------------------- */
/* Life cycle                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static di_status check_config(const di_sched_config *c) {
    if (c->block_size <= 0 || c->n_blocks <= 0 || c->max_running <= 0 || c->max_model_len <= 1)
        return di_error(DI_ERR_INVALID_ARG,
                        "scheduler: block_size (%d), n_blocks (%d), "
                        "max_running (%d) must be positive and max_model_len (%lld) > 1",
                        (int)c->block_size, (int)c->n_blocks, (int)c->max_running,
                        (long long)c->max_model_len);
    if (c->max_batch_tokens < c->max_running)
        return di_error(DI_ERR_INVALID_ARG,
                        "scheduler: max_batch_tokens (%lld) must be at least "
                        "max_running (%d) so that every running sequence can decode each step",
                        (long long)c->max_batch_tokens, (int)c->max_running);
    if (c->max_prefill_tokens > c->max_batch_tokens)
        return di_error(DI_ERR_INVALID_ARG,
                        "scheduler: max_prefill_tokens (%lld) exceeds max_batch_tokens (%lld)",
                        (long long)c->max_prefill_tokens, (long long)c->max_batch_tokens);
    if ((int64_t)c->n_blocks * c->block_size < c->max_model_len)
        return di_error(DI_ERR_INVALID_ARG,
                        "scheduler: %d KV blocks of %d tokens cannot hold "
                        "one sequence of max_model_len %lld tokens",
                        (int)c->n_blocks, (int)c->block_size, (long long)c->max_model_len);
    if (c->replay_tokens < 0)
        return di_error(DI_ERR_INVALID_ARG, "scheduler: replay_tokens must be >= 0");
    return DI_OK;
}

di_status di_sched_create(const di_sched_config *cfg, di_sched **out) {
    *out = NULL;
    di_status st = check_config(cfg);
    if (st != DI_OK) return st;
    di_sched *s = di_calloc(1, sizeof *s);
    if (!s) return di_error(DI_ERR_OUT_OF_MEMORY, "scheduler: no memory");
    s->cfg = *cfg;
    if (s->cfg.max_prefill_tokens <= 0) s->cfg.max_prefill_tokens = s->cfg.max_batch_tokens;
    st = di_block_pool_init(&s->pool, cfg->n_blocks, cfg->block_size);
    if (st == DI_OK && cfg->enable_prefix_cache) st = di_prefix_cache_init(&s->pc, &s->pool);
    if (st != DI_OK) {
        di_sched_free(s);
        return st;
    }
    size_t n_run = (size_t)cfg->max_running;
    s->running = di_calloc(n_run, sizeof *s->running);
    s->free_slots = di_calloc(n_run, sizeof *s->free_slots);
    bool ok = true;
    for (int k = 0; k < 2; k++) {
        di_sched_pending *pb = &s->bufs[k];
        pb->seqs = di_calloc(n_run, sizeof *pb->seqs);
        pb->reqs = di_calloc(n_run, sizeof *pb->reqs);
        pb->epochs = di_calloc(n_run, sizeof *pb->epochs);
        pb->is_decode = di_calloc(n_run, sizeof *pb->is_decode);
        pb->batch.seqs = pb->seqs;
        ok = ok && pb->seqs && pb->reqs && pb->epochs && pb->is_decode;
    }
    s->sampled = di_calloc(n_run, sizeof *s->sampled);
    s->match_scratch =
        di_calloc((size_t)di_sched_blocks_for(s, cfg->max_model_len), sizeof *s->match_scratch);
    if (!ok || !s->running || !s->free_slots || !s->sampled || !s->match_scratch) {
        di_sched_free(s);
        return di_error(DI_ERR_OUT_OF_MEMORY, "scheduler: no memory for %d running sequences",
                        (int)cfg->max_running);
    }
    for (int32_t i = 0; i < cfg->max_running; i++)
        s->free_slots[i] = cfg->max_running - 1 - i;
    s->n_free_slots = cfg->max_running;
    *out = s;
    return DI_OK;
}

void di_sched_free(di_sched *s) {
    if (!s) return;
    for (int64_t i = 0; i < s->n_reqs; i++)
        req_free(s->reqs[i]);
    di_free(s->reqs);
    di_free(s->running);
    di_free(s->waiting);
    di_free(s->free_slots);
    for (int k = 0; k < 2; k++) {
        di_free(s->bufs[k].seqs);
        di_free(s->bufs[k].reqs);
        di_free(s->bufs[k].epochs);
        di_free(s->bufs[k].is_decode);
    }
    di_free(s->sampled);
    di_free(s->match_scratch);
    if (s->cfg.enable_prefix_cache) di_prefix_cache_free(&s->pc);
    di_block_pool_free(&s->pool);
    di_free(s);
}

/* ---------------------------------------------------------------------------------------- */
/* Adding, finishing, releasing                                                               */
/* ---------------------------------------------------------------------------------------- */

/* Makes room for one more request in the live list and the waiting ring. */
static di_status reserve_request_room(di_sched *s) {
    if (s->n_reqs < s->reqs_cap) return DI_OK;
    int64_t cap = s->reqs_cap ? 2 * s->reqs_cap : 16;
    di_sched_req **reqs = di_realloc(s->reqs, (size_t)cap * sizeof *reqs);
    if (!reqs)
        return di_error(DI_ERR_OUT_OF_MEMORY, "scheduler: no memory for %lld requests",
                        (long long)cap);
    s->reqs = reqs;
    di_sched_req **w = di_malloc((size_t)cap * sizeof *w);
    if (!w) return di_error(DI_ERR_OUT_OF_MEMORY, "scheduler: no memory for the queue");
    for (int64_t i = 0; i < s->n_waiting; i++)
        w[i] = di_sched_waiting_at(s, i);
    di_free(s->waiting);
    s->waiting = w;
    s->wait_head = 0;
    s->wait_cap = cap;
    s->reqs_cap = cap;
    return DI_OK;
}

void di_sched_finish_now(di_sched *s, di_sched_req *r, di_finish_reason reason) {
    if (r->state == DI_REQ_PREFILL || r->state == DI_REQ_DECODE) {
        di_sched_remove_running(s, r);
        di_sched_release_blocks(s, r);
    } else if (r->state == DI_REQ_WAITING || r->state == DI_REQ_PREEMPTED) {
        for (int64_t i = 0; i < s->n_waiting; i++) {
            if (di_sched_waiting_at(s, i) == r) {
                di_sched_waiting_remove(s, i);
                break;
            }
        }
    }
    r->state = DI_REQ_FINISHED;
    r->finish_reason = reason;
    r->finish_deferred = DI_FINISH_NONE;
}

di_status di_sched_add(di_sched *s, int64_t id, const int32_t *prompt, int64_t n_prompt,
                       const di_sched_req_params *p) {
    if (!p) return di_error(DI_ERR_INVALID_ARG, "request %lld: no parameters", (long long)id);
    if (!prompt || n_prompt <= 0)
        return di_error(DI_ERR_INVALID_ARG, "request %lld: the prompt is empty", (long long)id);
    if (p->max_tokens < 1)
        return di_error(DI_ERR_INVALID_ARG, "request %lld: max_tokens must be >= 1, got %lld",
                        (long long)id, (long long)p->max_tokens);
    if (p->n_stop_token_ids < 0 || (p->n_stop_token_ids > 0 && !p->stop_token_ids))
        return di_error(DI_ERR_INVALID_ARG, "request %lld: bad stop_token_ids", (long long)id);
    if (p->prompt_logprobs && s->cfg.max_prompt_logits < 1)
        return di_error(DI_ERR_UNSUPPORTED, "request %lld: prompt logprobs need max_prompt_logits",
                        (long long)id);
    if (find_req(s, id))
        return di_error(DI_ERR_INVALID_ARG, "request %lld: the id is already in use",
                        (long long)id);
    di_status st = reserve_request_room(s);
    if (st != DI_OK) return st;

    di_sched_req *r = di_calloc(1, sizeof *r);
    if (!r) return di_error(DI_ERR_OUT_OF_MEMORY, "request %lld: no memory", (long long)id);
    r->id = id;
    r->n_prompt = n_prompt;
    r->max_tokens = p->max_tokens;
    r->min_tokens = p->min_tokens;
    r->ignore_eos = p->ignore_eos;
    r->plp_end = p->prompt_logprobs ? n_prompt - 1 : 0;
    r->slot = -1;
    r->chain = di_prefix_chain_root();
    bool fits = n_prompt < s->cfg.max_model_len;
    r->cap = fits ? n_prompt + DI_MIN(p->max_tokens, s->cfg.max_model_len - n_prompt) : n_prompt;
    r->max_blocks = di_sched_blocks_for(s, r->cap);
    r->tokens = di_malloc((size_t)r->cap * sizeof *r->tokens);
    r->blocks = di_malloc((size_t)r->max_blocks * sizeof *r->blocks);
    r->n_stop = p->n_stop_token_ids;
    r->stop_ids = di_malloc((size_t)(r->n_stop ? r->n_stop : 1) * sizeof *r->stop_ids);
    if (!r->tokens || !r->blocks || !r->stop_ids) {
        req_free(r);
        return di_error(DI_ERR_OUT_OF_MEMORY, "request %lld: no memory for %lld tokens",
                        (long long)id, (long long)r->cap);
    }
    memcpy(r->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    r->n_tokens = n_prompt;
    if (r->n_stop) memcpy(r->stop_ids, p->stop_token_ids, (size_t)r->n_stop * sizeof(int32_t));
    s->reqs[s->n_reqs++] = r;

    if (!fits) {
        snprintf(r->error, sizeof r->error,
                 "the prompt has %lld tokens; max_model_len %lld leaves no room to generate",
                 (long long)n_prompt, (long long)s->cfg.max_model_len);
        r->state = DI_REQ_FINISHED;
        r->finish_reason = DI_FINISH_ERROR;
        return DI_OK;
    }
    r->state = DI_REQ_WAITING;
    s->waiting[(s->wait_head + s->n_waiting) % s->wait_cap] = r;
    s->n_waiting++;
    return DI_OK;
}

/* Disaggregated: a request in flight on a side keeps its blocks and slot (the worker is
 * writing its rows) and finishes when that side post-processes. */
static void finish_or_defer(di_sched *s, di_sched_req *r, di_finish_reason reason) {
    if (s->cfg.disaggregate && r->n_pending > 0) {
        if (r->finish_deferred == DI_FINISH_NONE) r->finish_deferred = reason;
        return;
    }
    di_sched_finish_now(s, r, reason);
}

di_status di_sched_finish(di_sched *s, int64_t id, di_finish_reason reason) {
    di_sched_req *r = find_req(s, id);
    if (!r) return di_error(DI_ERR_NOT_FOUND, "request %lld: no such request", (long long)id);
    if (r->state != DI_REQ_FINISHED) finish_or_defer(s, r, reason);
    return DI_OK;
}

di_status di_sched_abort(di_sched *s, int64_t id) {
    return di_sched_finish(s, id, DI_FINISH_ABORT);
}

int64_t di_sched_finished(const di_sched *s, int64_t *ids, int64_t cap) {
    int64_t n = 0;
    for (int64_t i = 0; i < s->n_reqs; i++) {
        if (s->reqs[i]->state != DI_REQ_FINISHED) continue;
        if (n < cap) ids[n] = s->reqs[i]->id;
        n++;
    }
    return n <= cap ? n : -n;
}

di_status di_sched_release(di_sched *s, int64_t id) {
    int64_t i = 0;
    while (i < s->n_reqs && s->reqs[i]->id != id)
        i++;
    if (i == s->n_reqs)
        return di_error(DI_ERR_NOT_FOUND, "request %lld: no such request", (long long)id);
    di_sched_req *r = s->reqs[i];
    if (r->state != DI_REQ_FINISHED)
        return di_error(DI_ERR_INVALID_ARG,
                        "request %lld: release before it finished (abort it first)", (long long)id);
    for (int b = 0; b < 2; b++) /* rows of a batch in flight must not point at freed memory */
        for (int32_t k = 0; k < s->bufs[b].batch.n_seqs; k++)
            if (s->bufs[b].reqs[k] == r) s->bufs[b].reqs[k] = NULL;
    memmove(&s->reqs[i], &s->reqs[i + 1], (size_t)(s->n_reqs - i - 1) * sizeof r);
    s->n_reqs--;
    req_free(r);
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Postprocess: results of the pending batch                                                  */
/* ---------------------------------------------------------------------------------------- */

static bool is_stop_token(const di_sched *s, const di_sched_req *r, int32_t t) {
    if (!r->ignore_eos && s->cfg.eos_token_id >= 0 && t == s->cfg.eos_token_id) return true;
    for (int64_t i = 0; i < r->n_stop; i++)
        if (r->stop_ids[i] == t) return true;
    return false;
}

/* vLLM's order: EOS and stop ids count only from min_tokens output tokens on; a stop token
 * wins over the length limit when both apply. */
static di_finish_reason stop_reason(const di_sched *s, const di_sched_req *r) {
    int64_t n_out = r->n_tokens - r->n_prompt;
    if (n_out >= r->min_tokens && is_stop_token(s, r, r->tokens[r->n_tokens - 1]))
        return DI_FINISH_STOP;
    if (n_out >= r->max_tokens || r->n_tokens >= s->cfg.max_model_len) return DI_FINISH_LENGTH;
    return DI_FINISH_NONE;
}

/* Registers the request's blocks that became full with rows written. */
static void register_full_blocks(di_sched *s, di_sched_req *r) {
    if (!s->cfg.enable_prefix_cache) return;
    int64_t bs = s->cfg.block_size;
    while ((r->n_registered + 1) * bs <= r->n_computed) {
        di_prefix_cache_insert(&s->pc, &r->chain, r->blocks[r->n_registered],
                               r->tokens + r->n_registered * bs);
        r->n_registered++;
    }
}

static di_status postprocess(di_sched *s, di_sched_pending *pb, const int32_t *sampled);

di_status di_sched_postprocess(di_sched *s, const int32_t *sampled) {
    if (s->cfg.disaggregate)
        return di_error(DI_ERR_INVALID_ARG, "scheduler: disaggregated mode post-processes each "
                                            "side with di_sched_postprocess_side");
    if (s->n_pending == 0)
        return di_error(DI_ERR_INVALID_ARG, "scheduler: postprocess without a scheduled batch");
    return postprocess(s, di_sched_oldest_pending(s), sampled);
}

di_status di_sched_postprocess_side(di_sched *s, di_sched_side side, const int32_t *sampled) {
    if (!s->cfg.disaggregate || (side != DI_SCHED_PREFILL_SIDE && side != DI_SCHED_DECODE_SIDE))
        return di_error(DI_ERR_INVALID_ARG,
                        "scheduler: di_sched_postprocess_side needs cfg.disaggregate and a side");
    di_sched_pending *pb = &s->bufs[side == DI_SCHED_PREFILL_SIDE ? 0 : 1];
    if (!pb->pending)
        return di_error(DI_ERR_INVALID_ARG, "scheduler: postprocess without a scheduled batch");
    return postprocess(s, pb, sampled);
}

static di_status postprocess(di_sched *s, di_sched_pending *pb, const int32_t *sampled) {
    for (int32_t i = 0; i < pb->batch.n_seqs; i++) /* check first: fail without changes */
        if (pb->seqs[i].n_logits && pb->reqs[i] && pb->reqs[i]->epoch == pb->epochs[i] &&
            sampled[i] < 0)
            return di_error(DI_ERR_INVALID_ARG, "scheduler: sampled token %d for request %lld",
                            (int)sampled[i], (long long)pb->seqs[i].req_id);
    for (int32_t i = 0; i < pb->batch.n_seqs; i++) {
        di_sched_req *r = pb->reqs[i];
        const di_sched_seq *q = &pb->seqs[i];
        /* Released, finished or preempted since it was scheduled: nothing to apply. */
        if (!r || r->epoch != pb->epochs[i]) continue;
        if (r->finish_deferred != DI_FINISH_NONE) { /* aborted while in flight: drop the row */
            di_sched_finish_now(s, r, r->finish_deferred);
            continue;
        }
        r->n_computed += q->n_tokens;
        r->n_pending -= q->n_tokens;
        register_full_blocks(s, r);
        if (q->n_logit_rows > q->n_logits)
            r->plp_done = DI_MAX(r->plp_done, DI_MIN(q->start + q->n_tokens, r->plp_end));
        if (q->n_logits == 0) continue;
        r->n_future--;
        r->tokens[r->n_tokens++] = sampled[i]; /* replaces the placeholder, if any */
        r->state = DI_REQ_DECODE;
        di_finish_reason why = stop_reason(s, r);
        if (why != DI_FINISH_NONE) di_sched_finish_now(s, r, why);
    }
    pb->pending = false; /* the rows stay readable until the buffer is reused */
    s->n_pending--;
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Queries                                                                                    */
/* ---------------------------------------------------------------------------------------- */

di_status di_sched_get(const di_sched *s, int64_t id, di_sched_req_info *out) {
    const di_sched_req *r = find_req(s, id);
    if (!r) return di_error(DI_ERR_NOT_FOUND, "request %lld: no such request", (long long)id);
    out->state = r->state;
    out->finish_reason = r->finish_reason;
    out->error = r->error;
    out->output = r->tokens + r->n_prompt;
    out->n_output = r->n_tokens - r->n_prompt;
    out->n_prompt = r->n_prompt;
    out->n_cached_tokens = r->n_cached_tokens;
    out->n_preemptions = r->n_preemptions;
    return DI_OK;
}

void di_sched_get_stats(const di_sched *s, di_sched_stats *out) {
    memset(out, 0, sizeof *out);
    out->n_running = s->n_running;
    out->n_waiting = (int32_t)s->n_waiting;
    for (int64_t i = 0; i < s->n_reqs; i++)
        if (s->reqs[i]->state == DI_REQ_FINISHED) out->n_finished++;
    out->kv_blocks_used = di_block_pool_n_used(&s->pool);
    out->kv_blocks_cached = s->cfg.enable_prefix_cache ? s->pc.n_entries : 0;
    out->kv_blocks_total = s->pool.n_blocks;
    out->prefix_hit_tokens = s->prefix_hit_tokens;
    out->n_preemptions = s->n_preemptions;
    out->n_steps = s->n_steps;
}

bool di_sched_has_work(const di_sched *s) {
    return s->n_running > 0 || s->n_waiting > 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Integrity                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static di_status check_running(const di_sched *s, const di_sched_req *r, uint8_t *slot_seen) {
    long long id = (long long)r->id;
    if (r->state != DI_REQ_PREFILL && r->state != DI_REQ_DECODE)
        return di_error(DI_ERR_INTERNAL, "request %lld: running in state %d", id, (int)r->state);
    if (r->slot < 0 || r->slot >= s->cfg.max_running || slot_seen[r->slot]++)
        return di_error(DI_ERR_INTERNAL, "request %lld: bad or shared slot %d", id, (int)r->slot);
    int64_t reserved = di_sched_eff_computed(r);
    int64_t want = DI_MAX(di_sched_blocks_for(s, reserved), r->n_hit_blocks);
    if (r->n_blocks != want || r->n_blocks > r->max_blocks)
        return di_error(DI_ERR_INTERNAL,
                        "request %lld: holds %lld blocks, expected %lld "
                        "(computed %lld, pending %lld)",
                        id, (long long)r->n_blocks, (long long)want, (long long)r->n_computed,
                        (long long)r->n_pending);
    if (reserved > di_sched_eff_tokens(r) || di_sched_eff_tokens(r) > r->cap ||
        r->n_registered > r->n_blocks)
        return di_error(DI_ERR_INTERNAL, "request %lld: counts out of order", id);
    if (s->n_pending == 0 && r->state == DI_REQ_DECODE && r->n_computed != r->n_tokens - 1)
        return di_error(DI_ERR_INTERNAL, "request %lld: decoding with %lld of %lld computed", id,
                        (long long)r->n_computed, (long long)r->n_tokens);
    /* The pending batches' live rows account for exactly n_pending and n_future. */
    int64_t tok = 0, fut = 0;
    for (int b = 0; b < 2; b++) {
        const di_sched_pending *pb = &s->bufs[b];
        if (!pb->pending) continue;
        for (int32_t i = 0; i < pb->batch.n_seqs; i++) {
            if (pb->reqs[i] != r || pb->epochs[i] != r->epoch) continue;
            tok += pb->seqs[i].n_tokens;
            fut += pb->seqs[i].n_logits;
        }
    }
    if (tok != r->n_pending || fut != r->n_future)
        return di_error(DI_ERR_INTERNAL,
                        "request %lld: pending %lld tokens / %lld samples, batches hold %lld / "
                        "%lld",
                        id, (long long)r->n_pending, (long long)r->n_future, (long long)tok,
                        (long long)fut);
    return DI_OK;
}

di_status di_sched_check(const di_sched *s) {
    int32_t *refs = di_calloc((size_t)s->pool.n_blocks, sizeof *refs);
    uint8_t *slot_seen = di_calloc((size_t)s->cfg.max_running, 1);
    di_status st = DI_OK;
    if (!refs || !slot_seen) {
        st = di_error(DI_ERR_OUT_OF_MEMORY, "scheduler check: no memory");
        goto done;
    }
    int64_t n_live = 0;
    for (int32_t i = 0; i < s->n_running && st == DI_OK; i++) {
        const di_sched_req *r = s->running[i];
        st = check_running(s, r, slot_seen);
        if (st == DI_OK && i > 0 && s->running[i - 1]->admit_seq >= r->admit_seq)
            st = di_error(DI_ERR_INTERNAL, "scheduler: running list out of admission order");
        for (int64_t b = 0; b < r->n_blocks; b++)
            refs[r->blocks[b]]++;
        n_live++;
    }
    for (int64_t i = 0; i < s->n_waiting && st == DI_OK; i++) {
        const di_sched_req *r = di_sched_waiting_at(s, i);
        if ((r->state != DI_REQ_WAITING && r->state != DI_REQ_PREEMPTED) || r->n_blocks ||
            r->slot >= 0 || r->n_computed || r->n_pending || r->n_future)
            st = di_error(DI_ERR_INTERNAL, "request %lld: waiting but holds state",
                          (long long)r->id);
        n_live++;
    }
    for (int64_t i = 0; i < s->n_reqs && st == DI_OK; i++) {
        const di_sched_req *r = s->reqs[i];
        if (r->state != DI_REQ_FINISHED) continue;
        if (r->n_blocks || r->slot >= 0)
            st = di_error(DI_ERR_INTERNAL, "request %lld: finished but holds blocks or a slot",
                          (long long)r->id);
        n_live++;
    }
    if (st == DI_OK && n_live != s->n_reqs)
        st = di_error(DI_ERR_INTERNAL, "scheduler: %lld requests, %lld in the queues",
                      (long long)s->n_reqs, (long long)n_live);
    if (st == DI_OK && s->n_free_slots + s->n_running != s->cfg.max_running)
        st = di_error(DI_ERR_INTERNAL, "scheduler: %d free slots with %d running",
                      (int)s->n_free_slots, (int)s->n_running);
    if (st == DI_OK) st = di_block_pool_check(&s->pool, refs);
    if (st == DI_OK && s->cfg.enable_prefix_cache) st = di_prefix_cache_check(&s->pc);
done:
    di_free(refs);
    di_free(slot_seen);
    return st;
}
