/*
 * engine.c -- the engine step: inbox -> scheduler -> batch builder -> batched forward ->
 * sampler -> postprocess -> outputs, and the public engine API around it.
 *
 * Plain loop (overlap off), one step:
 *     drain inbox; schedule; build; forward; sample; postprocess; deliver
 * Overlap loop (mini-sglang's): the forward of step N runs on a compute thread that drives
 * the thread pool, while the calling thread schedules step N+1 and then post-processes N:
 *     drain inbox; schedule N+1; build N+1           (while N computes)
 *     wait N; sample N; resolve N+1's pending ids from N's tokens; launch N+1
 *     postprocess N; deliver                         (while N+1 computes)
 * The scheduler supports two pending batches (docs/engine-design.md): decodes of N+1 consume
 * N's tokens through DI_SCHED_PENDING_TOKEN rows, which the builder resolves right before
 * launch; rows of requests that stopped in the meantime are ignored by their epoch.
 * Device loop (overlap on a backend with fences, e.g. CUDA; step_device): no compute thread;
 * step N+1 is enqueued before the engine waits for step N, its pending ids read on the
 * device from N's tokens (di_batch_args.pending_on_device), so the device runs decode steps
 * back to back while the host samples and post-processes the previous one:
 *     drain inbox; schedule N+1; build N+1; enqueue N+1 (behind N)
 *     wait N; sample N; postprocess N; deliver       (while N+1 computes)
 *
 * The batch builder copies what the forward reads (ids, block tables), so the scheduler can
 * move on (and even preempt a request of the batch in flight) while the forward runs.
 *
 * Batch invariance: the forward computes each row independently of the batch (see
 * deepseek_v3.c), and sampling is keyed by (seed, sample index, position), so results do not
 * depend on the batch, the chunk size, the thread count, preemption or overlap. That costs
 * little on the CPU backend, so batch_invariant is on by default; turned off, the matmul may
 * pick kernels by batch size (di_cpu_matmul_fast), and results agree only to rounding.
 */
#include "engine_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ENG_DEFAULT_LEN      4096
#define ENG_DEFAULT_KV_LIMIT ((int64_t)1 << 30)
/* On a GPU the default pool may take up to this share of the device's free memory (after
 * the weights): the rest is left to the runner's activations, graphs and other programs. */
#define ENG_DEVICE_KV_SHARE 0.5
/* Logits rows per step for prompt logprobs (beyond one per sequence): the logits buffer
 * grows by this many rows of the vocabulary; longer prompts take several steps. */
#define ENG_PROMPT_LOGITS_ROWS 64
/* Most threads that sample one batch's rows (each holds a sampler scratch:
 * di_sampler_scratch_size, 28 bytes per vocabulary entry). */
#define ENG_SAMPLE_THREADS 16

/* The CPU's default prompt tokens per step (di_engine_params.max_prefill_tokens <= 0). */
#define ENG_CPU_PREFILL_TOKENS 512

int64_t eng_default_kv_bytes(int64_t need, int64_t one_seq, int64_t device_free) {
    const int64_t cap = device_free >= 0 ? (int64_t)((double)device_free * ENG_DEVICE_KV_SHARE)
                                         : ENG_DEFAULT_KV_LIMIT;
    return DI_MAX(DI_MIN(need, cap), one_seq);
}

di_engine_params di_engine_default_params(void) {
    di_engine_params p = {.n_threads = 0,
                          .max_batch_tokens = 2048,
                          .max_prefill_tokens = 0,
                          .max_running = 64,
                          .kv_memory_bytes = 0,
                          .block_size = 16,
                          .max_model_len = 0,
                          .enable_prefix_cache = true,
                          .batch_invariant = true,
                          .overlap = false,
                          .disaggregate = false,
                          .prefill_threads = 0,
                          .tokenizer_path = NULL,
                          .tokenizer = NULL};
    return p;
}

const char *di_engine_finish_str(di_engine_finish r) {
    switch (r) {
    case DI_ENGINE_FINISH_STOP:
        return "stop";
    case DI_ENGINE_FINISH_LENGTH:
        return "length";
    case DI_ENGINE_FINISH_ABORT:
        return "abort";
    case DI_ENGINE_FINISH_ERROR:
        return "error";
    default:
        return "";
    }
}

