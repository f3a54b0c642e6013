/*
 * sched.h -- continuous batching over paged KV blocks: the request state machine and the
 * per-step batch decision. Plain C over token ids and counts; no tensors, no backend.
 *
 * The engine step is
 *     di_sched_schedule(s, &batch);          which sequences run which tokens this step
 *     model_runner(batch) -> sampled[];      one token per sequence with n_logits == 1
 *     di_sched_postprocess(s, sampled);      append, stop checks, free finished requests
 * (di_sched_step does exactly that). The overlap loop schedules step N+1 before step N's
 * results are post-processed; see di_sched_schedule and docs/engine-design.md.
 *
 * Request life:
 *     WAITING --admit--> PREFILL (chunked, maybe several steps) --last chunk--> DECODE
 *     PREFILL / DECODE --out of KV blocks, newest first--> PREEMPTED (waiting again, first
 *        in line, its generated tokens kept and recomputed as part of its "prompt")
 *     any --stop condition / abort / prompt that can never fit--> FINISHED
 *
 * Design stance (nano-vllm / vLLM v1 habits):
 *   - A request is a token array (prompt then output) and a count of tokens whose KV rows
 *     are computed (n_computed). Prefill, chunked prefill, recompute after preemption and
 *     decode are the same thing: run tokens [n_computed, n_tokens) in pieces under a budget.
 *   - Each step: decodes first (one token each, oldest first), then chunks of running
 *     prefills, then new admissions, all under max_batch_tokens; prefill tokens (including
 *     V4 window replay) are further capped by max_prefill_tokens so a long prompt never
 *     stretches a step and decodes keep flowing.
 *   - KV blocks are reserved check-then-commit before a sequence enters the batch. When a
 *     running request cannot grow, the newest running request is preempted (its blocks
 *     freed; their full blocks stay in the prefix cache) -- never an error. Admission never
 *     preempts.
 *   - Prompt logprobs (vLLM's prompt_logprobs): such a request needs logits rows for every
 *     prompt position, not only the last. Its prefill chunks request them (n_logit_rows)
 *     from a separate per-step budget, max_prompt_logits, and stop at the end of the prompt;
 *     until its prompt logits are complete it does not use the prefix cache for its own
 *     prompt (positions served from the cache would have no logits), so they are always
 *     computed. Rows already post-processed are not asked for again after a preemption.
 *   - Everything a step needs is allocated when a request is added (its token array and
 *     block table at their final size) or at init (the batch arrays): schedule and
 *     postprocess never allocate.
 *
 * Invariants (checked by di_sched_check after every step in the tests):
 *   - Each block's count equals the number of running requests whose table holds it.
 *   - A running request holds ceil((n_computed + n_pending) / block_size) blocks (or its
 *     prefix-cache hit, if larger), n_pending being its tokens in pending batches; its live
 *     rows in the pending batches add up to n_pending tokens and n_future samples.
 *   - Waiting and finished requests hold no blocks, no state slot, nothing pending.
 */
#ifndef DI_SCHED_H
#define DI_SCHED_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct di_sched di_sched;

typedef struct di_sched_config {
    int32_t block_size;         /* tokens per KV block */
    int32_t n_blocks;           /* blocks in the KV pool */
    int64_t max_batch_tokens;   /* tokens per step (decodes + prefill + replay), >= max_running */
    int64_t max_prefill_tokens; /* prefill + replay tokens per step; <= 0: max_batch_tokens */
    int32_t max_running;        /* most sequences running at once */
    int64_t max_model_len;      /* prompt + output limit; n_blocks * block_size must hold it */
    int32_t eos_token_id;       /* -1: none */
    bool enable_prefix_cache;
    /* V4 bounded replay: tokens of window state to rebuild after a prefix-cache hit (the
     * runner's di_arch_vtable.replay_tokens, its window layers' receptive field: see
     * docs/engine-design.md); 0 for models without window layers. */
    int64_t replay_tokens;
    /* Logits rows per step for prompt logprobs, beyond the one row per sequence that
     * samples; 0: requests with prompt_logprobs are refused by di_sched_add. */
    int64_t max_prompt_logits;
    /* Disaggregated prefill/decode: two sides, each with at most one pending batch, scheduled
     * and post-processed independently (di_sched_schedule_side and friends; the unified calls
     * are refused). See "Disaggregated mode" below. */
    bool disaggregate;
} di_sched_config;

di_sched_config di_sched_default_config(void);

typedef enum {
    DI_REQ_WAITING,
    DI_REQ_PREFILL,
    DI_REQ_DECODE,
    DI_REQ_PREEMPTED, /* waiting again after preemption */
    DI_REQ_FINISHED,
} di_req_state;

typedef enum {
    DI_FINISH_NONE,
    DI_FINISH_STOP,   /* EOS or a stop token id (or di_sched_finish from a stop string) */
    DI_FINISH_LENGTH, /* max_tokens, or max_model_len reached */
    DI_FINISH_ABORT,  /* di_sched_abort */
    DI_FINISH_ERROR,  /* the request can never run (prompt too long for max_model_len) */
} di_finish_reason;

