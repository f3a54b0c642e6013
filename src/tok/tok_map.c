/*
 * tok_map.c -- the hash maps behind vocab and merge lookups.
 *
 * Design stance: linear probing over power-of-two tables kept at most half full, sized once
 * from the expected count (the tokenizer is built once and then only read). Keys are not
 * copied: a string map stores spans into the tokenizer's arena and compares against it.
 * Invariant: a stored hash is never 0 (0 marks an empty slot).
 */
#include "tok/tok_internal.h"

#include <string.h>

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

/* A simple multiply-mix hash, 8 bytes per step; fast on the short keys BPE uses. */
uint64_t tok_hash(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0x100000001B3ull);
    while (n >= 8) {
        h = (h ^ load64(p)) * 0x100000001B3ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t tail = 0;
    for (size_t i = 0; i < n; i++)
        tail |= (uint64_t)p[i] << (8 * i);
    h = mix(h ^ tail);
    return h ? h : 1;
}

static size_t pow2_for(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2)
        cap <<= 1;
    return cap;
}

di_status tok_strmap_init(tok_strmap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_for(expected);
    m->hash = di_calloc(m->cap, sizeof *m->hash);
    m->key = di_malloc(m->cap * sizeof *m->key);
    m->val = di_malloc(m->cap * sizeof *m->val);
    if (!m->hash || !m->key || !m->val) {
        tok_strmap_free(m);
        return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: cannot allocate a hash map");
    }
    return DI_OK;
}

void tok_strmap_free(tok_strmap *m) {
    di_free(m->hash);
    di_free(m->key);
    di_free(m->val);
    memset(m, 0, sizeof *m);
}

static di_status strmap_grow(tok_strmap *m) {
    tok_strmap g;
    di_status st = tok_strmap_init(&g, m->cap);
    if (st != DI_OK) return st;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->hash[i]) continue;
        size_t j = (size_t)m->hash[i] & (g.cap - 1);
        while (g.hash[j])
            j = (j + 1) & (g.cap - 1);
        g.hash[j] = m->hash[i];
        g.key[j] = m->key[i];
        g.val[j] = m->val[i];
    }
    g.n = m->n;
    tok_strmap_free(m);
    *m = g;
    return DI_OK;
}

di_status tok_strmap_put(tok_strmap *m, const char *arena, tok_span key, int32_t val) {
    if ((m->n + 1) * 2 > m->cap) {
        di_status st = strmap_grow(m);
        if (st != DI_OK) return st;
    }
    uint64_t h = tok_hash(arena + key.off, key.len);
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    for (; m->hash[i]; i = (i + 1) & mask) {
        if (m->hash[i] == h && m->key[i].len == key.len &&
            !memcmp(arena + m->key[i].off, arena + key.off, key.len)) {
            m->val[i] = val; /* a later entry overwrites, as a Rust HashMap collect does */
            return DI_OK;
        }
    }
    m->hash[i] = h;
    m->key[i] = key;
    m->val[i] = val;
    m->n++;
    return DI_OK;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *arena, const void *s, size_t n) {
    if (!m->cap) return -1;
    uint64_t h = tok_hash(s, n);
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    for (; m->hash[i]; i = (i + 1) & mask) {
        if (m->hash[i] == h && m->key[i].len == n && !memcmp(arena + m->key[i].off, s, n))
            return m->val[i];
    }
    return -1;
}

di_status tok_pairmap_init(tok_pairmap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_for(expected);
    m->key = di_calloc(m->cap, sizeof *m->key);
    m->rank = di_malloc(m->cap * sizeof *m->rank);
    m->id = di_malloc(m->cap * sizeof *m->id);
    if (!m->key || !m->rank || !m->id) {
        tok_pairmap_free(m);
        return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: cannot allocate the merge table");
    }
    return DI_OK;
}

void tok_pairmap_free(tok_pairmap *m) {
    di_free(m->key);
    di_free(m->rank);
    di_free(m->id);
    memset(m, 0, sizeof *m);
}

/* The table is sized from the merge count up front, so it never needs to grow. */
void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    size_t mask = m->cap - 1, i = (size_t)(h >> 20) & mask;
    for (; m->key[i] && m->key[i] != k; i = (i + 1) & mask) {
    }
    if (!m->key[i]) m->n++;
    m->key[i] = k;
    m->rank[i] = rank;
    m->id[i] = id;
}
