/*
 * jinja_lex.c -- turns template text into tokens, applying Jinja's whitespace control the
 * way jinja2's lexer does with trim_blocks=True and lstrip_blocks=True.
 *
 * Design stance: one pass over the text. Outside tags we emit JT_DATA; a tag opens with
 * JT_VAR_BEGIN / JT_BLOCK_BEGIN, its expression tokens follow, and the matching END token
 * closes it. Comments vanish. Whitespace rules, as in jinja2:
 *   - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}", "-#}" strip all
 *     whitespace after it.
 *   - lstrip_blocks: spaces and tabs between the start of a line and "{%" or "{#" go
 *     (not before "{{", and not when the tag starts with "{%+").
 *   - trim_blocks: one newline right after "%}" or "#}" goes (not after "+%}").
 *   - Newlines are normalised to "\n" and one trailing newline of the template is dropped.
 *
 * Invariants: every token's text is owned by the token list; positions (line:col, 1-based,
 * col counted in bytes) refer to the normalised text.
 */
#include "tok/jinja.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    const char *src;
    size_t len, pos;
    size_t mark_pos; /* line/col cache: position mark_pos is at mark_line:mark_col */
    int mark_line, mark_col;
    bool line_starting;
    jtok_list *out;
} lexer;

static void where(lexer *lx, size_t pos, int *line, int *col) {
    if (pos < lx->mark_pos) {
        lx->mark_pos = 0;
        lx->mark_line = 1;
        lx->mark_col = 1;
    }
    for (; lx->mark_pos < pos; lx->mark_pos++) {
        if (lx->src[lx->mark_pos] == '\n') {
            lx->mark_line++;
            lx->mark_col = 1;
        } else {
            lx->mark_col++;
        }
    }
    *line = lx->mark_line;
    *col = lx->mark_col;
}

static di_status lex_error(lexer *lx, size_t pos, const char *msg) {
    int line, col;
    where(lx, pos, &line, &col);
    return di_error(DI_ERR_FORMAT, "line %d:%d: %s", line, col, msg);
}

static di_status emit(lexer *lx, jtok_kind kind, size_t pos, const char *text, size_t len,
                      jtok **tok_out) {
    jtok_list *l = lx->out;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        jtok *p = di_realloc(l->toks, cap * sizeof *p);
        if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate tokens");
        l->toks = p;
        l->cap = cap;
    }
    jtok *t = &l->toks[l->n];
    *t = (jtok){.kind = kind, .len = len};
    t->text = di_malloc(len + 1);
    if (!t->text) return di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate a token");
    if (len) memcpy(t->text, text, len);
    t->text[len] = '\0';
    where(lx, pos, &t->line, &t->col);
    l->n++;
    if (tok_out) *tok_out = t;
    return DI_OK;
}

/* ========================================================================================== */
/* Whitespace helpers                                                                          */
/* ========================================================================================== */

/* Length of text once trailing whitespace (Python's str.rstrip()) is removed. */
static size_t rstrip_len(const char *s, size_t len) {
    size_t keep = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp = jinja_utf8_next(s, len, &i);
        if (!jinja_is_space(cp)) keep = i;
    }
    return keep;
}

/* Position after the whitespace (Python's \s*) that starts at pos. */
static size_t skip_space(const char *s, size_t len, size_t pos) {
    while (pos < len) {
        size_t i = pos;
        if (!jinja_is_space(jinja_utf8_next(s, len, &i))) break;
        pos = i;
    }
    return pos;
}

/* lstrip_blocks: drop spaces/tabs that follow the last newline of the data (or start the
 * data when it starts a line) if nothing else follows them. */
