/*
 * regex_gbnf.c -- regular expressions as GBNF (gbnf_text.h): the regex front end of
 * constrained generation, and JSON Schema's "pattern".
 *
 * Design stance: a regex without back references or look-around is a regular language, and
 * GBNF's groups, alternation and postfixes (* + ? {m,n}) are the regex operators, so the
 * translation is one recursive descent that writes the same structure as GBNF text:
 * literals become "literals", classes become [classes] over code points (shorthands and
 * negation resolved into ranges here), `.` is any character but a line feed. What cannot be
 * a regular language (\1, (?=, (?!, (?<=, \b) is refused with the offset.
 *
 * Inside a JSON string (in_json) the text of a match is what a JSON encoder writes: a '"',
 * a '\\' or a control character of the pattern appears escaped (\" \\ \n \t \r \b \f or
 * \u00XX), so a literal becomes its escaped form and a class loses those characters and
 * gains their escapes as alternatives.
 */
#include "constrain/gbnf_text.h"
#include "constrain/grammar.h"
#include "constrain/grammar_build.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Text                                                                                       */
/* ---------------------------------------------------------------------------------------- */

void gt_putn(gt_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = di_realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p, b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

void gt_puts(gt_buf *b, const char *s) {
    gt_putn(b, s, strlen(s));
}

void gt_printf(gt_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        gt_putn(b, tmp, (size_t)n);
        return;
    }
    char *big = di_malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    gt_putn(b, big, (size_t)n);
    di_free(big);
}

void gt_literal(gt_buf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[3] = {'\\', (char)c, 0};
            gt_puts(b, e);
        } else if (c < 0x20 || c == 0x7F) {
            gt_printf(b, "\\x%02X", c);
        } else {
            gt_putn(b, (const char *)&s[i], 1);
        }
    }
}

void gt_class_char(gt_buf *b, uint32_t c) {
    if (c < 0x20 || c == 0x7F || c == ']' || c == '[' || c == '\\' || c == '-' || c == '^' ||
        c == '"')
        gt_printf(b, c < 0x100 ? "\\x%02X" : "\\u%04X", c);
    else if (c < 0x80)
        gt_printf(b, "%c", (char)c);
    else if (c < 0x10000)
        gt_printf(b, "\\u%04X", c);
    else
        gt_printf(b, "\\U%08X", c);
}

void gt_free(gt_buf *b) {
    di_free(b->s);
    *b = (gt_buf){0};
}

/* ---------------------------------------------------------------------------------------- */
/* The regex parser                                                                           */
/* ---------------------------------------------------------------------------------------- */

#define RX_MAX_DEPTH 200

typedef struct {
    const char *s, *p, *end;
    gt_buf *out;
    bool json;
    int depth;
    di_status st;
} rx;

static void rx_fail(rx *r, const char *what) {
    if (r->st != DI_OK) return;
    r->st = di_error(DI_ERR_INVALID_ARG, "regex: offset %lld: %s", (long long)(r->p - r->s), what);
}

/* Writes a class (a set of code point ranges, closed) as GBNF: in JSON mode without the
 * characters a JSON string escapes, and with those escapes as alternatives. */
