/*
 * fuzz_grammar.c -- libFuzzer target: the input is GBNF grammar text, then bytes to match.
 *
 * The first NUL byte (if any) splits the input: before it the grammar, after it a text fed
 * to a matcher of the compiled grammar byte by byte. di_grammar_from_gbnf must return a status
 * for any text; on success the grammar must satisfy grammar.h's invariants (checked below:
 * every alternative ends, every rule reference is in range, root exists), and the matcher
 * must neither crash nor loop on any bytes.
 */
#include "constrain/grammar.h"
#include "constrain/matcher.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    di_grammar *g = NULL;
    if (di_grammar_from_gbnf((const char *)data, glen, &g) != DI_OK) return 0;
    if (g->root < 0 || g->root >= g->n_rules || g->n_elems == 0 ||
        g->elems[g->n_elems - 1].kind != DI_GE_END)
        abort();
    for (int32_t r = 0; r < g->n_rules; r++)
        if (g->rule_nalt[r] < 1) abort();
    for (int64_t i = 0; i < g->n_elems; i++)
        if (g->elems[i].kind == DI_GE_RULE &&
            (g->elems[i].rule < 0 || g->elems[i].rule >= g->n_rules))
            abort();
    di_matcher *m = NULL;
    if (di_matcher_create(g, &m) == DI_OK) {
        const uint8_t *text = nul ? nul + 1 : data + size;
        size_t tlen = nul ? size - glen - 1 : 0;
        for (size_t i = 0; i < tlen; i++)
            if (!di_matcher_accept(m, text + i, 1)) break;
        (void)di_matcher_can_end(m);
        di_matcher_free(m);
    }
    di_grammar_free(g);
    return 0;
}
