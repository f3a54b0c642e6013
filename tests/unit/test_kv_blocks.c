/*
 * test_kv_blocks.c -- the paged KV block pool and the prefix cache (src/kv/block_pool.c,
 * src/kv/prefix_cache.c): check-then-commit allocation, free / LRU bookkeeping, the chained
 * FNV-1a hash against values computed independently (Python), exact-match lookup, eviction
 * order, orphaned children after a parent's eviction, and a randomized run of owners taking
 * and dropping blocks with the integrity checks after every operation.
 */
#include "kv/block_pool.h"
#include "kv/prefix_cache.h"
#include "test.h"

/* Expected refcounts from a list of owners' block tables. */
static void count_refs(int32_t n_blocks, int32_t *const *tables, const int64_t *n, int n_owners,
                       int32_t *refs) {
    memset(refs, 0, (size_t)n_blocks * sizeof *refs);
    for (int o = 0; o < n_owners; o++)
        for (int64_t i = 0; i < n[o]; i++)
            refs[tables[o][i]]++;
}

TEST(pool_check_then_commit) {
    di_block_pool p;
    CHECK_EQ_INT(di_block_pool_init(&p, 8, 4), DI_OK);
    CHECK(di_block_pool_can_allocate(&p, 8));
    CHECK(!di_block_pool_can_allocate(&p, 9));
    int32_t a[8], b[8];
    CHECK_EQ_INT(di_block_pool_allocate(&p, 5, a), DI_OK);
    CHECK_EQ_INT(a[0], 0);
    CHECK_EQ_INT(di_block_pool_n_used(&p), 5);
    /* A failed allocation leaves everything as it was. */
    int32_t before_free = p.n_free;
    CHECK_EQ_INT(di_block_pool_allocate(&p, 4, b), DI_ERR_OUT_OF_MEMORY);
    CHECK_EQ_INT(p.n_free, before_free);
    CHECK_EQ_INT(di_block_pool_check(&p, NULL), DI_OK);
    /* Shared block: two owners. */
    di_block_pool_ref(&p, a[1]);
    int32_t refs[8] = {1, 2, 1, 1, 1, 0, 0, 0};
    CHECK_EQ_INT(di_block_pool_check(&p, refs), DI_OK);
    refs[1] = 1;
    CHECK_EQ_INT(di_block_pool_check(&p, refs), DI_ERR_INTERNAL); /* an owner is missing */
    for (int i = 0; i < 5; i++)
        di_block_pool_unref(&p, a[i]);
    di_block_pool_unref(&p, a[1]);
    CHECK_EQ_INT(di_block_pool_n_available(&p), 8);
    CHECK_EQ_INT(di_block_pool_check(&p, NULL), DI_OK);
    di_block_pool_free(&p);
    CHECK_EQ_INT(di_block_pool_init(&p, 0, 4), DI_ERR_INVALID_ARG);
}

TEST(hash_is_fnv1a) {
    /* Values from a few lines of Python: FNV-1a 64 over parent (8 bytes LE) + tokens (4 LE). */
    int32_t t1[4] = {1, 2, 3, 4}, t2[4] = {-1, 100000, 0, 7};
    CHECK(di_prefix_hash_block(DI_PREFIX_ROOT_HASH, t1, 0) == 0xf4ed18ebf16aa5ccULL);
    uint64_t h1 = di_prefix_hash_block(DI_PREFIX_ROOT_HASH, t1, 4);
    CHECK(h1 == 0x58cc85c45867f1c8ULL);
    CHECK(di_prefix_hash_block(h1, t2, 4) == 0x89bb66bd8920537eULL);
}

/* Registers n full blocks of tokens as one chain in freshly allocated blocks. */
static void register_chain(di_prefix_cache *c, const int32_t *tokens, int64_t n, int32_t *blk) {
    CHECK_EQ_INT(di_block_pool_allocate(c->pool, n, blk), DI_OK);
    di_prefix_chain ch = di_prefix_chain_root();
    for (int64_t i = 0; i < n; i++)
        CHECK_EQ_INT(di_prefix_cache_insert(c, &ch, blk[i], tokens + i * c->block_size), blk[i]);
}

