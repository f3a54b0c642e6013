/*
 * tok_added.c -- finding added tokens (special tokens and the like) in text.
 *
 * Design stance: mirror Hugging Face's AddedVocabulary::find_matches. Matches are
 * leftmost-longest over all contents of one set (what an Aho-Corasick automaton in
 * LeftmostLongest mode yields): scan left to right, and at the first position where some
 * content starts take the longest one. After a match the scan resumes at its end, even when
 * the match is then discarded (single_word) or widened (lstrip / rstrip).
 * Invariant: the pieces written cover [start, end) in order without gaps.
 */
#include "tok/tok_internal.h"

#include <string.h>

di_status tok_trie_init(tok_trie *tr, size_t total_bytes) {
    memset(tr, 0, sizeof *tr);
    tr->cap_nodes = (int32_t)total_bytes + 1;
    tr->term = di_malloc((size_t)tr->cap_nodes * sizeof *tr->term);
    if (!tr->term) return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: added-token trie");
    tr->term[0] = -1;
    tr->n_nodes = 1;
    return tok_pairmap_init(&tr->edges, total_bytes + 1);
}

void tok_trie_free(tok_trie *tr) {
    tok_pairmap_free(&tr->edges);
    di_free(tr->term);
    memset(tr, 0, sizeof *tr);
}

di_status tok_trie_add(tok_trie *tr, const uint8_t *s, size_t n, int32_t id) {
    if (n == 0) return DI_OK; /* HF ignores empty contents */
    int32_t node = 0, rank, child;
    for (size_t i = 0; i < n; i++) {
        if (tok_pairmap_get(&tr->edges, node, s[i], &rank, &child)) {
            node = child;
            continue;
        }
        if (tr->n_nodes >= tr->cap_nodes)
            return di_error(DI_ERR_INTERNAL, "tokenizer: added-token trie overflow");
        child = tr->n_nodes++;
        tr->term[child] = -1;
        tok_pairmap_put(&tr->edges, node, s[i], 0, child);
        node = child;
    }
    tr->term[node] = id;
    tr->first[s[0] >> 3] |= (uint8_t)(1u << (s[0] & 7));
    return DI_OK;
}

/* Longest content starting at pos; returns its id (or -1) and sets *stop. */
static int32_t trie_longest(const tok_trie *tr, const uint8_t *text, int64_t pos, int64_t end,
                            int64_t *stop) {
    int32_t node = 0, best = -1, rank;
    for (int64_t j = pos; j < end; j++) {
        if (!tok_pairmap_get(&tr->edges, node, text[j], &rank, &node)) break;
        if (tr->term[node] >= 0) {
            best = tr->term[node];
            *stop = j + 1;
        }
    }
    return best;
}

/* Whether the code point at byte offset pos is a regex "word" character (\w). */
static bool is_word_at(const di_tokenizer *t, tok_scratch *sc, const uint8_t *text, int64_t pos,
                       int64_t end) {
    uint32_t cp;
    size_t len = tok_utf8_next(text + pos, (size_t)(end - pos), &cp);
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
               cp == '_';
    int rc = pcre2_match(t->word_re, text + pos, len, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK,
                         sc->md, NULL);
    return rc >= 0;
}

static bool single_word_ok(const di_tokenizer *t, tok_scratch *sc, const uint8_t *text, int64_t seg,
                           int64_t start, int64_t stop, int64_t end) {
    if (start > seg) {
        int64_t p = start - 1;
        while (p > seg && (text[p] & 0xC0) == 0x80)
            p--;
        if (is_word_at(t, sc, text, p, start)) return false;
    }
    if (stop < end && is_word_at(t, sc, text, stop, end)) return false;
    return true;
}

static int64_t space_run_back(const uint8_t *text, int64_t lo, int64_t pos) {
    while (pos > lo) {
        int64_t p = pos - 1;
        while (p > lo && (text[p] & 0xC0) == 0x80)
            p--;
        uint32_t cp;
        tok_utf8_next(text + p, (size_t)(pos - p), &cp);
        if (!tok_is_unicode_space(cp)) break;
        pos = p;
    }
    return pos;
}

static int64_t space_run_fwd(const uint8_t *text, int64_t pos, int64_t end) {
    while (pos < end) {
        uint32_t cp;
        size_t len = tok_utf8_next(text + pos, (size_t)(end - pos), &cp);
        if (!tok_is_unicode_space(cp)) break;
        pos += (int64_t)len;
    }
    return pos;
}

di_status tok_split_added(const di_tokenizer *t, const tok_trie *tr, tok_scratch *sc,
                          const uint8_t *text, int64_t seg, int64_t end, tok_piece_vec *out) {
    int64_t done = seg; /* HF's start_offset: end of the last emitted match */
    int64_t pos = seg;
    di_status st;
    while (tr->n_nodes > 1 && pos < end) {
        uint8_t b = text[pos];
        if (!(tr->first[b >> 3] & (1u << (b & 7)))) {
            pos++;
            continue;
        }
        int64_t stop = pos;
        int32_t id = trie_longest(tr, text, pos, end, &stop);
        if (id < 0) {
            pos++;
            continue;
        }
        int64_t start = pos;
        pos = stop;
        if (t->added_single[id] && !single_word_ok(t, sc, text, seg, start, stop, end)) continue;
        if (t->added_lstrip[id]) start = DI_MAX(space_run_back(text, seg, start), done);
        if (t->added_rstrip[id]) stop = space_run_fwd(text, stop, end);
        if (done < start && (st = tok_piece_push(out, done, start, -1, false)) != DI_OK) return st;
        if ((st = tok_piece_push(out, start, stop, id, true)) != DI_OK) return st;
        done = stop;
    }
    if (done < end) return tok_piece_push(out, done, end, -1, false);
    return DI_OK;
}
