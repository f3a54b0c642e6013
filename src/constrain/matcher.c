/*
 * matcher.c -- the grammar matcher (matcher.h): interned stacks, interned sets of stacks
 * (states), cached byte transitions and cached token masks.
 *
 * A stack node (pos, parent) means "match the element at pos, then go on with stack
 * parent"; node 0 is the empty stack. Expanding (pos, parent) until a byte element is on top
 * follows the grammar without consuming input: END pops to the parent, a rule reference
 * pushes its continuation (unless that is END: a tail position) and branches into each of the
 * rule's alternatives. The grammar has no left recursion (grammar.h), so this terminates; a
 * per-advance set of visited (pos, parent) pairs keeps shared sub-expansions from repeating.
 */
#include "constrain/matcher.h"

#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* A map from 64-bit keys to int32 values (open addressing; key 0 is "empty")                 */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    uint64_t *key;
    int32_t *val;
    size_t cap, n; /* cap: a power of two */
    size_t *used;  /* slots filled since the last clear (only for sets cleared often) */
    size_t n_used;
    bool track;
} u64map;

static size_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

static void map_free(u64map *m) {
    di_free(m->key), di_free(m->val), di_free(m->used);
    bool track = m->track;
    *m = (u64map){.track = track};
}

/* Slot of key+1 (found, or the empty slot where it would go). */
static size_t map_slot(const u64map *m, uint64_t k) {
    size_t i = mix(k) & (m->cap - 1);
    while (m->key[i] && m->key[i] != k)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static bool map_put(u64map *m, uint64_t key, int32_t val);

static bool map_grow(u64map *m) {
    size_t cap = m->cap ? 2 * m->cap : 256;
    u64map g = {.key = di_calloc(cap, sizeof(uint64_t)),
                .val = di_malloc(cap * sizeof(int32_t)),
                .cap = cap,
                .track = m->track};
    if (g.track) g.used = di_malloc(cap * sizeof(size_t));
    if (!g.key || !g.val || (g.track && !g.used)) {
        map_free(&g);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->key[i]) map_put(&g, m->key[i] - 1, m->val[i]);
    map_free(m);
    *m = g;
    return true;
}

static bool map_put(u64map *m, uint64_t key, int32_t val) {
    if (2 * (m->n + 1) > m->cap && !map_grow(m)) return false;
    size_t i = map_slot(m, key + 1);
    if (!m->key[i]) {
        m->key[i] = key + 1, m->n++;
        if (m->track) m->used[m->n_used++] = i;
    }
    m->val[i] = val;
    return true;
}

/* The value of key, or -2 when absent. */
static int32_t map_get(const u64map *m, uint64_t key) {
    if (!m->cap) return -2;
    size_t i = map_slot(m, key + 1);
    return m->key[i] ? m->val[i] : -2;
}

/* Empties a tracked map in time proportional to what it held. */
static void map_clear(u64map *m) {
    for (size_t j = 0; j < m->n_used; j++)
        m->key[m->used[j]] = 0;
    m->n = m->n_used = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The vocabulary trie                                                                        */
/* ---------------------------------------------------------------------------------------- */

/* Nodes in depth-first order, so a node's subtree is the range [i, i + size[i]): its first
 * child is i + 1 and the next sibling of child c is c + size[c]. Node 0 is the root. The
 * tokens ending at node i are ids[term[i] .. term[i + 1]). */
struct di_vocab_trie {
    uint8_t *byte; /* [n_nodes] the edge into the node */
    int32_t *size; /* [n_nodes] */
    int32_t *term; /* [n_nodes + 1] */
    int32_t *ids;  /* [n_ids] */
    int32_t n_nodes, n_ids;
};

typedef struct {
    const uint8_t *s;
    int32_t n, id;
} tok_str;

static int cmp_tok(const void *a, const void *b) {
    const tok_str *x = a, *y = b;
    int32_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, (size_t)n);
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

di_status di_vocab_trie_build(const di_tokenizer *tok, int32_t vocab, di_vocab_trie **out) {
    *out = NULL;
    int32_t n_ids = vocab < tok->n_ids ? vocab : tok->n_ids;
    tok_str *v = di_malloc((size_t)(n_ids ? n_ids : 1) * sizeof *v);
    di_vocab_trie *t = di_calloc(1, sizeof *t);
    if (!v || !t) {
        di_free(v), di_free(t);
        return di_error(DI_ERR_OUT_OF_MEMORY, "vocab trie: out of memory");
    }
    int32_t n = 0;
    int64_t total = 1;
    for (int32_t id = 0; id < n_ids; id++) {
        const tok_span sp = tok->tok_dec[id];
        if (sp.len == TOK_NO_STR || sp.len == 0 || (tok->tok_flags[id] & TOK_FLAG_SPECIAL))
            continue;
        v[n++] = (tok_str){(const uint8_t *)tok->arena + sp.off, (int32_t)sp.len, id};
        total += (int64_t)sp.len;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_tok);
    /* at most one node per byte of every token, plus the root */
    t->byte = di_malloc((size_t)total);
    t->size = di_malloc((size_t)total * sizeof *t->size);
    t->term = di_malloc((size_t)(total + 1) * sizeof *t->term);
    t->ids = di_malloc((size_t)(n ? n : 1) * sizeof *t->ids);
    int32_t *path = di_malloc((size_t)(total + 1) * sizeof *path); /* node at each depth */
    if (!t->byte || !t->size || !t->term || !t->ids || !path) {
        di_free(v), di_free(path);
        di_vocab_trie_free(t);
        return di_error(DI_ERR_OUT_OF_MEMORY, "vocab trie: out of memory");
    }
    /* Sorted strings: each shares a prefix with the one before; the nodes past that prefix
     * are new. A node's subtree size is known once the walk leaves it (the next string's
     * shared prefix is shorter than its depth). */
    int32_t *end_node = di_malloc((size_t)(n ? n : 1) * sizeof *end_node);
    int32_t *cnt = NULL;
    if (!end_node) goto oom;
    t->byte[0] = 0, path[0] = 0;
    int32_t nodes = 1, depth = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t lcp = 0;
        if (k > 0) {
            int32_t m = v[k].n < v[k - 1].n ? v[k].n : v[k - 1].n;
            while (lcp < m && v[k].s[lcp] == v[k - 1].s[lcp])
                lcp++;
        }
        for (; depth > lcp; depth--) /* close the nodes below the shared prefix */
            t->size[path[depth]] = nodes - path[depth];
        for (; depth < v[k].n; depth++) {
            t->byte[nodes] = v[k].s[depth];
            path[depth + 1] = nodes++;
        }
        end_node[k] = path[v[k].n];
    }
    for (; depth > 0; depth--)
        t->size[path[depth]] = nodes - path[depth];
    t->size[0] = nodes;
    /* the tokens of each node, grouped by a counting sort over their end nodes */
    cnt = di_calloc((size_t)nodes + 1, sizeof *cnt);
    if (!cnt) goto oom;
    for (int32_t k = 0; k < n; k++)
        cnt[end_node[k]]++;
    t->term[0] = 0;
    for (int32_t i = 0; i < nodes; i++)
        t->term[i + 1] = t->term[i] + cnt[i];
    memset(cnt, 0, (size_t)nodes * sizeof *cnt);
    for (int32_t k = 0; k < n; k++)
        t->ids[t->term[end_node[k]] + cnt[end_node[k]]++] = v[k].id;
    t->n_nodes = nodes, t->n_ids = n;
    di_free(v), di_free(path), di_free(cnt), di_free(end_node);
    *out = t;
    return DI_OK;
oom:
    di_free(v), di_free(path), di_free(cnt), di_free(end_node);
    di_vocab_trie_free(t);
    return di_error(DI_ERR_OUT_OF_MEMORY, "vocab trie: out of memory");
}

void di_vocab_trie_free(di_vocab_trie *t) {
    if (!t) return;
    di_free(t->byte), di_free(t->size), di_free(t->term), di_free(t->ids), di_free(t);
}

/* ---------------------------------------------------------------------------------------- */
/* Stacks and states                                                                          */
/* ---------------------------------------------------------------------------------------- */

#define MASK_CACHE 16 /* token masks kept per matcher */

struct di_matcher {
    const di_grammar *g;
    /* stack nodes: node 0 is the empty stack */
    int32_t *pos, *parent;
    int32_t n_nodes, cap_nodes;
    u64map node_map; /* (pos, parent) -> node */
    /* states: sorted stack ids in one pool */
    int32_t *pool;
    int64_t pool_n, pool_cap;
    int64_t *st_off;
    int32_t *st_len;
    uint64_t *st_hash;
    int32_t n_states, cap_states;
    u64map state_map; /* content hash -> first state with it (probing by content: below) */
    u64map trans;     /* (state, byte) -> state, -1 dead */
    int32_t cur;      /* the current state */
    /* scratch of one advance */
    u64map seen; /* (pos, parent) pairs expanded */
    int32_t *todo_pos, *todo_par, *out;
    int64_t n_todo, cap_todo, n_out, cap_out;
    /* token masks: state -> slot */
    uint32_t *masks; /* [MASK_CACHE][words] */
    int32_t mask_state[MASK_CACHE];
    int64_t words;
    int32_t mask_next;
    bool oom;
};

static int32_t intern_node(di_matcher *m, int32_t pos, int32_t parent) {
    uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)parent;
    int32_t id = map_get(&m->node_map, key);
    if (id >= 0) return id;
    if (m->n_nodes == m->cap_nodes) {
        int32_t cap = m->cap_nodes ? 2 * m->cap_nodes : 256;
        int32_t *p = di_realloc(m->pos, (size_t)cap * sizeof *p);
        if (p) m->pos = p;
        int32_t *q = p ? di_realloc(m->parent, (size_t)cap * sizeof *q) : NULL;
        if (!p || !q) return m->oom = true, -1;
        m->parent = q, m->cap_nodes = cap;
    }
    id = m->n_nodes;
    if (!map_put(&m->node_map, key, id)) return m->oom = true, -1;
    m->pos[id] = pos, m->parent[id] = parent, m->n_nodes++;
    return id;
}

