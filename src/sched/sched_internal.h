/*
 * sched_internal.h -- the scheduler's records, shared by sched.c (requests, postprocess,
 * queries, integrity) and sched_step.c (building a step's batch, preemption).
 *
 * Ownership: the scheduler owns every request record, and each record owns its token array,
 * block table and stop ids. The running list, the waiting deque and the request list hold
 * borrowed pointers to the same records.
 */
#ifndef DI_SCHED_INTERNAL_H
#define DI_SCHED_INTERNAL_H

#include "kv/block_pool.h"
#include "kv/prefix_cache.h"
#include "sched/sched.h"

typedef struct di_sched_req {
    int64_t id;
    di_req_state state;
    di_finish_reason finish_reason;
    char error[160];

    int32_t *tokens;  /* [cap] prompt then output, owned */
    int64_t n_tokens; /* prompt + output so far */
    int64_t n_prompt;
    int64_t cap;        /* min(n_prompt + max_tokens, max_model_len) */
    int64_t n_computed; /* KV rows [0, n_computed) are written (post-processed) */
    int64_t n_pending;  /* tokens in batches scheduled but not yet post-processed */
    int64_t n_future;   /* tokens those batches will sample (not yet in tokens[]) */
    int32_t future_row; /* row of the newest pending batch that samples the next token */
    uint32_t epoch;     /* bumped when preempted or finished: stale batch rows are ignored */
    int64_t sched_mark; /* the schedule call that last placed it in a batch */

    int32_t *blocks; /* [max_blocks] block table, owned */
    int64_t n_blocks;
    int64_t max_blocks;    /* ceil(cap / block_size) */
    int64_t n_hit_blocks;  /* blocks shared from the prefix cache at admission */
    int64_t n_registered;  /* leading blocks already registered in the prefix cache */
    di_prefix_chain chain; /* end of the registered chain, to register the next block */
    int64_t replay_end;    /* positions below this that are scheduled are window replay */

    int32_t slot;      /* state slot while running, else -1 */
    bool reset_state;  /* the next piece is the first since admission */
    int64_t admit_seq; /* admission order; the largest running one is preempted first */

    int64_t max_tokens, min_tokens;
    bool ignore_eos;
    int32_t *stop_ids; /* [n_stop], owned */
    int64_t n_stop;

    /* Prompt logprobs: logits of positions [0, plp_end) are needed (plp_end = n_prompt - 1,
     * 0 when not asked); rows of [0, plp_done) were post-processed. */
    int64_t plp_end, plp_done;

    /* Disaggregated mode: an abort / finish that arrived while the request was in flight on
     * a side; applied by that side's post-process (DI_FINISH_NONE: none). */
    di_finish_reason finish_deferred;

    bool admitted_once;
    int64_t n_cached_tokens;
    int64_t n_preemptions;
} di_sched_req;

/* A scheduled batch and what postprocess needs to apply it. */
typedef struct di_sched_pending {
    di_sched_batch batch;
    di_sched_seq *seqs;  /* [max_running] */
    di_sched_req **reqs; /* [max_running] parallel to seqs; NULL once released */
    uint32_t *epochs;    /* [max_running] the request's epoch when scheduled */
    uint8_t *is_decode;  /* [max_running] */
    bool pending;        /* scheduled, not yet post-processed or discarded */
} di_sched_pending;

struct di_sched {
    di_sched_config cfg;
    di_block_pool pool;
    di_prefix_cache pc; /* used when cfg.enable_prefix_cache */

    di_sched_req **reqs; /* [n_reqs] every live request in order of arrival */
    int64_t n_reqs, reqs_cap;

    di_sched_req **running; /* [max_running] admission order, oldest first */
    int32_t n_running;

    /* Waiting requests, a ring: preempted ones are pushed at the front. Its capacity grows
     * with reqs_cap (in di_sched_add), so preemption never allocates. */
    di_sched_req **waiting;
    int64_t wait_head, n_waiting, wait_cap;

    int32_t *free_slots; /* [max_running] stack of unused state slots */
    int32_t n_free_slots;

    /* Two batch buffers: with the overlap loop, step N+1 is scheduled while step N is in
     * flight. Batches are post-processed in the order they were scheduled. */
    di_sched_pending bufs[2];
    int32_t newest;    /* buffer of the latest schedule */
    int32_t n_pending; /* batches scheduled, not yet post-processed: 0, 1 or 2 */
    int64_t sched_calls;
    int32_t *sampled; /* [max_running] tokens of the last di_sched_step */

    int32_t *match_scratch; /* [ceil(max_model_len / block_size)] prefix-cache hits */
    int64_t admit_counter;
    int64_t prefix_hit_tokens;
    int64_t n_preemptions;
    int64_t n_steps;
};

/* Where a request stands once the pending batches are applied. */
static inline int64_t di_sched_eff_computed(const di_sched_req *r) {
    return r->n_computed + r->n_pending;
}
static inline int64_t di_sched_eff_tokens(const di_sched_req *r) {
    return r->n_tokens + r->n_future;
}

/* Prompt logits still to be delivered: the request skips the prefix cache and its prefill
 * chunks stop at the end of the prompt. */
static inline bool di_sched_needs_prompt_logits(const di_sched_req *r) {
    return r->plp_done < r->plp_end;
}

/* Disaggregated mode: in a pending batch of the other side (scheduled by an earlier call),
 * so its rows are being written right now: it must not be preempted or scheduled. */
static inline bool di_sched_in_flight_elsewhere(const di_sched *s, const di_sched_req *r) {
    return s->cfg.disaggregate && r->n_pending > 0 && r->sched_mark != s->sched_calls;
}

/* sched.c */
int64_t di_sched_blocks_for(const di_sched *s, int64_t n_tokens);
di_sched_req *di_sched_waiting_at(const di_sched *s, int64_t i);
void di_sched_waiting_push_front(di_sched *s, di_sched_req *r);
void di_sched_waiting_remove(di_sched *s, int64_t i);
void di_sched_release_blocks(di_sched *s, di_sched_req *r);
void di_sched_remove_running(di_sched *s, di_sched_req *r);
/* Finishes r at once (any state), freeing its blocks and slot. */
void di_sched_finish_now(di_sched *s, di_sched_req *r, di_finish_reason reason);

/* sched_step.c */
di_sched_pending *di_sched_oldest_pending(di_sched *s);
void di_sched_preempt(di_sched *s, di_sched_req *r);

#endif /* DI_SCHED_INTERNAL_H */
