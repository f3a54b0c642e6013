/*
 * threadpool.h -- a fixed pool of compute threads that runs one parallel loop at a time.
 *
 * di_pool_run(pool, n, fn, ctx) calls fn(ctx, i, tid) for every i in [0, n) and returns when
 * all calls are done. Work is split into contiguous ranges by index so that which thread
 * computes which index depends only on (n, thread count), never on timing; kernels that must
 * be batch-invariant additionally make each index's arithmetic independent of the split.
 * The calling thread takes part as thread 0. Workers spin briefly between loops (decode runs
 * thousands of short loops per second) and then sleep.
 */
#ifndef DI_THREADPOOL_H
#define DI_THREADPOOL_H

#include <stdint.h>

typedef struct di_pool di_pool;

/* fn computes the items [begin, end) on thread tid (0 <= tid < n_threads). */
typedef void (*di_pool_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/* n_threads <= 0 means all online cores. Returns NULL on failure (di_last_error says why). */
di_pool *di_pool_create(int n_threads);
void di_pool_free(di_pool *pool);
int di_pool_size(const di_pool *pool);

/* Splits [0, n) into one contiguous range per thread (ranges are multiples of `grain`, except
 * the last) and runs them. Not reentrant: call from one thread at a time. */
void di_pool_run(di_pool *pool, int64_t n, int64_t grain, di_pool_fn fn, void *ctx);

/* Like di_pool_run, but threads claim ranges of `grain` items in order from a shared counter
 * until none is left, so a thread that is slowed down (another process on its core, a
 * slower part of the work) does less of it instead of holding up the others at the end.
 * Which thread computes which range then depends on timing: only for loops whose items'
 * results do not depend on who computes them (the matmuls). Not reentrant either. */
void di_pool_run_dynamic(di_pool *pool, int64_t n, int64_t grain, di_pool_fn fn, void *ctx);

#endif /* DI_THREADPOOL_H */