static bool push_todo(di_matcher *m, int32_t pos, int32_t parent) {
    if (m->n_todo == m->cap_todo) {
        int64_t cap = m->cap_todo ? 2 * m->cap_todo : 64;
        int32_t *a = di_realloc(m->todo_pos, (size_t)cap * sizeof *a);
        if (a) m->todo_pos = a;
        int32_t *b = a ? di_realloc(m->todo_par, (size_t)cap * sizeof *b) : NULL;
        if (!a || !b) return m->oom = true, false;
        m->todo_par = b, m->cap_todo = cap;
    }
    m->todo_pos[m->n_todo] = pos, m->todo_par[m->n_todo++] = parent;
    return true;
}

static bool push_out(di_matcher *m, int32_t node) {
    if (m->n_out == m->cap_out) {
        int64_t cap = m->cap_out ? 2 * m->cap_out : 64;
        int32_t *a = di_realloc(m->out, (size_t)cap * sizeof *a);
        if (!a) return m->oom = true, false;
        m->out = a, m->cap_out = cap;
    }
    m->out[m->n_out++] = node;
    return true;
}

/* Adds to m->out the stacks (byte element on top, or the empty stack) that (pos, parent)
 * expands to without consuming input. */
static void expand(di_matcher *m, int32_t pos, int32_t parent) {
    const di_grammar *g = m->g;
    m->n_todo = 0;
    if (!push_todo(m, pos, parent)) return;
    while (m->n_todo > 0 && !m->oom) {
        m->n_todo--;
        pos = m->todo_pos[m->n_todo], parent = m->todo_par[m->n_todo];
        for (;;) {
            uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)parent;
            if (map_get(&m->seen, key) >= 0) break;
            if (!map_put(&m->seen, key, 0)) {
                m->oom = true;
                break;
            }
            const di_gram_elem e = g->elems[pos];
            if (e.kind == DI_GE_END) { /* this alternative is done: on with the parent */
                if (parent == 0) {
                    push_out(m, 0);
                    break;
                }
                pos = m->pos[parent], parent = m->parent[parent];
                continue;
            }
            if (e.kind == DI_GE_BYTES) {
                int32_t id = intern_node(m, pos, parent);
                if (id >= 0) push_out(m, id);
                break;
            }
            /* a rule: its continuation (nothing for a tail position), then each alternative */
            int32_t cont =
                g->elems[pos + 1].kind == DI_GE_END ? parent : intern_node(m, pos + 1, parent);
            if (cont < 0) break;
            for (int32_t a = 0; a < g->rule_nalt[e.rule]; a++)
                if (!push_todo(m, g->alt_first[g->rule_alt[e.rule] + a], cont)) break;
            break;
        }
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The state of m->out's stacks (sorted, deduplicated here); -1 when empty or on OOM. */
static int32_t intern_state(di_matcher *m) {
    if (m->oom || m->n_out == 0) return -1;
    qsort(m->out, (size_t)m->n_out, sizeof *m->out, cmp_i32);
    int64_t k = 0;
    for (int64_t i = 0; i < m->n_out; i++)
        if (k == 0 || m->out[i] != m->out[k - 1]) m->out[k++] = m->out[i];
    m->n_out = k;
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < k; i++)
        h = (h ^ (uint32_t)m->out[i]) * 0x100000001B3ull, h ^= h >> 29;
    /* states with the same hash are chained through keys h, h + 1, ... (rarely more than one) */
    for (uint64_t probe = h;; probe++) {
        int32_t s = map_get(&m->state_map, probe);
        if (s < 0) break;
        if (m->st_hash[s] == h && m->st_len[s] == k &&
            memcmp(m->pool + m->st_off[s], m->out, (size_t)k * sizeof *m->out) == 0)
            return s;
    }
    if (m->n_states == m->cap_states) {
        int32_t cap = m->cap_states ? 2 * m->cap_states : 64;
        int64_t *o = di_realloc(m->st_off, (size_t)cap * sizeof *o);
        if (o) m->st_off = o;
        int32_t *l = o ? di_realloc(m->st_len, (size_t)cap * sizeof *l) : NULL;
        if (l) m->st_len = l;
        uint64_t *hh = l ? di_realloc(m->st_hash, (size_t)cap * sizeof *hh) : NULL;
        if (!o || !l || !hh) return m->oom = true, -1;
        m->st_hash = hh, m->cap_states = cap;
    }
    if (m->pool_n + k > m->pool_cap) {
        int64_t cap = m->pool_cap ? 2 * m->pool_cap : 1024;
        while (cap < m->pool_n + k)
            cap *= 2;
        int32_t *p = di_realloc(m->pool, (size_t)cap * sizeof *p);
        if (!p) return m->oom = true, -1;
        m->pool = p, m->pool_cap = cap;
    }
    int32_t s = m->n_states;
    uint64_t probe = h;
    while (map_get(&m->state_map, probe) >= 0)
        probe++;
    if (!map_put(&m->state_map, probe, s)) return m->oom = true, -1;
    memcpy(m->pool + m->pool_n, m->out, (size_t)k * sizeof *m->out);
    m->st_off[s] = m->pool_n, m->st_len[s] = (int32_t)k, m->st_hash[s] = h;
    m->pool_n += k;
    m->n_states++;
    return s;
}

