/*
 * engine_internal.h -- private structures of the engine (engine.c: the step loop and the
 * runner; engine_req.c: requests, the inbox, sampling; engine_output.c: results, stop
 * strings and outputs).
 *
 * Ownership: the engine owns every request (eng_req) from di_engine_add_request until all
 * of its samples' final outputs were returned and the next step began; a request owns its
 * samples (eng_sample), one per completion (n > 1), each a separate scheduler request.
 *
 * Threads: `lock` guards the inbox (new requests, aborts) and the caller-id map; everything
 * else belongs to the thread calling di_engine_step. With overlap, the compute thread only
 * reads the batch it was handed and writes the logits buffer and the KV pool.
 */
#ifndef DI_ENGINE_INTERNAL_H
#define DI_ENGINE_INTERNAL_H

#include "api_internal.h"
#include "constrain/gbnf_text.h"
#include "constrain/grammar.h"
#include "constrain/matcher.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/core.h"
#include "core/threadpool.h"
#include "sample/sampler.h"
#include "sched/sched.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct eng_req eng_req;

/* One completion of a request: a scheduler request of its own. */
typedef struct eng_sample {
    eng_req *req;     /* owner */
    int32_t index;    /* sample index: keys the random numbers with the seed */
    int64_t sched_id; /* -1 until added to the scheduler (children wait for the prefill) */
    int64_t cap;      /* most output tokens: min(max_tokens, max_model_len) */

    int64_t n_out;          /* tokens appended so far */
    int32_t *out;           /* [cap] */
    int64_t delivered;      /* tokens returned in outputs */
    di_engine_logprobs *lp; /* [cap] when logprobs >= 0 */
    int32_t *lp_ids;        /* [cap][N] */
    float *lp_vals;         /* [cap][N] */

    /* Penalty history (only with penalties): distinct ids of prompt and output. */
    int32_t *h_ids, *h_cnt; /* [n_prompt + cap] */
    int64_t h_n;
    int32_t *h_index; /* [vocab] position in h_ids, or -1 */

    /* Text (when the engine has a tokenizer). text[0, emit) may be returned; bytes after
     * `emit` are held back while a stop string may be forming. */
    di_detok *detok;
    char *text;
    int64_t text_len, text_cap, emit, text_delivered;

    bool finished;        /* no more tokens */
    bool final_delivered; /* its finished output was returned: release at the next step */
    di_engine_finish reason;
    char error[256];
    int64_t cached_tokens;
    bool plp_sent;   /* its first output (carrying the prompt logprobs) was returned */
    bool dirty;      /* on the engine's output list */
    bool sched_done; /* its scheduler request finished and was handled */
    bool cut;        /* the text was cut at a stop string */

    /* Constrained generation (the request has a grammar): where the output is in it, and
     * the mask of allowed tokens for the next row (written by the sampling thread) */
    di_matcher *matcher;
    uint32_t *allowed;     /* [(vocab + 31) / 32] */
    const char *row_error; /* why the last row gave no token (static text), or NULL */
} eng_sample;

struct eng_req {
    uint64_t id;
    char *id_str;          /* owned, or NULL */
    di_sampling_params sp; /* arrays point at the owned copies below */
    char **stop;           /* [sp.n_stop] owned strings */
    int32_t *stop_ids;
    di_logit_bias *bias;
    char *grammar_text;  /* the constraint as GBNF (sp.grammar's copy, or converted from a
                            JSON schema or regex); sp.grammar points at it */
    di_grammar *grammar; /* compiled; the samples' matchers borrow it */
    int64_t max_stop_len;
    int32_t *prompt; /* [n_prompt] owned */
    int64_t n_prompt;
    /* Prompt logprobs (sp.prompt_logprobs >= 0): plp[k] is prompt position k + 1, from the
     * logits of position k in sample 0's prefill rows; entries [0, plp_filled) are written
     * (in position order; a recompute rewrites the same values). */
    di_engine_logprobs *plp; /* [max(n_prompt - 1, 1)] */
    int32_t *plp_ids;        /* [n_prompt - 1][N], N = max(prompt_logprobs, 1) */
    float *plp_vals;         /* [n_prompt - 1][N] */
    int64_t plp_filled;
    eng_sample *samples; /* [sp.n] */
    int32_t n_final;     /* samples whose final output was returned */
    int32_t n_released;  /* samples freed */
    bool children_added; /* samples 1.. are in the scheduler */
    bool abort_requested;
    eng_req *next; /* inbox link */
};