static void emit_class(rx *r, gb_class *c) {
    bool esc_q = false, esc_bs = false, ctl[32] = {false};
    gb_class keep = {0};
    for (int32_t i = 0; i < c->n && r->st == DI_OK; i++) {
        uint32_t lo = c->r[i][0], hi = c->r[i][1];
        if (r->json) {
            for (uint32_t x = lo; x <= hi && x < 0x20; x++)
                ctl[x] = true;
            if (lo <= '"' && hi >= '"') esc_q = true;
            if (lo <= '\\' && hi >= '\\') esc_bs = true;
            if (lo < 0x20) lo = 0x20;
            if (lo > hi) continue;
            /* cut '"' and '\\' out of [lo, hi] */
            uint32_t cuts[2] = {'"', '\\'};
            uint32_t a = lo;
            for (int k = 0; k < 2 && a <= hi; k++) {
                if (cuts[k] < a || cuts[k] > hi) continue;
                if (cuts[k] > a) gb_cls_add(&keep, a, cuts[k] - 1);
                a = cuts[k] + 1;
            }
            if (a <= hi) gb_cls_add(&keep, a, hi);
        } else {
            gb_cls_add(&keep, lo, hi);
        }
    }
    int alts = (keep.n > 0) + esc_q + esc_bs;
    for (int x = 0; x < 32; x++)
        alts += ctl[x];
    if (alts == 0) {
        rx_fail(r, "a character class that matches nothing here");
        gb_cls_free(&keep);
        return;
    }
    if (alts > 1) gt_puts(r->out, "(");
    bool first = true;
    if (keep.n > 0) {
        gt_puts(r->out, "[");
        for (int32_t i = 0; i < keep.n; i++) {
            gt_class_char(r->out, keep.r[i][0]);
            if (keep.r[i][1] != keep.r[i][0]) {
                gt_puts(r->out, "-");
                gt_class_char(r->out, keep.r[i][1]);
            }
        }
        gt_puts(r->out, "]");
        first = false;
    }
    if (esc_q) gt_puts(r->out, first ? "\"\\\\\\\"\"" : " | \"\\\\\\\"\""), first = false;
    if (esc_bs) gt_puts(r->out, first ? "\"\\\\\\\\\"" : " | \"\\\\\\\\\""), first = false;
    static const char *short_esc[32] = {
        ['\b'] = "b", ['\f'] = "f", ['\n'] = "n", ['\r'] = "r", ['\t'] = "t"};
    for (int x = 0; x < 32; x++) {
        if (!ctl[x]) continue;
        if (!first) gt_puts(r->out, " | ");
        if (short_esc[x])
            gt_printf(r->out, "\"\\\\%s\"", short_esc[x]);
        else
            gt_printf(r->out, "\"\\\\u00%02x\"", x);
        first = false;
    }
    if (alts > 1) gt_puts(r->out, ")");
    gb_cls_free(&keep);
}

static void emit_char(rx *r, uint32_t c) {
    if (!r->json || (c >= 0x20 && c != '"' && c != '\\')) { /* a literal */
        uint8_t u[4];
        int n = gb_utf8_encode(c, u);
        gt_puts(r->out, "\"");
        gt_literal(r->out, (const char *)u, (size_t)n);
        gt_puts(r->out, "\"");
        return;
    }
    gb_class k = {0}; /* a character JSON escapes: the class form writes its escape */
    gb_cls_add(&k, c, c);
    emit_class(r, &k);
    gb_cls_free(&k);
}

static int64_t rx_utf8(rx *r) {
    uint32_t cp;
    int n = gb_utf8_decode(r->p, (size_t)(r->end - r->p), &cp);
    if (!n) return -1;
    r->p += n;
    return cp;
}

/* A shorthand class (\d \w \s and negations) into c; false if e is not one. */
static bool shorthand(char e, gb_class *c) {
    gb_class t = {0};
    char lower = (char)(e | 0x20);
    if (lower == 'd') {
        gb_cls_add(&t, '0', '9');
    } else if (lower == 'w') {
        gb_cls_add(&t, '0', '9'), gb_cls_add(&t, 'A', 'Z'), gb_cls_add(&t, 'a', 'z'),
            gb_cls_add(&t, '_', '_');
    } else if (lower == 's') {
        gb_cls_add(&t, '\t', '\r'), gb_cls_add(&t, ' ', ' '), gb_cls_add(&t, 0xA0, 0xA0);
        gb_cls_add(&t, 0x2028, 0x2029), gb_cls_add(&t, 0xFEFF, 0xFEFF);
    } else {
        return false;
    }
    gb_cls_close(&t, e != lower); /* upper case: the complement */
    for (int32_t i = 0; i < t.n; i++)
        gb_cls_add(c, t.r[i][0], t.r[i][1]);
    gb_cls_free(&t);
    return true;
}

/* An escape after '\\' (the cursor past it): a code point in *cp, or a shorthand added to
 * *cls (returns 1 then), or 0 for a code point; -1 on error. */
