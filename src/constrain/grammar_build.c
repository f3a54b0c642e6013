/*
 * grammar_build.c -- the grammar builder (grammar_build.h): rules as growable lists of
 * alternatives, character classes compiled to UTF-8 byte ranges, repetitions as right-
 * recursive helper rules, and the checks that make a di_grammar.
 *
 * UTF-8 of a class: within one encoded length, byte strings sort as their code points do, so
 * an interval [lo, hi] of one length is the byte strings between enc(lo) and enc(hi); that
 * set splits into a few sequences of byte ranges (utf8_between below: the prefix shared by
 * both ends, then the low end's tail up to the maximum, a middle of full ranges, and the
 * high end's tail from the minimum). The surrogates are taken out first, so every sequence
 * produced encodes valid UTF-8 only.
 */
#include "constrain/grammar_build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Sequences and rules                                                                        */
/* ---------------------------------------------------------------------------------------- */

static di_status too_big(void) {
    return di_error(DI_ERR_INVALID_ARG, "grammar: too large (more than %d rules or %d elements)",
                    DI_GRAMMAR_MAX_RULES, DI_GRAMMAR_MAX_ELEMS);
}

di_status gb_seq_push(gb_builder *b, gb_seq *s, di_gram_elem e) {
    if (++b->n_elems > DI_GRAMMAR_MAX_ELEMS) return too_big();
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 8;
        di_gram_elem *p = di_realloc(s->e, (size_t)cap * sizeof *p);
        if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "grammar: out of memory");
        s->e = p, s->cap = cap;
    }
    s->e[s->n++] = e;
    return DI_OK;
}

di_status gb_seq_append(gb_builder *b, gb_seq *s, const gb_seq *t) {
    for (int64_t i = 0; i < t->n; i++) {
        di_status st = gb_seq_push(b, s, t->e[i]);
        if (st != DI_OK) return st;
    }
    return DI_OK;
}

void gb_seq_free(gb_seq *s) {
    di_free(s->e);
    *s = (gb_seq){0};
}

void gb_free(gb_builder *b) {
    for (int32_t r = 0; r < b->n_rules; r++) {
        for (int32_t a = 0; a < b->rules[r].n_alts; a++)
            gb_seq_free(&b->rules[r].alts[a]);
        di_free(b->rules[r].alts);
        di_free(b->rules[r].name);
    }
    di_free(b->rules);
    di_free(b->htab);
    *b = (gb_builder){0};
}

static int32_t new_rule(gb_builder *b, char *name) {
    if (!name || b->n_rules >= DI_GRAMMAR_MAX_RULES) {
        di_free(name);
        return -1;
    }
    if (b->n_rules == b->cap_rules) {
        int32_t cap = b->cap_rules ? 2 * b->cap_rules : 16;
        gb_rule *p = di_realloc(b->rules, (size_t)cap * sizeof *p);
        if (!p) {
            di_free(name);
            return -1;
        }
        b->rules = p, b->cap_rules = cap;
    }
    b->rules[b->n_rules] = (gb_rule){.name = name};
    return b->n_rules++;
}

static char *str_n(const char *s, size_t n) {
    char *p = di_malloc(n + 1);
    if (p) memcpy(p, s, n), p[n] = '\0';
    return p;
}

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* The named rules in an open-addressing table (helper rules are never looked up by name). */
static bool names_grow(gb_builder *b) {
    int32_t cap = b->hcap ? 2 * b->hcap : 64;
    int32_t *t = di_malloc((size_t)cap * sizeof *t);
    if (!t) return false;
    for (int32_t i = 0; i < cap; i++)
        t[i] = -1;
    for (int32_t i = 0; i < b->hcap; i++) {
        int32_t r = b->htab[i];
        if (r < 0) continue;
        const char *nm = b->rules[r].name;
        size_t k = (size_t)(name_hash(nm, strlen(nm)) & (uint64_t)(cap - 1));
        while (t[k] >= 0)
            k = (k + 1) & (size_t)(cap - 1);
        t[k] = r;
    }
    di_free(b->htab);
    b->htab = t, b->hcap = cap;
    return true;
}