TEST(prefix_match_and_evict) {
    di_block_pool p;
    di_prefix_cache c;
    CHECK_EQ_INT(di_block_pool_init(&p, 6, 2), DI_OK);
    CHECK_EQ_INT(di_prefix_cache_init(&c, &p), DI_OK);
    int32_t seq[8] = {10, 11, 12, 13, 14, 15, 16, 17}, blk[4], hit[4];
    register_chain(&c, seq, 3, blk); /* blocks 0,1,2 hold [10 11][12 13][14 15] */
    CHECK_EQ_INT(di_prefix_cache_check(&c), DI_OK);
    CHECK_EQ_INT(di_prefix_cache_match(&c, seq, 4, hit, NULL), 3);
    CHECK_EQ_INT(hit[2], blk[2]);
    int32_t other[4] = {10, 11, 99, 13};
    CHECK_EQ_INT(di_prefix_cache_match(&c, other, 2, hit, NULL), 1); /* exact tokens only */
    int32_t shifted[4] = {12, 13, 14, 15};
    CHECK_EQ_INT(di_prefix_cache_match(&c, shifted, 2, hit, NULL), 0); /* parent matters */

    /* Released: the blocks stay matchable, on the LRU list, last block freed first. */
    for (int i = 2; i >= 0; i--)
        di_block_pool_unref(&p, blk[i]);
    CHECK_EQ_INT(p.n_evictable, 3);
    CHECK_EQ_INT(di_prefix_cache_match(&c, seq, 4, hit, NULL), 3);
    CHECK_EQ_INT(di_block_pool_check(&p, NULL), DI_OK);

    /* Taking 4 blocks uses the 3 free ones, then evicts the least recently freed: block 2. */
    int32_t got[4];
    CHECK_EQ_INT(di_block_pool_allocate(&p, 4, got), DI_OK);
    CHECK_EQ_INT(got[3], blk[2]);
    CHECK_EQ_INT(di_prefix_cache_match(&c, seq, 4, hit, NULL), 2);
    CHECK_EQ_INT(di_prefix_cache_check(&c), DI_OK);
    /* A hit on a count-0 block pulls it off the LRU list. */
    di_block_pool_ref(&p, blk[0]);
    CHECK_EQ_INT(p.n_evictable, 1);
    CHECK_EQ_INT(di_block_pool_check(&p, NULL), DI_OK);

    di_block_pool_unref(&p, blk[0]);
    for (int i = 0; i < 4; i++)
        di_block_pool_unref(&p, got[i]);
    CHECK_EQ_INT(di_prefix_cache_check(&c), DI_OK);
    CHECK_EQ_INT(di_block_pool_check(&p, NULL), DI_OK);
    di_prefix_cache_free(&c);
    di_block_pool_free(&p);
}

TEST(prefix_orphan_after_parent_eviction) {
    /* The parent of a held block is evicted; the same first tokens are registered again in
     * another block. The old child must not match under the new parent. */
    di_block_pool p;
    di_prefix_cache c;
    CHECK_EQ_INT(di_block_pool_init(&p, 4, 2), DI_OK);
    CHECK_EQ_INT(di_prefix_cache_init(&c, &p), DI_OK);
    int32_t seq[4] = {5, 6, 7, 8}, ab[2], hit[2], tmp[3], a2[1];
    register_chain(&c, seq, 2, ab);
    di_block_pool_unref(&p, ab[0]);                          /* the child ab[1] stays held */
    CHECK_EQ_INT(di_block_pool_allocate(&p, 3, tmp), DI_OK); /* evicts ab[0] */
    CHECK_EQ_INT(tmp[2], ab[0]);
    for (int i = 0; i < 3; i++)
        di_block_pool_unref(&p, tmp[i]);
    register_chain(&c, seq, 1, a2);
    CHECK_EQ_INT(di_prefix_cache_match(&c, seq, 2, hit, NULL), 1);
    CHECK_EQ_INT(hit[0], a2[0]);
    CHECK(p.cached[ab[1]]);
    di_block_pool_unref(&p, a2[0]);
    di_block_pool_unref(&p, ab[1]);
    CHECK_EQ_INT(di_prefix_cache_check(&c), DI_OK);
    CHECK_EQ_INT(di_block_pool_check(&p, NULL), DI_OK);
    di_prefix_cache_free(&c);
    di_block_pool_free(&p);
}

