/*
 * tokenizer.c -- the public tokenizer API: load / free, encode, decode, lookups.
 *
 * Encode pipeline (Hugging Face's order):
 *   bytes --repair UTF-8--> text --split on non-normalized added tokens--> segments
 *   --split on normalized added tokens--> segments --pre-tokenizer--> words --BPE--> ids,
 *   then the post-processor's ids around them when add_special.
 *
 * Concurrency: the tokenizer is read-only after loading. Each encode borrows a scratch
 * object (PCRE2 match data, JIT stack, work arrays) from a small pool under a mutex and
 * returns it, so the hot path never allocates once the pool is warm.
 */
#define _POSIX_C_SOURCE 200809L
#include "tok/tok_internal.h"

#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------------------------------- */
/* Scratch pool                                                                               */
/* ---------------------------------------------------------------------------------------- */

void tok_scratch_free(tok_scratch *sc) {
    if (!sc) return;
    pcre2_match_data_free(sc->md);
    pcre2_match_context_free(sc->mctx);
    pcre2_jit_stack_free(sc->jit);
    di_free(sc->text);
    di_free(sc->ids);
    di_free(sc->segs.v);
    di_free(sc->segs2.v);
    for (int i = 0; i < TOK_MAX_PRETOK; i++) {
        di_free(sc->lvl[i].v);
        di_free(sc->pfx[i]);
    }
    di_free(sc->sym_id);
    di_free(sc->sym_prev);
    di_free(sc->sym_next);
    di_free(sc->heap);
    di_free(sc->heap_id);
    di_free(sc);
}

static tok_scratch *scratch_get(const di_tokenizer *ct) {
    di_tokenizer *t = (di_tokenizer *)ct; /* the pool is the one mutable part */
    pthread_mutex_lock(&t->pool_lock);
    tok_scratch *sc = t->pool;
    if (sc) t->pool = sc->next_free;
    pthread_mutex_unlock(&t->pool_lock);
    if (sc) return sc;
    sc = di_calloc(1, sizeof *sc);
    if (!sc) return NULL;
    sc->md = pcre2_match_data_create(16, NULL);
    sc->mctx = pcre2_match_context_create(NULL);
    sc->jit = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
    if (!sc->md || !sc->mctx) {
        tok_scratch_free(sc);
        return NULL;
    }
    if (sc->jit) pcre2_jit_stack_assign(sc->mctx, NULL, sc->jit);
    return sc;
}

static void scratch_put(const di_tokenizer *ct, tok_scratch *sc) {
    di_tokenizer *t = (di_tokenizer *)ct;
    pthread_mutex_lock(&t->pool_lock);
    sc->next_free = t->pool;
    t->pool = sc;
    pthread_mutex_unlock(&t->pool_lock);
}

di_status tok_piece_push(tok_piece_vec *v, int64_t s, int64_t e, int32_t id, bool match) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        tok_piece *p = di_realloc(v->v, cap * sizeof *p);
        if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: scratch");
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = (tok_piece){s, e, id, match};
    return DI_OK;
}