/* The state after byte b from state s; -1 when the grammar allows no such byte. */
static int32_t step(di_matcher *m, int32_t s, uint8_t b) {
    uint64_t key = (uint64_t)(uint32_t)s << 8 | b;
    int32_t t = map_get(&m->trans, key);
    if (t != -2) return t;
    const di_grammar *g = m->g;
    map_clear(&m->seen);
    m->n_out = 0;
    for (int32_t i = 0; i < m->st_len[s] && !m->oom; i++) {
        int32_t node = m->pool[m->st_off[s] + i];
        if (node == 0) continue;
        const di_gram_elem e = g->elems[m->pos[node]];
        if (b >= e.lo && b <= e.hi) expand(m, m->pos[node] + 1, m->parent[node]);
    }
    t = intern_state(m);
    if (m->oom) return -1;
    if (!map_put(&m->trans, key, t)) return m->oom = true, -1;
    return t;
}

static void reset_tables(di_matcher *m) {
    map_free(&m->node_map), map_free(&m->state_map), map_free(&m->trans);
    m->n_nodes = 0, m->n_states = 0, m->pool_n = 0;
    for (int i = 0; i < MASK_CACHE; i++)
        m->mask_state[i] = -1;
    /* node 0: the empty stack (never looked up by key) */
    if (m->cap_nodes == 0) {
        m->pos = di_malloc(256 * sizeof *m->pos), m->parent = di_malloc(256 * sizeof *m->parent);
        if (!m->pos || !m->parent) {
            m->oom = true;
            return;
        }
        m->cap_nodes = 256;
    }
    m->pos[0] = m->parent[0] = -1, m->n_nodes = 1;
}

