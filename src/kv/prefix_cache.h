/*
 * prefix_cache.h -- content-addressed reuse of full KV blocks across requests.
 *
 * A full block (block_size tokens) is identified by its tokens and by the block before it:
 * its key is the 64-bit FNV-1a hash of (parent hash, tokens). A request that starts with the
 * same tokens as an earlier one walks the chain from the first block and shares every block
 * found, so only the rest of its prompt is computed.
 *
 * Design stance:
 *   - The hash only finds candidates. A hit also needs the exact tokens and the exact parent:
 *     each registration gets a unique generation number, and a block stores the generation of
 *     its parent, so a 64-bit collision or a parent that was evicted and reused can never
 *     produce a false hit.
 *   - Blocks stay registered after their last owner lets go (count 0, on the pool's LRU
 *     list) and are evicted, least recently freed first, only when the pool needs memory:
 *     the cache installs itself as the pool's eviction hook.
 *   - Lookup never changes state; the caller takes references to the blocks it uses
 *     (check-then-commit, as for allocation).
 *   - Only blocks whose rows were fully written (after the step that computed them) may be
 *     registered, so a hit never reads rows still being written.
 *
 * Invariants (checked by di_prefix_cache_check): a block is in the table exactly once iff
 * the pool marks it cached, and its lookup by its own key finds it; a registered block has a
 * non-zero generation.
 */
#ifndef DI_KV_PREFIX_CACHE_H
#define DI_KV_PREFIX_CACHE_H

#include "kv/block_pool.h"

#include <stdint.h>

/* FNV-1a 64-bit, over the parent hash (8 bytes, little-endian) then each token (4 bytes,
 * little-endian). The first block of a sequence uses DI_PREFIX_ROOT_HASH as its parent. */
#define DI_PREFIX_ROOT_HASH 0xcbf29ce484222325ULL
uint64_t di_prefix_hash_block(uint64_t parent_hash, const int32_t *tokens, int64_t n);

/* Where a chain of blocks ends: the hash and generation of its last block ({ROOT, 0} for the
 * empty chain). A request keeps one to register its next full block. */
typedef struct di_prefix_chain {
    uint64_t hash;
    uint64_t gen;
} di_prefix_chain;

static inline di_prefix_chain di_prefix_chain_root(void) {
    di_prefix_chain c = {DI_PREFIX_ROOT_HASH, 0};
    return c;
}

typedef struct di_prefix_cache {
    di_block_pool *pool; /* borrowed; must outlive the cache */
    int32_t block_size;
    int32_t n_blocks;

    /* Per block, meaningful while the pool marks the block cached. */
    uint64_t *hash;       /* [n_blocks] chained content hash, owned */
    uint64_t *gen;        /* [n_blocks] registration number, 0 when not registered */
    uint64_t *parent_gen; /* [n_blocks] the parent's registration number (0: first block) */
    int32_t *tokens;      /* [n_blocks][block_size] the block's tokens, owned */

    int32_t *slots;   /* [n_slots] block ids or -1: open addressing, linear probing, owned */
    uint64_t n_slots; /* a power of two, at least twice n_blocks */
    uint64_t next_gen;
    int32_t n_entries;
} di_prefix_cache;

/* Creates an empty cache over pool and installs its eviction hook on the pool. */
di_status di_prefix_cache_init(di_prefix_cache *c, di_block_pool *pool);
void di_prefix_cache_free(di_prefix_cache *c);

/* Finds the longest chain of registered blocks equal to the leading full blocks of tokens,
 * looking at most max_blocks blocks (tokens holds at least max_blocks * block_size ids).
 * Writes the block ids to out[0..k-1], the chain's end to *end (may be NULL), returns k.
 * Changes nothing: the caller references the blocks it keeps. */
int64_t di_prefix_cache_match(const di_prefix_cache *c, const int32_t *tokens, int64_t max_blocks,
                              int32_t *out, di_prefix_chain *end);

/* Registers block (held by the caller, rows written) as the successor of *chain holding
 * tokens[0..block_size-1]. If an equal block is already registered (another request computed
 * the same prefix at the same time), nothing is registered. Either way *chain advances to the
 * registered block, whose id is returned. */
int32_t di_prefix_cache_insert(di_prefix_cache *c, di_prefix_chain *chain, int32_t block,
                               const int32_t *tokens);

/* Checks the invariants above: DI_OK or DI_ERR_INTERNAL with a message. */
di_status di_prefix_cache_check(const di_prefix_cache *c);

#endif /* DI_KV_PREFIX_CACHE_H */
