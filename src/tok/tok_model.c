/*
 * tok_model.c -- reading the "model" (BPE vocab and merges) and "added_tokens" sections of
 * tokenizer.json into the tokenizer's tables.
 *
 * Design stance: validate as Hugging Face does at load time (a merge whose parts or result
 * are missing from the vocab is an error naming the merge), and precompute everything the
 * hot path needs: BPE keys as raw bytes for ByteLevel tokenizers, the id of every single
 * byte, and the bytes the decoder emits for every id.
 */
#include "tok/tok_internal.h"

#include <stdio.h>
#include <string.h>

di_status tok_arena_add(di_tokenizer *t, const void *s, size_t n, tok_span *out) {
    if (t->arena_len + n + 2 > t->arena_cap) {
        size_t cap = DI_MAX(2 * t->arena_cap, t->arena_len + n + 4096);
        char *p = di_realloc(t->arena, cap);
        if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: string arena");
        t->arena = p;
        t->arena_cap = cap;
    }
    if (t->arena_len + n >= TOK_NO_STR) return di_error(DI_ERR_RANGE, "tokenizer: too large");
    memcpy(t->arena + t->arena_len, s, n);
    out->off = (uint32_t)t->arena_len;
    out->len = (uint32_t)n;
    t->arena[t->arena_len + n] = '\0'; /* every string stays NUL-terminated */
    t->arena_len += n + 1;
    return DI_OK;
}

/* Maps a ByteLevel token text back to its bytes; returns the length, or -1 when some
 * character is not one of GPT-2's 256. out holds at least n bytes. */
static long bytelevel_to_bytes(const char *s, size_t n, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        i += tok_utf8_next((const uint8_t *)s + i, n - i, &cp);
        int b = tok_cp_to_byte(cp);
        if (b < 0) return -1;
        out[o++] = (uint8_t)b;
    }
    return (long)o;
}

static di_status check_id(json_t *v, const char *what, const char *name, int32_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX - 1)
        return di_error(DI_ERR_FORMAT, "%s \"%s\": id must be an integer in [0, 2^31-1)", what,
                        name);
    *out = (int32_t)json_integer_value(v);
    return DI_OK;
}

static di_status load_vocab(di_tokenizer *t, json_t *vocab) {
    const char *key;
    json_t *v;
    uint8_t *buf = NULL;
    size_t buf_cap = 0;
    di_status st = DI_OK;
    json_object_foreach(vocab, key, v) {
        int32_t id;
        size_t klen = strlen(key);
        if ((st = check_id(v, "model.vocab", key, &id)) != DI_OK) break;
        tok_span sp;
        if ((st = tok_arena_add(t, key, klen, &sp)) != DI_OK) break;
        if ((st = tok_strmap_put(&t->vocab, t->arena, sp, id)) != DI_OK) break;
        t->tok_str[id] = sp;
        t->tok_dec[id] = sp;
        if (!t->byte_level) {
            if ((st = tok_strmap_put(&t->bpe, t->arena, sp, id)) != DI_OK) break;
            continue;
        }
        if (klen > buf_cap) {
            uint8_t *p = di_realloc(buf, klen + 16);
            if (!p) {
                st = di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: vocab");
                break;
            }
            buf = p;
            buf_cap = klen + 16;
        }
        long blen = bytelevel_to_bytes(key, klen, buf);
        if (blen < 0) continue; /* BPE over bytes can never produce this token */
        tok_span bs;
        if ((st = tok_arena_add(t, buf, (size_t)blen, &bs)) != DI_OK) break;
        if ((st = tok_strmap_put(&t->bpe, t->arena, bs, id)) != DI_OK) break;
        if (blen == 1) t->byte_id[buf[0]] = id;
        t->tok_dec[id] = bs;
    }
    di_free(buf);
    return st;
}

/* A merge as "a b" or ["a", "b"]; returns pointers into the JSON values. */
static di_status merge_parts(json_t *m, size_t idx, const char **a, size_t *al, const char **b,
                             size_t *bl) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        const char *sp = strchr(s, ' ');
        if (!sp)
            return di_error(DI_ERR_FORMAT, "model.merges[%zu] \"%s\": expected \"a b\"", idx, s);
        *a = s;
        *al = (size_t)(sp - s);
        *b = sp + 1;
        *bl = strlen(sp + 1);
        return DI_OK;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *al = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *bl = json_string_length(json_array_get(m, 1));
        return DI_OK;
    }
    return di_error(DI_ERR_FORMAT, "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", idx);
}

static di_status load_merges(di_tokenizer *t, json_t *merges) {
    size_t n = json_array_size(merges);
    di_status st = tok_pairmap_init(&t->merges, n);
    if (st != DI_OK) return st;
    char *cat = NULL;
    size_t cat_cap = 0;
    for (size_t i = 0; i < n && st == DI_OK; i++) {
        const char *a = "", *b = "";
        size_t al = 0, bl = 0;
        if ((st = merge_parts(json_array_get(merges, i), i, &a, &al, &b, &bl)) != DI_OK) break;
        int32_t ia = tok_strmap_get(&t->vocab, t->arena, a, al);
        int32_t ib = tok_strmap_get(&t->vocab, t->arena, b, bl);
        if (ia < 0 || ib < 0) {
            st = di_error(DI_ERR_FORMAT,
                          "model.merges[%zu] (\"%.*s\" \"%.*s\"): token \"%.*s\" "
                          "is not in the vocab",
                          i, (int)al, a, (int)bl, b, (int)(ia < 0 ? al : bl), ia < 0 ? a : b);
            break;
        }
        if (al + bl > cat_cap) {
            char *p = di_realloc(cat, al + bl + 64);
            if (!p) {
                st = di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: merges");
                break;
            }
            cat = p;
            cat_cap = al + bl + 64;
        }
        memcpy(cat, a, al);
        memcpy(cat + al, b, bl);
        int32_t im = tok_strmap_get(&t->vocab, t->arena, cat, al + bl);
        if (im < 0) {
            st = di_error(DI_ERR_FORMAT,
                          "model.merges[%zu]: merged token \"%.*s\" is not in "
                          "the vocab",
                          i, (int)(al + bl), cat);
            break;
        }
        tok_pairmap_put(&t->merges, ia, ib, (int32_t)i, im);
    }
    di_free(cat);
    return st;
}