static di_matcher *alloc_matcher(const di_grammar *g) {
    di_matcher *m = di_calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = g;
    m->seen.track = true;
    reset_tables(m);
    return m;
}

di_status di_matcher_create(const di_grammar *g, di_matcher **out) {
    *out = NULL;
    di_matcher *m = alloc_matcher(g);
    if (!m) return di_error(DI_ERR_OUT_OF_MEMORY, "grammar matcher: out of memory");
    map_clear(&m->seen);
    m->n_out = 0;
    for (int32_t a = 0; a < g->rule_nalt[g->root] && !m->oom; a++) {
        /* expand() resets its work list, so the root's alternatives go one by one */
        expand(m, g->alt_first[g->rule_alt[g->root] + a], 0);
    }
    m->cur = intern_state(m);
    if (m->oom || m->cur < 0) {
        di_matcher_free(m);
        return di_error(DI_ERR_OUT_OF_MEMORY, "grammar matcher: out of memory");
    }
    *out = m;
    return DI_OK;
}

/* Stack node n of src as a node of dst (interned bottom first; its depth is the nesting of
 * the output, so the recursion is as deep as the stack). */
static int32_t copy_chain(di_matcher *dst, const di_matcher *src, int32_t n) {
    if (n == 0) return 0;
    int32_t parent = copy_chain(dst, src, src->parent[n]);
    return parent < 0 ? -1 : intern_node(dst, src->pos[n], parent);
}