static int rx_escape(rx *r, uint32_t *cp, gb_class *cls) {
    if (r->p >= r->end) return rx_fail(r, "a trailing backslash"), -1;
    char e = *r->p++;
    if (cls && shorthand(e, cls)) return 1;
    switch (e) {
    case 'n':
        *cp = '\n';
        return 0;
    case 't':
        *cp = '\t';
        return 0;
    case 'r':
        *cp = '\r';
        return 0;
    case 'f':
        *cp = '\f';
        return 0;
    case 'v':
        *cp = '\v';
        return 0;
    case '0':
        *cp = 0;
        return 0;
    case 'x':
    case 'u': {
        int digits = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        if (e == 'u' && r->p < r->end && *r->p == '{') { /* \u{...} */
            r->p++;
            int k = 0;
            while (r->p < r->end && *r->p != '}' && k < 6 && gb_hex_digit(*r->p) >= 0)
                v = v << 4 | (uint32_t)gb_hex_digit(*r->p++), k++;
            if (r->p >= r->end || *r->p != '}' || k == 0)
                return rx_fail(r, "a bad \\u{...} escape"), -1;
            r->p++;
        } else {
            for (int i = 0; i < digits; i++) {
                if (r->p >= r->end || gb_hex_digit(*r->p) < 0)
                    return rx_fail(r, "a bad hexadecimal escape"), -1;
                v = v << 4 | (uint32_t)gb_hex_digit(*r->p++);
            }
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            return rx_fail(r, "an escape that is not a Unicode scalar value"), -1;
        *cp = v;
        return 0;
    }
    case 'b':
    case 'B':
        return rx_fail(r, "word boundaries (\\b, \\B) are not supported"), -1;
    default:
        if (e >= '1' && e <= '9') return rx_fail(r, "back references are not supported"), -1;
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
            return rx_fail(r, "an unknown escape"), -1;
        *cp = (uint32_t)(unsigned char)e; /* an escaped punctuation character: itself */
        return 0;
    }
}

static void rx_class(rx *r) {
    r->p++; /* '[' */
    bool negate = r->p < r->end && *r->p == '^';
    if (negate) r->p++;
    gb_class c = {0};
    bool first = true;
    while (r->st == DI_OK && r->p < r->end && (*r->p != ']' || first)) {
        first = false;
        uint32_t lo;
        if (*r->p == '\\') {
            r->p++;
            if (rx_escape(r, &lo, &c) != 0) continue; /* a shorthand went into c, or an error */
        } else {
            int64_t v = rx_utf8(r);
            if (v < 0) {
                rx_fail(r, "ill-formed UTF-8");
                break;
            }
            lo = (uint32_t)v;
        }
        uint32_t hi = lo;
        if (r->end - r->p >= 2 && r->p[0] == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                if (rx_escape(r, &hi, NULL) != 0) break;
            } else {
                int64_t v = rx_utf8(r);
                if (v < 0) {
                    rx_fail(r, "ill-formed UTF-8");
                    break;
                }
                hi = (uint32_t)v;
            }
            if (hi < lo) {
                rx_fail(r, "a reversed range in a class");
                break;
            }
        }
        gb_cls_add(&c, lo, hi);
    }
    if (r->st == DI_OK && r->p >= r->end) rx_fail(r, "an unterminated class");
    if (r->st == DI_OK) {
        r->p++; /* ']' */
        gb_cls_close(&c, negate);
        emit_class(r, &c);
    }
    gb_cls_free(&c);
}

static void rx_alt(rx *r);

/* A postfix after an atom, copied as GBNF's (a lazy '?' after it changes nothing here). */
static void rx_quant(rx *r) {
    if (r->p >= r->end) return;
    char c = *r->p;
    if (c == '*' || c == '+' || c == '?') {
        gt_putn(r->out, r->p++, 1);
    } else if (c == '{') {
        const char *q = r->p + 1;
        long m = -1, n = -1;
        bool comma = false;
        while (q < r->end && *q >= '0' && *q <= '9' && m < 100000)
            m = (m < 0 ? 0 : m * 10) + (*q++ - '0');
        if (q < r->end && *q == ',') {
            comma = true, q++;
            while (q < r->end && *q >= '0' && *q <= '9' && n < 100000)
                n = (n < 0 ? 0 : n * 10) + (*q++ - '0');
        }
        if (m < 0 || q >= r->end || *q != '}') return; /* not a quantifier: a literal '{' next */
        if (m > 10000 || n > 10000) return rx_fail(r, "a repetition count over 10000");
        if (n >= 0 && n < m) return rx_fail(r, "a repetition {m,n} with n < m");
        if (!comma)
            gt_printf(r->out, "{%ld}", m);
        else if (n < 0)
            gt_printf(r->out, "{%ld,}", m);
        else
            gt_printf(r->out, "{%ld,%ld}", m, n);
        r->p = q + 1;
    } else {
        return;
    }
    if (r->p < r->end && (*r->p == '?' || *r->p == '+')) r->p++; /* lazy / possessive */
    if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '?' || *r->p == '{'))
        rx_fail(r, "a quantifier after a quantifier");
}