int32_t gb_rule_id(gb_builder *b, const char *name, size_t len) {
    if (2 * (b->n_named + 1) > b->hcap && !names_grow(b)) return -1;
    size_t k = (size_t)(name_hash(name, len) & (uint64_t)(b->hcap - 1));
    for (; b->htab[k] >= 0; k = (k + 1) & (size_t)(b->hcap - 1)) {
        const char *nm = b->rules[b->htab[k]].name;
        if (strlen(nm) == len && memcmp(nm, name, len) == 0) return b->htab[k];
    }
    int32_t r = new_rule(b, str_n(name, len));
    if (r >= 0) b->htab[k] = r, b->n_named++;
    return r;
}

int32_t gb_helper(gb_builder *b, int32_t parent) {
    const char *pn = b->rules[parent].name;
    size_t n = strlen(pn) + 16;
    char *name = di_malloc(n);
    if (name) snprintf(name, n, "%s.%d", pn, b->n_rules); /* "." is not a name character */
    int32_t r = new_rule(b, name);
    if (r >= 0) b->rules[r].defined = true;
    return r;
}

di_status gb_add_alt(gb_builder *b, int32_t r, const gb_seq *s) {
    gb_rule *R = &b->rules[r];
    if (R->n_alts == R->cap_alts) {
        int32_t cap = R->cap_alts ? 2 * R->cap_alts : 4;
        gb_seq *p = di_realloc(R->alts, (size_t)cap * sizeof *p);
        if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "grammar: out of memory");
        R->alts = p, R->cap_alts = cap;
    }
    gb_seq *d = &R->alts[R->n_alts];
    *d = (gb_seq){0};
    di_status st = gb_seq_append(b, d, s);
    if (st != DI_OK) {
        gb_seq_free(d);
        return st;
    }
    R->n_alts++;
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Character classes                                                                          */
/* ---------------------------------------------------------------------------------------- */

di_status gb_cls_add(gb_class *c, uint32_t lo, uint32_t hi) {
    if (c->n == c->cap) {
        int32_t cap = c->cap ? 2 * c->cap : 8;
        uint32_t(*p)[2] = di_realloc(c->r, (size_t)cap * sizeof *p);
        if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "grammar: out of memory");
        c->r = p, c->cap = cap;
    }
    c->r[c->n][0] = lo, c->r[c->n][1] = hi;
    c->n++;
    return DI_OK;
}

void gb_cls_free(gb_class *c) {
    di_free(c->r);
    *c = (gb_class){0};
}

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

#define CP_MAX 0x10FFFFu

di_status gb_cls_close(gb_class *c, bool negate) {
    if (c->n > 1) qsort(c->r, (size_t)c->n, sizeof *c->r, cmp_range);
    int32_t m = 0; /* merge overlapping and adjacent ranges */
    for (int32_t i = 0; i < c->n; i++) {
        if (m > 0 && c->r[i][0] <= c->r[m - 1][1] + 1) {
            if (c->r[i][1] > c->r[m - 1][1]) c->r[m - 1][1] = c->r[i][1];
        } else {
            c->r[m][0] = c->r[i][0], c->r[m][1] = c->r[i][1], m++;
        }
    }
    c->n = m;
    gb_class out = {0};
    di_status st = DI_OK;
    if (negate) { /* the gaps between the merged ranges */
        uint32_t next = 0;
        for (int32_t i = 0; i < c->n && st == DI_OK; i++) {
            if (c->r[i][0] > next) st = gb_cls_add(&out, next, c->r[i][0] - 1);
            next = c->r[i][1] + 1;
        }
        if (st == DI_OK && next <= CP_MAX) st = gb_cls_add(&out, next, CP_MAX);
    } else {
        for (int32_t i = 0; i < c->n && st == DI_OK; i++)
            st = gb_cls_add(&out, c->r[i][0], c->r[i][1]);
    }
    /* cut out the surrogates */
    gb_class fin = {0};
    for (int32_t i = 0; i < out.n && st == DI_OK; i++) {
        uint32_t lo = out.r[i][0], hi = out.r[i][1];
        if (lo < 0xD800 && st == DI_OK) st = gb_cls_add(&fin, lo, hi < 0xD800 ? hi : 0xD7FF);
        if (hi > 0xDFFF && st == DI_OK) st = gb_cls_add(&fin, lo > 0xDFFF ? lo : 0xE000, hi);
    }
    gb_cls_free(&out);
    gb_cls_free(c);
    if (st != DI_OK) {
        gb_cls_free(&fin);
        return st;
    }
    *c = fin;
    return DI_OK;
}