/* ---------------------------------------------------------------------------------------- */
/* The forward, inline or on the compute thread                                               */
/* ---------------------------------------------------------------------------------------- */

/* A device reports its ops' first error at the sync. The step's logits are then not
 * trustworthy: they become NaN, so the sampler's guard finishes the step's requests with an
 * error instead of sampling garbage; the cause goes to the log. */
static void forward_failed(di_engine *e, const eng_batch *b) {
    di_log(DI_LOG_ERROR, "engine: forward on %s failed: %s", e->be.ops->name, di_last_error());
    for (int64_t i = 0; i < b->n_lrows * e->vocab; i++)
        e->logits[i] = NAN;
    for (int64_t i = 0; b->tokens && i < b->n_lrows; i++)
        b->tokens[i] = -1;
}

/* Runs b's forward to completion, or with `defer` (the device loop) maybe only enqueues it:
 * then b->ticket > 0 (finish_deferred waits for it; the ticket stays, marking a batch whose
 * logits rows were never downloaded). */
static void run_forward(di_engine *e, eng_batch *b, bool defer, bool pending) {
    double t0 = di_time_now();
    b->ticket = 0;
    di_batch_args a = {.seqs = b->seqs,
                       .n_seqs = b->sb->n_seqs,
                       .logits = b->logits,
                       .tokens = b->tokens,
                       .defer = defer,
                       .pending_on_device = pending,
                       .ticket = defer ? &b->ticket : NULL};
    for (int64_t i = 0; b->tokens && i < b->n_lrows; i++)
        b->tokens[i] = -1;
    e->model->arch->forward_batch(e->model->weights, e->state, &e->be, &a);
    if (b->ticket == 0 && e->be.ops->sync(e->be.ctx)) forward_failed(e, b);
    e->work_time = di_time_now() - t0;
    e->work_expert_loads =
        e->model->arch->take_expert_loads ? e->model->arch->take_expert_loads(e->state) : 0;
}

static void *compute_main(void *arg) {
    di_engine *e = arg;
    pthread_mutex_lock(&e->tlock);
    for (;;) {
        while (!e->work_ready && !e->thread_quit)
            pthread_cond_wait(&e->cv, &e->tlock);
        if (e->thread_quit) break;
        eng_batch *b = e->work;
        pthread_mutex_unlock(&e->tlock);
        run_forward(e, b, false, false);
        pthread_mutex_lock(&e->tlock);
        e->work_ready = false;
        e->work_done = true;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->tlock);
    return NULL;
}

static void launch(di_engine *e, eng_batch *b) {
    e->stats.n_prompt_tokens += b->sb->n_prefill_tokens;
    if (!e->thread_started) {
        run_forward(e, b, false, false);
        e->stats.time_device_s += e->work_time;
        e->stats.n_expert_loads += e->work_expert_loads;
        return;
    }
    pthread_mutex_lock(&e->tlock);
    e->work = b;
    e->work_done = false;
    e->work_ready = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->tlock);
    e->in_flight = true;
}

static void wait_forward(di_engine *e) {
    if (!e->in_flight) return;
    pthread_mutex_lock(&e->tlock);
    while (!e->work_done)
        pthread_cond_wait(&e->cv, &e->tlock);
    pthread_mutex_unlock(&e->tlock);
    e->in_flight = false;
    e->stats.time_device_s += e->work_time;
    e->stats.n_expert_loads += e->work_expert_loads;
}

/* ---------------------------------------------------------------------------------------- */
/* Batch builder                                                                              */
/* ---------------------------------------------------------------------------------------- */

static int64_t blocks_per_seq(const di_engine *e) {
    return (e->max_model_len + e->scfg.block_size - 1) / e->scfg.block_size;
}