di_status tok_ids_push(tok_scratch *sc, int32_t id) {
    if (sc->n_ids == sc->ids_cap) {
        size_t cap = sc->ids_cap ? 2 * sc->ids_cap : 256;
        int32_t *p = di_realloc(sc->ids, cap * sizeof *p);
        if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: output ids");
        sc->ids = p;
        sc->ids_cap = cap;
    }
    sc->ids[sc->n_ids++] = id;
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Load / free                                                                                */
/* ---------------------------------------------------------------------------------------- */

static di_tokenizer *tok_new(void) {
    di_tokenizer *t = di_calloc(1, sizeof *t);
    if (!t) return NULL;
    pthread_mutex_init(&t->pool_lock, NULL);
    tok_cache_init(t);
    t->bos_id = t->eos_id = t->unk_id = -1;
    return t;
}

void di_tokenizer_free(di_tokenizer *t) {
    if (!t) return;
    while (t->pool) {
        tok_scratch *n = t->pool->next_free;
        tok_scratch_free(t->pool);
        t->pool = n;
    }
    pthread_mutex_destroy(&t->pool_lock);
    tok_cache_free(t);
    tok_strmap_free(&t->vocab);
    tok_strmap_free(&t->added);
    tok_strmap_free(&t->bpe);
    tok_pairmap_free(&t->merges);
    tok_trie_free(&t->trie[0]);
    tok_trie_free(&t->trie[1]);
    for (int i = 0; i < t->n_steps; i++)
        pcre2_code_free(t->steps[i].re);
    pcre2_code_free(t->word_re);
    di_free(t->pre_ids);
    di_free(t->post_ids);
    di_free(t->tok_str);
    di_free(t->tok_dec);
    di_free(t->tok_flags);
    di_free(t->added_lstrip);
    di_free(t->added_rstrip);
    di_free(t->added_single);
    di_free(t->arena);
    di_free(t);
}

static di_status load_text(const char *json, size_t len, const char *what, di_tokenizer **out) {
    di_tokenizer *t = tok_new();
    if (!t) return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    di_status st = tok_load_json(t, json, len, what);
    if (st == DI_OK)
        st = tok_regex_compile("[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]",
                               PCRE2_ZERO_TERMINATED, false, "word regex", &t->word_re);
    if (st != DI_OK) {
        di_tokenizer_free(t);
        return st;
    }
    *out = t;
    return DI_OK;
}

di_status di_tokenizer_load_json(const char *json, size_t len, di_tokenizer **out) {
    if (!out || (!json && len)) return di_error(DI_ERR_INVALID_ARG, "tokenizer: NULL argument");
    *out = NULL;
    return load_text(json ? json : "", len, "tokenizer.json", out);
}

di_status di_tokenizer_load(const char *path, di_tokenizer **out) {
    if (!path || !out) return di_error(DI_ERR_INVALID_ARG, "tokenizer: NULL argument");
    *out = NULL;
    struct stat stt;
    bool dir = stat(path, &stt) == 0 && S_ISDIR(stt.st_mode);
    char *file = dir ? di_path_join(path, "tokenizer.json") : di_strdup(path);
    char *cfg = dir ? di_path_join(path, "tokenizer_config.json") : NULL;
    char *text = NULL;
    size_t len = 0;
    di_status st = file ? di_read_file(file, &text, &len)
                        : di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    if (st == DI_OK) st = load_text(text, len, file, out);
    if (st == DI_OK && cfg && stat(cfg, &stt) == 0 && (st = tok_apply_config(*out, cfg)) != DI_OK) {
        di_tokenizer_free(*out);
        *out = NULL;
    }
    di_free(text);
    di_free(file);
    di_free(cfg);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Encode                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* A segment with no added token in it: the second (normalized) added-token pass, then the
 * pre-tokenizer and BPE. There is no normalizer, so the text is already "normalized". */
static di_status encode_plain(const di_tokenizer *t, tok_scratch *sc, const uint8_t *s, int64_t a,
                              int64_t b) {
    if (t->trie[1].n_nodes <= 1) return tok_pretok_run(t, sc, (const char *)s + a, (size_t)(b - a));
    sc->segs2.n = 0;
    di_status st = tok_split_added(t, &t->trie[1], sc, s, a, b, &sc->segs2);
    for (size_t i = 0; st == DI_OK && i < sc->segs2.n; i++) {
        tok_piece p = sc->segs2.v[i];
        st = p.id >= 0
                 ? tok_ids_push(sc, p.id)
                 : tok_pretok_run(t, sc, (const char *)s + p.start, (size_t)(p.end - p.start));
    }
    return st;
}

static di_status encode_text(const di_tokenizer *t, tok_scratch *sc, const uint8_t *s, size_t n) {
    sc->segs.n = 0;
    di_status st = tok_split_added(t, &t->trie[0], sc, s, 0, (int64_t)n, &sc->segs);
    for (size_t i = 0; st == DI_OK && i < sc->segs.n; i++) {
        tok_piece p = sc->segs.v[i];
        st = p.id >= 0 ? tok_ids_push(sc, p.id) : encode_plain(t, sc, s, p.start, p.end);
    }
    return st;
}

static di_status repair_utf8(tok_scratch *sc, const uint8_t **s, size_t *n) {
    size_t valid = tok_utf8_valid_prefix(*s, *n);
    if (valid == *n) return DI_OK;
    if (sc->text_cap < 3 * *n) {
        uint8_t *p = di_realloc(sc->text, 3 * *n);
        if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: text buffer");
        sc->text = p;
        sc->text_cap = 3 * *n;
    }
    memcpy(sc->text, *s, valid);
    *n = valid + tok_utf8_lossy(*s + valid, *n - valid, sc->text + valid, true, NULL);
    *s = sc->text;
    return DI_OK;
}

int64_t di_tokenizer_encode(const di_tokenizer *t, const char *text, size_t len, bool add_special,
                            int32_t *ids, int64_t cap) {
    if (!t || (!text && len) || cap < 0 || (!ids && cap > 0)) {
        di_error(DI_ERR_INVALID_ARG, "di_tokenizer_encode: invalid argument");
        return DI_TOK_ERROR;
    }
    tok_scratch *sc = scratch_get(t);
    if (!sc) {
        di_error(DI_ERR_OUT_OF_MEMORY, "di_tokenizer_encode: out of memory");
        return DI_TOK_ERROR;
    }
    const uint8_t *s = (const uint8_t *)(text ? text : "");
    size_t n = len;
    sc->n_ids = 0;
    di_status st = repair_utf8(sc, &s, &n);
    for (int32_t i = 0; st == DI_OK && add_special && i < t->n_pre; i++)
        st = tok_ids_push(sc, t->pre_ids[i]);
    if (st == DI_OK) st = encode_text(t, sc, s, n);
    for (int32_t i = 0; st == DI_OK && add_special && i < t->n_post; i++)
        st = tok_ids_push(sc, t->post_ids[i]);
    int64_t got = (int64_t)sc->n_ids;
    if (st == DI_OK && got <= cap && got) memcpy(ids, sc->ids, (size_t)got * sizeof *ids);
    scratch_put(t, sc);
    if (st != DI_OK) return DI_TOK_ERROR;
    return got <= cap ? got : -got;
}
