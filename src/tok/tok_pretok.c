/*
 * tok_pretok.c -- the pre-tokenizer: Split (regex or literal, five behaviours, invert),
 * Digits and ByteLevel, as a Sequence or alone.
 *
 * Design stance: every step becomes a tok_pretok_step (a compiled PCRE2 pattern plus a
 * behaviour), and a piece of text flows depth-first through the steps: step k splits the
 * piece, and each resulting sub-piece goes through step k+1, then to BPE. Depth-first keeps
 * the working set small and needs one piece list per level, reused across calls.
 *
 * Regexes: PCRE2 in UTF + UCP mode with JIT. Hugging Face uses Oniguruma; the patterns that
 * tokenizers ship (\p{N}{1,3}, script ranges, (?i:'s|...), \s+(?!\S)) mean the same in both.
 * ByteLevel must be the last step, because after it HF's later steps would see mapped chars.
 */
#include "tok/tok_internal.h"

#include <string.h>

const char tok_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

di_status tok_regex_compile(const char *pat, size_t len, bool literal, const char *what,
                            pcre2_code **out) {
    int err;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP;
    if (literal) opts = PCRE2_UTF | PCRE2_LITERAL;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &err, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return di_error(DI_ERR_FORMAT, "%s: bad regex at offset %zu: %s", what, (size_t)eoff,
                        (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if no JIT */
    *out = re;
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Loading                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static di_status parse_behavior(const char *b, tok_split_behavior *out) {
    static const struct {
        const char *name;
        tok_split_behavior v;
    } k[] = {{"Removed", TOK_SPLIT_REMOVED},
             {"Isolated", TOK_SPLIT_ISOLATED},
             {"MergedWithPrevious", TOK_SPLIT_MERGED_PREV},
             {"MergedWithNext", TOK_SPLIT_MERGED_NEXT},
             {"Contiguous", TOK_SPLIT_CONTIGUOUS}};
    for (size_t i = 0; b && i < DI_ARRAY_LEN(k); i++)
        if (!strcmp(b, k[i].name)) {
            *out = k[i].v;
            return DI_OK;
        }
    return di_error(DI_ERR_FORMAT, "pre_tokenizer Split: unknown behavior \"%s\"", b ? b : "");
}

static di_status load_split(tok_pretok_step *s, json_t *j) {
    json_t *pat = json_object_get(j, "pattern");
    json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    json_t *p = json_is_string(rx) ? rx : lit;
    if (!json_is_string(p))
        return di_error(DI_ERR_FORMAT,
                        "pre_tokenizer Split: \"pattern\" must be {\"Regex\": ...} or "
                        "{\"String\": ...}");
    di_status st = parse_behavior(json_string_value(json_object_get(j, "behavior")), &s->behavior);
    if (st != DI_OK) return st;
    s->invert = json_is_true(json_object_get(j, "invert"));
    return tok_regex_compile(json_string_value(p), json_string_length(p), p == lit,
                             "pre_tokenizer Split pattern", &s->re);
}

static di_status load_step(di_tokenizer *t, json_t *j, bool last) {
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return di_error(DI_ERR_FORMAT, "pre_tokenizer: missing \"type\"");
    if (t->n_steps >= TOK_MAX_PRETOK)
        return di_error(DI_ERR_UNSUPPORTED, "pre_tokenizer: more than %d steps", TOK_MAX_PRETOK);
    tok_pretok_step *s = &t->steps[t->n_steps];
    memset(s, 0, sizeof *s);
    di_status st = DI_OK;
    if (!strcmp(type, "Split")) {
        st = load_split(s, j);
    } else if (!strcmp(type, "Digits")) {
        bool each = json_is_true(json_object_get(j, "individual_digits"));
        s->behavior = TOK_SPLIT_ISOLATED;
        st = tok_regex_compile(each ? "\\p{N}" : "\\p{N}+", PCRE2_ZERO_TERMINATED, false, "Digits",
                               &s->re);
    } else if (!strcmp(type, "ByteLevel")) {
        if (!last)
            return di_error(DI_ERR_UNSUPPORTED,
                            "pre_tokenizer: ByteLevel must be the last pre-tokenizer");
        s->prefix_space = json_is_true(json_object_get(j, "add_prefix_space"));
        s->behavior = TOK_SPLIT_ISOLATED;
        json_t *ur = json_object_get(j, "use_regex");
        if (!ur || json_is_true(ur))
            st = tok_regex_compile(tok_gpt2_regex, PCRE2_ZERO_TERMINATED, false, "ByteLevel",
                                   &s->re);
        t->byte_level = true;
    } else {
        return di_error(DI_ERR_UNSUPPORTED, "pre_tokenizer type \"%s\" is not supported", type);
    }
    if (st == DI_OK) t->n_steps++;
    return st;
}

di_status tok_pretok_load(di_tokenizer *t, json_t *pt) {
    if (!pt || json_is_null(pt)) return DI_OK;
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pt, "pretokenizers");
        if (!json_is_array(list))
            return di_error(DI_ERR_FORMAT, "pre_tokenizer Sequence: missing \"pretokenizers\"");
        size_t n = json_array_size(list);
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(list, i);
            const char *et = json_string_value(json_object_get(e, "type"));
            if (et && !strcmp(et, "Sequence"))
                return di_error(DI_ERR_UNSUPPORTED, "pre_tokenizer: nested Sequence");
            di_status st = load_step(t, e, i + 1 == n);
            if (st != DI_OK) return st;
        }
        return DI_OK;
    }
    return load_step(t, pt, true);
}

