/*
 * gbnf_parse.c -- the GBNF front end (grammar.h): llama.cpp's grammar format, parsed by
 * recursive descent straight into the builder (grammar_build.h).
 *
 *   grammar      ::= (rule | blank)*
 *   rule         ::= name "::=" alternatives      (ends at a newline outside parentheses)
 *   alternatives ::= sequence ("|" sequence)*     (a newline may follow "|")
 *   sequence     ::= (item postfix?)*
 *   item         ::= "literal" | [class] | [^class] | name | "(" alternatives ")" | "."
 *   postfix      ::= "*" | "+" | "?" | "{" m "}" | "{" m ",}" | "{" m "," n "}" | "{," n "}"
 *
 * Names are [A-Za-z0-9_-]+; "#" starts a comment to the end of the line; literals and
 * classes take \n \r \t \\ \" \' \[ \] \- \/ and \xHH, \uHHHH, \UHHHHHHHH escapes; other
 * text is UTF-8 (ill-formed UTF-8 is an error). llama.cpp's token references (<[id]>,
 * <token>) are not supported: they are refused with a message saying so.
 *
 * Errors name the line and column (1-based, in bytes) where the input stopped making sense.
 */
#include "constrain/grammar_build.h"

#include <stdbool.h>
#include <string.h>

#define GBNF_MAX_REPEAT 100000 /* largest m or n in {m,n}: bounds the expansion */
#define GBNF_MAX_DEPTH  256    /* parentheses nesting: the parser recurses per level */

typedef struct {
    const char *s, *end, *p; /* text, its end, the cursor */
    gb_builder b;
    int32_t rule; /* the rule whose body is being parsed (helpers are named after it) */
    int depth;
} gbnf;

static void line_col(const gbnf *g, const char *at, long long *line, long long *col) {
    *line = 1, *col = 1;
    for (const char *q = g->s; q < at && q < g->end; q++) {
        if (*q == '\n')
            ++*line, *col = 1;
        else
            ++*col;
    }
}

static di_status fail_at(const gbnf *g, const char *at, const char *what) {
    long long line, col;
    line_col(g, at, &line, &col);
    return di_error(DI_ERR_INVALID_ARG, "grammar: line %lld:%lld: %s", line, col, what);
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* Skips spaces, tabs, comments and (when newline_ok) line breaks. */
static void skip_space(gbnf *g, bool newline_ok) {
    while (g->p < g->end) {
        char c = *g->p;
        if (c == ' ' || c == '\t') {
            g->p++;
        } else if (c == '#') {
            while (g->p < g->end && *g->p != '\n' && *g->p != '\r')
                g->p++;
        } else if (newline_ok && (c == '\n' || c == '\r')) {
            g->p++;
        } else {
            break;
        }
    }
}

/* Decodes one UTF-8 character at the cursor; -1 when ill-formed. */
static int64_t next_utf8(gbnf *g) {
    uint32_t cp;
    int n = gb_utf8_decode(g->p, (size_t)(g->end - g->p), &cp);
    if (!n) return -1;
    g->p += n;
    return cp;
}

/* One character of a literal or class (an escape or a UTF-8 character) into *cp. */
static di_status parse_char(gbnf *g, uint32_t *cp) {
    const char *at = g->p;
    if (*g->p != '\\') {
        int64_t c = next_utf8(g);
        if (c < 0) return fail_at(g, at, "ill-formed UTF-8");
        *cp = (uint32_t)c;
        return DI_OK;
    }
    if (g->end - g->p < 2) return fail_at(g, at, "unfinished escape");
    char e = g->p[1];
    g->p += 2;
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = g->p < g->end ? gb_hex_digit(*g->p) : -1;
            if (h < 0) return fail_at(g, g->p, "bad hexadecimal escape");
            v = v << 4 | (uint32_t)h;
            g->p++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            return fail_at(g, at, "escape is not a Unicode scalar value");
        *cp = v;
        return DI_OK;
    }
    switch (e) {
    case 'n':
        *cp = '\n';
        return DI_OK;
    case 'r':
        *cp = '\r';
        return DI_OK;
    case 't':
        *cp = '\t';
        return DI_OK;
    case '\\':
    case '"':
    case '\'':
    case '[':
    case ']':
    case '-':
    case '/':
        *cp = (uint32_t)(unsigned char)e;
        return DI_OK;
    default:
        return fail_at(g, at, "unknown escape");
    }
}

