/*
 * tok_bpe.c -- the BPE model: merging one pre-tokenized word into ids, with a word cache.
 *
 * Design stance: the same algorithm as Hugging Face's Word::merge_all, so results agree
 * even for vocabularies whose merges are not "consistent": symbols form a doubly linked
 * list over an array; a binary min-heap holds candidate merges ordered by (rank, position);
 * a popped candidate is stale when its left symbol was absorbed or the pair at that position
 * no longer merges into the same id. Each merge pushes at most two new candidates, so a word
 * of n symbols costs O(n log n).
 *
 * Cache: words up to TOK_CACHE_KEY bytes whose result fits TOK_CACHE_IDS ids are kept in a
 * direct-mapped table split into shards, each under its own mutex, so concurrent encoders
 * rarely wait. Entries are overwritten on collision, which bounds the memory.
 */
#include "tok/tok_internal.h"

#include <string.h>

void tok_cache_init(di_tokenizer *t) {
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) {
        pthread_mutex_init(&t->cache[i].lock, NULL);
        t->cache[i].slots = NULL; /* allocated on first store */
    }
}

void tok_cache_free(di_tokenizer *t) {
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) {
        pthread_mutex_destroy(&t->cache[i].lock);
        di_free(t->cache[i].slots);
        t->cache[i].slots = NULL;
    }
}

static bool cache_get(const di_tokenizer *t, tok_scratch *sc, uint64_t h, const uint8_t *w,
                      size_t n) {
    tok_cache_shard *sh = (tok_cache_shard *)&t->cache[h % TOK_CACHE_SHARDS];
    bool hit = false;
    pthread_mutex_lock(&sh->lock);
    if (sh->slots) {
        const tok_cache_entry *e = &sh->slots[(h >> 8) % TOK_CACHE_SLOTS];
        if (e->hash == h && e->key_len == n && !memcmp(e->key, w, n) &&
            sc->n_ids + e->n_ids <= sc->ids_cap) {
            memcpy(sc->ids + sc->n_ids, e->ids, e->n_ids * sizeof(int32_t));
            sc->n_ids += e->n_ids;
            hit = true;
        }
    }
    pthread_mutex_unlock(&sh->lock);
    return hit;
}

static void cache_put(const di_tokenizer *t, uint64_t h, const uint8_t *w, size_t n,
                      const int32_t *ids, size_t n_ids) {
    tok_cache_shard *sh = (tok_cache_shard *)&t->cache[h % TOK_CACHE_SHARDS];
    pthread_mutex_lock(&sh->lock);
    if (!sh->slots) sh->slots = di_calloc(TOK_CACHE_SLOTS, sizeof(tok_cache_entry));
    if (sh->slots) {
        tok_cache_entry *e = &sh->slots[(h >> 8) % TOK_CACHE_SLOTS];
        e->hash = h;
        e->key_len = (uint8_t)n;
        e->n_ids = (uint8_t)n_ids;
        memcpy(e->key, w, n);
        memcpy(e->ids, ids, n_ids * sizeof(int32_t));
    }
    pthread_mutex_unlock(&sh->lock);
}

static di_status bpe_reserve(tok_scratch *sc, size_t n) {
    if (sc->bpe_cap >= n) return DI_OK;
    size_t cap = DI_MAX(n, 2 * sc->bpe_cap);
    int32_t *a = di_realloc(sc->sym_id, cap * sizeof(int32_t));
    if (a) sc->sym_id = a;
    int32_t *b = di_realloc(sc->sym_prev, cap * sizeof(int32_t));
    if (b) sc->sym_prev = b;
    int32_t *c = di_realloc(sc->sym_next, cap * sizeof(int32_t));
    if (c) sc->sym_next = c;
    uint64_t *d = di_realloc(sc->heap, 3 * cap * sizeof(uint64_t));
    if (d) sc->heap = d;
    int32_t *e = di_realloc(sc->heap_id, 3 * cap * sizeof(int32_t));
    if (e) sc->heap_id = e;
    if (!a || !b || !c || !d || !e) return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: scratch");
    sc->bpe_cap = cap;
    return DI_OK;
}

/* ---- binary min-heap over (rank << 32 | pos), with the merged id alongside ---------------- */

static void heap_push(tok_scratch *sc, size_t *hn, uint64_t key, int32_t id) {
    size_t i = (*hn)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (sc->heap[parent] <= key) break;
        sc->heap[i] = sc->heap[parent];
        sc->heap_id[i] = sc->heap_id[parent];
        i = parent;
    }
    sc->heap[i] = key;
    sc->heap_id[i] = id;
}

