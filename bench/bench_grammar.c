/*
 * bench_grammar.c -- cost of constrained generation's token masks at DeepSeek-V3's real
 * vocabulary (not a test; never run by ctest).
 *
 *   bench_grammar TOKENIZER_DIR GRAMMAR_DIR [step_ms]
 *
 * For each case (a grammar and a document it accepts), the document is tokenized with the
 * real tokenizer and replayed token by token as a constrained generation would: the mask of
 * the allowed tokens for the next position (di_matcher_mask), then the chosen token's bytes
 * (di_matcher_accept). Reports per token: the mean and worst mask time, how many masks came
 * from the per-state cache, and the mean as a share of a decode step (step_ms, default the
 * nominal 10 ms). The first token's mask builds the first states; the vocabulary trie is
 * built once (its time is printed) and shared by all requests of an engine.
 */
#include "constrain/gbnf_text.h"
#include "constrain/grammar.h"
#include "constrain/matcher.h"
#include "core/core.h"
#include "deepinfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name, *kind, *spec, *doc; /* kind: "gbnf-file", "schema", "regex" */
} bench_case;

static const bench_case k_cases[] = {
    {"json.gbnf, nested document", "gbnf-file", "llama.cpp/json.gbnf",
     "{\"name\": \"deepinfer\", \"version\": \"1.2.3\", \"tags\": [\"llm\", \"inference\", "
     "\"moe\"], \"config\": {\"layers\": 27, \"experts\": 64, \"shared\": 2, \"dtype\": "
     "\"bf16\", \"description\": \"A Mixture-of-Experts inference engine written in C, with a "
     "CUDA backend for Hopper GPUs and constrained generation from grammars.\"}, \"ok\": true}"},
    {"JSON Schema, object of 5 typed keys", "schema",
     "{\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"integer\"}, \"title\": "
     "{\"type\": \"string\", \"maxLength\": 80}, \"tags\": {\"type\": \"array\", \"items\": "
     "{\"enum\": [\"news\", \"tech\", \"sport\"]}}, \"date\": {\"type\": \"string\", \"format\": "
     "\"date\"}, \"draft\": {\"type\": \"boolean\"}}, \"required\": [\"id\", \"title\", "
     "\"tags\", \"date\", \"draft\"], \"additionalProperties\": false}",
     "{\"id\": 4021, \"title\": \"Sparse experts make large models cheaper to serve\", "
     "\"tags\": [\"tech\", \"news\"], \"date\": \"2026-11-29\", \"draft\": false}"},
    {"regex, e-mail-like", "regex", "[a-z0-9._]+@[a-z0-9-]+(\\.[a-z]{2,10}){1,2}",
     "first.last_2026@mail-server.example.co"},
    {"c.gbnf, a small C program", "gbnf-file", "llama.cpp/c.gbnf",
     "int main(){int x = 1;while(x<100){x = x*2;}return x;}"},
};

static double now(void) {
    return di_time_now();
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_grammar TOKENIZER_DIR GRAMMAR_DIR [step_ms]\n");
        return 2;
    }
    double step_ms = argc > 3 ? atof(argv[3]) : 10.0;
    di_tokenizer *tok = NULL;
    if (di_tokenizer_load(argv[1], &tok) != DI_OK) {
        fprintf(stderr, "bench_grammar: %s\n", di_last_error());
        return 1;
    }
    const int32_t vocab = di_tokenizer_vocab_size(tok), eos = di_tokenizer_eos_id(tok);
    double t0 = now();
    di_vocab_trie *trie = NULL;
    if (di_vocab_trie_build(tok, vocab, &trie) != DI_OK) return 1;
    printf("vocabulary %d tokens; trie built in %.1f ms\n", vocab, (now() - t0) * 1e3);
    printf("%-38s %7s %12s %12s %10s %12s\n", "case", "tokens", "mean mask us", "worst us",
           "cached", "% of step");
    uint32_t *mask = malloc((size_t)((vocab + 31) / 32) * sizeof *mask);
    for (size_t c = 0; c < sizeof k_cases / sizeof *k_cases; c++) {
        const bench_case *bc = &k_cases[c];
        char *gbnf = NULL;
        di_status st;
        if (!strcmp(bc->kind, "gbnf-file")) {
            char path[1024];
            size_t len;
            snprintf(path, sizeof path, "%s/%s", argv[2], bc->spec);
            st = di_read_file(path, &gbnf, &len);
        } else if (!strcmp(bc->kind, "schema")) {
            st = di_json_schema_to_gbnf(bc->spec, strlen(bc->spec), &gbnf);
        } else {
            st = di_regex_to_gbnf(bc->spec, strlen(bc->spec), &gbnf);
        }
        di_grammar *g = NULL;
        if (st == DI_OK) st = di_grammar_from_gbnf(gbnf, strlen(gbnf), &g);
        if (st != DI_OK) {
            printf("%-38s skipped: %s\n", bc->name, di_last_error());
            di_free(gbnf);
            continue;
        }
        int32_t ids[1024];
        int64_t n = di_tokenizer_encode(tok, bc->doc, strlen(bc->doc), false, ids, 1024);
        di_matcher *m = NULL;
        di_matcher_create(g, &m);
        double total = 0, worst = 0;
        int64_t done = 0, repeats = 0;
        for (int64_t i = 0; i < n; i++) {
            double a = now();
            di_matcher_mask(m, trie, eos, mask, vocab);
            double dt = now() - a;
            /* a mask that took under 20 us came from the cache (the walk takes longer) */
            repeats += dt < 20e-6;
            total += dt, worst = dt > worst ? dt : worst;
            if (!(mask[ids[i] >> 5] >> (ids[i] & 31) & 1u)) {
                printf("%-38s the document's token %lld is masked (grammar and document "
                       "disagree)\n",
                       bc->name, (long long)i);
                break;
            }
            size_t bl;
            const char *b = di_tokenizer_id_bytes(tok, ids[i], &bl);
            di_matcher_accept(m, b, bl);
            done++;
        }
        if (done == n)
            printf("%-38s %7lld %12.1f %12.1f %6lld/%-3lld %11.2f%%\n", bc->name, (long long)n,
                   total / (double)n * 1e6, worst * 1e6, (long long)repeats, (long long)n,
                   100.0 * total / (double)n / (step_ms * 1e-3));
        di_matcher_free(m);
        di_grammar_free(g);
        di_free(gbnf);
    }
    printf("(%% of a decode step of %.1f ms)\n", step_ms);
    free(mask);
    di_vocab_trie_free(trie);
    di_tokenizer_free(tok);
    return 0;
}
