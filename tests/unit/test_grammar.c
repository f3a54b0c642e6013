/*
 * test_grammar.c -- the GBNF front end and the grammar matcher (src/constrain).
 *
 * Independent references: jansson's JSON parser for what llama.cpp's json.gbnf accepts
 * (random documents and every one-byte deletion of them: the grammar and jansson must agree),
 * and, for token masks, the matcher's own byte-by-byte acceptance of every token of
 * DeepSeek-V3's real vocabulary (the mask walks a trie through cached transitions; the brute
 * force feeds each token's bytes to a fresh copy of the matcher).
 *
 * Data: $DI_SHARED_DIR/grammars (every GBNF file there must compile) and
 * $DI_SHARED_DIR/tokenizers/deepseek-v3; tests that need them SKIP when absent.
 */
#include "constrain/grammar.h"
#include "constrain/matcher.h"
#include "core/core.h"
#include "deepinfer.h"
#include "test.h"

#include <dirent.h>
#include <jansson.h>
#include <stdbool.h>

#define GRAMMARS DI_SHARED_DIR "/grammars"
#define DS_DIR   DI_SHARED_DIR "/tokenizers/deepseek-v3"

static di_grammar *compile(const char *text) {
    di_grammar *g = NULL;
    di_status st = di_grammar_from_gbnf(text, strlen(text), &g);
    if (st != DI_OK) printf("  grammar error: %s\n", di_last_error());
    return g;
}

/* Whether the whole text is a sentence of g (accepted byte by byte and complete). */
static bool matches(const di_grammar *g, const char *text, size_t n) {
    di_matcher *m = NULL;
    if (di_matcher_create(g, &m) != DI_OK) return false;
    bool ok = di_matcher_accept(m, text, n) && di_matcher_can_end(m);
    di_matcher_free(m);
    return ok;
}

static bool matches_s(const di_grammar *g, const char *text) {
    return matches(g, text, strlen(text));
}

/* The compile error's message for text, or "" when it compiled. */
static const char *error_of(const char *text) {
    di_grammar *g = NULL;
    if (di_grammar_from_gbnf(text, strlen(text), &g) == DI_OK) {
        di_grammar_free(g);
        return "";
    }
    return di_last_error();
}

static char *read_all(const char *path, size_t *n) {
    char *buf = NULL;
    if (di_read_file(path, &buf, n) != DI_OK) return NULL;
    return buf;
}

/* ---------------------------------------------------------------------------------------- */

TEST(shared_grammars_compile) {
    const char *dirs[] = {GRAMMARS "/llama.cpp", GRAMMARS "/llguidance"};
    int n = 0;
    for (int d = 0; d < 2; d++) {
        DIR *dir = opendir(dirs[d]);
        if (!dir) continue;
        struct dirent *e;
        while ((e = readdir(dir))) {
            size_t L = strlen(e->d_name);
            if (L < 6 || strcmp(e->d_name + L - 5, ".gbnf") != 0) continue;
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", dirs[d], e->d_name);
            size_t len;
            char *text = read_all(path, &len);
            CHECK_MSG(text != NULL, "%s", path);
            di_grammar *g = NULL;
            di_status st = text ? di_grammar_from_gbnf(text, len, &g) : DI_ERR_IO;
            CHECK_MSG(st == DI_OK, "%s: %s", e->d_name, di_last_error());
            di_matcher *m = NULL;
            if (g) CHECK(di_matcher_create(g, &m) == DI_OK);
            di_matcher_free(m);
            di_grammar_free(g);
            di_free(text);
            n++;
        }
        closedir(dir);
    }
    if (n == 0) SKIP("no grammars under " GRAMMARS);
    CHECK(n >= 9);
}