const char *di_finish_reason_str(di_finish_reason r);

/* What the scheduler needs of a request's sampling parameters (see di_sampling_params). */
typedef struct di_sched_req_params {
    int64_t max_tokens; /* >= 1 */
    int64_t min_tokens; /* EOS / stop ids do not stop before this many output tokens */
    bool ignore_eos;
    const int32_t *stop_token_ids; /* [n_stop_token_ids], copied by di_sched_add */
    int64_t n_stop_token_ids;
    bool prompt_logprobs; /* needs the logits of every prompt position (prompt_logprobs >= 0) */
} di_sched_req_params;

/* The scheduler's part of a request's sampling parameters (borrows stop_token_ids). */
static inline di_sched_req_params di_sched_params_from_sampling(const di_sampling_params *p) {
    di_sched_req_params r;
    r.max_tokens = p->max_tokens;
    r.min_tokens = p->min_tokens;
    r.ignore_eos = p->ignore_eos;
    r.stop_token_ids = p->stop_token_ids;
    r.n_stop_token_ids = p->n_stop_token_ids;
    r.prompt_logprobs = p->prompt_logprobs >= 0;
    return r;
}

/* With the overlap loop, a decode may be scheduled before the token it consumes is known:
 * its input id is then DI_SCHED_PENDING_TOKEN(row), the token sampled for seqs[row] of the
 * previous batch, which the runner substitutes on the device; postprocess of the previous
 * batch then writes the real id in its place. Real ids are >= 0. */
#define DI_SCHED_PENDING_TOKEN(row) (-1 - (int32_t)(row))

/* One sequence of a step's batch. Pointers stay valid until the request is released. */
typedef struct di_sched_seq {
    int64_t req_id;
    int32_t slot;          /* per-sequence state slot in [0, max_running) (V4 window rings) */
    bool reset_state;      /* first piece since admission: clear the slot's state first */
    const int32_t *tokens; /* [n_tokens] ids at positions start .. start + n_tokens - 1 */
    int64_t n_tokens;
    int64_t start;              /* position of tokens[0] */
    int64_t n_replay;           /* leading tokens whose KV rows already exist (shared, do not
                                   write them): they only rebuild window state */
    const int32_t *block_table; /* [n_blocks_table] covers positions 0 .. start + n_tokens - 1 */
    int64_t n_blocks_table;
    int32_t n_logits; /* 0, or 1: logits of the last position are needed to sample */
    /* Logits rows the runner returns: those of the last n_logit_rows positions (>= n_logits).
     * More than n_logits only for prompt logprobs: the rows of positions
     * start + n_tokens - n_logit_rows .. start + n_tokens - 1, the last one being the
     * sampled row when n_logits == 1. */
    int64_t n_logit_rows;
} di_sched_seq;

typedef struct di_sched_batch {
    int64_t step;       /* the scheduler's step counter */
    di_sched_seq *seqs; /* [n_seqs], owned by the scheduler */
    int32_t n_seqs;
    int64_t n_tokens; /* all tokens of the step */
    int64_t n_decode_tokens;
    int64_t n_prefill_tokens; /* prompt / recompute tokens, replay excluded */
    int64_t n_replay_tokens;
    int32_t n_logits;     /* sequences that need a sampled token */
    int64_t n_logit_rows; /* logits rows of all sequences (<= max_running + max_prompt_logits) */
} di_sched_batch;

typedef struct di_sched_stats {
    int32_t n_running;
    int32_t n_waiting;
    int32_t n_finished;       /* finished, not yet released */
    int32_t kv_blocks_used;   /* held by running requests */
    int32_t kv_blocks_cached; /* registered in the prefix cache (held or evictable) */
    int32_t kv_blocks_total;
    int64_t prefix_hit_tokens; /* summed over all admissions */
    int64_t n_preemptions;
    int64_t n_steps;
} di_sched_stats;

typedef struct di_sched_req_info {
    di_req_state state;
    di_finish_reason finish_reason;
    const char *error;     /* message when finish_reason is DI_FINISH_ERROR, else "" */
    const int32_t *output; /* [n_output] generated tokens */
    int64_t n_output;
    int64_t n_prompt;
    int64_t n_cached_tokens; /* prefix-cache hit tokens at the first admission */
    int64_t n_preemptions;
} di_sched_req_info;

di_status di_sched_create(const di_sched_config *cfg, di_sched **out);
void di_sched_free(di_sched *s);

/* Copies the prompt and the parameters; the request waits behind earlier ones. Fails
 * (nothing added) on a duplicate id, an empty prompt or max_tokens < 1. A prompt that can
 * never fit is accepted and finished at once with DI_FINISH_ERROR. */
di_status di_sched_add(di_sched *s, int64_t id, const int32_t *prompt, int64_t n_prompt,
                       const di_sched_req_params *params);

