/*
 * prefix_cache.c -- the hash table of registered KV blocks (see prefix_cache.h).
 *
 * The table is open addressing with linear probing over block ids; deletion shifts the
 * following entries back instead of leaving tombstones, so lookups stay short no matter how
 * many blocks were evicted. Several entries may share a hash (a collision, never a duplicate
 * of the same parent and tokens); lookup checks each candidate exactly.
 */
#include "kv/prefix_cache.h"

#include <string.h>

#define FNV_PRIME 0x100000001b3ULL

uint64_t di_prefix_hash_block(uint64_t parent_hash, const int32_t *tokens, int64_t n) {
    uint64_t h = DI_PREFIX_ROOT_HASH;
    for (int i = 0; i < 8; i++) {
        h ^= (parent_hash >> (8 * i)) & 0xff;
        h *= FNV_PRIME;
    }
    for (int64_t t = 0; t < n; t++) {
        uint32_t v = (uint32_t)tokens[t];
        for (int i = 0; i < 4; i++) {
            h ^= (v >> (8 * i)) & 0xff;
            h *= FNV_PRIME;
        }
    }
    return h;
}

static const int32_t *block_tokens(const di_prefix_cache *c, int32_t b) {
    return c->tokens + (size_t)b * (size_t)c->block_size;
}

/* ---------------------------------------------------------------------------------------- */
/* Hash table                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static uint64_t home_slot(const di_prefix_cache *c, uint64_t h) {
    return h & (c->n_slots - 1);
}

/* The registered block with this hash, parent and tokens, or -1. */
static int32_t find_entry(const di_prefix_cache *c, uint64_t h, uint64_t parent_gen,
                          const int32_t *tokens) {
    size_t bytes = (size_t)c->block_size * sizeof(int32_t);
    for (uint64_t i = home_slot(c, h);; i = (i + 1) & (c->n_slots - 1)) {
        int32_t b = c->slots[i];
        if (b < 0) return -1;
        if (c->hash[b] == h && c->parent_gen[b] == parent_gen &&
            memcmp(block_tokens(c, b), tokens, bytes) == 0)
            return b;
    }
}

static void table_insert(di_prefix_cache *c, int32_t b) {
    uint64_t i = home_slot(c, c->hash[b]);
    while (c->slots[i] >= 0)
        i = (i + 1) & (c->n_slots - 1);
    c->slots[i] = b;
    c->n_entries++;
}

static void table_remove(di_prefix_cache *c, int32_t b) {
    uint64_t mask = c->n_slots - 1;
    uint64_t i = home_slot(c, c->hash[b]);
    while (c->slots[i] != b)
        i = (i + 1) & mask; /* present: the pool said it is cached */
    /* Backward shift: move later entries of the probe run into the hole when their home
     * slot does not lie (cyclically) between the hole and their position. */
    for (uint64_t j = (i + 1) & mask; c->slots[j] >= 0; j = (j + 1) & mask) {
        uint64_t k = home_slot(c, c->hash[c->slots[j]]);
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        c->slots[i] = c->slots[j];
        i = j;
    }
    c->slots[i] = -1;
    c->n_entries--;
}