/* ---------------------------------------------------------------------------------------- */
/* Running                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* All matches of re in s as (offsets, is_match) pieces covering s, as HF's Pattern does. */
static di_status find_matches(const pcre2_code *re, tok_scratch *sc, const char *s, size_t n,
                              tok_piece_vec *v) {
    size_t off = 0, prev = 0;
    di_status st;
    while (off <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, sc->md, sc->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return di_error(DI_ERR_INTERNAL, "tokenizer regex: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
        size_t ms = ov[0], me = ov[1];
        if (prev != ms && (st = tok_piece_push(v, (int64_t)prev, (int64_t)ms, -1, false)) != DI_OK)
            return st;
        if ((st = tok_piece_push(v, (int64_t)ms, (int64_t)me, -1, true)) != DI_OK) return st;
        prev = me;
        if (me > ms) {
            off = me;
        } else { /* empty match: step over one character */
            if (me >= n) break;
            uint32_t cp;
            off = me + tok_utf8_next((const uint8_t *)s + me, n - me, &cp);
        }
    }
    if (prev != n) return tok_piece_push(v, (int64_t)prev, (int64_t)n, -1, false);
    return DI_OK;
}

/* Rewrites the (offsets, is_match) list in place so that `match` means "remove". */
static void apply_behavior(tok_piece_vec *v, tok_split_behavior b, bool invert) {
    size_t n = v->n, k = 0;
    tok_piece *p = v->v;
    if (invert)
        for (size_t i = 0; i < n; i++)
            p[i].match = !p[i].match;
    bool prev = false;
    switch (b) {
    case TOK_SPLIT_REMOVED:
        return;
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++)
            p[i].match = false;
        return;
    case TOK_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            bool m = p[i].match;
            if (m && !prev && k > 0) {
                p[k - 1].end = p[i].end;
            } else {
                p[k] = p[i];
                p[k++].match = false;
            }
            prev = m;
        }
        break;
    case TOK_SPLIT_MERGED_NEXT: /* the same from the right */
        k = n;
        for (size_t i = n; i-- > 0;) {
            bool m = p[i].match;
            if (m && !prev && k < n) {
                p[k].start = p[i].start;
            } else {
                p[--k] = p[i];
                p[k].match = false;
            }
            prev = m;
        }
        memmove(p, p + k, (n - k) * sizeof *p);
        k = n - k;
        break;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            bool m = p[i].match;
            if (m == prev && k > 0) {
                p[k - 1].end = p[i].end;
            } else {
                p[k] = p[i];
                p[k++].match = false;
            }
            prev = m;
        }
        break;
    }
    v->n = k;
}

static di_status run_level(const di_tokenizer *t, tok_scratch *sc, int lvl, const char *s,
                           size_t n) {
    if (n == 0) return DI_OK; /* HF drops empty pieces at every split */
    if (lvl == t->n_steps) return tok_bpe_word(t, sc, (const uint8_t *)s, n);
    const tok_pretok_step *step = &t->steps[lvl];
    if (step->prefix_space && s[0] != ' ') {
        if (sc->pfx_cap[lvl] < n + 1) {
            char *p = di_realloc(sc->pfx[lvl], n + 1);
            if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: scratch");
            sc->pfx[lvl] = p;
            sc->pfx_cap[lvl] = n + 1;
        }
        sc->pfx[lvl][0] = ' ';
        memcpy(sc->pfx[lvl] + 1, s, n);
        s = sc->pfx[lvl];
        n++;
    }
    if (!step->re) return run_level(t, sc, lvl + 1, s, n);
    tok_piece_vec *v = &sc->lvl[lvl];
    v->n = 0;
    di_status st = find_matches(step->re, sc, s, n, v);
    if (st != DI_OK) return st;
    apply_behavior(v, step->behavior, step->invert);
    for (size_t i = 0; i < v->n; i++) {
        tok_piece p = v->v[i];
        if (p.match) continue;
        st = run_level(t, sc, lvl + 1, s + p.start, (size_t)(p.end - p.start));
        if (st != DI_OK) return st;
    }
    return DI_OK;
}

di_status tok_pretok_run(const di_tokenizer *t, tok_scratch *sc, const char *s, size_t n) {
    return run_level(t, sc, 0, s, n);
}