/* A scheduled batch as the model sees it (copies: the scheduler may move on meanwhile). */
typedef struct eng_batch {
    const di_sched_batch *sb; /* the scheduler's batch (rows map to seqs[]) */
    di_batch_seq *seqs;       /* [max_running] */
    int32_t *ids;             /* [max_batch_tokens] (placeholders resolved before launch) */
    int32_t *tables;          /* [max_running][blocks_per_seq] */
    int32_t *lrow;            /* [max_running] first logits row of each seq, or -1 */
    int64_t n_lrows;
    int64_t n_tokens;
    float *logits; /* where the forward writes its logits rows (the engine's or a worker's) */
    /* NULL, or [logits rows]: the forward may return a device_draw row's
     * token here instead of the row (di_batch_args.tokens); -1 = read the row */
    int32_t *tokens;
    /* > 0: its forward was deferred (the device loop, engine.c): its fence, and its logits
     * rows were never downloaded */
    int64_t ticket;
} eng_batch;

/* Disaggregated mode: one worker per side, each a thread with its own thread pool, backend,
 * runner state (activation buffers; the decode worker's shares the prefill worker's KV pool
 * and slots, di_batch_config.share), logits buffer and batch copy. The calling thread
 * schedules, samples and post-processes; a worker only runs forward_batch on the batch it
 * was handed. `busy` belongs to the calling thread; work_ready / done / quit to e->tlock. */
typedef struct eng_worker {
    di_engine *e;
    di_sched_side side;
    di_pool *pool; /* owned */
    di_backend be;
    void *state;
    float *logits;
    eng_batch batch;
    pthread_t thread;
    bool started, busy;
    bool work_ready, done, quit;
    double work_time;
    int64_t work_expert_loads; /* the last forward's (arch->take_expert_loads) */
} eng_worker;

/* Open-addressing map from caller id to request (linear probing, tombstones). */
enum { SLOT_EMPTY, SLOT_FULL, SLOT_TOMB };
typedef struct eng_map {
    uint64_t *keys;
    eng_req **vals;
    uint8_t *state; /* empty, full or deleted */
    int64_t cap, n, used;
} eng_map;

struct di_engine {
    di_model *model; /* borrowed */
    di_engine_params p;
    char *tokenizer_path; /* owned copy, or NULL */
    di_tokenizer *tok;    /* lazily loaded and owned, or the caller's (tok_borrowed) */
    bool tok_borrowed;
    bool tok_tried;
    di_vocab_trie *vtrie; /* the tokenizer's vocabulary as a byte trie, built on the first
                             request with a grammar (under lock); owned */
    int64_t vocab, max_model_len;
    int32_t eos;

    di_sched *sched;
    di_sched_config scfg;
    di_pool *own_pool; /* when n_threads differs from the model's */
    di_backend be;
    void *state; /* the architecture's batch state */

    eng_batch batches[2];
    int cur; /* index of the in-flight (overlap) or last batch */
    bool in_flight;
    /* The overlap loop on a device backend with fences (engine.c step_device): steps are
     * enqueued behind the running one instead of on the compute thread. */
    bool device_loop;
    float *logits;             /* [max_running + scfg.max_prompt_logits][vocab] */
    int32_t *tokens;           /* [2][the same rows]: each batch's (eng_batch.tokens) */
    int32_t *sampled;          /* [max_running] */
    di_sample_result *results; /* [max_running] */
    bool *row_ok;              /* [max_running] */
    /* Sampler scratch: n_sscratch blocks of sscratch_size bytes, one per thread that samples
     * (eng_sample_batch spreads a batch's rows over sample_pool; NULL: one by one) */
    unsigned char *sscratch;
    size_t sscratch_size;
    int n_sscratch;
    di_pool *sample_pool;

    /* sched id -> sample */
    eng_sample **by_sid;
    int64_t n_sid, cap_sid;

    /* outputs of the current step, in order */
    eng_sample **dirty;
    int64_t n_dirty, cap_dirty, dirty_head;
    eng_sample **to_release;
    int64_t n_release, cap_release;
    di_engine_output *outs; /* records being returned */
    int64_t n_live_samples;

    /* inbox (lock) */
    pthread_mutex_t lock;
    eng_map map;
    eng_req *inbox_head, *inbox_tail;
    uint64_t *aborts;
    int64_t n_aborts, cap_aborts;
    int64_t n_inbox;
    uint64_t seed_counter;

