/*
 * grammar.h -- the grammar IR that constrained generation runs on, and its GBNF front end.
 *
 * Design stance: the IR is over bytes, not characters. A model's tokens are byte strings
 * (byte-level BPE), and a token may end in the middle of a UTF-8 character, so a matcher over
 * code points would need partial-character state. Instead the front end compiles every
 * character class into the UTF-8 byte sequences that encode it (a class of code points is a
 * union of at most a few dozen sequences of byte ranges), and the matcher (matcher.h) only
 * ever tests one byte against one range.
 *
 * A grammar is a list of rules; a rule is a list of alternatives; an alternative is a
 * sequence of elements ending with DI_GE_END. An element matches one byte in [lo, hi]
 * (DI_GE_BYTES) or one whole rule (DI_GE_RULE). Repetitions (*, +, ?, {m,n}), groups and
 * classes become helper rules (right recursion, never left), so the IR has no other forms.
 *
 * Invariants after di_grammar_from_gbnf succeeds: every rule has at least one alternative,
 * every DI_GE_RULE names an existing rule, no rule can reach itself without consuming a byte
 * (left recursion is rejected: a matcher could not expand it), and `root` exists.
 */
#ifndef DI_CONSTRAIN_GRAMMAR_H
#define DI_CONSTRAIN_GRAMMAR_H

#include "core/core.h"

#include <stddef.h>
#include <stdint.h>

typedef enum { DI_GE_END = 0, DI_GE_BYTES, DI_GE_RULE } di_gram_kind;

typedef struct di_gram_elem {
    uint8_t kind;   /* di_gram_kind */
    uint8_t lo, hi; /* DI_GE_BYTES: the byte range, inclusive */
    int32_t rule;   /* DI_GE_RULE: the rule it expands to */
} di_gram_elem;

typedef struct di_grammar {
    di_gram_elem *elems; /* [n_elems] every alternative back to back, each ending in END */
    int64_t n_elems;
    int32_t *alt_first; /* [n_alts] index in elems of alternative a's first element */
    int32_t n_alts;
    int32_t *rule_alt;  /* [n_rules] rule r's alternatives are rule_alt[r] .. + rule_nalt[r] */
    int32_t *rule_nalt; /* [n_rules] */
    int32_t n_rules;
    int32_t root;
    char **names; /* [n_rules] the rule's name; helper rules are named after their parent */
} di_grammar;

/* Most rules and elements a grammar may compile to (a bound on untrusted input). */
#define DI_GRAMMAR_MAX_RULES (1 << 16)
#define DI_GRAMMAR_MAX_ELEMS (1 << 22)

/* Compiles GBNF text (llama.cpp's grammar format: `name ::= alternatives`, "literals",
 * [classes] and [^negated], `.`, groups, * + ? {m} {m,} {m,n}, # comments; the start rule is
 * `root`). Errors are DI_ERR_INVALID_ARG with a message "grammar: line L:C: ..." naming the
 * place, or the rule for undefined / left-recursive rules. */
di_status di_grammar_from_gbnf(const char *text, size_t len, di_grammar **out);
void di_grammar_free(di_grammar *g);

#endif /* DI_CONSTRAIN_GRAMMAR_H */