static di_status check_model_options(di_tokenizer *t, json_t *model) {
    if (json_is_true(json_object_get(model, "byte_fallback")))
        return di_error(DI_ERR_UNSUPPORTED, "model BPE: byte_fallback true is not supported");
    json_t *d = json_object_get(model, "dropout");
    if (json_is_number(d) && json_number_value(d) > 0.0)
        return di_error(DI_ERR_UNSUPPORTED, "model BPE: dropout is not supported");
    const char *opt[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < DI_ARRAY_LEN(opt); i++) {
        const char *s = json_string_value(json_object_get(model, opt[i]));
        if (s && s[0])
            return di_error(DI_ERR_UNSUPPORTED, "model BPE: %s is not supported", opt[i]);
    }
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    return DI_OK;
}

di_status tok_load_bpe(di_tokenizer *t, json_t *model) {
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab)) return di_error(DI_ERR_FORMAT, "model: \"vocab\" missing");
    if (merges && !json_is_array(merges))
        return di_error(DI_ERR_FORMAT, "model: \"merges\" must be an array");
    di_status st = check_model_options(t, model);
    if (st != DI_OK) return st;
    size_t nv = json_object_size(vocab);
    if ((st = tok_strmap_init(&t->vocab, nv)) != DI_OK) return st;
    if ((st = tok_strmap_init(&t->bpe, nv)) != DI_OK) return st;
    if ((st = load_vocab(t, vocab)) != DI_OK) return st;
    if ((st = load_merges(t, merges)) != DI_OK) return st;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    t->unk_id = unk ? tok_strmap_get(&t->vocab, t->arena, unk, strlen(unk)) : -1;
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Added tokens                                                                               */
/* ---------------------------------------------------------------------------------------- */

static bool flag(json_t *o, const char *k, bool dflt) {
    json_t *v = json_object_get(o, k);
    return v ? json_is_true(v) : dflt;
}

di_status tok_load_added(di_tokenizer *t, json_t *added) {
    size_t n = json_array_size(added), total = 0;
    for (size_t i = 0; i < n; i++)
        total += json_string_length(json_object_get(json_array_get(added, i), "content"));
    di_status st;
    if ((st = tok_strmap_init(&t->added, n)) != DI_OK) return st;
    if ((st = tok_trie_init(&t->trie[0], total)) != DI_OK) return st;
    if ((st = tok_trie_init(&t->trie[1], total)) != DI_OK) return st;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(added, i), *c = json_object_get(e, "content");
        int32_t id;
        if (!json_is_string(c))
            return di_error(DI_ERR_FORMAT, "added_tokens[%zu]: \"content\" missing", i);
        const char *s = json_string_value(c);
        size_t len = json_string_length(c);
        if ((st = check_id(json_object_get(e, "id"), "added_tokens", s, &id)) != DI_OK) return st;
        if (len == 0) continue;
        tok_span sp;
        if ((st = tok_arena_add(t, s, len, &sp)) != DI_OK) return st;
        if ((st = tok_strmap_put(&t->added, t->arena, sp, id)) != DI_OK) return st;
        t->tok_str[id] = sp;
        t->tok_dec[id] = sp;
        t->tok_flags[id] = TOK_FLAG_ADDED | (flag(e, "special", false) ? TOK_FLAG_SPECIAL : 0);
        t->added_lstrip[id] = flag(e, "lstrip", false);
        t->added_rstrip[id] = flag(e, "rstrip", false);
        t->added_single[id] = flag(e, "single_word", false);
        tok_trie *tr = &t->trie[flag(e, "normalized", true) ? 1 : 0];
        if ((st = tok_trie_add(tr, (const uint8_t *)s, len, id)) != DI_OK) return st;
    }
    return DI_OK;
}

/* The ByteLevel decoder turns a token whose characters are all GPT-2 byte characters into
 * those bytes, and leaves any other token (e.g. "<｜User｜>") as its UTF-8 text. */
di_status tok_finish_ids(di_tokenizer *t) {
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (int32_t id = 0; id < t->n_ids; id++) {
        tok_span sp = t->tok_str[id];
        if (sp.len == TOK_NO_STR) continue;
        t->tok_dec[id] = sp;
        if (t->decoder != TOK_DECODER_BYTELEVEL) continue;
        if (sp.len > cap) {
            uint8_t *p = di_realloc(buf, sp.len + 64);
            if (!p) {
                di_free(buf);
                return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: decoder table");
            }
            buf = p;
            cap = sp.len + 64;
        }
        long n = bytelevel_to_bytes(t->arena + sp.off, sp.len, buf);
        if (n < 0) continue;
        tok_span bs = sp;
        /* Mapped bytes are never longer than the text, so an unchanged token keeps its span. */
        if ((size_t)n != sp.len || memcmp(buf, t->arena + sp.off, sp.len)) {
            di_status st = tok_arena_add(t, buf, (size_t)n, &bs);
            if (st != DI_OK) {
                di_free(buf);
                return st;
            }
        }
        t->tok_dec[id] = bs;
    }
    di_free(buf);
    return DI_OK;
}
