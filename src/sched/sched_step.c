/*
 * sched_step.c -- one step's batch decision: decodes, then prefill chunks of running
 * requests, then admissions, under the token budgets; KV blocks reserved check-then-commit;
 * preemption of the newest running request when a running one cannot grow.
 *
 * Why the newest: the oldest running request can always finish (the config guarantees one
 * sequence of max_model_len fits the pool, and every other request is newer and can be
 * preempted), so the system always makes progress, and the work thrown away is the least.
 *
 * Preempting a request already placed in this step's batch takes it out again and gives its
 * tokens back to the budget. That only happens in the prefill pass (a decode scheduled
 * earlier may be newer than a prefilling request); in the decode pass every newer request
 * is still unscheduled, because decodes are visited oldest first.
 *
 * Prompt logprobs: a request that needs them gets logits rows for each position of its
 * prefill chunks from bud->logits (max_prompt_logits per step), its chunks end at the end of
 * the prompt (so the rows are always the chunk's last ones), and it is admitted without a
 * prefix-cache hit. The one row per sampling sequence needs no budget: the logits buffer
 * holds max_running of them besides.
 *
 * Every decision starts from where the pending batches leave a request (n_computed +
 * n_pending), so the same code serves the plain loop and the overlap loop.
 */
#include "sched/sched_internal.h"

#include <string.h>

typedef struct budget {
    int64_t tokens;  /* left of max_batch_tokens */
    int64_t prefill; /* left of max_prefill_tokens */
    int64_t logits;  /* left of max_prompt_logits */
} budget;

/* ---------------------------------------------------------------------------------------- */
/* The batch                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static di_sched_pending *building(di_sched *s) {
    return &s->bufs[s->newest];
}

di_sched_pending *di_sched_oldest_pending(di_sched *s) {
    return &s->bufs[s->n_pending == 2 ? 1 - s->newest : s->newest];
}

/* Logits rows of r's next chunk [start, end): the positions still missing prompt logits
 * (plus the sampled last row), or just the sampled row. */
static int64_t logit_rows(const di_sched_req *r, int64_t start, int64_t end, bool sample) {
    int64_t lo = DI_MAX(start, r->plp_done);
    if (di_sched_needs_prompt_logits(r) && lo < r->plp_end && end > lo) return end - lo;
    return sample ? 1 : 0;
}

/* Caps a prefill chunk of r starting at `start`: a request that needs prompt logits stops at
 * the end of its prompt and takes at most bud->logits rows. */
static int64_t cap_prompt_chunk(const di_sched_req *r, int64_t start, int64_t chunk,
                                const budget *bud) {
    if (!di_sched_needs_prompt_logits(r) || start >= r->n_prompt) return chunk;
    int64_t lo = DI_MAX(start, r->plp_done);
    chunk = DI_MIN(chunk, r->n_prompt - start);
    return DI_MIN(chunk, DI_MAX(0, lo - start) + bud->logits);
}

/* Puts the next n tokens of r (from where the pending batches leave it) into the batch. */
static void batch_add(di_sched *s, di_sched_req *r, int64_t n, bool decode, budget *bud) {
    di_sched_pending *pb = building(s);
    di_sched_batch *b = &pb->batch;
    int32_t row = b->n_seqs++;
    di_sched_seq *q = &pb->seqs[row];
    int64_t start = di_sched_eff_computed(r);
    if (start == r->n_tokens) /* overlap: the input is the token step N is still sampling */
        r->tokens[start] = DI_SCHED_PENDING_TOKEN(r->future_row);
    q->req_id = r->id;
    q->slot = r->slot;
    q->reset_state = r->reset_state;
    q->tokens = r->tokens + start;
    q->n_tokens = n;
    q->start = start;
    q->n_replay = DI_MAX(0, DI_MIN(r->replay_end - start, n));
    q->block_table = r->blocks;
    q->n_blocks_table = r->n_blocks;
    q->n_logits = start + n == di_sched_eff_tokens(r) ? 1 : 0;
    q->n_logit_rows = logit_rows(r, start, start + n, q->n_logits);
    pb->reqs[row] = r;
    pb->epochs[row] = r->epoch;
    pb->is_decode[row] = decode;
    r->reset_state = false;
    r->n_pending += n;
    r->n_future += q->n_logits;
    r->sched_mark = s->sched_calls;

    b->n_tokens += n;
    b->n_logits += q->n_logits;
    b->n_logit_rows += q->n_logit_rows;
    b->n_replay_tokens += q->n_replay;
    if (decode)
        b->n_decode_tokens += n;
    else
        b->n_prefill_tokens += n - q->n_replay;
    bud->tokens -= n;
    if (!decode) bud->prefill -= n;
    bud->logits -= q->n_logit_rows - q->n_logits;
}

