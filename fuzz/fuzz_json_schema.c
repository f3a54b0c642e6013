/*
 * fuzz_json_schema.c -- libFuzzer target: the JSON-Schema and regex front ends of constrained
 * generation (src/constrain/json_schema.c, regex_gbnf.c).
 *
 * The first byte picks the front end (even: the rest is a JSON Schema, odd: a regex). Each
 * must return a status for any input, and what it returns on success must be GBNF that
 * di_grammar_from_gbnf compiles (a converter that writes a broken grammar aborts here),
 * with a matcher that starts.
 */
#include "constrain/gbnf_text.h"
#include "constrain/grammar.h"
#include "constrain/matcher.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *text = (const char *)data + 1;
    char *gbnf = NULL;
    di_status st = data[0] % 2 ? di_regex_to_gbnf(text, size - 1, &gbnf)
                               : di_json_schema_to_gbnf(text, size - 1, &gbnf);
    if (st != DI_OK) return 0;
    di_grammar *g = NULL;
    st = di_grammar_from_gbnf(gbnf, strlen(gbnf), &g);
    /* a converter's output must compile; the only refusals allowed are the grammar's own
     * limits and left recursion written by the input (a regex like (a*)*b is fine) */
    if (st != DI_OK && st != DI_ERR_INVALID_ARG) abort();
    if (st == DI_OK) {
        di_matcher *m = NULL;
        if (di_matcher_create(g, &m) == DI_OK) di_matcher_free(m);
        di_grammar_free(g);
    }
    free(gbnf);
    return 0;
}
