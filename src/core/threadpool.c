/*
 * threadpool.c -- see threadpool.h.
 *
 * Dispatch: the caller publishes a job and bumps `generation`; workers that see a new
 * generation run their range and increment `done`. Workers spin on the generation for a
 * short while (cheap handoff for back-to-back decode kernels) before parking on a condition
 * variable, so an idle engine does not burn CPU.
 */
#define _POSIX_C_SOURCE 200809L
#include "core/threadpool.h"
#include "core/core.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

/* About 0.2 ms (10 us before): long enough to stay awake across the serial host work between the
 * products of a prefill (routing, an expert's SiLU and gathers), whose futex wake-ups
 * otherwise cost more than they save; an idle engine still parks soon after. */
#define DI_POOL_SPIN 400000

typedef struct {
    di_pool *pool;
    int tid;
} worker_arg;

struct di_pool {
    int n_threads;
    pthread_t *threads; /* [n_threads - 1]; thread 0 is the caller */
    worker_arg *args;   /* [n_threads - 1] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint_fast64_t generation;
    atomic_int done;
    atomic_int sleeping;
    atomic_bool stop;
    /* the current job, valid while a generation is running */
    di_pool_fn fn;
    void *ctx;
    int64_t n, grain;
    bool dynamic;             /* di_pool_run_dynamic: ranges come from `next` */
    atomic_int_fast64_t next; /* the first unclaimed item (dynamic only) */
};

static void run_range(di_pool *p, int tid) {
    int64_t n = p->n, grain = p->grain > 0 ? p->grain : 1;
    if (p->dynamic) {
        for (;;) {
            int64_t b = atomic_fetch_add_explicit(&p->next, grain, memory_order_relaxed);
            if (b >= n) return;
            p->fn(p->ctx, b, DI_MIN(b + grain, n), tid);
        }
    }
    int64_t chunks = (n + grain - 1) / grain;
    int64_t per = chunks / p->n_threads, extra = chunks % p->n_threads;
    int64_t c0 = tid * per + (tid < extra ? tid : extra);
    int64_t c1 = c0 + per + (tid < extra ? 1 : 0);
    int64_t b = c0 * grain, e = DI_MIN(c1 * grain, n);
    if (b < e) p->fn(p->ctx, b, e, tid);
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    di_pool *p = wa->pool;
    uint_fast64_t seen = 0;
    for (;;) {
        uint_fast64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < DI_POOL_SPIN) continue;
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleeping, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        run_range(p, wa->tid);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
    return NULL;
}

di_pool *di_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = di_cpu_count();
    di_pool *p = di_calloc(1, sizeof *p);
    if (!p) {
        di_error(DI_ERR_OUT_OF_MEMORY, "thread pool: out of memory");
        return NULL;
    }
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleeping, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->next, 0);
    if (n_threads > 1) {
        p->threads = di_calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->args = di_calloc((size_t)n_threads - 1, sizeof *p->args);
        if (!p->threads || !p->args) {
            di_free(p->threads);
            di_free(p->args);
            di_free(p);
            di_error(DI_ERR_OUT_OF_MEMORY, "thread pool: out of memory");
            return NULL;
        }
        for (int i = 0; i < n_threads - 1; i++) {
            p->args[i] = (worker_arg){p, i + 1};
            if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
                p->n_threads = i + 1;
                di_pool_free(p);
                di_error(DI_ERR_INTERNAL, "thread pool: cannot start thread %d", i + 1);
                return NULL;
            }
        }
    }
    return p;
}

void di_pool_free(di_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads - 1; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    di_free(p->threads);
    di_free(p->args);
    di_free(p);
}

int di_pool_size(const di_pool *p) {
    return p ? p->n_threads : 1;
}

static void pool_run(di_pool *p, int64_t n, int64_t grain, di_pool_fn fn, void *ctx, bool dynamic) {
    if (n <= 0) return;
    if (!p || p->n_threads == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    p->dynamic = dynamic;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->grain = grain;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_range(p, 0);
    while (atomic_load_explicit(&p->done, memory_order_acquire) < p->n_threads - 1) {
        /* spin: the other ranges are about as long as ours */
    }
}

void di_pool_run(di_pool *p, int64_t n, int64_t grain, di_pool_fn fn, void *ctx) {
    pool_run(p, n, grain, fn, ctx, false);
}

void di_pool_run_dynamic(di_pool *p, int64_t n, int64_t grain, di_pool_fn fn, void *ctx) {
    pool_run(p, n, grain, fn, ctx, true);
}