static di_status push_bytes(gbnf *g, gb_seq *s, uint32_t cp) {
    uint8_t u[4];
    int n = gb_utf8_encode(cp, u);
    for (int i = 0; i < n; i++) {
        di_status st =
            gb_seq_push(&g->b, s, (di_gram_elem){.kind = DI_GE_BYTES, .lo = u[i], .hi = u[i]});
        if (st != DI_OK) return st;
    }
    return DI_OK;
}

static di_status parse_literal(gbnf *g, gb_seq *s) {
    const char *at = g->p++;
    while (g->p < g->end && *g->p != '"') {
        if (*g->p == '\n' || *g->p == '\r') break;
        uint32_t cp;
        di_status st = parse_char(g, &cp);
        if (st == DI_OK) st = push_bytes(g, s, cp);
        if (st != DI_OK) return st;
    }
    if (g->p >= g->end || *g->p != '"') return fail_at(g, at, "unterminated string literal");
    g->p++;
    return DI_OK;
}

static di_status parse_class(gbnf *g, gb_seq *s) {
    const char *at = g->p++;
    bool negate = g->p < g->end && *g->p == '^';
    if (negate) g->p++;
    gb_class c = {0};
    di_status st = DI_OK;
    while (st == DI_OK && g->p < g->end && *g->p != ']') {
        if (*g->p == '\n' || *g->p == '\r') break;
        uint32_t lo, hi;
        st = parse_char(g, &lo);
        hi = lo;
        if (st == DI_OK && g->end - g->p >= 2 && g->p[0] == '-' && g->p[1] != ']') {
            g->p++;
            const char *rat = g->p;
            st = parse_char(g, &hi);
            if (st == DI_OK && hi < lo) st = fail_at(g, rat, "character range is reversed");
        }
        if (st == DI_OK) st = gb_cls_add(&c, lo, hi);
    }
    if (st == DI_OK && (g->p >= g->end || *g->p != ']'))
        st = fail_at(g, at, "unterminated character class");
    if (st == DI_OK) {
        g->p++;
        st = gb_cls_close(&c, negate);
    }
    if (st == DI_OK && c.n == 0) st = fail_at(g, at, "character class matches nothing");
    if (st == DI_OK) st = gb_cls_emit(&g->b, g->rule, &c, s);
    gb_cls_free(&c);
    return st;
}

static di_status parse_alternatives(gbnf *g, int32_t rule, bool nested);

/* A postfix's number; -1 when there is none at the cursor. */
static int64_t parse_int(gbnf *g) {
    int64_t v = -1;
    while (g->p < g->end && *g->p >= '0' && *g->p <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (*g->p - '0');
        if (v > GBNF_MAX_REPEAT) v = GBNF_MAX_REPEAT + 1;
        g->p++;
    }
    return v;
}

/* After an item: *, +, ?, {m,n} into *min / *max (max -1: unbounded); false when none. */
static di_status parse_postfix(gbnf *g, bool nested, bool *has, int64_t *min, int64_t *max) {
    *has = true;
    char c = g->p < g->end ? *g->p : '\0';
    if (c == '*' || c == '+' || c == '?') {
        g->p++;
        *min = c == '+' ? 1 : 0, *max = c == '?' ? 1 : -1;
        skip_space(g, nested);
        return DI_OK;
    }
    if (c != '{') {
        *has = false;
        return DI_OK;
    }
    const char *at = g->p++;
    skip_space(g, nested);
    int64_t m = parse_int(g), n;
    skip_space(g, nested);
    if (g->p < g->end && *g->p == ',') {
        g->p++;
        skip_space(g, nested);
        n = parse_int(g);
        if (m < 0) m = 0;
        skip_space(g, nested);
    } else {
        if (m < 0) return fail_at(g, at, "expected a number in {m,n}");
        n = m;
    }
    if (g->p >= g->end || *g->p != '}') return fail_at(g, at, "unterminated {m,n} repetition");
    g->p++;
    if (m > GBNF_MAX_REPEAT || n > GBNF_MAX_REPEAT)
        return fail_at(g, at, "repetition count too large (at most 100000)");
    if (n >= 0 && n < m) return fail_at(g, at, "repetition {m,n} has n < m");
    *min = m, *max = n;
    skip_space(g, nested);
    return DI_OK;
}

