/*
 * block_pool.h -- fixed-size paged KV blocks with reference counts (no tensors here).
 *
 * A block holds the cache rows of block_size consecutive positions of one sequence, in
 * every layer; this module only deals in block ids (0 .. n_blocks-1). The model runner maps
 * an id to its rows in the per-layer pools; nothing here knows what a row is.
 *
 * Design stance:
 *   - Allocation is check-then-commit: di_block_pool_can_allocate(n) answers without
 *     changing anything, and di_block_pool_allocate(n) either hands out n blocks or fails
 *     with DI_ERR_OUT_OF_MEMORY leaving the pool exactly as it was.
 *   - A block whose count drops to 0 goes to one of two places. A plain block goes to the
 *     free stack. A block the prefix cache has registered ("cached") goes to the tail of an
 *     LRU list: it still holds valid rows that a later request may reuse. Allocation takes
 *     from the free stack first, then evicts the LRU head, calling the eviction hook so the
 *     prefix cache forgets it.
 *   - Taking a reference to a cached block at count 0 (a prefix-cache hit) pulls it out of
 *     the LRU list; it is no longer available for allocation.
 *
 * Invariants (checked by di_block_pool_check):
 *   - Every block is in exactly one of: in use (ref > 0, in no list), free (ref == 0, not
 *     cached, on the free stack once), evictable (ref == 0, cached, on the LRU list once).
 *   - n_free + n_evictable + n_used == n_blocks.
 *   - When the caller passes the expected counts (how many block tables hold each block),
 *     every ref equals its expected count.
 */
#ifndef DI_KV_BLOCK_POOL_H
#define DI_KV_BLOCK_POOL_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

/* Called when a cached block at count 0 is taken for a new owner; optional. */
typedef struct di_block_evict_hook {
    void (*on_evict)(void *ctx, int32_t block);
    void *ctx;
} di_block_evict_hook;

typedef struct di_block_pool {
    int32_t n_blocks;
    int32_t block_size; /* tokens per block */

    int32_t *ref;        /* [n_blocks] reference counts, owned */
    uint8_t *cached;     /* [n_blocks] 1 while the prefix cache has the block registered */
    int32_t *free_stack; /* [n_blocks] ids of free (uncached, unreferenced) blocks, owned */
    int32_t n_free;

    /* Evictable blocks (cached, count 0) in least-recently-freed-first order. */
    int32_t *lru_prev; /* [n_blocks], -1 at the ends or when not on the list, owned */
    int32_t *lru_next; /* [n_blocks] */
    int32_t lru_head, lru_tail;
    int32_t n_evictable;

    di_block_evict_hook hook;
} di_block_pool;

/* All blocks start free. Fails with DI_ERR_INVALID_ARG / DI_ERR_OUT_OF_MEMORY, pool empty. */
di_status di_block_pool_init(di_block_pool *p, int32_t n_blocks, int32_t block_size);
void di_block_pool_free(di_block_pool *p);

static inline int32_t di_block_pool_n_available(const di_block_pool *p) {
    return p->n_free + p->n_evictable;
}
static inline int32_t di_block_pool_n_used(const di_block_pool *p) {
    return p->n_blocks - p->n_free - p->n_evictable;
}
static inline bool di_block_pool_can_allocate(const di_block_pool *p, int64_t n) {
    return n >= 0 && n <= (int64_t)di_block_pool_n_available(p);
}

/* Hands out n blocks with count 1 into out[0..n-1], free blocks first, then evicting the
 * least recently freed cached ones. Fails (nothing changed) when fewer are available. */
di_status di_block_pool_allocate(di_block_pool *p, int64_t n, int32_t *out);

/* Adds a reference (a prefix-cache hit shares the block). A cached block at count 0 leaves
 * the LRU list. */
void di_block_pool_ref(di_block_pool *p, int32_t block);

/* Drops a reference. At count 0 the block becomes free, or evictable if it is cached. */
void di_block_pool_unref(di_block_pool *p, int32_t block);

/* Marks a block the caller holds (ref > 0) as cached, so that at count 0 it waits on the
 * LRU list instead of the free stack. The mark is cleared only by eviction. */
void di_block_pool_mark_cached(di_block_pool *p, int32_t block);

/* Checks the invariants above. expected_refs ([n_blocks] or NULL) are the counts the owners
 * imply. Returns DI_OK, or DI_ERR_INTERNAL with a message naming the first bad block. */
di_status di_block_pool_check(const di_block_pool *p, const int32_t *expected_refs);

#endif /* DI_KV_BLOCK_POOL_H */