    /* finished scheduler ids, released once no pending batch can hold them */
    int64_t *rel_old, *rel_new;
    int64_t n_rel_old, n_rel_new, cap_rel;
    int64_t *fin_ids; /* di_sched_finished buffer */
    int64_t cap_fin;

    /* overlap compute thread (tlock, cv) */
    pthread_mutex_t tlock;
    pthread_t thread;
    bool thread_started, thread_quit, work_ready, work_done;
    pthread_cond_t cv;
    eng_batch *work;
    double work_time;
    int64_t work_expert_loads; /* the last forward's (arch->take_expert_loads) */

    eng_worker workers[2]; /* p.disaggregate: [DI_SCHED_PREFILL_SIDE], [DI_SCHED_DECODE_SIDE] */

    di_engine_stats stats;
};

/* engine.c: pieces of the step shared with the disaggregated loop */
void eng_build(di_engine *e, const di_sched_batch *sb, eng_batch *b);
void eng_sample_batch(di_engine *e, const eng_batch *b);
void eng_release_finished(di_engine *e, bool all);
di_status eng_alloc_batch(eng_batch *b, int32_t max_running, int64_t max_tokens, int64_t bps);
/* The KV pool's bytes when kv_memory_bytes is 0: need (max_running sequences of
 * max_model_len tokens), capped at 1 GiB in host memory or, on a device with device_free
 * >= 0 bytes free, at half of that; never less than one_seq (one such sequence). */
int64_t eng_default_kv_bytes(int64_t need, int64_t one_seq, int64_t device_free);
void eng_free_batch(eng_batch *b);

/* engine_disagg.c: the two workers */
di_status eng_disagg_create(di_engine *e, const di_batch_config *bc, int32_t n_threads);
void eng_disagg_free(di_engine *e);
di_status eng_step_disagg(di_engine *e, double *t_sched, double *t_post);
bool eng_disagg_busy(const di_engine *e);

/* engine_req.c (requests, inbox, sampling) and engine_output.c (results -> outputs) */
di_status eng_map_init(eng_map *m);
void eng_map_free(eng_map *m);
eng_req *eng_map_get(const eng_map *m, uint64_t id);
di_status eng_map_put(eng_map *m, uint64_t id, eng_req *r);
void eng_map_del(eng_map *m, uint64_t id);

void eng_req_free(eng_req *r);
/* Moves the inbox into the scheduler and applies aborts (the step's first action). */
di_status eng_drain_inbox(di_engine *e);
/* Samples one row: fills e->sampled[row], e->results[row]. token >= 0: the token a device
 * runner found for the row (only for rows eng_device_sample accepted). */
void eng_sample_row(di_engine *e, const di_sched_seq *q, int32_t row, const float *logits,
                    int32_t token, void *scratch);
/* Fills seq bs's device_draw and sample (the parameters of q's sampled row): whether a device
 * runner may choose its token (di_sampler_device_draw; greedy when the temperature is). Only
 * for batches with a tokens buffer (a runner on device memory). */
void eng_device_sample(const di_engine *e, const di_sched_seq *q, di_batch_seq *bs);
/* Prompt logprobs from a seq's logits rows ([q->n_logit_rows][vocab]), when it asked. */
void eng_prompt_logprobs(di_engine *e, const di_sched_seq *q, const float *rows);
/* After di_sched_postprocess: new tokens, stop strings, finished requests, children. */
di_status eng_after_postprocess(di_engine *e, const eng_batch *b);
/* Releases samples whose final output was returned (start of a step). */
void eng_release_delivered(di_engine *e);
/* Writes up to cap records of the dirty list; returns the count. */
int64_t eng_deliver(di_engine *e, di_engine_output *out, int64_t cap);
void eng_mark_dirty(di_engine *e, eng_sample *s);
/* Ends a sample with a reason (flushing its text unless a stop string cut it). */
void eng_finish_sample(di_engine *e, eng_sample *s, di_engine_finish reason, const char *err);
/* Completions 1.. of a request join the scheduler once completion 0 has its first token. */
void eng_maybe_add_children(di_engine *e, eng_req *r);
/* The penalty history gains id (count += counted). */
void eng_history_add(eng_sample *s, int32_t id, int32_t counted);

#endif /* DI_ENGINE_INTERNAL_H */