di_status di_matcher_clone(const di_matcher *src, di_matcher **out) {
    *out = NULL;
    di_matcher *m = alloc_matcher(src->g);
    if (!m) return di_error(DI_ERR_OUT_OF_MEMORY, "grammar matcher: out of memory");
    m->n_out = 0;
    for (int32_t i = 0; i < src->st_len[src->cur] && !m->oom; i++) {
        int32_t node = copy_chain(m, src, src->pool[src->st_off[src->cur] + i]);
        if (node >= 0) push_out(m, node);
    }
    m->cur = intern_state(m);
    if (m->oom || m->cur < 0) {
        di_matcher_free(m);
        return di_error(DI_ERR_OUT_OF_MEMORY, "grammar matcher: out of memory");
    }
    *out = m;
    return DI_OK;
}

/* Once the tables grow past their bounds, rebuilds them around the current state alone: a
 * clone's tables replace m's. */
static void keep_bounded(di_matcher *m) {
    if (m->n_nodes <= DI_MATCHER_MAX_NODES && m->n_states <= DI_MATCHER_MAX_STATES) return;
    di_matcher *c = NULL;
    if (di_matcher_clone(m, &c) != DI_OK) {
        m->oom = true;
        return;
    }
    di_matcher old = *m;
    *m = *c;
    *c = old; /* m's old tables go with c */
    di_matcher_free(c);
}

