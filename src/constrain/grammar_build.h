/*
 * grammar_build.h -- what the grammar front ends share: a builder that collects rules as
 * lists of alternatives (helper rules may be added while a rule's body is being parsed), the
 * UTF-8 compilation of character classes, repetitions, and the final checks (undefined rules,
 * left recursion) that turn it into a di_grammar.
 */
#ifndef DI_CONSTRAIN_GRAMMAR_BUILD_H
#define DI_CONSTRAIN_GRAMMAR_BUILD_H

#include "constrain/grammar.h"

#include <stdbool.h>

/* A sequence of elements under construction (no END). */
typedef struct gb_seq {
    di_gram_elem *e;
    int64_t n, cap;
} gb_seq;

typedef struct gb_rule {
    char *name;
    gb_seq *alts; /* [n_alts] */
    int32_t n_alts, cap_alts;
    bool defined; /* has a body (a rule referenced before its definition is not, yet) */
    int64_t ref_line, ref_col; /* where it was first referenced (for "undefined rule") */
} gb_rule;

typedef struct gb_builder {
    gb_rule *rules;
    int32_t n_rules, cap_rules;
    int64_t n_elems; /* total so far, against DI_GRAMMAR_MAX_ELEMS */
    int32_t *htab;   /* [hcap] named rules by name hash, -1 empty */
    int32_t hcap, n_named;
} gb_builder;

/* A set of code point ranges (a character class), kept sorted and merged by gb_cls_close. */
typedef struct gb_class {
    uint32_t (*r)[2];
    int32_t n, cap;
} gb_class;

void gb_free(gb_builder *b);
/* The id of the rule called name[0, len), created (undefined) if new; -1 on overflow. */
int32_t gb_rule_id(gb_builder *b, const char *name, size_t len);
/* A new helper rule named "<parent>.<k>"; -1 on overflow. */
int32_t gb_helper(gb_builder *b, int32_t parent);
/* Appends an alternative (copied) to rule r. */
di_status gb_add_alt(gb_builder *b, int32_t r, const gb_seq *s);
di_status gb_seq_push(gb_builder *b, gb_seq *s, di_gram_elem e);
di_status gb_seq_append(gb_builder *b, gb_seq *s, const gb_seq *t);
void gb_seq_free(gb_seq *s);

di_status gb_cls_add(gb_class *c, uint32_t lo, uint32_t hi);
/* Sorts and merges; with negate, replaces the set by its complement in [0, 0x10FFFF]. The
 * surrogates (U+D800..U+DFFF, never valid UTF-8) are removed either way. */
di_status gb_cls_close(gb_class *c, bool negate);
/* Appends to s the elements that match one character of the class: one byte range inline
 * when the class is a single ASCII range, else a helper rule of parent with one alternative
 * per UTF-8 byte-range sequence. An empty class matches nothing (a rule with no way through
 * is an error at di_grammar_from_gbnf's checks: it would be a dead end). */
di_status gb_cls_emit(gb_builder *b, int32_t parent, const gb_class *c, gb_seq *s);
void gb_cls_free(gb_class *c);

/* The UTF-8 bytes of code point cp into o[0..3]; returns their count. */
int gb_utf8_encode(uint32_t cp, uint8_t *o);
/* The code point UTF-8 encodes at p[0, left) into *cp; returns the bytes it took, or 0 when
 * they are ill-formed (overlong, a surrogate, past U+10FFFF, cut short). */
int gb_utf8_decode(const char *p, size_t left, uint32_t *cp);
/* The value of a hexadecimal digit, or -1. */
int gb_hex_digit(char c);

/* Replaces unit (the elements of one parsed item) by its repetition {min, max} (max < 0:
 * unbounded) appended to s, through helper rules of parent. */
di_status gb_repeat(gb_builder *b, int32_t parent, const gb_seq *unit, int64_t min, int64_t max,
                    gb_seq *s);

/* Checks (root exists, every rule defined, no left recursion) and flattens into *out. */
di_status gb_finish(gb_builder *b, di_grammar **out);

#endif /* DI_CONSTRAIN_GRAMMAR_BUILD_H */