void eng_build(di_engine *e, const di_sched_batch *sb, eng_batch *b) {
    const int64_t bps = blocks_per_seq(e);
    b->sb = sb;
    b->ticket = 0;
    b->n_tokens = b->n_lrows = 0;
    for (int32_t i = 0; i < sb->n_seqs; i++) {
        const di_sched_seq *q = &sb->seqs[i];
        int32_t *ids = b->ids + b->n_tokens, *tab = b->tables + (int64_t)i * bps;
        memcpy(ids, q->tokens, (size_t)q->n_tokens * sizeof(int32_t));
        memcpy(tab, q->block_table, (size_t)q->n_blocks_table * sizeof(int32_t));
        b->seqs[i] = (di_batch_seq){.ids = ids,
                                    .n = q->n_tokens,
                                    .pos0 = q->start,
                                    .n_replay = q->n_replay,
                                    .block_table = tab,
                                    .slot = q->slot,
                                    .reset_state = q->reset_state,
                                    .n_logits = q->n_logit_rows};
        if (b->tokens) eng_device_sample(e, q, &b->seqs[i]); /* a runner may use them */
        b->lrow[i] = q->n_logit_rows > 0 ? (int32_t)b->n_lrows : -1;
        b->n_lrows += q->n_logit_rows;
        b->n_tokens += q->n_tokens;
    }
}

/* Pending ids (tokens of the previous batch still being sampled) become e->sampled[row]. */
static void resolve_pending(di_engine *e, eng_batch *b) {
    for (int64_t k = 0; k < b->n_tokens; k++)
        if (b->ids[k] < 0) {
            int32_t row = -1 - b->ids[k];
            b->ids[k] = e->sampled[row];
        }
}

typedef struct sample_job {
    di_engine *e;
    const eng_batch *b;
    int64_t grain;
} sample_job;

/* Seqs [begin, end) of the batch: their sampled rows (the last of each seq's n_logit_rows),
 * with the scratch of this range (begin / grain: one range per scratch, see below). */
static void sample_seqs(void *ctx, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const sample_job *j = ctx;
    di_engine *e = j->e;
    const eng_batch *b = j->b;
    void *scratch = e->sscratch + (size_t)(begin / j->grain) * e->sscratch_size;
    for (int64_t i = begin; i < end; i++) {
        const di_sched_seq *q = &b->sb->seqs[i];
        if (b->lrow[i] < 0 || !q->n_logits) continue;
        const int64_t last = b->lrow[i] + q->n_logit_rows - 1;
        if (b->ticket > 0 && b->tokens[last] < 0) { /* deferred: NaN / +inf, or a failed step */
            e->sampled[i] = 0; /* as eng_sample_row leaves a row it cannot sample */
            e->row_ok[i] = false;
            continue;
        }
        eng_sample_row(e, q, (int32_t)i, b->logits + last * e->vocab,
                       b->tokens ? b->tokens[last] : -1, scratch);
    }
}

/* Each seq's rows are its last n_logit_rows positions; the sampled row is the last. Prompt
 * logprobs first, one seq at a time; then the sampled rows, spread over the sample pool in
 * at most n_sscratch ranges (each row's token depends on the row, its request and the seed
 * only, so not on the split). With no more ranges than pool threads, the pool gives each
 * range to one thread, so range k may use scratch k. */
void eng_sample_batch(di_engine *e, const eng_batch *b) {
    const int64_t n = b->sb->n_seqs;
    for (int64_t i = 0; i < n; i++) {
        const di_sched_seq *q = &b->sb->seqs[i];
        if (b->lrow[i] >= 0 && q->n_logit_rows > q->n_logits)
            eng_prompt_logprobs(e, q, b->logits + (int64_t)b->lrow[i] * e->vocab);
    }
    /* Rows whose token came from the device cost nothing to take: the pool's hand-off would
     * be most of the time then, so they stay on this thread. */
    bool host_rows = false;
    for (int64_t i = 0; i < n && !host_rows; i++) {
        const di_sched_seq *q = &b->sb->seqs[i];
        host_rows = b->lrow[i] >= 0 && q->n_logits &&
                    !(b->tokens && b->tokens[b->lrow[i] + q->n_logit_rows - 1] >= 0);
    }
    sample_job job = {e, b, (n + e->n_sscratch - 1) / e->n_sscratch};
    if (job.grain < 1) job.grain = 1;
    if (host_rows && e->sample_pool && e->n_sscratch > 1 && n > 1)
        di_pool_run(e->sample_pool, n, job.grain, sample_seqs, &job);
    else
        sample_seqs(&job, 0, n, 0);
}

