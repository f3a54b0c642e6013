/*
 * matcher.h -- runs a grammar (grammar.h) over bytes, and gives the token mask a sampler
 * needs at each step.
 *
 * Design stance: a pushdown recogniser whose configurations are *sets of stacks*, as
 * llama.cpp's grammar sampler keeps them, made cheap by interning. A stack is a linked list
 * of grammar positions ("match the element at pos, then continue with the parent stack"),
 * and every stack node is interned, so equal stacks are one id. A set of stacks, sorted, is
 * interned too: that id is a *state*. Advancing a state by a byte gives another state, and
 * the transition is cached, so the matcher is a lazily built DFA over the grammar's reachable
 * configurations. Token masks walk the vocabulary's byte trie (vocab_trie below) through
 * those cached transitions, cutting a subtree at the first dead byte, and the mask of a state
 * is cached too: inside a JSON string, say, the state after every token is the same one, and
 * its mask is computed once.
 *
 * Every stack in a state has a DI_GE_BYTES element on top, or is the empty stack (the input
 * so far is a complete sentence). Right recursion does not grow the stacks (an element
 * followed by END is a tail position: nothing is pushed for it), so `x*` over a long output
 * stays one state.
 *
 * Memory: the interning tables grow with what the generation visits (deeper nesting, new
 * states). They belong to one matcher (one sample of one request); when they pass
 * DI_MATCHER_MAX_NODES / _STATES the caches are rebuilt around the current state only.
 * Not thread-safe: one matcher per sampling thread at a time.
 */
#ifndef DI_CONSTRAIN_MATCHER_H
#define DI_CONSTRAIN_MATCHER_H

#include "constrain/grammar.h"
#include "deepinfer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DI_MATCHER_MAX_NODES  (1 << 22)
#define DI_MATCHER_MAX_STATES (1 << 18)

typedef struct di_matcher di_matcher;

/* The vocabulary as a byte trie, built once per tokenizer (immutable, shared by matchers).
 * Special tokens and tokens with no bytes are left out: a grammar never allows them. */
typedef struct di_vocab_trie di_vocab_trie;

di_status di_vocab_trie_build(const di_tokenizer *tok, int32_t vocab, di_vocab_trie **out);
void di_vocab_trie_free(di_vocab_trie *t);

/* A matcher at the grammar's start (borrows g: it must outlive the matcher). */
di_status di_matcher_create(const di_grammar *g, di_matcher **out);
/* A matcher in the same state as m, with fresh caches (for a request's other samples). */
di_status di_matcher_clone(const di_matcher *m, di_matcher **out);
void di_matcher_free(di_matcher *m);

/* Advances by n bytes when the grammar allows all of them; otherwise returns false and
 * leaves the state as it was. (Also false when the matcher ran out of memory.) */
bool di_matcher_accept(di_matcher *m, const void *bytes, size_t n);

/* The input so far is a complete sentence of the grammar. */
bool di_matcher_can_end(const di_matcher *m);
/* Complete, and no byte can follow: only the end of the output is left. */
bool di_matcher_done(const di_matcher *m);

/* Writes the tokens the grammar allows next as bits: mask[id / 32] bit id % 32, for ids in
 * [0, vocab) (words = (vocab + 31) / 32); end_id (e.g. EOS; -1: none) is allowed exactly when
 * the input so far is complete. DI_ERR_OUT_OF_MEMORY if the caches could not grow. */
di_status di_matcher_mask(di_matcher *m, const di_vocab_trie *t, int32_t end_id, uint32_t *mask,
                          int64_t vocab);

#endif /* DI_CONSTRAIN_MATCHER_H */
