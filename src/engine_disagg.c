/*
 * engine_disagg.c -- disaggregated prefill/decode: two workers in one process.
 *
 * Each worker is a thread with its own thread pool, CPU backend, runner state (activation
 * buffers), logits buffer and batch copy; the decode worker's runner state shares the
 * prefill worker's KV pool and V4 slots (di_batch_config.share), so a finished prefill is
 * handed over by ownership: the scheduler moves the request to its decode side, the block
 * table and slot stay what they were. The calling thread (di_engine_step) owns the scheduler:
 *
 *     drain inbox
 *     for each idle worker (decode first): schedule its side -> build -> hand it the batch
 *     wait until a worker is done (decode first when both are)
 *     sample its batch -> post-process its side -> outputs
 *
 * So one di_engine_step applies one worker's batch, and the decode worker is handed its next
 * batch as soon as its last one is post-processed, whatever the prefill worker is doing: a
 * long prompt runs in chunks on the prefill worker while the decodes keep stepping.
 *
 * Correctness does not depend on the interleaving: the scheduler never lets the two batches
 * in flight touch the same blocks or slots (sched.h, "Disaggregated mode"), every row's
 * forward is independent of its batch (batch invariance), and sampling is keyed by (seed,
 * sample index, position). So the outputs equal the unified engine's, bit for bit.
 */
#include "engine_internal.h"

#include <string.h>

static void run_worker_forward(eng_worker *w) {
    di_engine *e = w->e;
    double t0 = di_time_now();
    di_batch_args a = {.seqs = w->batch.seqs, .n_seqs = w->batch.sb->n_seqs, .logits = w->logits};
    e->model->arch->forward_batch(e->model->weights, w->state, &w->be, &a);
    w->work_time = di_time_now() - t0;
    w->work_expert_loads =
        e->model->arch->take_expert_loads ? e->model->arch->take_expert_loads(w->state) : 0;
}

static void *worker_main(void *arg) {
    eng_worker *w = arg;
    di_engine *e = w->e;
    pthread_mutex_lock(&e->tlock);
    for (;;) {
        while (!w->work_ready && !w->quit)
            pthread_cond_wait(&e->cv, &e->tlock);
        if (w->quit) break;
        pthread_mutex_unlock(&e->tlock);
        run_worker_forward(w);
        pthread_mutex_lock(&e->tlock);
        w->work_ready = false;
        w->done = true;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->tlock);
    return NULL;
}

static void hand_over(di_engine *e, eng_worker *w) {
    e->stats.n_prompt_tokens += w->batch.sb->n_prefill_tokens;
    pthread_mutex_lock(&e->tlock);
    w->done = false;
    w->work_ready = true;
    w->busy = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->tlock);
}

/* Blocks until a busy worker is done and returns it (the decode worker when both are). */
static eng_worker *wait_any(di_engine *e) {
    eng_worker *d = &e->workers[DI_SCHED_DECODE_SIDE], *p = &e->workers[DI_SCHED_PREFILL_SIDE];
    pthread_mutex_lock(&e->tlock);
    while (!(d->busy && d->done) && !(p->busy && p->done))
        pthread_cond_wait(&e->cv, &e->tlock);
    eng_worker *w = d->busy && d->done ? d : p;
    w->busy = w->done = false;
    pthread_mutex_unlock(&e->tlock);
    e->stats.time_device_s += w->work_time;
    e->stats.n_expert_loads += w->work_expert_loads;
    if (w->side == DI_SCHED_DECODE_SIDE) {
        e->stats.n_decode_steps++;
        e->stats.time_decode_busy_s += w->work_time;
    } else {
        e->stats.n_prefill_steps++;
        e->stats.time_prefill_busy_s += w->work_time;
    }
    return w;
}

bool eng_disagg_busy(const di_engine *e) {
    return e->workers[0].busy || e->workers[1].busy;
}