/* One sequence into s (until "|", ")", the end, or a newline at the top level). */
static di_status parse_sequence(gbnf *g, bool nested, gb_seq *s) {
    for (;;) {
        if (g->p >= g->end) return DI_OK;
        char c = *g->p;
        if (c == '|' || c == ')' || c == '\n' || c == '\r') return DI_OK;
        const char *at = g->p;
        gb_seq unit = {0};
        di_status st = DI_OK;
        if (c == '"') {
            st = parse_literal(g, &unit);
        } else if (c == '[') {
            st = parse_class(g, &unit);
        } else if (c == '.') {
            g->p++;
            gb_class any = {0};
            st = gb_cls_add(&any, 0, 0x10FFFF);
            if (st == DI_OK) st = gb_cls_close(&any, false);
            if (st == DI_OK) st = gb_cls_emit(&g->b, g->rule, &any, &unit);
            gb_cls_free(&any);
        } else if (c == '(') {
            if (++g->depth > GBNF_MAX_DEPTH) return fail_at(g, at, "parentheses nested too deeply");
            g->p++;
            int32_t sub = gb_helper(&g->b, g->rule);
            if (sub < 0) return fail_at(g, at, "grammar too large");
            skip_space(g, true);
            st = parse_alternatives(g, sub, true);
            if (st == DI_OK && (g->p >= g->end || *g->p != ')'))
                st = fail_at(g, at, "unmatched \"(\"");
            if (st == DI_OK) {
                g->p++;
                st = gb_seq_push(&g->b, &unit, (di_gram_elem){.kind = DI_GE_RULE, .rule = sub});
            }
            g->depth--;
        } else if (is_name_char(c)) {
            const char *name = g->p;
            while (g->p < g->end && is_name_char(*g->p))
                g->p++;
            int32_t r = gb_rule_id(&g->b, name, (size_t)(g->p - name));
            if (r < 0) return fail_at(g, at, "grammar too large");
            if (!g->b.rules[r].defined && g->b.rules[r].ref_line == 0) {
                long long line, col;
                line_col(g, at, &line, &col);
                g->b.rules[r].ref_line = line, g->b.rules[r].ref_col = col;
            }
            st = gb_seq_push(&g->b, &unit, (di_gram_elem){.kind = DI_GE_RULE, .rule = r});
        } else if (c == '<' || c == '!') {
            st = fail_at(g, at, "token references (<[id]>, <token>, !<...>) are not supported");
        } else {
            st = fail_at(g, at, "expected a literal, a class, a rule name, \"(\" or \".\"");
        }
        if (st == DI_OK) {
            skip_space(g, nested);
            bool has;
            int64_t min = 0, max = 0;
            st = parse_postfix(g, nested, &has, &min, &max);
            if (st == DI_OK)
                st = has ? gb_repeat(&g->b, g->rule, &unit, min, max, s)
                         : gb_seq_append(&g->b, s, &unit);
        }
        gb_seq_free(&unit);
        if (st != DI_OK) return st;
    }
}

static di_status parse_alternatives(gbnf *g, int32_t rule, bool nested) {
    for (;;) {
        gb_seq s = {0};
        di_status st = parse_sequence(g, nested, &s);
        if (st == DI_OK) st = gb_add_alt(&g->b, rule, &s);
        gb_seq_free(&s);
        if (st != DI_OK) return st;
        if (g->p >= g->end || *g->p != '|') return DI_OK;
        g->p++;
        skip_space(g, true);
    }
}

static di_status parse_rule(gbnf *g) {
    const char *at = g->p;
    while (g->p < g->end && is_name_char(*g->p))
        g->p++;
    if (g->p == at) return fail_at(g, at, "expected a rule name");
    int32_t r = gb_rule_id(&g->b, at, (size_t)(g->p - at));
    if (r < 0) return fail_at(g, at, "grammar too large");
    if (g->b.rules[r].defined) return fail_at(g, at, "rule defined twice");
    g->b.rules[r].defined = true;
    skip_space(g, false);
    if (g->end - g->p < 3 || memcmp(g->p, "::=", 3) != 0)
        return fail_at(g, g->p, "expected \"::=\"");
    g->p += 3;
    skip_space(g, true);
    g->rule = r;
    di_status st = parse_alternatives(g, r, false);
    if (st != DI_OK) return st;
    if (g->p < g->end && *g->p == ')') return fail_at(g, g->p, "unmatched \")\"");
    if (g->p < g->end && *g->p != '\n' && *g->p != '\r')
        return fail_at(g, g->p, "expected the end of the line");
    return DI_OK;
}

di_status di_grammar_from_gbnf(const char *text, size_t len, di_grammar **out) {
    *out = NULL;
    if (!text) return di_error(DI_ERR_INVALID_ARG, "grammar: no text");
    gbnf g = {.s = text, .end = text + len, .p = text};
    di_status st = DI_OK;
    for (;;) {
        skip_space(&g, true);
        if (g.p >= g.end) break;
        st = parse_rule(&g);
        if (st != DI_OK) break;
    }
    if (st == DI_OK) st = gb_finish(&g.b, out);
    gb_free(&g.b);
    return st;
}