TEST(literals_classes_repetition) {
    di_grammar *g = compile("root ::= \"a\"{2,3} tail\ntail ::= [x-z]? | \"!\"+\n");
    CHECK(g != NULL);
    if (!g) return;
    CHECK(matches_s(g, "aa"));
    CHECK(matches_s(g, "aaa"));
    CHECK(matches_s(g, "aaay"));
    CHECK(matches_s(g, "aa!!!"));
    CHECK(!matches_s(g, "a"));
    CHECK(!matches_s(g, "aaaa"));
    CHECK(!matches_s(g, "aaw"));
    CHECK(!matches_s(g, "aa!y"));
    di_grammar_free(g);

    /* {m,} and {,n}, groups, alternatives across lines after "|", comments */
    g = compile("root ::= (\"ab\" | \"c\"){2,} \"-\" [0-9]{,2}  # trailing comment\n"
                "  # a comment line\n");
    CHECK(g != NULL);
    if (g) {
        CHECK(matches_s(g, "abc-"));
        CHECK(matches_s(g, "cab-12"));
        CHECK(!matches_s(g, "ab-1"));
        CHECK(!matches_s(g, "abab-123"));
        di_grammar_free(g);
    }
    g = compile("root ::= \"x\" |\n   \"y\"\n");
    CHECK(g != NULL);
    if (g) {
        CHECK(matches_s(g, "x") && matches_s(g, "y") && !matches_s(g, "xy"));
        di_grammar_free(g);
    }
}

TEST(utf8_classes) {
    /* a negated class is every other code point, as UTF-8 of any length */
    di_grammar *g = compile("root ::= [^a]\n");
    CHECK(g != NULL);
    if (!g) return;
    CHECK(matches_s(g, "b"));
    CHECK(matches_s(g, "\xc3\xa9"));         /* é */
    CHECK(matches_s(g, "\xe2\x82\xac"));     /* € */
    CHECK(matches_s(g, "\xf0\x9f\x98\x80")); /* U+1F600 */
    CHECK(matches_s(g, "\xf4\x8f\xbf\xbf")); /* U+10FFFF */
    CHECK(!matches_s(g, "a"));
    CHECK(!matches_s(g, "\xed\xa0\x80"));     /* a surrogate: not UTF-8 */
    CHECK(!matches_s(g, "\xc0\xaf"));         /* overlong */
    CHECK(!matches_s(g, "\xf4\x90\x80\x80")); /* past U+10FFFF */
    CHECK(!matches_s(g, "bb"));
    di_grammar_free(g);

    /* ranges given as UTF-8 text and as escapes, across encoded lengths */
    g = compile("root ::= [\xe3\x81\x81-\xe3\x82\x9f]+ [\\u00e0-\\U0001F600] .\n");
    CHECK(g != NULL);
    if (!g) return;
    CHECK(matches_s(g, "\xe3\x81\xb2\xe3\x82\x89\xc3\xa0z"));         /* ひら à z */
    CHECK(matches_s(g, "\xe3\x81\xb2\xf0\x9f\x98\x80\xe2\x82\xac"));  /* ひ 😀 € */
    CHECK(!matches_s(g, "\xe3\x81\xb2\xf0\x9f\x98\x81\xe2\x82\xac")); /* U+1F601: past */
    CHECK(!matches_s(g, "\xe3\x82\xa0\xc3\xa0z"));                    /* U+30A0: past */
    di_grammar_free(g);
}

TEST(errors_name_the_place) {
    CHECK(strstr(error_of("root ::= foo\n"), "undefined rule \"foo\""));
    CHECK(strstr(error_of("root ::= foo\n"), "line 1:10"));
    CHECK(strstr(error_of("root ::= \"abc\n"), "line 1:10: unterminated string literal"));
    CHECK(strstr(error_of("root ::= [abc\n"), "unterminated character class"));
    CHECK(strstr(error_of("root ::= [z-a]\n"), "reversed"));
    CHECK(strstr(error_of("a ::= \"x\"\n"), "no rule named \"root\""));
    CHECK(strstr(error_of("root ::= root \"x\" | \"y\"\n"), "\"root\" is left-recursive"));
    CHECK(
        strstr(error_of("root ::= a\na ::= b? a \"x\"\nb ::= \"y\"\n"), "\"a\" is left-recursive"));
    CHECK(strstr(error_of("root ::= <[12]>\n"), "token references"));
    CHECK(strstr(error_of("root ::= \"x\"\nroot ::= \"y\"\n"), "line 2:1: rule defined twice"));
    CHECK(strstr(error_of("root ::= (\"x\"\n"), "unmatched \"(\""));
    CHECK(strstr(error_of("root ::= \"x\"{3,2}\n"), "n < m"));
    CHECK(strstr(error_of("root ::= \"x\"{1000000}\n"), "too large"));
    CHECK(strstr(error_of("root ::= \"\\q\"\n"), "unknown escape"));
    CHECK(strstr(error_of("root ::= \"\xff\"\n"), "ill-formed UTF-8"));
    CHECK(strstr(error_of("root ::= [^\\x00-\\U0010FFFF]\n"), "matches nothing"));
    CHECK(strstr(error_of("root ::= \"x\" )\n"), "unmatched \")\""));
    CHECK(*error_of("root ::= \"\"\n") == '\0'); /* the empty sentence is fine */
}

