/*
 * block_pool.c -- reference-counted KV blocks: a free stack for plain blocks and an LRU
 * list for cached blocks nobody holds (see block_pool.h for the invariants).
 *
 * Every operation is O(1) except allocation (O(n) in the blocks handed out) and the
 * integrity check (O(n_blocks)). Nothing allocates after init.
 */
#include "kv/block_pool.h"

#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* LRU list of evictable blocks                                                               */
/* ---------------------------------------------------------------------------------------- */

static void lru_push_tail(di_block_pool *p, int32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0)
        p->lru_next[p->lru_tail] = b;
    else
        p->lru_head = b;
    p->lru_tail = b;
    p->n_evictable++;
}

static void lru_remove(di_block_pool *p, int32_t b) {
    int32_t prev = p->lru_prev[b], next = p->lru_next[b];
    if (prev >= 0)
        p->lru_next[prev] = next;
    else
        p->lru_head = next;
    if (next >= 0)
        p->lru_prev[next] = prev;
    else
        p->lru_tail = prev;
    p->lru_prev[b] = p->lru_next[b] = -1;
    p->n_evictable--;
}

/* ---------------------------------------------------------------------------------------- */
/* Life cycle                                                                                 */
/* ---------------------------------------------------------------------------------------- */

di_status di_block_pool_init(di_block_pool *p, int32_t n_blocks, int32_t block_size) {
    memset(p, 0, sizeof *p);
    if (n_blocks <= 0 || block_size <= 0)
        return di_error(DI_ERR_INVALID_ARG,
                        "block pool: n_blocks (%d) and block_size (%d) must be positive",
                        (int)n_blocks, (int)block_size);
    p->ref = di_calloc((size_t)n_blocks, sizeof *p->ref);
    p->cached = di_calloc((size_t)n_blocks, sizeof *p->cached);
    p->free_stack = di_calloc((size_t)n_blocks, sizeof *p->free_stack);
    p->lru_prev = di_calloc((size_t)n_blocks, sizeof *p->lru_prev);
    p->lru_next = di_calloc((size_t)n_blocks, sizeof *p->lru_next);
    if (!p->ref || !p->cached || !p->free_stack || !p->lru_prev || !p->lru_next) {
        di_block_pool_free(p);
        return di_error(DI_ERR_OUT_OF_MEMORY, "block pool: cannot allocate %d block records",
                        (int)n_blocks);
    }
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    /* Stack order makes block 0 the first one handed out, which keeps tests readable. */
    for (int32_t i = 0; i < n_blocks; i++) {
        p->free_stack[i] = n_blocks - 1 - i;
        p->lru_prev[i] = p->lru_next[i] = -1;
    }
    p->n_free = n_blocks;
    p->lru_head = p->lru_tail = -1;
    return DI_OK;
}

void di_block_pool_free(di_block_pool *p) {
    di_free(p->ref);
    di_free(p->cached);
    di_free(p->free_stack);
    di_free(p->lru_prev);
    di_free(p->lru_next);
    memset(p, 0, sizeof *p);
    p->lru_head = p->lru_tail = -1;
}

/* ---------------------------------------------------------------------------------------- */
/* Allocation and references                                                                  */
/* ---------------------------------------------------------------------------------------- */

di_status di_block_pool_allocate(di_block_pool *p, int64_t n, int32_t *out) {
    if (!di_block_pool_can_allocate(p, n))
        return di_error(DI_ERR_OUT_OF_MEMORY, "block pool: %lld blocks requested, %d available",
                        (long long)n, (int)di_block_pool_n_available(p));
    for (int64_t i = 0; i < n; i++) {
        int32_t b;
        if (p->n_free > 0) {
            b = p->free_stack[--p->n_free];
        } else {
            b = p->lru_head;
            lru_remove(p, b);
            p->cached[b] = 0;
            if (p->hook.on_evict) p->hook.on_evict(p->hook.ctx, b);
        }
        p->ref[b] = 1;
        out[i] = b;
    }
    return DI_OK;
}

void di_block_pool_ref(di_block_pool *p, int32_t b) {
    if (p->ref[b] == 0) lru_remove(p, b); /* only cached blocks are shared at count 0 */
    p->ref[b]++;
}

void di_block_pool_unref(di_block_pool *p, int32_t b) {
    if (--p->ref[b] > 0) return;
    if (p->cached[b])
        lru_push_tail(p, b);
    else
        p->free_stack[p->n_free++] = b;
}

void di_block_pool_mark_cached(di_block_pool *p, int32_t b) {
    p->cached[b] = 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Integrity                                                                                  */
/* ---------------------------------------------------------------------------------------- */

di_status di_block_pool_check(const di_block_pool *p, const int32_t *expected_refs) {
    /* seen[b]: 1 on the free stack, 2 on the LRU list. The check allocates its scratch: it
     * runs in tests and debug builds, never inside an engine step of a release build. */
    uint8_t *seen = di_calloc((size_t)p->n_blocks, 1);
    if (!seen) return di_error(DI_ERR_OUT_OF_MEMORY, "block pool check: no memory");
    di_status st = DI_OK;
    if (p->n_free < 0 || p->n_free > p->n_blocks) {
        st = di_error(DI_ERR_INTERNAL, "block pool: n_free %d out of range", (int)p->n_free);
        goto done;
    }
    for (int32_t i = 0; i < p->n_free; i++) {
        int32_t b = p->free_stack[i];
        if (b < 0 || b >= p->n_blocks || seen[b]) {
            st = di_error(DI_ERR_INTERNAL,
                          "block pool: free stack entry %d (block %d) is invalid or repeated",
                          (int)i, (int)b);
            goto done;
        }
        seen[b] = 1;
    }
    int32_t n_lru = 0, prev = -1;
    for (int32_t b = p->lru_head; b >= 0; b = p->lru_next[b]) {
        if (b >= p->n_blocks || seen[b] || p->lru_prev[b] != prev || ++n_lru > p->n_blocks) {
            st = di_error(DI_ERR_INTERNAL, "block pool: LRU list is broken at block %d", (int)b);
            goto done;
        }
        seen[b] = 2;
        prev = b;
    }
    if (prev != p->lru_tail || n_lru != p->n_evictable) {
        st = di_error(DI_ERR_INTERNAL, "block pool: LRU tail %d / count %d, expected %d / %d",
                      (int)p->lru_tail, (int)p->n_evictable, (int)prev, (int)n_lru);
        goto done;
    }
    for (int32_t b = 0; b < p->n_blocks; b++) {
        bool ok;
        if (p->ref[b] > 0)
            ok = seen[b] == 0;
        else if (p->ref[b] == 0)
            ok = p->cached[b] ? seen[b] == 2 : seen[b] == 1;
        else
            ok = false;
        if (!ok) {
            st = di_error(DI_ERR_INTERNAL, "block pool: block %d has ref %d, cached %d, but is %s",
                          (int)b, (int)p->ref[b], (int)p->cached[b],
                          seen[b] == 1   ? "on the free stack"
                          : seen[b] == 2 ? "on the LRU list"
                                         : "on no list");
            goto done;
        }
        if (expected_refs && expected_refs[b] != p->ref[b]) {
            st = di_error(DI_ERR_INTERNAL, "block pool: block %d has ref %d but %d owners", (int)b,
                          (int)p->ref[b], (int)expected_refs[b]);
            goto done;
        }
    }
done:
    di_free(seen);
    return st;
}