static void on_evict(void *ctx, int32_t b) {
    di_prefix_cache *c = ctx;
    table_remove(c, b);
    c->gen[b] = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Life cycle                                                                                 */
/* ---------------------------------------------------------------------------------------- */

di_status di_prefix_cache_init(di_prefix_cache *c, di_block_pool *pool) {
    memset(c, 0, sizeof *c);
    size_t n = (size_t)pool->n_blocks;
    uint64_t n_slots = 16;
    while (n_slots < 2 * (uint64_t)n)
        n_slots *= 2;
    c->hash = di_calloc(n, sizeof *c->hash);
    c->gen = di_calloc(n, sizeof *c->gen);
    c->parent_gen = di_calloc(n, sizeof *c->parent_gen);
    c->tokens = di_calloc(n * (size_t)pool->block_size, sizeof *c->tokens);
    c->slots = di_malloc((size_t)n_slots * sizeof *c->slots);
    if (!c->hash || !c->gen || !c->parent_gen || !c->tokens || !c->slots) {
        di_prefix_cache_free(c);
        return di_error(DI_ERR_OUT_OF_MEMORY,
                        "prefix cache: cannot allocate records for %d blocks of %d tokens",
                        (int)pool->n_blocks, (int)pool->block_size);
    }
    for (uint64_t i = 0; i < n_slots; i++)
        c->slots[i] = -1;
    c->pool = pool;
    c->block_size = pool->block_size;
    c->n_blocks = pool->n_blocks;
    c->n_slots = n_slots;
    c->next_gen = 1;
    pool->hook.on_evict = on_evict;
    pool->hook.ctx = c;
    return DI_OK;
}

void di_prefix_cache_free(di_prefix_cache *c) {
    if (c->pool && c->pool->hook.ctx == c) c->pool->hook = (di_block_evict_hook){NULL, NULL};
    di_free(c->hash);
    di_free(c->gen);
    di_free(c->parent_gen);
    di_free(c->tokens);
    di_free(c->slots);
    memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------------------------------- */
/* Lookup and registration                                                                    */
/* ---------------------------------------------------------------------------------------- */

int64_t di_prefix_cache_match(const di_prefix_cache *c, const int32_t *tokens, int64_t max_blocks,
                              int32_t *out, di_prefix_chain *end) {
    di_prefix_chain chain = di_prefix_chain_root();
    int64_t k = 0;
    for (; k < max_blocks; k++) {
        const int32_t *t = tokens + k * c->block_size;
        uint64_t h = di_prefix_hash_block(chain.hash, t, c->block_size);
        int32_t b = find_entry(c, h, chain.gen, t);
        if (b < 0) break;
        out[k] = b;
        chain.hash = h;
        chain.gen = c->gen[b];
    }
    if (end) *end = chain;
    return k;
}

int32_t di_prefix_cache_insert(di_prefix_cache *c, di_prefix_chain *chain, int32_t block,
                               const int32_t *tokens) {
    uint64_t h = di_prefix_hash_block(chain->hash, tokens, c->block_size);
    int32_t b = find_entry(c, h, chain->gen, tokens);
    if (b < 0) {
        b = block;
        c->hash[b] = h;
        c->gen[b] = c->next_gen++;
        c->parent_gen[b] = chain->gen;
        memcpy(c->tokens + (size_t)b * (size_t)c->block_size, tokens,
               (size_t)c->block_size * sizeof *tokens);
        table_insert(c, b);
        di_block_pool_mark_cached(c->pool, b);
    }
    chain->hash = h;
    chain->gen = c->gen[b];
    return b;
}

/* ---------------------------------------------------------------------------------------- */
/* Integrity                                                                                  */
/* ---------------------------------------------------------------------------------------- */

di_status di_prefix_cache_check(const di_prefix_cache *c) {
    int32_t n_cached = 0;
    for (int32_t b = 0; b < c->n_blocks; b++) {
        if (!c->pool->cached[b]) continue;
        n_cached++;
        if (c->gen[b] == 0)
            return di_error(DI_ERR_INTERNAL, "prefix cache: cached block %d has no generation",
                            (int)b);
        if (find_entry(c, c->hash[b], c->parent_gen[b], block_tokens(c, b)) != b)
            return di_error(DI_ERR_INTERNAL,
                            "prefix cache: cached block %d is not found by its own key", (int)b);
    }
    int32_t n_slots_used = 0;
    for (uint64_t i = 0; i < c->n_slots; i++) {
        int32_t b = c->slots[i];
        if (b < 0) continue;
        n_slots_used++;
        if (b >= c->n_blocks || !c->pool->cached[b])
            return di_error(DI_ERR_INTERNAL,
                            "prefix cache: slot %llu holds block %d, which is not cached",
                            (unsigned long long)i, (int)b);
    }
    /* Every cached block is found by its key and the counts agree, so no block can sit in
     * two slots. */
    if (n_slots_used != n_cached || n_cached != c->n_entries)
        return di_error(DI_ERR_INTERNAL,
                        "prefix cache: %d entries, %d slots used, %d cached blocks",
                        (int)c->n_entries, (int)n_slots_used, (int)n_cached);
    return DI_OK;
}