/* ---------------------------------------------------------------------------------------- */
/* json.gbnf against jansson                                                                  */
/* ---------------------------------------------------------------------------------------- */

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

typedef struct {
    char *s;
    size_t n, cap;
} sbuf;

static void put(sbuf *b, const char *s) {
    size_t L = strlen(s);
    if (b->n + L + 1 > b->cap) {
        b->cap = 2 * (b->n + L + 1);
        b->s = realloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, L + 1);
    b->n += L;
}

/* A random JSON value inside json.gbnf's limits (short numbers, single spaces). */
static void gen_value(sbuf *b, int depth) {
    static const char *strs[] = {"a", "h\\u00e9", "\\n\\\"q", "caf\xc3\xa9", "\xf0\x9f\x98\x80",
                                 "",  "x y",      "\\\\"};
    static const char *nums[] = {"0", "-12", "3.25", "1e5", "-0.5E-3", "123456", "7.0e+2"};
    uint32_t k = depth > 3 ? 2 + rnd(3) : rnd(5);
    if (k == 0 || k == 1) {
        put(b, k == 0 ? "{" : "[");
        int n = (int)rnd(4);
        for (int i = 0; i < n; i++) {
            if (i) put(b, rnd(2) ? ", " : ",");
            if (k == 0) {
                put(b, "\"");
                put(b, strs[rnd(8)]);
                put(b, rnd(2) ? "\": " : "\":");
            }
            gen_value(b, depth + 1);
        }
        put(b, k == 0 ? "}" : "]");
    } else if (k == 2) {
        put(b, "\"");
        put(b, strs[rnd(8)]);
        put(b, "\"");
    } else if (k == 3) {
        put(b, nums[rnd(7)]);
    } else {
        static const char *lits[] = {"true", "false", "null"};
        put(b, lits[rnd(3)]);
    }
}

static bool jansson_valid(const char *s, size_t n) {
    json_error_t err;
    json_t *j = json_loadb(s, n, 0, &err); /* an object or an array at the top */
    bool ok = j && json_is_object(j);
    json_decref(j);
    return ok;
}

TEST(json_grammar_agrees_with_jansson) {
    size_t len;
    char *text = read_all(GRAMMARS "/llama.cpp/json.gbnf", &len);
    if (!text) {
        SKIP("no json.gbnf");
        return;
    }
    di_grammar *g = NULL;
    CHECK(di_grammar_from_gbnf(text, len, &g) == DI_OK);
    di_free(text);
    if (!g) return;
    int docs = 0, variants = 0, valid_variants = 0;
    for (int it = 0; it < 300; it++) {
        sbuf b = {0};
        put(&b, "{\"k\": ");
        gen_value(&b, 0);
        put(&b, "}");
        CHECK_MSG(jansson_valid(b.s, b.n), "generator made invalid JSON: %s", b.s);
        CHECK_MSG(matches(g, b.s, b.n), "grammar rejects %s", b.s);
        docs++;
        /* every deletion of one byte: both say yes or both say no */
        char *v = malloc(b.n + 1);
        for (size_t i = 0; i < b.n; i++) {
            memcpy(v, b.s, i);
            memcpy(v + i, b.s + i + 1, b.n - i - 1);
            bool jv = jansson_valid(v, b.n - 1), gv = matches(g, v, b.n - 1);
            CHECK_MSG(jv == gv, "deleting byte %zu of %s: jansson %d, grammar %d", i, b.s, jv, gv);
            variants++;
            valid_variants += jv;
        }
        free(v);
        free(b.s);
    }
    printf("  %d documents, %d one-byte deletions (%d still valid JSON)\n", docs, variants,
           valid_variants);
    CHECK(valid_variants > 100 && valid_variants < variants - 100);
    di_grammar_free(g);
}

/* ---------------------------------------------------------------------------------------- */
/* Token masks over the real vocabulary                                                       */
/* ---------------------------------------------------------------------------------------- */