di_status eng_step_disagg(di_engine *e, double *t_sched, double *t_post) {
    double t0 = di_time_now();
    const di_sched_side order[2] = {DI_SCHED_DECODE_SIDE, DI_SCHED_PREFILL_SIDE};
    for (int k = 0; k < 2; k++) {
        eng_worker *w = &e->workers[order[k]];
        if (w->busy) continue;
        const di_sched_batch *sb;
        di_status st = di_sched_schedule_side(e->sched, w->side, &sb);
        if (st) return st;
        if (sb->n_seqs == 0) continue;
        eng_build(e, sb, &w->batch);
        hand_over(e, w);
    }
    *t_sched += di_time_now() - t0;
    if (!eng_disagg_busy(e)) { /* nothing can run: report requests that finished anyway */
        di_status st = eng_after_postprocess(e, NULL);
        eng_release_finished(e, true);
        return st;
    }
    eng_worker *w = wait_any(e);
    double t1 = di_time_now();
    eng_sample_batch(e, &w->batch);
    di_status st = di_sched_postprocess_side(e->sched, w->side, e->sampled);
    if (!st) st = eng_after_postprocess(e, &w->batch);
    /* Finished requests are in no batch in flight (the scheduler defers finishing those). */
    eng_release_finished(e, true);
    *t_post += di_time_now() - t1;
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Create / free                                                                              */
/* ---------------------------------------------------------------------------------------- */

static di_status worker_init(di_engine *e, eng_worker *w, di_sched_side side, int32_t threads,
                             const di_batch_config *bc, const void *share) {
    const di_engine_params *p = &e->p;
    w->e = e;
    w->side = side;
    w->pool = di_pool_create(threads);
    if (!w->pool)
        return di_error(DI_ERR_OUT_OF_MEMORY, "engine: cannot create a pool of %d threads",
                        (int)threads);
    di_status st = di_backend_cpu_init(&w->be, w->pool, e->max_model_len);
    if (st) return st;
    di_backend_cpu_set_batch_invariant(&w->be, p->batch_invariant);
    di_backend_cuda_set_batch_invariant(&w->be, p->batch_invariant);
    /* The prefill worker runs up to max_prefill_tokens per step, the decode worker one token
     * per running sequence: each sizes its activation buffers for that. */
    di_batch_config c = *bc;
    c.max_batch_tokens =
        side == DI_SCHED_PREFILL_SIDE ? e->scfg.max_prefill_tokens : (int64_t)p->max_running;
    c.share = share;
    st = e->model->arch->batch_state_create(e->model->weights, &c, &w->state);
    if (st) return st;
    const int64_t bps = (e->max_model_len + p->block_size - 1) / p->block_size;
    st = eng_alloc_batch(&w->batch, p->max_running, p->max_batch_tokens, bps);
    if (st) return st;
    int64_t rows = p->max_running + (side == DI_SCHED_PREFILL_SIDE ? e->scfg.max_prompt_logits : 0);
    w->logits = di_malloc((size_t)(rows * e->vocab) * sizeof(float));
    if (!w->logits) return di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory for logits");
    w->batch.logits = w->logits;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0)
        return di_error(DI_ERR_INTERNAL, "engine: cannot start the %s worker",
                        side == DI_SCHED_PREFILL_SIDE ? "prefill" : "decode");
    w->started = true;
    return DI_OK;
}

di_status eng_disagg_create(di_engine *e, const di_batch_config *bc, int32_t n_threads) {
    /* Two workers on one GPU would need their own streams and an event at the hand-off; not
     * built yet, so refuse rather than run untested. */
    if (e->model->cuda_device >= 0)
        return di_error(DI_ERR_UNSUPPORTED,
                        "engine params: disaggregate runs on the CPU backend only (the model is "
                        "on cuda:%d)",
                        e->model->cuda_device);
    int32_t prefill = e->p.prefill_threads > 0 ? e->p.prefill_threads : DI_MAX(n_threads / 2, 1);
    int32_t decode = DI_MAX(n_threads - prefill, 1);
    di_status st = worker_init(e, &e->workers[DI_SCHED_PREFILL_SIDE], DI_SCHED_PREFILL_SIDE,
                               prefill, bc, NULL);
    if (!st)
        st = worker_init(e, &e->workers[DI_SCHED_DECODE_SIDE], DI_SCHED_DECODE_SIDE, decode, bc,
                         e->workers[DI_SCHED_PREFILL_SIDE].state);
    return st;
}

void eng_disagg_free(di_engine *e) {
    /* Threads first (a busy one finishes its batch), then the decode worker's state, which
     * borrows the prefill worker's pool. */
    for (int k = 0; k < 2; k++) {
        eng_worker *w = &e->workers[k];
        if (!w->started) continue;
        pthread_mutex_lock(&e->tlock);
        while (w->busy && !w->done)
            pthread_cond_wait(&e->cv, &e->tlock);
        w->quit = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->tlock);
        pthread_join(w->thread, NULL);
        w->started = false;
    }
    const int order[2] = {DI_SCHED_DECODE_SIDE, DI_SCHED_PREFILL_SIDE};
    for (int k = 0; k < 2; k++) {
        eng_worker *w = &e->workers[order[k]];
        if (w->state) e->model->arch->batch_state_free(w->state);
        w->state = NULL;
        di_backend_free(&w->be);
        di_pool_free(w->pool);
        w->pool = NULL;
        eng_free_batch(&w->batch);
        di_free(w->logits);
        w->logits = NULL;
    }
}