/* Takes r out of the batch being built (it is being preempted), returning its budget. */
static void batch_remove(di_sched *s, di_sched_req *r, budget *bud) {
    di_sched_pending *pb = building(s);
    di_sched_batch *b = &pb->batch;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        if (pb->reqs[i] != r) continue;
        const di_sched_seq *q = &pb->seqs[i];
        b->n_tokens -= q->n_tokens;
        b->n_logits -= q->n_logits;
        b->n_logit_rows -= q->n_logit_rows;
        b->n_replay_tokens -= q->n_replay;
        bud->tokens += q->n_tokens;
        bud->logits += q->n_logit_rows - q->n_logits;
        if (pb->is_decode[i]) {
            b->n_decode_tokens -= q->n_tokens;
        } else {
            b->n_prefill_tokens -= q->n_tokens - q->n_replay;
            bud->prefill += q->n_tokens;
        }
        size_t tail = (size_t)(b->n_seqs - i - 1);
        memmove(&pb->seqs[i], &pb->seqs[i + 1], tail * sizeof *pb->seqs);
        memmove(&pb->reqs[i], &pb->reqs[i + 1], tail * sizeof *pb->reqs);
        memmove(&pb->epochs[i], &pb->epochs[i + 1], tail * sizeof *pb->epochs);
        memmove(&pb->is_decode[i], &pb->is_decode[i + 1], tail * sizeof *pb->is_decode);
        b->n_seqs--;
        return; /* its pending counts are reset by the preemption that follows */
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Preemption                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* Sends a running request (not in the batch any more) back to the front of the waiting
 * queue. Its blocks are freed (full ones stay in the prefix cache, so the recompute often
 * starts from a hit); its tokens, generated ones included, are kept and become the prefix to
 * recompute. */
void di_sched_preempt(di_sched *s, di_sched_req *r) {
    di_sched_remove_running(s, r);
    di_sched_release_blocks(s, r);
    r->state = DI_REQ_PREEMPTED;
    r->n_preemptions++;
    s->n_preemptions++;
    di_sched_waiting_push_front(s, r);
}

/* Preempts a running request, taking it out of this step's batch first. */
static void preempt_one(di_sched *s, di_sched_req *r, budget *bud) {
    if (r->sched_mark == s->sched_calls) batch_remove(s, r, bud);
    di_sched_preempt(s, r);
}

/* The newest running request newer than r that may be preempted now, or NULL. Unified: the
 * newest. Disaggregated: requests in flight on the other side are skipped (their rows are
 * being written), so an older one may find only those and have to wait. */
static di_sched_req *newest_victim(const di_sched *s, const di_sched_req *r) {
    for (int32_t i = s->n_running - 1; i >= 0; i--) {
        di_sched_req *c = s->running[i];
        if (c == r) return NULL;
        if (!di_sched_in_flight_elsewhere(s, c)) return c;
    }
    return NULL;
}

/* Makes `need` blocks allocatable by preempting running requests newer than r. Returns false
 * when none is left to preempt and the blocks are still missing. need <= 0 happens while a
 * replay runs inside blocks shared from the prefix cache. */
static bool make_room(di_sched *s, const di_sched_req *r, int64_t need, budget *bud) {
    if (need <= 0) return true;
    while (!di_block_pool_can_allocate(&s->pool, need)) {
        di_sched_req *v = newest_victim(s, r);
        if (!v) return false;
        preempt_one(s, v, bud);
    }
    return true;
}

/* Commits `need` new blocks to r's table; make_room or the caller checked they exist. */
static void grow(di_sched *s, di_sched_req *r, int64_t need) {
    if (need <= 0) return;
    di_status st = di_block_pool_allocate(&s->pool, need, r->blocks + r->n_blocks);
    (void)st; /* cannot fail: checked */
    r->n_blocks += need;
}

/* ---------------------------------------------------------------------------------------- */
/* The three passes                                                                           */
/* ---------------------------------------------------------------------------------------- */

/* Decoding once the pending batches are applied: one token left to compute. */
static bool is_decoding(const di_sched_req *r) {
    return di_sched_eff_computed(r) == di_sched_eff_tokens(r) - 1;
}

static void schedule_decodes(di_sched *s, budget *bud) {
    for (int32_t i = 0; i < s->n_running; i++) {
        di_sched_req *r = s->running[i];
        if (di_sched_in_flight_elsewhere(s, r) || !is_decoding(r)) continue;
        /* Overlap: the token in flight already ends the request by length. */
        if (di_sched_eff_tokens(r) >= r->cap) continue;
        if (bud->tokens < 1) break; /* not reached: max_batch_tokens >= max_running */
        int64_t need = di_sched_blocks_for(s, di_sched_eff_computed(r) + 1) - r->n_blocks;
        if (!make_room(s, r, need, bud)) {
            if (s->running[s->n_running - 1] == r) {
                preempt_one(s, r, bud); /* r is the newest: it yields to the older ones */
                break;
            }
            continue; /* disaggregated: only requests in flight are newer; wait for them */
        }
        grow(s, r, need);
        batch_add(s, r, 1, true, bud);
    }
}

static void schedule_prefill_chunks(di_sched *s, budget *bud) {
    int64_t bs = s->cfg.block_size;
    for (int32_t i = 0; i < s->n_running; i++) {
        di_sched_req *r = s->running[i];
        if (di_sched_in_flight_elsewhere(s, r) || is_decoding(r) || r->sched_mark == s->sched_calls)
            continue;
        int64_t done = di_sched_eff_computed(r);
        int64_t chunk = DI_MIN(r->n_tokens - done, DI_MIN(bud->tokens, bud->prefill));
        if (chunk <= 0) break;
        chunk = cap_prompt_chunk(r, done, chunk, bud);
        if (chunk <= 0) continue; /* out of prompt-logits rows this step */
        int64_t need = di_sched_blocks_for(s, done + chunk) - r->n_blocks;
        if (!make_room(s, r, need, bud)) {
            /* Nothing newer to preempt: take the part that fits and keep the blocks it has. */
            int64_t room = (r->n_blocks + di_block_pool_n_available(&s->pool)) * bs;
            chunk = DI_MIN(chunk, room - done);
            if (chunk <= 0) continue;
            need = di_sched_blocks_for(s, done + chunk) - r->n_blocks;
        }
        grow(s, r, need);
        batch_add(s, r, chunk, false, bud);
    }
}

/* Admits the head of the waiting queue if its first chunk fits; returns false to stop
 * admitting (first come, first served: a big request is not overtaken by small ones). */
static bool admit_one(di_sched *s, budget *bud) {
    di_sched_req *r = di_sched_waiting_at(s, 0);
    int64_t bs = s->cfg.block_size;

    /* Prefix-cache hit: full blocks only, and at least the last token is computed so that
     * the step yields its logits. None while prompt logits are missing: cached positions
     * would have no logits (vLLM recomputes them; so do we, by not using the cache). */
    int64_t n_hit = 0;
    di_prefix_chain chain = di_prefix_chain_root();
    if (s->cfg.enable_prefix_cache && !di_sched_needs_prompt_logits(r))
        n_hit = di_prefix_cache_match(&s->pc, r->tokens, (r->n_tokens - 1) / bs, s->match_scratch,
                                      &chain);
    int64_t hit_tokens = n_hit * bs;
    int64_t start = hit_tokens, replay_end = 0;
    if (s->cfg.replay_tokens > 0 && n_hit > 0) {
        /* Window layers' state is not cached: rebuild it from the trailing hit tokens. */
        start = DI_MAX(0, hit_tokens - s->cfg.replay_tokens);
        replay_end = hit_tokens;
    }
    int64_t chunk = DI_MIN(r->n_tokens - start, DI_MIN(bud->tokens, bud->prefill));
    chunk = cap_prompt_chunk(r, start, chunk, bud);
    if (chunk <= 0) return false; /* out of prompt-logits rows: wait for the next step */
    int64_t need = DI_MAX(0, di_sched_blocks_for(s, start + chunk) - n_hit);
    int64_t n_pinned = 0; /* hit blocks nobody holds leave the allocatable set once held */
    for (int64_t i = 0; i < n_hit; i++)
        if (s->pool.ref[s->match_scratch[i]] == 0) n_pinned++;
    if (!di_block_pool_can_allocate(&s->pool, need + n_pinned)) return false;

    /* Commit. Hit blocks are referenced before allocating so eviction cannot take them. */
    s->wait_head = (s->wait_head + 1) % s->wait_cap;
    s->n_waiting--;
    for (int64_t i = 0; i < n_hit; i++) {
        di_block_pool_ref(&s->pool, s->match_scratch[i]);
        r->blocks[i] = s->match_scratch[i];
    }
    r->n_blocks = n_hit;
    r->n_hit_blocks = n_hit;
    r->n_registered = n_hit;
    r->chain = chain;
    grow(s, r, need);
    r->n_computed = start;
    r->replay_end = replay_end;
    r->slot = s->free_slots[--s->n_free_slots];
    r->reset_state = true;
    r->admit_seq = ++s->admit_counter;
    r->state = DI_REQ_PREFILL;
    s->running[s->n_running++] = r;
    s->prefix_hit_tokens += hit_tokens;
    if (!r->admitted_once) r->n_cached_tokens = hit_tokens;
    r->admitted_once = true;
    batch_add(s, r, chunk, false, bud);
    return true;
}

/* Fills bufs[s->newest] (emptied first) with the passes asked for. */
static void fill_batch(di_sched *s, budget bud, bool decodes, bool prefills) {
    di_sched_pending *pb = building(s);
    di_sched_batch *b = &pb->batch;
    s->sched_calls++;
    memset(b, 0, sizeof *b);
    b->seqs = pb->seqs;
    b->step = s->n_steps;

    int64_t preemptions_before = s->n_preemptions;
    if (decodes) schedule_decodes(s, &bud);
    if (prefills) {
        schedule_prefill_chunks(s, &bud);
        /* Memory was short enough to preempt: admitting now would only thrash. */
        bool admit = s->n_preemptions == preemptions_before;
        while (admit && s->n_waiting > 0 && s->n_running < s->cfg.max_running && bud.tokens > 0 &&
               bud.prefill > 0 && admit_one(s, &bud)) {
        }
    }
    /* Rows are final now: remember where each request's next token will come from. */
    for (int32_t i = 0; i < b->n_seqs; i++)
        if (b->seqs[i].n_logits) pb->reqs[i]->future_row = i;
    if (b->n_seqs > 0) {
        pb->pending = true;
        s->n_pending++;
        s->n_steps++;
    }
}

di_status di_sched_schedule(di_sched *s, const di_sched_batch **out) {
    if (s->cfg.disaggregate)
        return di_error(DI_ERR_INVALID_ARG,
                        "scheduler: disaggregated mode schedules each side with "
                        "di_sched_schedule_side");
    if (s->n_pending == 2)
        return di_error(DI_ERR_INVALID_ARG, "scheduler: two batches in flight; post-process the "
                                            "older one first");
    s->newest = 1 - s->newest; /* the other buffer is free: at most one batch is pending */
    budget bud = {s->cfg.max_batch_tokens, s->cfg.max_prefill_tokens, s->cfg.max_prompt_logits};
    fill_batch(s, bud, true, true);
    *out = &building(s)->batch;
    if ((*out)->n_seqs == 0)
        s->newest = 1 - s->newest; /* nothing scheduled: keep the pending one the newest */
    return DI_OK;
}

static di_status check_side(const di_sched *s, di_sched_side side, const char *what) {
    if (!s->cfg.disaggregate)
        return di_error(DI_ERR_INVALID_ARG, "scheduler: %s needs cfg.disaggregate", what);
    if (side != DI_SCHED_PREFILL_SIDE && side != DI_SCHED_DECODE_SIDE)
        return di_error(DI_ERR_INVALID_ARG, "scheduler: %s: no side %d", what, (int)side);
    return DI_OK;
}

/* Disaggregated: bufs[side] is the side's only batch buffer. The prefill side runs chunks and
 * admissions under max_prefill_tokens (its whole step); the decode side runs decodes only. */
di_status di_sched_schedule_side(di_sched *s, di_sched_side side, const di_sched_batch **out) {
    di_status st = check_side(s, side, "di_sched_schedule_side");
    if (st) return st;
    bool prefill = side == DI_SCHED_PREFILL_SIDE;
    int32_t k = prefill ? DI_SCHED_PREFILL_SIDE : DI_SCHED_DECODE_SIDE;
    if (s->bufs[k].pending)
        return di_error(DI_ERR_INVALID_ARG,
                        "scheduler: the %s side's batch is pending; post-process it first",
                        prefill ? "prefill" : "decode");
    s->newest = k;
    budget bud = prefill ? (budget){s->cfg.max_prefill_tokens, s->cfg.max_prefill_tokens,
                                    s->cfg.max_prompt_logits}
                         : (budget){s->cfg.max_batch_tokens, 0, 0};
    fill_batch(s, bud, !prefill, prefill);
    *out = &s->bufs[k].batch;
    return DI_OK;
}

di_status di_sched_discard_side(di_sched *s, di_sched_side side) {
    di_status st = check_side(s, side, "di_sched_discard_side");
    if (st) return st;
    di_sched_pending *pb = &s->bufs[side == DI_SCHED_PREFILL_SIDE ? 0 : 1];
    if (!pb->pending) return di_error(DI_ERR_INVALID_ARG, "scheduler: no pending batch to discard");
    /* The side's live rows, newest request first (the waiting queue ends up oldest first). */
    for (int32_t i = s->n_running - 1; i >= 0; i--) {
        di_sched_req *r = s->running[i];
        bool in_batch = false;
        for (int32_t k = 0; k < pb->batch.n_seqs && !in_batch; k++)
            in_batch = pb->reqs[k] == r && pb->epochs[k] == r->epoch;
        if (!in_batch) continue;
        if (r->finish_deferred != DI_FINISH_NONE)
            di_sched_finish_now(s, r, r->finish_deferred);
        else
            di_sched_preempt(s, r);
    }
    pb->batch.n_seqs = 0;
    pb->pending = false;
    s->n_pending--;
    return DI_OK;
}

di_status di_sched_discard(di_sched *s) {
    if (s->cfg.disaggregate)
        return di_error(DI_ERR_INVALID_ARG, "scheduler: disaggregated mode discards each side "
                                            "with di_sched_discard_side");
    if (s->n_pending == 0)
        return di_error(DI_ERR_INVALID_ARG, "scheduler: no pending batch to discard");
    /* Every request with a live row in a pending batch is preempted, newest first, so that
     * the waiting queue ends up oldest first. */
    for (int32_t i = s->n_running - 1; i >= 0; i--) {
        di_sched_req *r = s->running[i];
        if (r->n_pending > 0) di_sched_preempt(s, r);
    }
    for (int k = 0; k < 2; k++) {
        s->bufs[k].batch.n_seqs = 0;
        s->bufs[k].pending = false;
    }
    s->n_pending = 0;
    return DI_OK;
}

di_status di_sched_step(di_sched *s, const di_sched_runner *runner, const di_sched_batch **out,
                        const int32_t **sampled_out) {
    const di_sched_batch *b;
    di_status st = di_sched_schedule(s, &b);
    if (out) *out = b;
    if (sampled_out) *sampled_out = s->sampled;
    if (st != DI_OK || b->n_seqs == 0) return st;
    st = runner->run(runner->ctx, b, s->sampled);
    if (st != DI_OK) {
        di_sched_discard(s);
        return st;
    }
    return di_sched_postprocess(s, s->sampled);
}
