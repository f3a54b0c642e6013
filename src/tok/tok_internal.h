/*
 * tok_internal.h -- internal structures of the byte-level BPE tokenizer (src/tok).
 *
 * Design stance: the tokenizer is immutable once loaded, so any number of threads may encode
 * and decode with it at once. The only mutable shared pieces are the BPE word cache (sharded,
 * each shard under its own mutex) and the pool of per-call scratch objects (one mutex).
 *
 * Layout:
 *   - Every string the tokenizer keeps lives in one byte arena (`arena`), addressed by
 *     tok_span {off, len}; the arena never moves after loading.
 *   - `bpe_map` maps a BPE key to its vocab id. With a ByteLevel pre-tokenizer the key is the
 *     raw bytes a token stands for (the GPT-2 byte<->char mapping is undone at load time), so
 *     encoding never builds the mapped string. Without ByteLevel the key is the token text.
 *   - `merges` maps a pair of ids (a, b) to (rank, merged id).
 *   - Per id: its original string (vocab entry or added-token content), the bytes the decoder
 *     emits for it, and flags (added / special).
 *
 * Invariants: every id stored in a map is in [0, n_ids); tok_str[id].len == TOK_NO_STR when
 * the id has no token; text given to the pipeline after tok_utf8_lossy is valid UTF-8.
 */
#ifndef DI_TOK_INTERNAL_H
#define DI_TOK_INTERNAL_H

#include "core/core.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define TOK_NO_STR     UINT32_MAX
#define TOK_MAX_PRETOK 16 /* pre-tokenizer steps in one Sequence */

enum { TOK_FLAG_ADDED = 1, TOK_FLAG_SPECIAL = 2 };

typedef struct {
    uint32_t off, len;
} tok_span;

/* ---- tok_map.c: open-addressing hash maps ---------------------------------------------- */

uint64_t tok_hash(const void *p, size_t n);

/* Byte-string -> int32 map; keys live in a caller-owned arena (addressed by offset). */
typedef struct {
    uint64_t *hash; /* [cap] 0 = empty slot */
    tok_span *key;  /* [cap] */
    int32_t *val;   /* [cap] */
    size_t cap, n;  /* cap is a power of two, kept at most half full */
} tok_strmap;

di_status tok_strmap_init(tok_strmap *m, size_t expected);
void tok_strmap_free(tok_strmap *m);
/* Inserts or overwrites. `arena` is the base the span is relative to. */
di_status tok_strmap_put(tok_strmap *m, const char *arena, tok_span key, int32_t val);
/* Returns the value, or -1. */
int32_t tok_strmap_get(const tok_strmap *m, const char *arena, const void *s, size_t n);

/* (a, b) id pair -> (rank, merged id). */
typedef struct {
    uint64_t *key; /* [cap] (a << 32 | b) + 1; 0 = empty */
    int32_t *rank; /* [cap] */
    int32_t *id;   /* [cap] */
    size_t cap, n;
} tok_pairmap;

di_status tok_pairmap_init(tok_pairmap *m, size_t expected);
void tok_pairmap_free(tok_pairmap *m);
void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
/* Returns true and fills rank / id when the pair merges. */
static inline bool tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *rank,
                                   int32_t *id) {
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    size_t mask = m->cap - 1, i = (size_t)(h >> 20) & mask;
    for (;; i = (i + 1) & mask) {
        if (m->key[i] == k) {
            *rank = m->rank[i];
            *id = m->id[i];
            return true;
        }
        if (m->key[i] == 0) return false;
    }
}

/* ---- tok_utf8.c: UTF-8 and the GPT-2 byte mapping --------------------------------------- */

/* Decodes `in` replacing every ill-formed sequence by U+FFFD with the "maximal subpart" rule
 * (WHATWG, Python's errors="replace", Rust's from_utf8_lossy). Writes at most 3 * n bytes to
 * out. With final == false an incomplete but so-far-valid sequence at the very end is left
 * unconsumed; *consumed says how many input bytes were used. Returns bytes written. */
size_t tok_utf8_lossy(const uint8_t *in, size_t n, uint8_t *out, bool final, size_t *consumed);
/* Length of the longest valid-UTF-8 prefix of s. */
size_t tok_utf8_valid_prefix(const uint8_t *s, size_t n);
/* Decodes one code point of valid UTF-8 at s (n > 0); returns its byte length. */
size_t tok_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
bool tok_is_unicode_space(uint32_t cp);

/* GPT-2's bijection between bytes and printable code points. */
uint32_t tok_byte_to_cp(uint8_t b);
/* Returns the byte for a mapped code point, or -1 if cp is not one of the 256. */
int tok_cp_to_byte(uint32_t cp);

/* ---- tok_pretok.c: pre-tokenizer ------------------------------------------------------- */

typedef enum {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS
} tok_split_behavior;

typedef struct {
    pcre2_code *re; /* NULL: no split (a ByteLevel step without use_regex) */
    tok_split_behavior behavior;
    bool invert;
    bool prefix_space; /* ByteLevel add_prefix_space */
} tok_pretok_step;

/* Compiles a Split pattern; literal == true for {"String": ...}. `what` names it in errors. */
di_status tok_regex_compile(const char *pat, size_t len, bool literal, const char *what,
                            pcre2_code **out);
extern const char tok_gpt2_regex[];

/* ---- scratch (one per concurrent encode call) ------------------------------------------ */

typedef struct {
    int64_t start, end;
    int32_t id; /* added-token id, or -1 for plain text */
    bool match;
} tok_piece;