int gb_utf8_encode(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) return o[0] = (uint8_t)cp, 1;
    if (cp < 0x800)
        return o[0] = (uint8_t)(0xC0 | cp >> 6), o[1] = (uint8_t)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12), o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18), o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

int gb_utf8_decode(const char *p, size_t left, uint32_t *cp) {
    const unsigned char *q = (const unsigned char *)p;
    const unsigned c = left ? q[0] : 0;
    const int n = c < 0x80             ? 1
                  : (c & 0xE0) == 0xC0 ? 2
                  : (c & 0xF0) == 0xE0 ? 3
                  : (c & 0xF8) == 0xF0 ? 4
                                       : 0;
    if (!left || !n || (size_t)n > left) return 0;
    uint32_t v = n == 1 ? c : n == 2 ? c & 0x1Fu : n == 3 ? c & 0x0Fu : c & 0x07u;
    for (int i = 1; i < n; i++) {
        if ((q[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (q[i] & 0x3Fu);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_cp[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

int gb_hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Where the byte-range sequences of a class go: alternatives of a helper rule. */
typedef struct {
    gb_builder *b;
    int32_t rule;
    uint8_t pre_lo[4], pre_hi[4]; /* the sequence being built, positions 0 .. depth - 1 */
} cls_sink;

static di_status sink_emit(cls_sink *k, int n) {
    gb_seq s = {0};
    di_status st = DI_OK;
    for (int i = 0; i < n && st == DI_OK; i++)
        st = gb_seq_push(
            k->b, &s, (di_gram_elem){.kind = DI_GE_BYTES, .lo = k->pre_lo[i], .hi = k->pre_hi[i]});
    if (st == DI_OK) st = gb_add_alt(k->b, k->rule, &s);
    gb_seq_free(&s);
    return st;
}

static bool all_eq(const uint8_t *s, int from, int n, uint8_t v) {
    for (int i = from; i < n; i++)
        if (s[i] != v) return false;
    return true;
}

/* The n-byte strings from L to H (inclusive, lexicographic, continuation bytes 80..BF after
 * position 0) as sequences of byte ranges, positions i .. n - 1 (0 .. i - 1 already set in
 * the sink's prefix). */
static di_status utf8_between(cls_sink *k, const uint8_t *L, const uint8_t *H, int i, int n) {
    if (i == n - 1) {
        k->pre_lo[i] = L[i], k->pre_hi[i] = H[i];
        return sink_emit(k, n);
    }
    if (L[i] == H[i]) {
        k->pre_lo[i] = k->pre_hi[i] = L[i];
        return utf8_between(k, L, H, i + 1, n);
    }
    static const uint8_t MIN[4] = {0x80, 0x80, 0x80, 0x80}, MAX[4] = {0xBF, 0xBF, 0xBF, 0xBF};
    di_status st = DI_OK;
    int first = L[i], last = H[i];
    if (!all_eq(L, i + 1, n, 0x80)) { /* L's own first byte, its tail up to the maximum */
        k->pre_lo[i] = k->pre_hi[i] = L[i];
        st = utf8_between(k, L, MAX, i + 1, n);
        first++;
    }
    bool h_tail = !all_eq(H, i + 1, n, 0xBF);
    if (h_tail) last--;
    if (st == DI_OK && first <= last) { /* a middle of whole ranges */
        k->pre_lo[i] = (uint8_t)first, k->pre_hi[i] = (uint8_t)last;
        for (int j = i + 1; j < n; j++)
            k->pre_lo[j] = 0x80, k->pre_hi[j] = 0xBF;
        st = sink_emit(k, n);
    }
    if (st == DI_OK && h_tail) { /* H's first byte, its tail from the minimum */
        k->pre_lo[i] = k->pre_hi[i] = H[i];
        st = utf8_between(k, MIN, H, i + 1, n);
    }
    return st;
}

di_status gb_cls_emit(gb_builder *b, int32_t parent, const gb_class *c, gb_seq *s) {
    if (c->n == 0) return di_error(DI_ERR_INVALID_ARG, "grammar: empty character class");
    if (c->n == 1 && c->r[0][1] < 0x80)
        return gb_seq_push(b, s,
                           (di_gram_elem){.kind = DI_GE_BYTES,
                                          .lo = (uint8_t)c->r[0][0],
                                          .hi = (uint8_t)c->r[0][1]});
    cls_sink k = {.b = b, .rule = gb_helper(b, parent)};
    if (k.rule < 0) return too_big();
    static const uint32_t len_end[4] = {0x7F, 0x7FF, 0xFFFF, CP_MAX};
    for (int32_t i = 0; i < c->n; i++) {
        uint32_t lo = c->r[i][0], hi = c->r[i][1];
        for (int n = 1; n <= 4; n++) { /* split at the encoded-length boundaries */
            uint32_t start = n == 1 ? 0 : len_end[n - 2] + 1;
            uint32_t a = lo > start ? lo : start, z = hi < len_end[n - 1] ? hi : len_end[n - 1];
            if (a > z) continue;
            uint8_t L[4], H[4];
            gb_utf8_encode(a, L), gb_utf8_encode(z, H);
            di_status st = utf8_between(&k, L, H, 0, n);
            if (st != DI_OK) return st;
        }
    }
    return gb_seq_push(b, s, (di_gram_elem){.kind = DI_GE_RULE, .rule = k.rule});
}

/* ---------------------------------------------------------------------------------------- */
/* Repetition                                                                                 */
/* ---------------------------------------------------------------------------------------- */

di_status gb_repeat(gb_builder *b, int32_t parent, const gb_seq *unit, int64_t min, int64_t max,
                    gb_seq *s) {
    di_status st = DI_OK;
    for (int64_t i = 0; i < min && st == DI_OK; i++)
        st = gb_seq_append(b, s, unit);
    if (st != DI_OK || max == min) return st;
    gb_seq body = {0}, empty = {0};
    int32_t r;
    if (max < 0) { /* r ::= unit r | "" */
        r = gb_helper(b, parent);
        if (r < 0) return too_big();
        st = gb_seq_append(b, &body, unit);
        if (st == DI_OK) st = gb_seq_push(b, &body, (di_gram_elem){.kind = DI_GE_RULE, .rule = r});
        if (st == DI_OK) st = gb_add_alt(b, r, &body);
        if (st == DI_OK) st = gb_add_alt(b, r, &empty);
    } else { /* max - min nested optionals: r_k ::= unit r_(k-1) | "", r_1 ::= unit | "" */
        r = -1;
        for (int64_t k = 0; k < max - min && st == DI_OK; k++) {
            int32_t rk = gb_helper(b, parent);
            if (rk < 0) {
                st = too_big();
                break;
            }
            body.n = 0;
            st = gb_seq_append(b, &body, unit);
            if (st == DI_OK && r >= 0)
                st = gb_seq_push(b, &body, (di_gram_elem){.kind = DI_GE_RULE, .rule = r});
            if (st == DI_OK) st = gb_add_alt(b, rk, &body);
            if (st == DI_OK) st = gb_add_alt(b, rk, &empty);
            r = rk;
        }
    }
    gb_seq_free(&body);
    if (st == DI_OK) st = gb_seq_push(b, s, (di_gram_elem){.kind = DI_GE_RULE, .rule = r});
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Checks and the flat form                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* nullable[r]: rule r can match the empty string (a fixed point over the alternatives). */
static void find_nullable(const gb_builder *b, bool *nullable) {
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < b->n_rules; r++) {
            if (nullable[r]) continue;
            for (int32_t a = 0; a < b->rules[r].n_alts && !nullable[r]; a++) {
                const gb_seq *s = &b->rules[r].alts[a];
                bool all = true;
                for (int64_t i = 0; i < s->n && all; i++)
                    all = s->e[i].kind == DI_GE_RULE && nullable[s->e[i].rule];
                if (all) nullable[r] = changed = true;
            }
        }
    }
}

/* Left recursion that a matcher could not expand. Edges r -> q: rule q at the front of one
 * of r's alternatives, or behind nullable rules; an edge is a tail when q is the
 * alternative's last element (expanding it pushes nothing: the matcher's per-step set of
 * visited positions ends a cycle of tails, as in `(x?)*`). A cycle through a non-tail edge
 * pushes a new stack node on every turn, so it is refused: a non-tail edge inside one
 * strongly connected component (Tarjan's algorithm, iterative). */
typedef struct {
    int32_t to;
    bool tail;
} lr_edge;

static di_status check_left_recursion(const gb_builder *b, const bool *nullable) {
    const int32_t n = b->n_rules;
    di_status st = DI_OK;
    /* edges, grouped by source: first[r] .. first[r + 1] */
    int64_t n_edges = 0, cap = 64;
    lr_edge *edges = di_malloc((size_t)cap * sizeof *edges);
    int64_t *first = di_malloc((size_t)(n + 1) * sizeof *first);
    int32_t *index = di_malloc((size_t)n * sizeof *index),
            *low = di_malloc((size_t)n * sizeof *low);
    int32_t *comp = di_malloc((size_t)n * sizeof *comp), *stk = di_malloc((size_t)n * sizeof *stk);
    int32_t *call = di_malloc((size_t)n * sizeof *call);
    int64_t *next_edge = di_malloc((size_t)n * sizeof *next_edge);
    bool *on = di_calloc((size_t)n ? (size_t)n : 1, sizeof *on);
    if (!edges || !first || !index || !low || !comp || !stk || !call || !next_edge || !on)
        st = di_error(DI_ERR_OUT_OF_MEMORY, "grammar: out of memory");
    for (int32_t r = 0; r < n && st == DI_OK; r++) {
        first[r] = n_edges;
        for (int32_t a = 0; a < b->rules[r].n_alts && st == DI_OK; a++) {
            const gb_seq *sq = &b->rules[r].alts[a];
            for (int64_t i = 0; i < sq->n && sq->e[i].kind == DI_GE_RULE; i++) {
                if (n_edges == cap) {
                    lr_edge *e2 = di_realloc(edges, (size_t)(cap *= 2) * sizeof *e2);
                    if (!e2) {
                        st = di_error(DI_ERR_OUT_OF_MEMORY, "grammar: out of memory");
                        break;
                    }
                    edges = e2;
                }
                edges[n_edges++] = (lr_edge){sq->e[i].rule, i == sq->n - 1};
                if (!nullable[sq->e[i].rule]) break;
            }
        }
    }
    if (st == DI_OK) first[n] = n_edges;
    for (int32_t r = 0; r < n; r++)
        if (index) index[r] = -1;
    int32_t counter = 0, sp = 0, n_comp = 0;
    for (int32_t root = 0; root < n && st == DI_OK; root++) {
        if (index[root] >= 0) continue;
        int32_t depth = 0;
        call[0] = root, next_edge[root] = first[root];
        index[root] = low[root] = counter++, stk[sp++] = root, on[root] = true;
        while (depth >= 0) {
            int32_t v = call[depth];
            if (next_edge[v] < first[v + 1]) {
                int32_t w = edges[next_edge[v]++].to;
                if (index[w] < 0) {
                    index[w] = low[w] = counter++, stk[sp++] = w, on[w] = true;
                    next_edge[w] = first[w];
                    call[++depth] = w;
                } else if (on[w] && index[w] < low[v]) {
                    low[v] = index[w];
                }
                continue;
            }
            if (low[v] == index[v]) { /* v roots a component */
                int32_t w;
                do {
                    w = stk[--sp];
                    on[w] = false;
                    comp[w] = n_comp;
                } while (w != v);
                n_comp++;
            }
            depth--;
            if (depth >= 0 && low[v] < low[call[depth]]) low[call[depth]] = low[v];
        }
    }
    for (int32_t r = 0; r < n && st == DI_OK; r++)
        for (int64_t k = first[r]; k < first[r + 1]; k++)
            if (!edges[k].tail && comp[edges[k].to] == comp[r]) {
                st = di_error(DI_ERR_INVALID_ARG,
                              "grammar: rule \"%s\" is left-recursive (it can reach itself "
                              "before matching any character)",
                              b->rules[r].name);
                break;
            }
    di_free(edges), di_free(first), di_free(index), di_free(low), di_free(comp), di_free(stk),
        di_free(call), di_free(next_edge), di_free(on);
    return st;
}

di_status gb_finish(gb_builder *b, di_grammar **out) {
    *out = NULL;
    int32_t root = -1;
    for (int32_t r = 0; r < b->n_rules; r++) {
        if (!b->rules[r].defined)
            return di_error(DI_ERR_INVALID_ARG, "grammar: line %lld:%lld: undefined rule \"%s\"",
                            (long long)b->rules[r].ref_line, (long long)b->rules[r].ref_col,
                            b->rules[r].name);
        if (strcmp(b->rules[r].name, "root") == 0) root = r;
    }
    if (root < 0) return di_error(DI_ERR_INVALID_ARG, "grammar: no rule named \"root\"");
    bool *nullable = di_calloc((size_t)b->n_rules, sizeof *nullable);
    if (!nullable) return di_error(DI_ERR_OUT_OF_MEMORY, "grammar: out of memory");
    find_nullable(b, nullable);
    di_status st = check_left_recursion(b, nullable);
    di_free(nullable);
    if (st != DI_OK) return st;

    di_grammar *g = di_calloc(1, sizeof *g);
    int64_t n_elems = 0;
    int32_t n_alts = 0;
    for (int32_t r = 0; r < b->n_rules; r++) {
        n_alts += b->rules[r].n_alts;
        for (int32_t a = 0; a < b->rules[r].n_alts; a++)
            n_elems += b->rules[r].alts[a].n + 1;
    }
    if (g) {
        g->elems = di_malloc((size_t)n_elems * sizeof *g->elems);
        g->alt_first = di_malloc((size_t)(n_alts ? n_alts : 1) * sizeof *g->alt_first);
        g->rule_alt = di_malloc((size_t)b->n_rules * sizeof *g->rule_alt);
        g->rule_nalt = di_malloc((size_t)b->n_rules * sizeof *g->rule_nalt);
        g->names = di_calloc((size_t)b->n_rules, sizeof *g->names);
    }
    if (!g || !g->elems || !g->alt_first || !g->rule_alt || !g->rule_nalt || !g->names) {
        di_grammar_free(g);
        return di_error(DI_ERR_OUT_OF_MEMORY, "grammar: out of memory");
    }
    g->n_rules = b->n_rules, g->root = root;
    for (int32_t r = 0; r < b->n_rules; r++) {
        g->rule_alt[r] = g->n_alts, g->rule_nalt[r] = b->rules[r].n_alts;
        g->names[r] = b->rules[r].name; /* ownership moves to the grammar */
        b->rules[r].name = NULL;
        for (int32_t a = 0; a < b->rules[r].n_alts; a++) {
            const gb_seq *s = &b->rules[r].alts[a];
            g->alt_first[g->n_alts++] = (int32_t)g->n_elems;
            if (s->n) memcpy(g->elems + g->n_elems, s->e, (size_t)s->n * sizeof *s->e);
            g->n_elems += s->n;
            g->elems[g->n_elems++] = (di_gram_elem){.kind = DI_GE_END};
        }
    }
    *out = g;
    return DI_OK;
}

void di_grammar_free(di_grammar *g) {
    if (!g) return;
    if (g->names)
        for (int32_t r = 0; r < g->n_rules; r++)
            di_free(g->names[r]);
    di_free(g->names), di_free(g->elems), di_free(g->alt_first), di_free(g->rule_alt),
        di_free(g->rule_nalt), di_free(g);
}