static void rx_seq(rx *r) {
    bool empty = true;
    while (r->st == DI_OK && r->p < r->end && *r->p != '|' && *r->p != ')') {
        char c = *r->p;
        if (!empty) gt_puts(r->out, " ");
        empty = false;
        if (c == '(') {
            r->p++;
            if (r->p < r->end && *r->p == '?') {
                if (r->end - r->p >= 2 && r->p[1] == ':') {
                    r->p += 2;
                } else if (r->end - r->p >= 3 && r->p[1] == '<' && r->p[2] != '=' &&
                           r->p[2] != '!') {
                    while (r->p < r->end && *r->p != '>') /* a named group: just a group */
                        r->p++;
                    if (r->p >= r->end) return rx_fail(r, "an unterminated group name");
                    r->p++;
                } else {
                    return rx_fail(r, "look-around and other (?...) groups are not supported");
                }
            }
            if (++r->depth > RX_MAX_DEPTH) return rx_fail(r, "groups nested too deeply");
            gt_puts(r->out, "(");
            rx_alt(r);
            r->depth--;
            if (r->st != DI_OK) return;
            if (r->p >= r->end || *r->p != ')') return rx_fail(r, "an unclosed group");
            r->p++;
            gt_puts(r->out, ")");
        } else if (c == '[') {
            rx_class(r);
        } else if (c == '.') {
            r->p++;
            gb_class any = {0};
            gb_cls_add(&any, '\n', '\n');
            gb_cls_close(&any, true);
            emit_class(r, &any);
            gb_cls_free(&any);
        } else if (c == '\\') {
            r->p++;
            gb_class sh = {0};
            uint32_t cp;
            int k = rx_escape(r, &cp, &sh);
            if (k == 1) {
                gb_cls_close(&sh, false);
                emit_class(r, &sh);
            } else if (k == 0) {
                emit_char(r, cp);
            }
            gb_cls_free(&sh);
        } else if (c == '^' || c == '$') {
            return rx_fail(r, "an anchor (^ or $) not at the pattern's ends");
        } else if (c == '*' || c == '+' || c == '?') {
            return rx_fail(r, "a quantifier with nothing before it");
        } else {
            int64_t v = rx_utf8(r);
            if (v < 0) return rx_fail(r, "ill-formed UTF-8");
            emit_char(r, (uint32_t)v);
        }
        if (r->st == DI_OK) rx_quant(r);
    }
    if (empty) gt_puts(r->out, "\"\"");
}

static void rx_alt(rx *r) {
    rx_seq(r);
    while (r->st == DI_OK && r->p < r->end && *r->p == '|') {
        r->p++;
        gt_puts(r->out, " | ");
        rx_seq(r);
    }
}

/* The characters of a JSON string (a rule body). */
#define JSON_CHAR "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})"

di_status di_regex_to_rules(gt_buf *b, const char *name, const char *re, size_t len, bool in_json) {
    rx r = {.s = re, .p = re, .end = re + len, .out = b, .json = in_json};
    bool start = len > 0 && re[0] == '^';
    bool end = len > 0 && re[len - 1] == '$' && !(len > 1 && re[len - 2] == '\\');
    if (start) r.p++;
    if (end) r.end--;
    if (r.end < r.p) r.end = r.p;
    gt_printf(b, "%s ::= ", name);
    if (in_json && !start) gt_printf(b, "%s-any ", name);
    gt_puts(b, "(");
    rx_alt(&r);
    if (r.st == DI_OK && r.p < r.end) rx_fail(&r, "an unmatched ')'");
    gt_puts(b, ")");
    if (in_json && !end) gt_printf(b, " %s-any", name);
    gt_puts(b, "\n");
    if (in_json && (!start || !end)) gt_printf(b, "%s-any ::= (" JSON_CHAR ")*\n", name);
    if (r.st != DI_OK) return r.st;
    if (b->oom) return di_error(DI_ERR_OUT_OF_MEMORY, "regex: out of memory");
    return DI_OK;
}

di_status di_regex_to_gbnf(const char *re, size_t len, char **out) {
    *out = NULL;
    gt_buf b = {0};
    di_status st = di_regex_to_rules(&b, "root", re, len, false);
    if (st != DI_OK) {
        gt_free(&b);
        return st;
    }
    *out = b.s;
    return DI_OK;
}
