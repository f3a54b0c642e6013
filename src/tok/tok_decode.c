/*
 * tok_decode.c -- ids back to text: whole-sequence decode, the streaming detokenizer, and
 * the small lookups (vocab size, token <-> id, BOS / EOS).
 *
 * Design stance: decoding is "concatenate each id's decoder bytes, then repair UTF-8", the
 * same as HF's ByteLevel decoder followed by String::from_utf8_lossy. Without a decoder HF
 * joins token texts with spaces, and so do we. The streaming detokenizer runs the same
 * repair incrementally: it emits everything up to an unfinished (but so far valid) UTF-8
 * sequence at the end and holds those at most 3 bytes back, so its output concatenates to
 * exactly the whole-sequence decode.
 */
#include "tok/tok_internal.h"

#include <string.h>

/* The bytes id contributes, or NULL when it is skipped (unknown id, or special + skip). */
static const char *id_bytes(const di_tokenizer *t, int32_t id, bool skip_special, size_t *n) {
    if (id < 0 || id >= t->n_ids || t->tok_dec[id].len == TOK_NO_STR) return NULL;
    if (skip_special && (t->tok_flags[id] & TOK_FLAG_SPECIAL)) return NULL;
    *n = t->tok_dec[id].len;
    return t->arena + t->tok_dec[id].off;
}

const char *di_tokenizer_id_bytes(const di_tokenizer *t, int32_t id, size_t *len) {
    size_t n = 0;
    const char *b = t && len ? id_bytes(t, id, false, &n) : NULL;
    if (len) *len = b ? n : 0;
    return b;
}

int64_t di_tokenizer_decode(const di_tokenizer *t, const int32_t *ids, int64_t n_ids,
                            bool skip_special, char *out, int64_t cap) {
    if (!t || n_ids < 0 || (!ids && n_ids) || cap < 0 || (!out && cap)) {
        di_error(DI_ERR_INVALID_ARG, "di_tokenizer_decode: invalid argument");
        return DI_TOK_ERROR;
    }
    bool sep = t->decoder == TOK_DECODER_NONE;
    size_t raw = 0, k = 0, n;
    for (int64_t i = 0; i < n_ids; i++)
        if (id_bytes(t, ids[i], skip_special, &n)) raw += n + (sep ? 1 : 0);
    uint8_t *buf = di_malloc(4 * raw + 1);
    if (!buf) {
        di_error(DI_ERR_OUT_OF_MEMORY, "di_tokenizer_decode: out of memory");
        return DI_TOK_ERROR;
    }
    for (int64_t i = 0; i < n_ids; i++) {
        const char *b = id_bytes(t, ids[i], skip_special, &n);
        if (!b) continue;
        if (sep && k) buf[k++] = ' ';
        memcpy(buf + k, b, n);
        k += n;
    }
    uint8_t *txt = buf;
    size_t len = k;
    if (tok_utf8_valid_prefix(buf, k) != k) {
        txt = buf + k; /* 3 * k more bytes are free after the raw bytes */
        len = tok_utf8_lossy(buf, k, txt, true, NULL);
    }
    if ((int64_t)len <= cap && len) memcpy(out, txt, len);
    di_free(buf);
    return (int64_t)len <= cap ? (int64_t)len : -(int64_t)len;
}

/* ---------------------------------------------------------------------------------------- */
/* Streaming                                                                                  */
/* ---------------------------------------------------------------------------------------- */

struct di_detok {
    const di_tokenizer *t;
    bool skip_special;
    bool started;    /* a token was emitted (for the space separator without a decoder) */
    uint8_t pend[4]; /* unfinished UTF-8 sequence held back */
    size_t n_pend;
    uint8_t *buf; /* work buffer */
    size_t cap;
};

di_status di_detok_create(const di_tokenizer *t, bool skip_special, di_detok **out) {
    if (!t || !out) return di_error(DI_ERR_INVALID_ARG, "di_detok_create: NULL argument");
    di_detok *d = di_calloc(1, sizeof *d);
    if (!d) return di_error(DI_ERR_OUT_OF_MEMORY, "di_detok_create: out of memory");
    d->t = t;
    d->skip_special = skip_special;
    *out = d;
    return DI_OK;
}

void di_detok_free(di_detok *d) {
    if (!d) return;
    di_free(d->buf);
    di_free(d);
}

static bool reserve(di_detok *d, size_t n) {
    if (d->cap >= n) return true;
    uint8_t *p = di_realloc(d->buf, n);
    if (!p) return false;
    d->buf = p;
    d->cap = n;
    return true;
}

int64_t di_detok_push(di_detok *d, int32_t id, char *out, int64_t cap) {
    if (!d || cap < 0 || (!out && cap)) {
        di_error(DI_ERR_INVALID_ARG, "di_detok_push: invalid argument");
        return DI_TOK_ERROR;
    }
    size_t n;
    const char *b = id_bytes(d->t, id, d->skip_special, &n);
    if (!b) return 0;
    bool sep = d->t->decoder == TOK_DECODER_NONE && d->started;
    size_t raw = d->n_pend + (sep ? 1 : 0) + n;
    if (!reserve(d, 4 * raw + 4)) {
        di_error(DI_ERR_OUT_OF_MEMORY, "di_detok_push: out of memory");
        return DI_TOK_ERROR;
    }
    memcpy(d->buf, d->pend, d->n_pend);
    size_t k = d->n_pend;
    if (sep) d->buf[k++] = ' ';
    memcpy(d->buf + k, b, n);
    size_t used, len = tok_utf8_lossy(d->buf, raw, d->buf + raw, false, &used);
    if ((int64_t)len > cap) return -(int64_t)len; /* nothing consumed */
    if (len) memcpy(out, d->buf + raw, len);
    d->n_pend = raw - used;
    memmove(d->pend, d->buf + used, d->n_pend);
    d->started = true;
    return (int64_t)len;
}

int64_t di_detok_flush(di_detok *d, char *out, int64_t cap) {
    if (!d || cap < 0 || (!out && cap)) {
        di_error(DI_ERR_INVALID_ARG, "di_detok_flush: invalid argument");
        return DI_TOK_ERROR;
    }
    uint8_t tmp[12];
    size_t len = tok_utf8_lossy(d->pend, d->n_pend, tmp, true, NULL);
    if ((int64_t)len > cap) return -(int64_t)len;
    if (len) memcpy(out, tmp, len);
    d->n_pend = 0;
    d->started = false;
    return (int64_t)len;
}

/* ---------------------------------------------------------------------------------------- */
/* Lookups                                                                                    */
/* ---------------------------------------------------------------------------------------- */

int32_t di_tokenizer_vocab_size(const di_tokenizer *t) {
    return t ? t->n_ids : 0;
}

int32_t di_tokenizer_token_to_id(const di_tokenizer *t, const char *s, size_t n) {
    if (!t || (!s && n)) return -1;
    int32_t id = tok_strmap_get(&t->added, t->arena, s, n);
    return id >= 0 ? id : tok_strmap_get(&t->vocab, t->arena, s, n);
}

const char *di_tokenizer_id_to_token(const di_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_ids || t->tok_str[id].len == TOK_NO_STR) return NULL;
    return t->arena + t->tok_str[id].off; /* the arena keeps a NUL after every string */
}

bool di_tokenizer_is_special(const di_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_ids && (t->tok_flags[id] & TOK_FLAG_SPECIAL);
}

int32_t di_tokenizer_bos_id(const di_tokenizer *t) {
    return t ? t->bos_id : -1;
}
int32_t di_tokenizer_eos_id(const di_tokenizer *t) {
    return t ? t->eos_id : -1;
}