/* Releases scheduler requests that no pending batch can reference any more. */
void eng_release_finished(di_engine *e, bool all) {
    for (int64_t i = 0; i < e->n_rel_old; i++)
        di_sched_release(e->sched, e->rel_old[i]);
    e->n_rel_old = 0;
    if (all) {
        for (int64_t i = 0; i < e->n_rel_new; i++)
            di_sched_release(e->sched, e->rel_new[i]);
    } else {
        memcpy(e->rel_old, e->rel_new, (size_t)e->n_rel_new * sizeof(int64_t));
        e->n_rel_old = e->n_rel_new;
    }
    e->n_rel_new = 0;
}

static di_status postprocess(di_engine *e, const eng_batch *b) {
    di_status st = di_sched_postprocess(e->sched, e->sampled);
    if (!st) st = eng_after_postprocess(e, b);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* The step                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static di_status step_plain(di_engine *e, double *t_sched, double *t_post) {
    double t0 = di_time_now();
    const di_sched_batch *sb;
    di_status st = di_sched_schedule(e->sched, &sb);
    if (st) return st;
    eng_batch *b = &e->batches[0];
    eng_build(e, sb, b);
    *t_sched += di_time_now() - t0;
    if (sb->n_seqs > 0) launch(e, b);
    double t1 = di_time_now();
    if (sb->n_seqs > 0) {
        eng_sample_batch(e, b);
        st = postprocess(e, b);
    } else {
        st = eng_after_postprocess(e, NULL);
    }
    eng_release_finished(e, true);
    *t_post += di_time_now() - t1;
    return st;
}

/* The overlap loops' first half: the batch in flight (NULL if none), and step N+1 scheduled
 * and built into the other batch buffer. */
static di_status schedule_next(di_engine *e, double *t_sched, eng_batch **prev, eng_batch **next,
                               const di_sched_batch **sb) {
    double t0 = di_time_now();
    *prev = e->in_flight ? &e->batches[e->cur] : NULL;
    *next = &e->batches[*prev ? 1 - e->cur : e->cur];
    di_status st = di_sched_schedule(e->sched, sb);
    if (st) return st;
    eng_build(e, *sb, *next);
    *t_sched += di_time_now() - t0;
    return DI_OK;
}

/* Waits for a batch the runner deferred; its tokens are then in b->tokens (-1 for a row
 * whose logits the sampler cannot use: sample_seqs reports it). */
static void finish_deferred(di_engine *e, eng_batch *b) {
    double t0 = di_time_now();
    if (e->be.ops->fence_wait(e->be.ctx, b->ticket)) {
        di_log(DI_LOG_ERROR, "engine: forward on %s failed: %s", e->be.ops->name, di_last_error());
        for (int64_t i = 0; i < b->n_lrows; i++)
            b->tokens[i] = -1;
    }
    e->stats.time_device_s += di_time_now() - t0;
}

/* The device loop (top of the file): N+1 is enqueued behind N, with its pending ids left
 * for the device, before N is waited for and post-processed. A batch the runner cannot
 * defer (a prefill chunk, rows sampled on the host) has run when the call returns and is
 * post-processed in the same step, after N. */
static di_status step_device(di_engine *e, double *t_sched, double *t_post) {
    eng_batch *prev, *next;
    const di_sched_batch *sb;
    di_status st = schedule_next(e, t_sched, &prev, &next, &sb);
    if (st) return st;
    const bool run = sb->n_seqs > 0;
    if (run) {
        e->stats.n_prompt_tokens += sb->n_prefill_tokens;
        run_forward(e, next, true, prev != NULL);
        e->stats.time_device_s += e->work_time;
        e->stats.n_expert_loads += e->work_expert_loads;
        e->cur = (int)(next - e->batches);
    }
    double t1 = di_time_now();
    if (prev) {
        finish_deferred(e, prev);
        eng_sample_batch(e, prev);
        st = postprocess(e, prev);
    }
    e->in_flight = run && next->ticket > 0;
    if (run && !e->in_flight) { /* even after prev's error: the scheduler holds it pending */
        eng_sample_batch(e, next);
        const di_status st_next = postprocess(e, next);
        if (!st) st = st_next;
    } else if (!run && !prev) {
        st = eng_after_postprocess(e, NULL);
    }
    eng_release_finished(e, !e->in_flight);
    *t_post += di_time_now() - t1;
    return st;
}

static di_status step_overlap(di_engine *e, double *t_sched, double *t_post) {
    eng_batch *prev, *next;
    const di_sched_batch *sb;
    di_status st = schedule_next(e, t_sched, &prev, &next, &sb);
    if (st) return st;

    wait_forward(e);
    double t1 = di_time_now();
    if (prev) eng_sample_batch(e, prev);
    if (sb->n_seqs > 0) {
        resolve_pending(e, next);
        launch(e, next);
        e->cur = (int)(next - e->batches);
    }
    if (prev) {
        st = postprocess(e, prev);
    } else {
        st = eng_after_postprocess(e, NULL);
    }
    eng_release_finished(e, !e->in_flight);
    *t_post += di_time_now() - t1;
    return st;
}

di_status di_engine_step(di_engine *e, di_engine_output *out, int64_t cap, int64_t *n_out) {
    if (!e || !n_out || (cap > 0 && !out))
        return di_error(DI_ERR_INVALID_ARG, "di_engine_step: NULL argument");
    *n_out = 0;
    if (e->dirty_head < e->n_dirty) { /* records a previous call could not return */
        *n_out = eng_deliver(e, out, cap);
        return DI_OK;
    }
    double t0 = di_time_now(), t_sched = 0, t_post = 0;
    eng_release_delivered(e);
    di_status st = eng_drain_inbox(e);
    t_sched += di_time_now() - t0;
    if (!st)
        st = e->p.disaggregate ? eng_step_disagg(e, &t_sched, &t_post)
             : e->device_loop  ? step_device(e, &t_sched, &t_post)
             : e->p.overlap    ? step_overlap(e, &t_sched, &t_post)
                               : step_plain(e, &t_sched, &t_post);
#ifndef NDEBUG
    /* Debug builds check the scheduler's invariants (block counts, pending rows, slots)
     * after every step, as the scheduler tests do. */
    if (!st) st = di_sched_check(e->sched);
#endif
    double t1 = di_time_now();
    *n_out = eng_deliver(e, out, cap);
    t_post += di_time_now() - t1;
    e->stats.n_steps++;
    e->stats.time_schedule_s += t_sched;
    e->stats.time_postprocess_s += t_post;
    e->stats.time_total_s += di_time_now() - t0;
    return st;
}

int64_t di_engine_output_cap(const di_engine *e) {
    /* Every live sample can report in one step; the caller may also pass less. */
    return e ? DI_MAX(e->n_live_samples, (int64_t)e->p.max_running) : 0;
}

bool di_engine_has_unfinished(di_engine *e) {
    if (!e) return false;
    pthread_mutex_lock(&e->lock);
    bool inbox = e->inbox_head != NULL || e->n_aborts > 0;
    pthread_mutex_unlock(&e->lock);
    return inbox || e->in_flight || eng_disagg_busy(e) || e->dirty_head < e->n_dirty ||
           e->n_live_samples > 0;
}

di_status di_engine_get_stats(const di_engine *e, di_engine_stats *out) {
    if (!e || !out) return di_error(DI_ERR_INVALID_ARG, "di_engine_get_stats: NULL argument");
    *out = e->stats;
    di_sched_stats ss;
    di_sched_get_stats(e->sched, &ss);
    out->n_running = ss.n_running;
    out->n_waiting = ss.n_waiting + (int32_t)e->n_inbox;
    out->kv_blocks_used = ss.kv_blocks_used;
    out->kv_blocks_total = ss.kv_blocks_total;
    out->prefix_cache_hit_tokens = ss.prefix_hit_tokens;
    out->n_preemptions = ss.n_preemptions;
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Create / free                                                                              */
/* ---------------------------------------------------------------------------------------- */

di_status eng_alloc_batch(eng_batch *b, int32_t max_running, int64_t max_tokens, int64_t bps) {
    b->seqs = di_calloc((size_t)max_running, sizeof *b->seqs);
    b->ids = di_malloc((size_t)max_tokens * sizeof(int32_t));
    b->tables = di_malloc((size_t)(max_running * bps) * sizeof(int32_t));
    b->lrow = di_malloc((size_t)max_running * sizeof(int32_t));
    if (!b->seqs || !b->ids || !b->tables || !b->lrow)
        return di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory for batch buffers");
    return DI_OK;
}

void eng_free_batch(eng_batch *b) {
    di_free(b->seqs);
    di_free(b->ids);
    di_free(b->tables);
    di_free(b->lrow);
}

static di_status check_params(const di_engine_params *p) {
    if (p->max_running < 1 || p->max_batch_tokens < p->max_running)
        return di_error(DI_ERR_INVALID_ARG,
                        "engine params: need max_running >= 1 and max_batch_tokens >= "
                        "max_running, got %d and %lld",
                        p->max_running, (long long)p->max_batch_tokens);
    if (p->block_size < 1)
        return di_error(DI_ERR_INVALID_ARG, "engine params: block_size must be >= 1, got %d",
                        p->block_size);
    if (p->kv_memory_bytes < 0)
        return di_error(DI_ERR_INVALID_ARG, "engine params: kv_memory_bytes must be >= 0");
    if (p->disaggregate && p->overlap)
        return di_error(DI_ERR_INVALID_ARG,
                        "engine params: overlap and disaggregate exclude each other (the "
                        "disaggregated workers already run apart from the scheduling thread)");
    return DI_OK;
}

di_status di_engine_create(di_model *model, const di_engine_params *params, di_engine **out) {
    if (!model || !out) return di_error(DI_ERR_INVALID_ARG, "di_engine_create: NULL argument");
    *out = NULL;
    di_engine_params p = params ? *params : di_engine_default_params();
    di_status st = check_params(&p);
    if (st) return st;
    const di_arch_vtable *arch = model->arch;
    if (!arch->forward_batch)
        return di_error(DI_ERR_UNSUPPORTED, "engine: %s has no batched runner", arch->name);

    di_engine *e = di_calloc(1, sizeof *e);
    if (!e) return di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory");
    pthread_mutex_init(&e->lock, NULL);
    pthread_mutex_init(&e->tlock, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->model = model;
    e->vocab = model->hp.vocab_size;
    e->eos = model->hp.eos_token_id;
    e->max_model_len = p.max_model_len > 0
                           ? DI_MIN(p.max_model_len, model->hp.max_position_embeddings)
                           : DI_MIN(ENG_DEFAULT_LEN, model->hp.max_position_embeddings);
    /* Prompt tokens per step by default: on the CPU ENG_CPU_PREFILL_TOKENS, since a step's
     * time grows with its tokens and every running decode waits for it; on a GPU a whole
     * step's worth, since a larger prefill step costs little more there (H200, 27-layer
     * V2-Lite, 64 / 256 concurrent: +1.6 % / +8 % output and first tokens sooner against 512;
     * src/backend/cuda/NOTES.md, twentieth round). */
    if (p.max_prefill_tokens <= 0)
        p.max_prefill_tokens =
            model->cuda_device >= 0 ? p.max_batch_tokens : ENG_CPU_PREFILL_TOKENS;
    if (p.max_prefill_tokens > p.max_batch_tokens) p.max_prefill_tokens = p.max_batch_tokens;
    int64_t mult = arch->block_multiple(model->weights);
    p.block_size = (int32_t)(((p.block_size + mult - 1) / mult) * mult);
    if (!arch->prefix_cache_ok(model->weights)) p.enable_prefix_cache = false;
    e->p = p;
    if (p.tokenizer_path) {
        e->tokenizer_path = di_strdup(p.tokenizer_path);
        e->p.tokenizer_path = e->tokenizer_path;
        if (!e->tokenizer_path) st = di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory");
    }

    /* KV pool: blocks from the memory budget; it must hold one sequence of max_model_len. */
    di_model_info info;
    di_model_get_info(model, &info);
    int64_t per_block = DI_MAX(info.kv_bytes_per_token, 1) * p.block_size;
    int64_t min_blocks = (e->max_model_len + p.block_size - 1) / p.block_size;
    int64_t bytes = p.kv_memory_bytes > 0
                        ? p.kv_memory_bytes
                        : eng_default_kv_bytes((int64_t)p.max_running * min_blocks * per_block,
                                               min_blocks * per_block,
                                               p.disaggregate ? -1 : di_model_device_free(model));
    int64_t n_blocks = bytes / per_block;
    /* a default pool (on a large device, of a model with a small cache) stops at the most
     * blocks the pool's 32-bit row indices address; an explicit size past it is refused */
    if (p.kv_memory_bytes == 0) n_blocks = DI_MIN(n_blocks, INT32_MAX / p.block_size);
    if (!st && n_blocks < min_blocks)
        st = di_error(DI_ERR_INVALID_ARG,
                      "engine params: kv_memory_bytes = %lld holds %lld blocks of %d tokens; "
                      "one sequence of max_model_len = %lld tokens needs %lld (%lld bytes)",
                      (long long)bytes, (long long)n_blocks, p.block_size,
                      (long long)e->max_model_len, (long long)min_blocks,
                      (long long)(min_blocks * per_block));
    if (!st && n_blocks > INT32_MAX / p.block_size)
        st = di_error(DI_ERR_RANGE, "engine params: kv_memory_bytes gives too many blocks");

    if (!st) {
        e->scfg = di_sched_default_config();
        e->scfg.block_size = p.block_size;
        e->scfg.n_blocks = (int32_t)n_blocks;
        e->scfg.max_batch_tokens = p.max_batch_tokens;
        e->scfg.max_prefill_tokens = p.max_prefill_tokens;
        e->scfg.max_running = p.max_running;
        e->scfg.max_model_len = e->max_model_len;
        e->scfg.eos_token_id = e->eos;
        e->scfg.enable_prefix_cache = p.enable_prefix_cache;
        e->scfg.replay_tokens = p.enable_prefix_cache ? arch->replay_tokens(model->weights) : 0;
        e->scfg.max_prompt_logits = ENG_PROMPT_LOGITS_ROWS;
        e->scfg.disaggregate = p.disaggregate;
        st = di_sched_create(&e->scfg, &e->sched);
    }
    di_batch_config bc = {.n_blocks = n_blocks,
                          .block_size = p.block_size,
                          .n_slots = p.max_running,
                          .max_model_len = e->max_model_len,
                          .max_batch_tokens = p.max_batch_tokens};
    if (!st && p.disaggregate) {
        st = eng_disagg_create(e, &bc, p.n_threads > 0 ? p.n_threads : di_pool_size(model->pool));
    } else if (!st) {
        di_pool *pool = model->pool;
        if (p.n_threads > 0 && p.n_threads != di_pool_size(model->pool)) {
            e->own_pool = di_pool_create(p.n_threads);
            if (!e->own_pool) st = DI_ERR_INTERNAL;
            pool = e->own_pool;
        }
        if (!st) st = di_model_backend_init(model, pool, e->max_model_len, &e->be);
        e->sample_pool = pool;
        if (!st) di_backend_cpu_set_batch_invariant(&e->be, p.batch_invariant);
        if (!st) di_backend_cuda_set_batch_invariant(&e->be, p.batch_invariant);
        if (!st) st = arch->batch_state_create(model->weights, &bc, &e->state);
        const int64_t bps = (e->max_model_len + p.block_size - 1) / p.block_size;
        for (int k = 0; k < 2 && !st; k++)
            st = eng_alloc_batch(&e->batches[k], p.max_running, p.max_batch_tokens, bps);
        if (!st) {
            int64_t rows = p.max_running + e->scfg.max_prompt_logits;
            e->logits = di_malloc((size_t)(rows * e->vocab) * sizeof(float));
            /* tokens from the runner only where the rows live in device memory */
            if (!e->be.ops->host_memory)
                e->tokens = di_malloc((size_t)(2 * rows) * sizeof(int32_t));
            if (!e->logits || (!e->be.ops->host_memory && !e->tokens))
                st = di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory for logits");
            /* One logits buffer: a batch's rows are read before the other batch's forward
             * writes any (the device loop defers only batches that return tokens). Tokens
             * per batch: a deferred batch's arrive while the next one runs. */
            e->batches[0].logits = e->batches[1].logits = e->logits;
            e->batches[0].tokens = e->tokens;
            e->batches[1].tokens = e->tokens ? e->tokens + rows : NULL;
        }
    }
    if (!st) {
        e->sampled = di_calloc((size_t)p.max_running, sizeof(int32_t));
        e->results = di_calloc((size_t)p.max_running, sizeof *e->results);
        e->row_ok = di_calloc((size_t)p.max_running, sizeof(bool));
        /* Up to ENG_SAMPLE_THREADS threads of the forward's pool sample a batch's rows (the
         * pool is idle then); the disaggregated engine's workers own their pools, so it
         * samples on the calling thread alone. */
        /* rounded up to 64 bytes: each block starts with 8-byte arrays (an odd vocabulary
         * makes the size 4 mod 8) */
        e->sscratch_size = (di_sampler_scratch_size(e->vocab) + 63) & ~(size_t)63;
        e->n_sscratch =
            e->sample_pool ? DI_MIN(di_pool_size(e->sample_pool), ENG_SAMPLE_THREADS) : 1;
        e->sscratch = di_malloc((size_t)e->n_sscratch * e->sscratch_size);
        if (!e->sampled || !e->results || !e->row_ok || !e->sscratch)
            st = di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory for sampling");
    }
    if (!st) st = eng_map_init(&e->map);
    if (!st && p.tokenizer) { /* borrowed from the caller */
        e->tok = (di_tokenizer *)p.tokenizer;
        e->tok_borrowed = true;
        e->tok_tried = true;
    } else if (!st && e->tokenizer_path) { /* an explicit tokenizer must load: fail early */
        st = di_tokenizer_load(e->tokenizer_path, &e->tok);
        e->tok_tried = true;
    }
    const di_backend_ops *o = e->be.ops;
    e->device_loop = !st && p.overlap && !p.disaggregate && !o->host_memory && o->fence &&
                     o->fence_wait && e->tokens;
    if (!st && p.overlap && !e->device_loop) {
        if (pthread_create(&e->thread, NULL, compute_main, e) != 0)
            st = di_error(DI_ERR_INTERNAL, "engine: cannot start the compute thread");
        else
            e->thread_started = true;
    }
    if (st) {
        di_engine_free(e);
        return st;
    }
    *out = e;
    return DI_OK;
}

void di_engine_free(di_engine *e) {
    if (!e) return;
    eng_disagg_free(e);                 /* stops the workers first: they use the states below */
    if (e->device_loop && e->in_flight) /* its downloads still go to e->tokens */
        e->be.ops->fence_wait(e->be.ctx, e->batches[e->cur].ticket);
    if (e->thread_started) {
        wait_forward(e);
        pthread_mutex_lock(&e->tlock);
        e->thread_quit = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->tlock);
        pthread_join(e->thread, NULL);
    }
    /* Every request still owned: those whose outputs were all returned wait in to_release;
     * the others (live or in the inbox) are in the map. */
    eng_release_delivered(e);
    for (int64_t i = 0; i < e->map.cap; i++)
        if (e->map.state && e->map.state[i] == SLOT_FULL) eng_req_free(e->map.vals[i]);
    eng_map_free(&e->map);
    if (e->state) e->model->arch->batch_state_free(e->state);
    di_backend_free(&e->be);
    di_pool_free(e->own_pool);
    di_sched_free(e->sched);
    for (int k = 0; k < 2; k++)
        eng_free_batch(&e->batches[k]);
    di_free(e->logits);
    di_free(e->tokens);
    di_free(e->sampled);
    di_free(e->results);
    di_free(e->row_ok);
    di_free(e->sscratch);
    di_free(e->by_sid);
    di_free(e->dirty);
    di_free(e->to_release);
    di_free(e->rel_old);
    di_free(e->rel_new);
    di_free(e->fin_ids);
    di_free(e->aborts);
    if (e->tok && !e->tok_borrowed) di_tokenizer_free(e->tok);
    di_vocab_trie_free(e->vtrie);
    di_free(e->tokenizer_path);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->tlock);
    pthread_mutex_destroy(&e->lock);
    di_free(e);
}