static void heap_pop(tok_scratch *sc, size_t *hn, uint64_t *key, int32_t *id) {
    *key = sc->heap[0];
    *id = sc->heap_id[0];
    size_t n = --(*hn);
    uint64_t k = sc->heap[n];
    int32_t v = sc->heap_id[n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && sc->heap[c + 1] < sc->heap[c]) c++;
        if (k <= sc->heap[c]) break;
        sc->heap[i] = sc->heap[c];
        sc->heap_id[i] = sc->heap_id[c];
        i = c;
    }
    sc->heap[i] = k;
    sc->heap_id[i] = v;
}

static void try_push(const di_tokenizer *t, tok_scratch *sc, size_t *hn, int32_t pos) {
    int32_t next = sc->sym_next[pos], rank, id;
    if (next < 0) return;
    if (tok_pairmap_get(&t->merges, sc->sym_id[pos], sc->sym_id[next], &rank, &id))
        heap_push(sc, hn, ((uint64_t)(uint32_t)rank << 32) | (uint32_t)pos, id);
}

/* ---- initial symbols -------------------------------------------------------------------- */

/* One symbol per byte (ByteLevel) or per character; unknown ones become unk or vanish. */
static size_t initial_symbols(const di_tokenizer *t, tok_scratch *sc, const uint8_t *w, size_t n) {
    size_t ns = 0;
    bool last_unk = false;
    for (size_t i = 0; i < n;) {
        size_t len = 1;
        int32_t id;
        if (t->byte_level) {
            id = t->byte_id[w[i]];
        } else {
            uint32_t cp;
            len = tok_utf8_next(w + i, n - i, &cp);
            id = tok_strmap_get(&t->bpe, t->arena, w + i, len);
        }
        i += len;
        bool unk = id < 0;
        if (unk) {
            if (t->unk_id < 0) continue; /* HF drops it when there is no unk token */
            if (t->fuse_unk && last_unk) continue;
            id = t->unk_id;
        }
        last_unk = unk;
        sc->sym_id[ns++] = id;
    }
    for (size_t i = 0; i < ns; i++) {
        sc->sym_prev[i] = (int32_t)i - 1;
        sc->sym_next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    return ns;
}

static void merge_all(const di_tokenizer *t, tok_scratch *sc, size_t ns) {
    size_t hn = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        try_push(t, sc, &hn, (int32_t)i);
    while (hn > 0) {
        uint64_t key;
        int32_t new_id, rank, id;
        heap_pop(sc, &hn, &key, &new_id);
        int32_t pos = (int32_t)(key & 0xffffffffu);
        int32_t next = sc->sym_next[pos];
        if (sc->sym_id[pos] < 0 || next < 0) continue;
        if (!tok_pairmap_get(&t->merges, sc->sym_id[pos], sc->sym_id[next], &rank, &id) ||
            id != new_id)
            continue; /* stale candidate */
        sc->sym_id[pos] = new_id;
        sc->sym_id[next] = -1;
        int32_t after = sc->sym_next[next];
        sc->sym_next[pos] = after;
        if (after >= 0) sc->sym_prev[after] = pos;
        if (sc->sym_prev[pos] >= 0) try_push(t, sc, &hn, sc->sym_prev[pos]);
        try_push(t, sc, &hn, pos);
    }
}

di_status tok_bpe_word(const di_tokenizer *t, tok_scratch *sc, const uint8_t *w, size_t n) {
    if (sc->n_ids + n + 1 > sc->ids_cap) {
        size_t cap = DI_MAX(2 * sc->ids_cap, sc->n_ids + n + 64);
        int32_t *p = di_realloc(sc->ids, cap * sizeof(int32_t));
        if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: output ids");
        sc->ids = p;
        sc->ids_cap = cap;
    }
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->bpe, t->arena, w, n);
        if (id >= 0) {
            sc->ids[sc->n_ids++] = id;
            return DI_OK;
        }
    }
    bool cacheable = n <= TOK_CACHE_KEY;
    uint64_t h = cacheable ? tok_hash(w, n) : 0;
    if (cacheable && cache_get(t, sc, h, w, n)) return DI_OK;
    di_status st = bpe_reserve(sc, n + 1);
    if (st != DI_OK) return st;
    size_t ns = initial_symbols(t, sc, w, n);
    merge_all(t, sc, ns);
    size_t first = sc->n_ids;
    for (int32_t i = ns ? 0 : -1; i >= 0; i = sc->sym_next[i])
        sc->ids[sc->n_ids++] = sc->sym_id[i];
    size_t got = sc->n_ids - first;
    if (cacheable && got <= TOK_CACHE_IDS) cache_put(t, h, w, n, sc->ids + first, got);
    return DI_OK;
}