static size_t lstrip_blocks_len(const lexer *lx, const char *s, size_t len) {
    size_t line_start = len;
    while (line_start > 0 && s[line_start - 1] != '\n')
        line_start--;
    if (line_start == 0 && !lx->line_starting) return len;
    for (size_t i = line_start; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t') return len;
    return line_start;
}

/* ========================================================================================== */
/* Expression tokens                                                                           */
/* ========================================================================================== */

static void put_utf8(char *dst, size_t *n, uint32_t cp) {
    if (cp < 0x80) {
        dst[(*n)++] = (char)cp;
    } else if (cp < 0x800) {
        dst[(*n)++] = (char)(0xc0 | (cp >> 6));
        dst[(*n)++] = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        dst[(*n)++] = (char)(0xe0 | (cp >> 12));
        dst[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        dst[(*n)++] = (char)(0x80 | (cp & 0x3f));
    } else {
        dst[(*n)++] = (char)(0xf0 | (cp >> 18));
        dst[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
        dst[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        dst[(*n)++] = (char)(0x80 | (cp & 0x3f));
    }
}

static bool read_hex(const char *s, size_t len, size_t pos, int digits, uint32_t *cp) {
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        if (pos + (size_t)k >= len || !isxdigit((unsigned char)s[pos + k])) return false;
        char c = (char)tolower((unsigned char)s[pos + k]);
        v = v * 16 + (uint32_t)(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    *cp = v;
    return true;
}

/* Decodes one escape sequence (s[*i] is the character after the backslash) the way
 * Python's "unicode-escape" codec does; writes into dst. */
static bool unescape_one(const char *s, size_t len, size_t *i, char *dst, size_t *n) {
    static const char simple_in[] = "\\'\"abfnrtv", simple_out[] = "\\'\"\a\b\f\n\r\t\v";
    char c = s[*i];
    const char *p = strchr(simple_in, c);
    if (c && p) {
        dst[(*n)++] = simple_out[p - simple_in];
        (*i)++;
        return true;
    }
    if (c == '\n') { /* line continuation */
        (*i)++;
        return true;
    }
    if (c >= '0' && c <= '7') {
        uint32_t v = 0;
        for (int k = 0; k < 3 && *i < len && s[*i] >= '0' && s[*i] <= '7'; k++, (*i)++)
            v = v * 8 + (uint32_t)(s[*i] - '0');
        put_utf8(dst, n, v);
        return true;
    }
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
        uint32_t cp;
        if (!read_hex(s, len, *i + 1, digits, &cp) || cp > 0x10ffff) return false;
        put_utf8(dst, n, cp);
        *i += 1 + (size_t)digits;
        return true;
    }
    dst[(*n)++] = '\\'; /* unknown escapes stay as they are */
    return true;
}

static di_status lex_string(lexer *lx) {
    char q = lx->src[lx->pos];
    size_t start = lx->pos, i = lx->pos + 1;
    char *buf = di_malloc(lx->len - start + 4);
    if (!buf) return di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate a string");
    size_t n = 0;
    while (i < lx->len && lx->src[i] != q) {
        if (lx->src[i] == '\\' && i + 1 < lx->len) {
            i++;
            if (!unescape_one(lx->src, lx->len, &i, buf, &n)) {
                di_free(buf);
                return lex_error(lx, i - 1, "invalid escape sequence in string literal");
            }
        } else {
            buf[n++] = lx->src[i++];
        }
    }
    if (i >= lx->len) {
        di_free(buf);
        return lex_error(lx, start, "unterminated string literal");
    }
    di_status st = emit(lx, JT_STRING, start, buf, n, NULL);
    di_free(buf);
    lx->pos = i + 1;
    return st;
}

/* Digits with optional single underscores between them; returns the end position. */
static size_t scan_digits(const char *s, size_t len, size_t i) {
    while (i < len && (isdigit((unsigned char)s[i]) ||
                       (s[i] == '_' && i + 1 < len && isdigit((unsigned char)s[i + 1]))))
        i++;
    return i;
}

static di_status lex_number(lexer *lx) {
    const char *s = lx->src;
    size_t start = lx->pos, i = scan_digits(s, lx->len, start);
    bool is_float = false;
    if (i + 1 < lx->len && s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
        i = scan_digits(s, lx->len, i + 1);
        is_float = true;
    }
    if (i < lx->len && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < lx->len && (s[j] == '+' || s[j] == '-')) j++;
        if (j < lx->len && isdigit((unsigned char)s[j])) {
            i = scan_digits(s, lx->len, j);
            is_float = true;
        }
    }
    char num[64];
    size_t n = 0;
    for (size_t k = start; k < i && n < sizeof num - 1; k++)
        if (s[k] != '_') num[n++] = s[k];
    num[n] = '\0';
    jtok *t;
    di_status st = emit(lx, is_float ? JT_FLOAT : JT_INT, start, num, n, &t);
    if (st != DI_OK) return st;
    if (is_float) {
        t->fval = strtod(num, NULL);
    } else {
        char *end;
        unsigned long long v = strtoull(num, &end, 10);
        if (n >= 20 || v > INT64_MAX) return lex_error(lx, start, "integer literal too large");
        t->ival = (int64_t)v;
    }
    lx->pos = i;
    return DI_OK;
}

static const char *const k_ops2[] = {"//", "**", "==", "!=", ">=", "<="};
static const char k_ops1[] = "+-/*%~[](){}><=.:|,;";

static di_status lex_operator(lexer *lx, int *depth) {
    const char *s = lx->src + lx->pos;
    for (size_t k = 0; k < DI_ARRAY_LEN(k_ops2); k++) {
        if (lx->pos + 2 <= lx->len && !memcmp(s, k_ops2[k], 2)) {
            lx->pos += 2;
            return emit(lx, JT_OP, lx->pos - 2, s, 2, NULL);
        }
    }
    if (!*s || !strchr(k_ops1, *s)) {
        char msg[64];
        snprintf(msg, sizeof msg, "unexpected character '%c' (0x%02x)",
                 isprint((unsigned char)*s) ? *s : '?', (unsigned char)*s);
        return lex_error(lx, lx->pos, msg);
    }
    if (strchr("([{", *s)) (*depth)++;
    if (strchr(")]}", *s) && *depth > 0) (*depth)--;
    lx->pos++;
    return emit(lx, JT_OP, lx->pos - 1, s, 1, NULL);
}

/* At depth 0, recognises the closing marker of a tag ("}}" or "%}") with its whitespace
 * control; on a match, emits the END token and moves past what it consumes. */
static di_status try_tag_end(lexer *lx, char kind, bool *ended) {
    const char *s = lx->src + lx->pos;
    size_t left = lx->len - lx->pos;
    char close = kind == '{' ? '}' : '%';
    jtok_kind tk = kind == '{' ? JT_VAR_END : JT_BLOCK_END;
    size_t start = lx->pos, end;
    *ended = false;
    if (left >= 3 && s[0] == '-' && s[1] == close && s[2] == '}') {
        end = skip_space(lx->src, lx->len, lx->pos + 3);
    } else if (kind == '%' && left >= 3 && s[0] == '+' && s[1] == '%' && s[2] == '}') {
        end = lx->pos + 3;
    } else if (left >= 2 && s[0] == close && s[1] == '}') {
        end = lx->pos + 2;
        if (kind == '%' && end < lx->len && lx->src[end] == '\n') end++; /* trim_blocks */
    } else {
        return DI_OK;
    }
    *ended = true;
    lx->pos = end;
    lx->line_starting = lx->src[end - 1] == '\n';
    return emit(lx, tk, start, "", 0, NULL);
}

static di_status lex_tag(lexer *lx, char kind) {
    int depth = 0;
    size_t open = lx->pos;
    for (;;) {
        lx->pos = skip_space(lx->src, lx->len, lx->pos);
        if (lx->pos >= lx->len)
            return lex_error(lx, open,
                             kind == '{' ? "unexpected end of template: \"}}\" missing"
                                         : "unexpected end of template: \"%}\" missing");
        di_status st;
        if (depth == 0) {
            bool ended;
            st = try_tag_end(lx, kind, &ended);
            if (st != DI_OK || ended) return st;
        }
        char c = lx->src[lx->pos];
        if (c == '\'' || c == '"') {
            st = lex_string(lx);
        } else if (isdigit((unsigned char)c)) {
            st = lex_number(lx);
        } else if (isalpha((unsigned char)c) || c == '_') {
            size_t b = lx->pos;
            while (lx->pos < lx->len &&
                   (isalnum((unsigned char)lx->src[lx->pos]) || lx->src[lx->pos] == '_'))
                lx->pos++;
            st = emit(lx, JT_NAME, b, lx->src + b, lx->pos - b, NULL);
        } else {
            st = lex_operator(lx, &depth);
        }
        if (st != DI_OK) return st;
    }
}

/* ========================================================================================== */
/* Comments, raw blocks, data                                                                  */
/* ========================================================================================== */

static di_status lex_comment(lexer *lx, size_t open) {
    const char *s = lx->src;
    for (size_t i = lx->pos; i + 1 < lx->len; i++) {
        if (s[i] != '#' || s[i + 1] != '}') continue;
        size_t end = i + 2;
        if (i > lx->pos && s[i - 1] == '-')
            end = skip_space(s, lx->len, end);
        else if (!(i > lx->pos && s[i - 1] == '+') && end < lx->len && s[end] == '\n')
            end++;
        lx->pos = end;
        lx->line_starting = s[end - 1] == '\n';
        return DI_OK;
    }
    return lex_error(lx, open, "unexpected end of template: \"#}\" missing");
}

/* If a block tag at lx->pos (after "{%" and its sign) is {% raw %} or {% endraw %}, returns
 * the position after its "%}" (with whitespace control) and the sign of the end. */
static bool match_word_tag(const lexer *lx, size_t pos, const char *word, size_t *after,
                           char *end_sign) {
    const char *s = lx->src;
    size_t n = strlen(word);
    pos = skip_space(s, lx->len, pos);
    if (pos + n > lx->len || memcmp(s + pos, word, n)) return false;
    pos = skip_space(s, lx->len, pos + n);
    *end_sign = 0;
    if (pos < lx->len && (s[pos] == '-' || s[pos] == '+')) *end_sign = s[pos++];
    if (pos + 2 > lx->len || s[pos] != '%' || s[pos + 1] != '}') return false;
    *after = pos + 2;
    return true;
}

static di_status lex_raw(lexer *lx, size_t body) {
    const char *s = lx->src;
    for (size_t i = body; i + 1 < lx->len; i++) {
        if (s[i] != '{' || s[i + 1] != '%') continue;
        size_t p = i + 2, after;
        char sign = 0, end_sign;
        if (p < lx->len && (s[p] == '-' || s[p] == '+')) sign = s[p++];
        if (!match_word_tag(lx, p, "endraw", &after, &end_sign)) continue;
        size_t n = i - body;
        if (sign == '-') n = rstrip_len(s + body, n);
        di_status st = n ? emit(lx, JT_DATA, body, s + body, n, NULL) : DI_OK;
        if (end_sign == '-')
            after = skip_space(s, lx->len, after);
        else if (end_sign != '+' && after < lx->len && s[after] == '\n')
            after++;
        lx->pos = after;
        lx->line_starting = s[after - 1] == '\n';
        return st;
    }
    return lex_error(lx, body, "missing {% endraw %}");
}

/* Emits the data before a tag at tag_pos, applying the tag's left whitespace control. */
static di_status emit_data_before(lexer *lx, size_t tag_pos, char kind, char sign) {
    const char *text = lx->src + lx->pos;
    size_t n = tag_pos - lx->pos;
    if (sign == '-')
        n = rstrip_len(text, n);
    else if (sign != '+' && kind != '{')
        n = lstrip_blocks_len(lx, text, n);
    return n ? emit(lx, JT_DATA, lx->pos, text, n, NULL) : DI_OK;
}

static di_status lex_all(lexer *lx) {
    const char *s = lx->src;
    while (lx->pos < lx->len) {
        size_t tag = lx->pos;
        while (tag + 1 < lx->len && !(s[tag] == '{' && strchr("{%#", s[tag + 1]) && s[tag + 1]))
            tag++;
        if (tag + 1 >= lx->len) /* no more tags */
            return emit(lx, JT_DATA, lx->pos, s + lx->pos, lx->len - lx->pos, NULL);
        char kind = s[tag + 1];
        char sign = tag + 2 < lx->len && (s[tag + 2] == '-' || s[tag + 2] == '+') ? s[tag + 2] : 0;
        size_t inner = tag + 2 + (sign ? 1 : 0), after;
        char end_sign;
        bool raw =
            kind == '%' && match_word_tag(lx, inner, "raw", &after, &end_sign) && end_sign != '+';
        di_status st = emit_data_before(lx, tag, kind, sign);
        if (st != DI_OK) return st;
        lx->pos = inner;
        if (raw) {
            if (end_sign == '-') after = skip_space(s, lx->len, after);
            st = lex_raw(lx, after);
        } else if (kind == '#') {
            st = lex_comment(lx, tag);
        } else {
            st = emit(lx, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, tag, "", 0, NULL);
            if (st == DI_OK) st = lex_tag(lx, kind);
        }
        if (st != DI_OK) return st;
    }
    return DI_OK;
}

/* Normalises "\r\n" and "\r" to "\n" and drops one trailing newline, like jinja2. */
static char *normalise(const char *src, size_t len, size_t *out_len) {
    char *t = di_malloc(len + 1);
    if (!t) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            t[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            t[n++] = src[i];
        }
    }
    if (n && t[n - 1] == '\n') n--;
    t[n] = '\0';
    *out_len = n;
    return t;
}

di_status jinja_lex(const char *src, size_t len, jtok_list *out) {
    *out = (jtok_list){0};
    size_t n;
    char *text = normalise(src, len, &n);
    if (!text) return di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate");
    lexer lx = {
        .src = text, .len = n, .mark_line = 1, .mark_col = 1, .line_starting = true, .out = out};
    di_status st = lex_all(&lx);
    if (st == DI_OK) st = emit(&lx, JT_EOF, n, "", 0, NULL);
    di_free(text);
    if (st != DI_OK) jinja_tokens_free(out);
    return st;
}

void jinja_tokens_free(jtok_list *t) {
    for (size_t i = 0; i < t->n; i++)
        di_free(t->toks[i].text);
    di_free(t->toks);
    *t = (jtok_list){0};
}