void di_matcher_free(di_matcher *m) {
    if (!m) return;
    map_free(&m->node_map), map_free(&m->state_map), map_free(&m->trans), map_free(&m->seen);
    di_free(m->pos), di_free(m->parent), di_free(m->pool), di_free(m->st_off), di_free(m->st_len),
        di_free(m->st_hash), di_free(m->todo_pos), di_free(m->todo_par), di_free(m->out),
        di_free(m->masks), di_free(m);
}

bool di_matcher_accept(di_matcher *m, const void *bytes, size_t n) {
    if (m->oom) return false;
    keep_bounded(m);
    const uint8_t *b = bytes;
    int32_t s = m->cur;
    for (size_t i = 0; i < n && s >= 0; i++)
        s = step(m, s, b[i]);
    if (s < 0) return false;
    m->cur = s;
    return true;
}

bool di_matcher_can_end(const di_matcher *m) {
    return m->st_len[m->cur] > 0 && m->pool[m->st_off[m->cur]] == 0; /* node 0 sorts first */
}

bool di_matcher_done(const di_matcher *m) {
    return di_matcher_can_end(m) && m->st_len[m->cur] == 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Token masks                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* Marks the tokens of node i's subtree that state s allows (s: after the bytes up to i). */
static void walk(di_matcher *m, const di_vocab_trie *t, int32_t i, int32_t s, uint32_t *mask) {
    for (int32_t k = t->term[i]; k < t->term[i + 1]; k++)
        mask[t->ids[k] >> 5] |= 1u << (t->ids[k] & 31);
    int32_t end = i + t->size[i];
    for (int32_t c = i + 1; c < end && !m->oom; c += t->size[c]) {
        int32_t s2 = step(m, s, t->byte[c]);
        if (s2 >= 0) walk(m, t, c, s2, mask);
    }
}

di_status di_matcher_mask(di_matcher *m, const di_vocab_trie *t, int32_t end_id, uint32_t *mask,
                          int64_t vocab) {
    int64_t words = (vocab + 31) / 32;
    keep_bounded(m);
    if (!m->masks || m->words != words) {
        di_free(m->masks);
        m->masks = di_malloc((size_t)(MASK_CACHE * words) * sizeof *m->masks);
        m->words = words;
        for (int i = 0; i < MASK_CACHE; i++)
            m->mask_state[i] = -1;
        if (!m->masks) return di_error(DI_ERR_OUT_OF_MEMORY, "grammar matcher: out of memory");
    }
    int slot = -1;
    for (int i = 0; i < MASK_CACHE; i++)
        if (m->mask_state[i] == m->cur) slot = i;
    if (slot < 0) {
        slot = m->mask_next;
        m->mask_next = (m->mask_next + 1) % MASK_CACHE;
        uint32_t *mk = m->masks + slot * words;
        memset(mk, 0, (size_t)words * sizeof *mk);
        /* the root's own tokens: none (every token has at least one byte) */
        int32_t end = t->size[0];
        for (int32_t c = 1; c < end && !m->oom; c += t->size[c]) {
            int32_t s2 = step(m, m->cur, t->byte[c]);
            if (s2 >= 0) walk(m, t, c, s2, mk);
        }
        if (m->oom) {
            m->mask_state[slot] = -1;
            return di_error(DI_ERR_OUT_OF_MEMORY, "grammar matcher: out of memory");
        }
        m->mask_state[slot] = m->cur;
    }
    memcpy(mask, m->masks + slot * words, (size_t)words * sizeof *mask);
    /* tokens past the vocabulary the trie was built for stay masked; the end token follows
     * whether the input is complete */
    if (end_id >= 0 && end_id < vocab) {
        if (di_matcher_can_end(m))
            mask[end_id >> 5] |= 1u << (end_id & 31);
        else
            mask[end_id >> 5] &= ~(1u << (end_id & 31));
    }
    return DI_OK;
}