typedef struct {
    tok_piece *v;
    size_t n, cap;
} tok_piece_vec;

typedef struct tok_scratch {
    struct tok_scratch *next_free;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    uint8_t *text; /* lossy-decoded input */
    size_t text_cap;
    int32_t *ids; /* output being built */
    size_t n_ids, ids_cap;
    tok_piece_vec segs; /* added-token split */
    tok_piece_vec segs2;
    tok_piece_vec lvl[TOK_MAX_PRETOK];
    char *pfx[TOK_MAX_PRETOK]; /* prefix-space copies, one per pre-tokenizer level */
    size_t pfx_cap[TOK_MAX_PRETOK];
    /* BPE work arrays */
    int32_t *sym_id, *sym_prev, *sym_next;
    uint64_t *heap; /* (rank << 32 | pos) */
    int32_t *heap_id;
    size_t bpe_cap;
} tok_scratch;

di_status tok_piece_push(tok_piece_vec *v, int64_t s, int64_t e, int32_t id, bool match);
di_status tok_ids_push(tok_scratch *sc, int32_t id);

/* ---- tok_cache.c: bounded BPE word cache ----------------------------------------------- */

#define TOK_CACHE_KEY    30
#define TOK_CACHE_IDS    15
#define TOK_CACHE_SHARDS 64
#define TOK_CACHE_SLOTS  512 /* per shard */

typedef struct {
    uint64_t hash;
    uint8_t key_len, n_ids;
    char key[TOK_CACHE_KEY];
    int32_t ids[TOK_CACHE_IDS];
} tok_cache_entry;

typedef struct {
    pthread_mutex_t lock;
    tok_cache_entry *slots; /* [TOK_CACHE_SLOTS] direct-mapped */
} tok_cache_shard;

/* ---- the tokenizer ---------------------------------------------------------------------- */

typedef enum { TOK_DECODER_NONE, TOK_DECODER_BYTELEVEL } tok_decoder_kind;

/* Added tokens of one matching set (non-normalized or normalized), as a byte trie whose
 * edges (node, byte) -> child live in a pair map. Node 0 is the root. */
typedef struct {
    tok_pairmap edges;
    int32_t *term; /* [cap_nodes] token id ending at the node, -1 = none */
    int32_t n_nodes, cap_nodes;
    uint8_t first[32]; /* bitmap of first bytes, to skip most positions quickly */
} tok_trie;

struct di_tokenizer {
    char *arena; /* owner of all strings */
    size_t arena_len, arena_cap;

    int32_t n_ids;      /* max id + 1 over vocab and added tokens */
    tok_span *tok_str;  /* [n_ids] original token string */
    tok_span *tok_dec;  /* [n_ids] bytes the decoder emits */
    uint8_t *tok_flags; /* [n_ids] TOK_FLAG_* */
    uint8_t *added_lstrip, *added_rstrip, *added_single; /* [n_ids] */

    tok_strmap vocab; /* model vocab, original strings -> id */
    tok_strmap added; /* added-token content -> id */
    tok_strmap bpe;   /* BPE key -> id (see header comment) */
    tok_pairmap merges;
    int32_t byte_id[256]; /* byte-level: id of each single byte, -1 if absent */
    int32_t unk_id;
    bool fuse_unk, ignore_merges, byte_level;

    tok_trie trie[2];    /* [0] non-normalized added tokens, [1] normalized */
    pcre2_code *word_re; /* \w for single_word added tokens */

    tok_pretok_step steps[TOK_MAX_PRETOK];
    int n_steps;

    int32_t *pre_ids, *post_ids; /* special ids around the sequence when add_special */
    int32_t n_pre, n_post;
    int32_t bos_id, eos_id;
    tok_decoder_kind decoder;

    tok_cache_shard cache[TOK_CACHE_SHARDS];
    pthread_mutex_t pool_lock;
    tok_scratch *pool;
};

/* tok_load.c */
di_status tok_load_json(di_tokenizer *t, const char *json, size_t len, const char *what);
di_status tok_arena_add(di_tokenizer *t, const void *s, size_t n, tok_span *out);
di_status tok_post_from_json(di_tokenizer *t, json_t *pp);
/* Reads a model folder's tokenizer_config.json (tok_post.c). */
di_status tok_apply_config(di_tokenizer *t, const char *path);
/* tok_model.c */
di_status tok_load_bpe(di_tokenizer *t, json_t *model);
di_status tok_load_added(di_tokenizer *t, json_t *added);
di_status tok_finish_ids(di_tokenizer *t);
/* tok_added.c */
di_status tok_trie_init(tok_trie *tr, size_t total_bytes);
di_status tok_trie_add(tok_trie *tr, const uint8_t *s, size_t n, int32_t id);
void tok_trie_free(tok_trie *tr);
di_status tok_split_added(const di_tokenizer *t, const tok_trie *tr, tok_scratch *sc,
                          const uint8_t *text, int64_t start, int64_t end, tok_piece_vec *out);
/* tok_pretok.c */
di_status tok_pretok_load(di_tokenizer *t, json_t *pt);
di_status tok_pretok_run(const di_tokenizer *t, tok_scratch *sc, const char *s, size_t n);
/* tok_bpe.c */
di_status tok_bpe_word(const di_tokenizer *t, tok_scratch *sc, const uint8_t *w, size_t n);
void tok_cache_init(di_tokenizer *t);
void tok_cache_free(di_tokenizer *t);
void tok_scratch_free(tok_scratch *sc);

#endif /* DI_TOK_INTERNAL_H */