TEST(prefix_duplicate_registration) {
    /* Two owners compute the same prefix at once: the second registration finds the first
     * block and registers nothing; its chain continues through the first one's block. */
    di_block_pool p;
    di_prefix_cache c;
    CHECK_EQ_INT(di_block_pool_init(&p, 8, 2), DI_OK);
    CHECK_EQ_INT(di_prefix_cache_init(&c, &p), DI_OK);
    int32_t seq[4] = {1, 2, 3, 4}, a[2], b[2], hit[2];
    register_chain(&c, seq, 2, a);
    CHECK_EQ_INT(di_block_pool_allocate(&p, 2, b), DI_OK);
    di_prefix_chain ch = di_prefix_chain_root();
    CHECK_EQ_INT(di_prefix_cache_insert(&c, &ch, b[0], seq), a[0]);
    CHECK_EQ_INT(di_prefix_cache_insert(&c, &ch, b[1], seq + 2), a[1]);
    CHECK_EQ_INT(c.n_entries, 2);
    CHECK(!p.cached[b[0]] && !p.cached[b[1]]);
    CHECK_EQ_INT(di_prefix_cache_match(&c, seq, 2, hit, NULL), 2);
    for (int i = 0; i < 2; i++) {
        di_block_pool_unref(&p, a[i]);
        di_block_pool_unref(&p, b[i]);
    }
    CHECK_EQ_INT(p.n_free, 6);
    CHECK_EQ_INT(p.n_evictable, 2);
    CHECK_EQ_INT(di_prefix_cache_check(&c), DI_OK);
    CHECK_EQ_INT(di_block_pool_check(&p, NULL), DI_OK);
    di_prefix_cache_free(&c);
    di_block_pool_free(&p);
}

/* ---------------------------------------------------------------------------------------- */
/* Randomized: owners with block tables over a small alphabet, so prefixes repeat           */
/* ---------------------------------------------------------------------------------------- */

#define N_OWNERS 6
#define MAX_BLK  8
#define BS       2

static uint64_t rng_state = 88172645463325252ULL;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

TEST(random_owners) {
    di_block_pool p;
    di_prefix_cache c;
    const int32_t n_blocks = 20;
    CHECK_EQ_INT(di_block_pool_init(&p, n_blocks, BS), DI_OK);
    CHECK_EQ_INT(di_prefix_cache_init(&c, &p), DI_OK);
    int32_t tokens[N_OWNERS][MAX_BLK * BS];
    int32_t table_mem[N_OWNERS][MAX_BLK];
    int32_t *tables[N_OWNERS];
    int64_t n[N_OWNERS] = {0};
    int32_t refs[20];
    int64_t hits = 0;
    for (int o = 0; o < N_OWNERS; o++)
        tables[o] = table_mem[o];
    for (int it = 0; it < 20000 && !test_cur_failed; it++) {
        int o = (int)rnd(N_OWNERS);
        if (n[o] > 0 && rnd(3) == 0) { /* the owner finishes */
            for (int64_t i = n[o] - 1; i >= 0; i--)
                di_block_pool_unref(&p, tables[o][i]);
            n[o] = 0;
        } else if (n[o] == 0) { /* a new owner: tokens from a 2-letter alphabet, reuse prefix */
            int64_t want = 1 + rnd(MAX_BLK);
            for (int i = 0; i < want * BS; i++)
                tokens[o][i] = (int32_t)rnd(2);
            int32_t hit[MAX_BLK];
            di_prefix_chain ch;
            int64_t k = di_prefix_cache_match(&c, tokens[o], want, hit, &ch);
            int64_t pinned = 0;
            for (int64_t i = 0; i < k; i++)
                pinned += p.ref[hit[i]] == 0;
            if (!di_block_pool_can_allocate(&p, want - k + pinned)) continue;
            for (int64_t i = 0; i < k; i++) {
                di_block_pool_ref(&p, hit[i]);
                tables[o][i] = hit[i];
                /* The hit must hold exactly these tokens. */
                CHECK(memcmp(c.tokens + hit[i] * BS, tokens[o] + i * BS, BS * 4) == 0);
            }
            hits += k;
            CHECK_EQ_INT(di_block_pool_allocate(&p, want - k, tables[o] + k), DI_OK);
            for (int64_t i = k; i < want; i++)
                di_prefix_cache_insert(&c, &ch, tables[o][i], tokens[o] + i * BS);
            n[o] = want;
        }
        count_refs(n_blocks, tables, n, N_OWNERS, refs);
        CHECK_EQ_INT(di_block_pool_check(&p, refs), DI_OK);
        CHECK_EQ_INT(di_prefix_cache_check(&c), DI_OK);
    }
    CHECK(hits > 1000);
    for (int o = 0; o < N_OWNERS; o++)
        for (int64_t i = 0; i < n[o]; i++)
            di_block_pool_unref(&p, tables[o][i]);
    CHECK_EQ_INT(di_block_pool_n_used(&p), 0);
    CHECK_EQ_INT(di_block_pool_check(&p, NULL), DI_OK);
    di_prefix_cache_free(&c);
    di_block_pool_free(&p);
}

int main(void) {
    RUN(pool_check_then_commit);
    RUN(hash_is_fnv1a);
    RUN(prefix_match_and_evict);
    RUN(prefix_orphan_after_parent_eviction);
    RUN(prefix_duplicate_registration);
    RUN(random_owners);
    return test_summary();
}