/* Decides the next step. *out points to one of the scheduler's two batch buffers, readable
 * until the buffer is reused (the schedule call after next) and emptied by di_sched_discard.
 * An empty batch (n_seqs == 0) means nothing can run now.
 *
 * At most two batches may be pending (scheduled, not post-processed): the plain loop
 * alternates schedule and postprocess; the overlap loop schedules step N+1 while step N is in
 * flight, then post-processes N. Step N+1 then continues every request from where step N
 * leaves it, decodes consume N's tokens through DI_SCHED_PENDING_TOKEN, and a request whose
 * token in flight ends it by length gets no more work. */
di_status di_sched_schedule(di_sched *s, const di_sched_batch **out);

/* Applies the results of the oldest pending batch: sampled[i] is the token of seqs[i] when
 * seqs[i].n_logits == 1 (ignored otherwise). Registers newly full blocks in the prefix
 * cache, appends tokens, checks stop conditions, frees finished requests' blocks. Rows of
 * requests aborted, finished or preempted since the batch was scheduled are ignored. */
di_status di_sched_postprocess(di_sched *s, const int32_t *sampled);

/* Gives up the pending batches without results (the model runner failed): every request in
 * them is preempted -- blocks freed, back to the front of the waiting queue -- so it is
 * recomputed from its tokens (and the prefix cache) later, with fresh per-sequence state. */
di_status di_sched_discard(di_sched *s);

/* The model runner as the engine step sees it. run() executes the batch and writes one
 * sampled token per sequence with n_logits == 1 into sampled[i] ([n_seqs]); it returns a
 * status, and on failure the step is discarded (di_sched_discard). */
typedef struct di_sched_runner {
    di_status (*run)(void *ctx, const di_sched_batch *batch, int32_t *sampled);
    void *ctx;
} di_sched_runner;

/* One engine step without overlap: schedule -> runner -> postprocess. *out (may be NULL)
 * receives the batch that ran, empty when nothing ran (nothing to run, or the runner failed
 * and the step was discarded); its sampled tokens are
 * in *sampled_out ([n_seqs], owned by the scheduler, valid until the next step). */
di_status di_sched_step(di_sched *s, const di_sched_runner *runner, const di_sched_batch **out,
                        const int32_t **sampled_out);

/* ---- Disaggregated mode (cfg.disaggregate) ---------------------------------------------
 *
 * Two workers run concurrently: the prefill side runs prompt chunks, recomputes and
 * admissions (its batch is capped by max_prefill_tokens and max_prompt_logits), the decode
 * side runs one token of every decoding request (max_batch_tokens). Each side has at most
 * one batch pending and schedules / post-processes it whenever its worker is free, so the
 * decode side never waits for a prefill chunk. Both sides share one block pool, prefix cache
 * and slot set. A request is on the prefill side until its last prompt chunk samples a token
 * (state DECODE): that post-process is the hand-off, which moves nothing (same blocks, same
 * slot). A preempted request goes back to the waiting queue, i.e. the prefill side.
 *
 * Since the two batches run at the same time, a request in flight on one side is never
 * preempted by the other (its rows are being written): preemption skips it, and a decode
 * that finds no room and only in-flight newer requests to preempt waits one step instead.
 * Abort / finish of a request in flight is deferred to its side's post-process (the request
 * keeps its blocks and slot until its rows are written, then finishes with that reason). */
typedef enum { DI_SCHED_PREFILL_SIDE = 0, DI_SCHED_DECODE_SIDE = 1 } di_sched_side;

/* Schedules the side's next batch (refused while its previous one is pending). *out is valid
 * until the side's next schedule; empty when it has nothing to run. */
di_status di_sched_schedule_side(di_sched *s, di_sched_side side, const di_sched_batch **out);
/* Applies the side's pending batch (sampled[i] as in di_sched_postprocess). */
di_status di_sched_postprocess_side(di_sched *s, di_sched_side side, const int32_t *sampled);
/* Gives up the side's pending batch: its requests are preempted (or finish, if an abort was
 * deferred), as di_sched_discard does for the unified loop. */
di_status di_sched_discard_side(di_sched *s, di_sched_side side);

/* Finishes a request now (any state): its blocks are freed, full ones stay cached. In
 * disaggregated mode a request in flight finishes when its side post-processes. */
di_status di_sched_abort(di_sched *s, int64_t id);
/* Same, with a reason chosen by the engine (a stop string matched by the detokenizer). */
di_status di_sched_finish(di_sched *s, int64_t id, di_finish_reason reason);

/* Ids of finished requests not yet released, oldest first; returns the count, or -needed
 * when cap is too small. */
int64_t di_sched_finished(const di_sched *s, int64_t *ids, int64_t cap);
/* Forgets a finished request (its info and output become invalid). */
di_status di_sched_release(di_sched *s, int64_t id);

di_status di_sched_get(const di_sched *s, int64_t id, di_sched_req_info *out);
void di_sched_get_stats(const di_sched *s, di_sched_stats *out);
bool di_sched_has_work(const di_sched *s);

/* Checks pool, prefix cache and every request's bookkeeping; DI_ERR_INTERNAL with a message
 * on the first inconsistency. O(blocks + requests); for tests and debug builds. */
di_status di_sched_check(const di_sched *s);

#endif /* DI_SCHED_H */
