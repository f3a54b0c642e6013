/*
 * test_threadpool.c -- the thread pool (src/core/threadpool.c): every item of a loop is run
 * exactly once, by a valid thread id, in ranges that respect the grain, for the static split
 * (di_pool_run) and the dynamic one (di_pool_run_dynamic), over thread counts, sizes and
 * grains, and back to back (the workers' generation handoff).
 */
#include "core/threadpool.h"
#include "test.h"

#include <stdatomic.h>
#include <stdbool.h>

#define MAX_ITEMS 5000

typedef struct {
    atomic_int hits[MAX_ITEMS];
    atomic_int bad_tid, bad_range;
    int n_threads;
    int64_t n, grain;
} count_job;

static void count_items(void *ctx, int64_t b, int64_t e, int tid) {
    count_job *j = ctx;
    if (tid < 0 || tid >= j->n_threads) atomic_fetch_add(&j->bad_tid, 1);
    /* A range starts on a grain boundary and is whole grains, except at the end. */
    if (b < 0 || e > j->n || b >= e || b % j->grain != 0 || (e != j->n && (e - b) % j->grain))
        atomic_fetch_add(&j->bad_range, 1);
    for (int64_t i = b; i < e && i < MAX_ITEMS; i++)
        atomic_fetch_add(&j->hits[i], 1);
}

static void check_loop(di_pool *pool, int n_threads, int64_t n, int64_t grain, bool dynamic) {
    static count_job j;
    for (int64_t i = 0; i < MAX_ITEMS; i++)
        atomic_store(&j.hits[i], 0);
    atomic_store(&j.bad_tid, 0);
    atomic_store(&j.bad_range, 0);
    j.n_threads = n_threads;
    j.n = n;
    j.grain = grain;
    if (dynamic)
        di_pool_run_dynamic(pool, n, grain, count_items, &j);
    else
        di_pool_run(pool, n, grain, count_items, &j);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; i++)
        wrong += atomic_load(&j.hits[i]) != 1;
    CHECK_MSG(wrong == 0, "%lld items not run exactly once (threads %d, n %lld, grain %lld, %s)",
              (long long)wrong, n_threads, (long long)n, (long long)grain,
              dynamic ? "dynamic" : "static");
    CHECK(atomic_load(&j.bad_tid) == 0);
    CHECK(atomic_load(&j.bad_range) == 0);
}

TEST(every_item_once) {
    const int threads[] = {1, 2, 3, 5};
    const int64_t sizes[] = {1, 7, 16, 64, 1000, MAX_ITEMS};
    const int64_t grains[] = {1, 3, 16, 64};
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
        di_pool *pool = di_pool_create(threads[t]);
        CHECK(pool != NULL);
        if (!pool) return;
        CHECK(di_pool_size(pool) == threads[t]);
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t g = 0; g < sizeof grains / sizeof *grains; g++)
                for (int dyn = 0; dyn < 2; dyn++)
                    check_loop(pool, threads[t], sizes[s], grains[g], dyn);
        di_pool_free(pool);
    }
}

/* Many short loops back to back, alternating the two kinds (decode's pattern). */
TEST(back_to_back) {
    di_pool *pool = di_pool_create(2);
    CHECK(pool != NULL);
    if (!pool) return;
    for (int rep = 0; rep < 2000; rep++)
        check_loop(pool, 2, 33 + rep % 50, 1 + rep % 4, rep % 2);
    di_pool_free(pool);
}

/* A NULL pool (the backends' "too small to split" case) runs everything on the caller. */
TEST(null_pool_runs_inline) {
    check_loop(NULL, 1, 100, 16, false);
    check_loop(NULL, 1, 100, 16, true);
}

int main(void) {
    RUN(every_item_once);
    RUN(back_to_back);
    RUN(null_pool_runs_inline);
    return test_summary();
}