TEST(token_mask_matches_brute_force) {
    di_tokenizer *tok = NULL;
    if (di_tokenizer_load(DS_DIR, &tok) != DI_OK) {
        SKIP("no DeepSeek-V3 tokenizer under " DS_DIR);
        return;
    }
    size_t len;
    char *text = read_all(GRAMMARS "/llama.cpp/json.gbnf", &len);
    if (!text) {
        di_tokenizer_free(tok);
        SKIP("no json.gbnf");
        return;
    }
    di_grammar *g = NULL;
    CHECK(di_grammar_from_gbnf(text, len, &g) == DI_OK);
    di_free(text);
    const int32_t vocab = di_tokenizer_vocab_size(tok), eos = di_tokenizer_eos_id(tok);
    di_vocab_trie *t = NULL;
    CHECK(di_vocab_trie_build(tok, vocab, &t) == DI_OK);
    const int64_t words = (vocab + 31) / 32;
    uint32_t *mask = calloc((size_t)words, sizeof *mask);
    /* prefixes that leave the matcher in different places: the start, after an open brace,
     * inside a string, inside a number, after a complete document */
    const char *prefixes[] = {"", "{", "{\"ke", "{\"k\": 12", "{\"k\": [true, \"\xc3", "{}"};
    for (size_t p = 0; g && t && p < sizeof prefixes / sizeof *prefixes; p++) {
        di_matcher *m = NULL;
        CHECK(di_matcher_create(g, &m) == DI_OK);
        if (!m) break;
        CHECK(di_matcher_accept(m, prefixes[p], strlen(prefixes[p])));
        CHECK(di_matcher_mask(m, t, eos, mask, vocab) == DI_OK);
        int64_t allowed = 0, differ = 0;
        for (int32_t id = 0; id < vocab; id++) {
            bool in_mask = mask[id >> 5] >> (id & 31) & 1u;
            bool want;
            if (id == eos) {
                want = di_matcher_can_end(m);
            } else if (di_tokenizer_is_special(tok, id) || !di_tokenizer_id_to_token(tok, id)) {
                want = false;
            } else {
                size_t bl = 0;
                const char *bytes = di_tokenizer_id_bytes(tok, id, &bl);
                di_matcher *c = NULL;
                CHECK(di_matcher_clone(m, &c) == DI_OK);
                want = bytes && bl > 0 && c && di_matcher_accept(c, bytes, bl);
                di_matcher_free(c);
            }
            allowed += in_mask;
            if (in_mask != want && differ++ < 5)
                printf("  prefix \"%s\": token %d mask %d, bytes accepted %d\n", prefixes[p], id,
                       in_mask, want);
        }
        CHECK_MSG(differ == 0, "prefix \"%s\": %lld tokens differ", prefixes[p], (long long)differ);
        printf("  prefix \"%s\": %lld of %d tokens allowed\n", prefixes[p], (long long)allowed,
               vocab);
        CHECK(allowed > 0);
        /* the same mask again comes from the cache: equal */
        uint32_t *again = calloc((size_t)words, sizeof *again);
        CHECK(di_matcher_mask(m, t, eos, again, vocab) == DI_OK);
        CHECK(memcmp(mask, again, (size_t)words * sizeof *mask) == 0);
        free(again);
        di_matcher_free(m);
    }
    free(mask);
    di_vocab_trie_free(t);
    di_grammar_free(g);
    di_tokenizer_free(tok);
}

TEST(done_and_end) {
    di_grammar *g = compile("root ::= \"yes\" | \"no\" | \"yes!\"\n");
    CHECK(g != NULL);
    if (!g) return;
    di_matcher *m = NULL;
    CHECK(di_matcher_create(g, &m) == DI_OK);
    CHECK(!di_matcher_can_end(m) && !di_matcher_done(m));
    CHECK(!di_matcher_accept(m, "yep", 3)); /* rejected: the state is unchanged */
    CHECK(di_matcher_accept(m, "yes", 3));
    CHECK(di_matcher_can_end(m) && !di_matcher_done(m)); /* "!" may still follow */
    CHECK(di_matcher_accept(m, "!", 1));
    CHECK(di_matcher_done(m));
    CHECK(!di_matcher_accept(m, "!", 1));
    di_matcher_free(m);
    di_grammar_free(g);
}

int main(void) {
    RUN(shared_grammars_compile);
    RUN(literals_classes_repetition);
    RUN(utf8_classes);
    RUN(errors_name_the_place);
    RUN(json_grammar_agrees_with_jansson);
    RUN(token_mask_matches_brute_force);
    RUN(done_and_end);
    return test_summary();
}
