/*
 * gbnf_text.h -- what the JSON-schema and regex front ends share: they write GBNF text (which
 * di_grammar_from_gbnf then compiles), so every constraint a request gives can be printed
 * and read as a grammar. A growable string, GBNF literal and class escaping, and the two
 * translators' entry points.
 */
#ifndef DI_CONSTRAIN_GBNF_TEXT_H
#define DI_CONSTRAIN_GBNF_TEXT_H

#include "core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gt_buf {
    char *s;
    size_t n, cap;
    bool oom; /* a failed append: the text is incomplete (checked once at the end) */
} gt_buf;

void gt_puts(gt_buf *b, const char *s);
void gt_putn(gt_buf *b, const char *s, size_t n);
void gt_printf(gt_buf *b, const char *fmt, ...) DI_PRINTF(2, 3);
/* Appends s[0, n) as the inside of a GBNF "literal" (quotes, backslashes and control bytes
 * escaped; other bytes as they are). */
void gt_literal(gt_buf *b, const char *s, size_t n);
/* Appends code point c escaped for use inside a GBNF [class]. */
void gt_class_char(gt_buf *b, uint32_t c);
void gt_free(gt_buf *b);

/* A regex (ECMA-262-like syntax: | () (?:) * + ? {m} {m,} {m,n} [..] [^..] . \d \w \s \D
 * \W \S, escapes; ^ and $ only at the ends) as GBNF rules named "<name>" and "<name>-...",
 * appended to b. in_json: the matched text sits inside a JSON string, so its characters are
 * those that need no escape there (no '"', '\\' or control characters), and a pattern
 * without ^ / $ may be surrounded by any such characters (JSON Schema's "pattern" is a
 * search, not a full match). Errors name the regex and the offset. */
di_status di_regex_to_rules(gt_buf *b, const char *name, const char *re, size_t len, bool in_json);

/* A whole grammar (root rule) whose sentences are the full matches of re. *out: NUL-
 * terminated GBNF, di_free. */
di_status di_regex_to_gbnf(const char *re, size_t len, char **out);

/* A whole grammar whose sentences are JSON documents valid under a JSON Schema (the subset
 * described in json_schema.c). *out: NUL-terminated GBNF, di_free. Errors name the schema
 * path ("json_schema: /properties/a: ..."). */
di_status di_json_schema_to_gbnf(const char *schema, size_t len, char **out);

#endif /* DI_CONSTRAIN_GBNF_TEXT_H */
