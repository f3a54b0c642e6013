/*
 * test_json_schema.c -- JSON Schema and regex constraints (src/constrain/json_schema.c,
 * regex_gbnf.c) against public conformance data, judged by the grammar matcher.
 *
 * References:
 *   - JSON-Schema-Test-Suite (draft 2020-12): for the keywords the converter enforces, every
 *     instance the suite marks valid must be accepted (a constraint must never block a valid
 *     output), and the ones marked invalid are counted as rejected or not (keywords that only
 *     narrow values are documented as not enforced).
 *   - JSONSchemaBench (maskbench sample): real-world schemas with valid and invalid
 *     instances; how many schemas convert, and that every valid instance of a converted
 *     schema is accepted.
 *   - rust-regex-testdata (via conformance/regex): full matches of simple patterns.
 * Instances are written compactly with their object keys in the schema's property order
 * (the order the grammar generates; see json_schema.c).
 *
 * Data: $DI_SHARED_DIR/conformance; tests SKIP when absent.
 */
#include "constrain/gbnf_text.h"
#include "constrain/grammar.h"
#include "constrain/matcher.h"
#include "core/core.h"
#include "test.h"

#include <dirent.h>
#include <jansson.h>

#define CONF DI_SHARED_DIR "/conformance"

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static di_grammar *schema_grammar(const json_t *schema) {
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    char *gbnf = NULL;
    di_grammar *g = NULL;
    if (text && di_json_schema_to_gbnf(text, strlen(text), &gbnf) == DI_OK) {
        if (di_grammar_from_gbnf(gbnf, strlen(gbnf), &g) != DI_OK) {
            printf("  generated GBNF does not compile: %s\n", di_last_error());
            g = NULL;
        }
    }
    free(text);
    di_free(gbnf);
    return g;
}

static bool accepts(const di_grammar *g, const char *s, size_t n) {
    di_matcher *m = NULL;
    if (di_matcher_create(g, &m) != DI_OK) return false;
    size_t i = 0;
    while (i < n && di_matcher_accept(m, s + i, 1))
        i++;
    bool ok = i == n && di_matcher_can_end(m);
    if (!ok && getenv("DI_TEST_VERBOSE")) /* where it stopped, for diagnosis */
        printf("    stops at byte %zu: ...%.40s\n", i, s + (i > 30 ? i - 30 : 0));
    di_matcher_free(m);
    return ok;
}

/* Resolves a "#/..." reference (JSON pointer with ~0 ~1 and %XX escapes) in root. */
static const json_t *resolve(const json_t *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *cur = root;
    const char *p = ref + 1;
    while (*p == '/' && cur) {
        p++;
        char key[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof key) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1'))
                key[k++] = p[1] == '0' ? '~' : '/', p += 2;
            else if (p[0] == '%' && p[1] && p[2]) {
                char h[3] = {p[1], p[2], 0};
                key[k++] = (char)strtol(h, NULL, 16), p += 3;
            } else
                key[k++] = *p++;
        }
        key[k] = 0;
        cur = json_is_object(cur)  ? json_object_get(cur, key)
              : json_is_array(cur) ? json_array_get(cur, (size_t)atol(key))
                                   : NULL;
    }
    return cur;
}

static const json_t *deref(const json_t *root, const json_t *s) {
    for (int i = 0; i < 20 && json_is_object(s) && json_is_string(json_object_get(s, "$ref")); i++)
        s = resolve(root, json_string_value(json_object_get(s, "$ref")));
    return s;
}

/* The property schemas of s in the converter's order: its own, then allOf parts' new ones. */
static void props_of(const json_t *root, const json_t *s, json_t *out, int depth) {
    s = deref(root, s);
    if (!json_is_object(s) || depth > 20) return;
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(s, "properties"), k, v) {
        if (!json_object_get(out, k)) json_object_set(out, k, v);
    }
    size_t i;
    json_array_foreach(json_object_get(s, "allOf"), i, v) props_of(root, v, out, depth + 1);
}

/* For an instance x under schema s: the anyOf / oneOf alternative the grammar would take (for
 * objects, the one naming most of x's keys; else the first whose type fits). */
static const json_t *pick_alt(const json_t *root, const json_t *s, const json_t *x) {
    const json_t *alts = json_object_get(s, "anyOf");
    if (!alts) alts = json_object_get(s, "oneOf");
    if (!json_is_array(alts)) return NULL;
    const json_t *best = NULL;
    int best_score = -1;
    size_t i;
    json_t *a;
    json_array_foreach(alts, i, a) {
        const json_t *d = deref(root, a);
        if (!json_is_object(d)) continue;
        int score = 0;
        const char *t = json_string_value(json_object_get(d, "type"));
        if (json_is_object(x)) {
            json_t *props = json_object();
            props_of(root, d, props, 0);
            const char *k;
            json_t *v;
            json_object_foreach((json_t *)x, k, v) score += json_object_get(props, k) != NULL;
            json_decref(props);
            if (t && strcmp(t, "object")) score = -1;
        } else if (json_is_array(x)) {
            score = t && !strcmp(t, "array") ? 1 : 0;
        }
        if (score > best_score) best = d, best_score = score;
    }
    return best;
}

/* A copy of x with every object's keys in the order the grammar of schema s writes them. */
static json_t *reorder(const json_t *root, const json_t *s, const json_t *x, int depth) {
    s = deref(root, s);
    if (depth > 60 || !json_is_object(s)) return json_deep_copy(x);
    const json_t *alt = pick_alt(root, s, x);
    /* anyOf beside properties: the converter merges each alternative into the node */
    if (alt && !json_object_get(s, "properties")) return reorder(root, alt, x, depth + 1);
    if (json_is_array(x)) {
        const json_t *pre = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
        if (json_is_array(items)) pre = items, items = NULL;
        json_t *a = json_array();
        size_t i;
        json_t *v;
        json_array_foreach((json_t *)x, i, v) {
            const json_t *sub =
                json_is_array(pre) && i < json_array_size(pre) ? json_array_get(pre, i) : items;
            json_array_append_new(a, reorder(root, sub, v, depth + 1));
        }
        return a;
    }
    if (!json_is_object(x)) return json_deep_copy(x);
    json_t *props = json_object();
    props_of(root, s, props, 0);
    if (alt) props_of(root, alt, props, 0);
    json_t *o = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) { /* the schema's keys first, in its order */
        const json_t *xv = json_object_get(x, k);
        if (xv) json_object_set_new(o, k, reorder(root, v, xv, depth + 1));
    }
    const json_t *addl = json_object_get(s, "additionalProperties");
    json_object_foreach((json_t *)x, k, v) { /* then the others, in their own order */
        if (!json_object_get(props, k))
            json_object_set_new(o, k, reorder(root, addl, v, depth + 1));
    }
    json_decref(props);
    return o;
}

static char *instance_text(const json_t *schema, const json_t *data) {
    json_t *r = reorder(schema, schema, data, 0);
    char *text = json_dumps(r, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    json_decref(r);
    return text;
}

/* ---------------------------------------------------------------------------------------- */

TEST(hand_checked_schemas) {
    const char *schema =
        "{\"type\": \"object\", \"properties\": {"
        "\"name\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 5},"
        "\"age\": {\"type\": \"integer\"},"
        "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a\", \"b\"]}, \"maxItems\": 2},"
        "\"when\": {\"type\": \"string\", \"format\": \"date\"},"
        "\"id\": {\"type\": \"string\", \"pattern\": \"^[A-Z]{2}-\\\\d+$\"},"
        "\"kid\": {\"$ref\": \"#\"}},"
        "\"required\": [\"name\"], \"additionalProperties\": false}";
    char *gbnf = NULL;
    CHECK(di_json_schema_to_gbnf(schema, strlen(schema), &gbnf) == DI_OK);
    di_grammar *g = NULL;
    CHECK(gbnf && di_grammar_from_gbnf(gbnf, strlen(gbnf), &g) == DI_OK);
    if (!g) {
        printf("%s\n%s\n", gbnf ? gbnf : "", di_last_error());
        di_free(gbnf);
        return;
    }
    const char *good[] = {"{\"name\":\"Ann\"}", "{ \"name\": \"Bo\", \"age\": -3 }",
                          "{\"name\":\"x\",\"tags\":[\"a\",\"b\"],\"when\":\"2024-02-29\"}",
                          "{\"name\":\"x\",\"id\":\"AB-12\",\"kid\":{\"name\":\"y\"}}"};
    const char *bad[] = {"{}",
                         "{\"name\":\"\"}",
                         "{\"name\":\"toolong\"}",
                         "{\"age\":1,\"name\":\"x\"}", /* not the schema's order */
                         "{\"name\":\"x\",\"extra\":1}",
                         "{\"name\":\"x\",\"age\":1.5}",
                         "{\"name\":\"x\",\"tags\":[\"a\",\"b\",\"a\"]}",
                         "{\"name\":\"x\",\"tags\":[\"c\"]}",
                         "{\"name\":\"x\",\"when\":\"2024-13-01\"}",
                         "{\"name\":\"x\",\"id\":\"ab-12\"}",
                         "{\"name\":\"x\",\"kid\":{}}"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        CHECK_MSG(accepts(g, good[i], strlen(good[i])), "rejects %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(!accepts(g, bad[i], strlen(bad[i])), "accepts %s", bad[i]);
    di_grammar_free(g);
    di_free(gbnf);

    /* errors name the place */
    const char *bad_ref =
        "{\"type\": \"object\", \"properties\": {\"a\": {\"$ref\": \"#/$defs/x\"}}}";
    CHECK(di_json_schema_to_gbnf(bad_ref, strlen(bad_ref), &gbnf) == DI_ERR_INVALID_ARG);
    CHECK_MSG(strstr(di_last_error(), "/properties/a: a $ref that points nowhere"), "%s",
              di_last_error());
    CHECK(di_json_schema_to_gbnf("{\"type\": \"strin\"}", 17, &gbnf) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "unknown type"));
    CHECK(di_json_schema_to_gbnf("{\"type\": ", 9, &gbnf) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "not JSON"));
}

TEST(regex_full_match) {
    struct {
        const char *re, *yes[3], *no[3];
    } cases[] = {
        {"[a-c]+\\d{2}", {"ab12", "c00", "abcabc99"}, {"ab1", "d12", "ab123"}},
        {"(foo|bar)?baz", {"baz", "foobaz", "barbaz"}, {"fooba", "foobarbaz", ""}},
        {"\\w+@\\w+\\.(com|org)",
         {"a@b.com", "x_1@y2.org", "A@B.org"},
         {"a@b.net", "@b.com", "a@.com"}},
        {"[^0-9\\s]{1,3}", {"a", "xyz", "\xc3\xa9\xc3\xa9"}, {"a1", "abcd", "a b"}},
        {"a.c",
         {"abc",
          "a\xe2\x82\xac"
          "c",
          "a c"},
         {"a\nc", "ac", "abbc"}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char *gbnf = NULL;
        di_grammar *g = NULL;
        CHECK_MSG(di_regex_to_gbnf(cases[k].re, strlen(cases[k].re), &gbnf) == DI_OK, "%s: %s",
                  cases[k].re, di_last_error());
        CHECK_MSG(gbnf && di_grammar_from_gbnf(gbnf, strlen(gbnf), &g) == DI_OK, "%s -> %s: %s",
                  cases[k].re, gbnf ? gbnf : "", di_last_error());
        for (int i = 0; g && i < 3; i++) {
            CHECK_MSG(accepts(g, cases[k].yes[i], strlen(cases[k].yes[i])), "%s rejects %s",
                      cases[k].re, cases[k].yes[i]);
            CHECK_MSG(!accepts(g, cases[k].no[i], strlen(cases[k].no[i])), "%s accepts %s",
                      cases[k].re, cases[k].no[i]);
        }
        di_grammar_free(g);
        di_free(gbnf);
    }
    char *gbnf = NULL;
    CHECK(di_regex_to_gbnf("(a)\\1", 5, &gbnf) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "offset 5: back references"));
    CHECK(di_regex_to_gbnf("a(?=b)", 6, &gbnf) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "look-around"));
    CHECK(di_regex_to_gbnf("(ab", 3, &gbnf) == DI_ERR_INVALID_ARG);
}

/* The suite's files for keywords the grammar enforces. */
static const char *k_enforced[] = {"type",     "properties",    "required",  "additionalProperties",
                                   "enum",     "const",         "items",     "prefixItems",
                                   "minItems", "maxItems",      "minLength", "maxLength",
                                   "anyOf",    "allOf",         "defs",      "ref",
                                   "pattern",  "boolean_schema"};

/* How a schema's instances fared. */
typedef struct {
    int valid, valid_ok, invalid, invalid_rej;
} tally;

/* Runs a schema's test instances ({"description", "data", "valid"}) through its grammar:
 * every valid one must be accepted; the invalid ones are counted. skip_int_reals leaves out
 * reals without a fraction: integers are written as 1, not 1.0 (what JSON parsers read as
 * integers), although JSON Schema counts 1.0 as one. */
static void run_instances(const di_grammar *g, const json_t *schema, const json_t *tests,
                          bool skip_int_reals, const char *where, tally *c) {
    size_t t;
    json_t *tc;
    json_array_foreach((json_t *)tests, t, tc) {
        const json_t *d = json_object_get(tc, "data");
        if (skip_int_reals && json_is_real(d) &&
            json_real_value(d) == (double)(long long)json_real_value(d))
            continue;
        char *text = instance_text(schema, d);
        bool ok = text && accepts(g, text, strlen(text));
        if (json_is_true(json_object_get(tc, "valid"))) {
            c->valid++, c->valid_ok += ok;
            CHECK_MSG(ok, "%s / \"%s\": rejects a valid instance: %.300s", where,
                      json_string_value(json_object_get(tc, "description")), text);
        } else {
            c->invalid++, c->invalid_rej += !ok;
        }
        free(text);
    }
}

TEST(json_schema_test_suite) {
    const char *dir = CONF "/json-schema-test-suite/tests/draft2020-12";
    int files = 0, groups = 0, converted = 0;
    tally c = {0};
    for (size_t f = 0; f < sizeof k_enforced / sizeof *k_enforced; f++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s.json", dir, k_enforced[f]);
        json_error_t err;
        json_t *doc = json_load_file(path, 0, &err);
        if (!doc) continue;
        files++;
        size_t i;
        json_t *grp;
        json_array_foreach(doc, i, grp) {
            groups++;
            const json_t *schema = json_object_get(grp, "schema");
            char where[300];
            snprintf(where, sizeof where, "%s: \"%s\"", k_enforced[f],
                     json_string_value(json_object_get(grp, "description")));
            di_grammar *g = schema_grammar(schema);
            if (!g) {
                if (getenv("DI_TEST_VERBOSE"))
                    printf("  not converted: %s: %s\n", where, di_last_error());
                continue;
            }
            converted++;
            run_instances(g, schema, json_object_get(grp, "tests"), !strcmp(k_enforced[f], "type"),
                          where, &c);
            di_grammar_free(g);
        }
        json_decref(doc);
    }
    if (files == 0) SKIP("no JSON-Schema-Test-Suite under " CONF);
    printf("  %d files, %d of %d schemas converted; valid instances accepted %d / %d, invalid "
           "rejected %d / %d\n",
           files, converted, groups, c.valid_ok, c.valid, c.invalid_rej, c.invalid);
}

TEST(jsonschemabench) {
    const char *dir = CONF "/schemas/jsonschemabench-maskbench";
    DIR *d = opendir(dir);
    if (!d) SKIP("no JSONSchemaBench sample under " CONF);
    int files = 0, converted = 0;
    tally c = {0};
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".json")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        json_error_t err;
        json_t *doc = json_load_file(path, 0, &err);
        if (!doc) continue;
        files++;
        const json_t *schema = json_object_get(doc, "schema");
        di_grammar *g = schema_grammar(schema);
        if (g) {
            converted++;
            run_instances(g, schema, json_object_get(doc, "tests"), false, e->d_name, &c);
            di_grammar_free(g);
        } else if (getenv("DI_TEST_VERBOSE")) {
            printf("  not converted: %s: %s\n", e->d_name, di_last_error());
        }
        json_decref(doc);
    }
    closedir(d);
    printf("  %d of %d schemas converted; valid instances accepted %d / %d, invalid rejected "
           "%d / %d\n",
           converted, files, c.valid_ok, c.valid, c.invalid_rej, c.invalid);
    CHECK(files > 0 && converted > 0);
}

int main(void) {
    RUN(hand_checked_schemas);
    RUN(regex_full_match);
    RUN(json_schema_test_suite);
    RUN(jsonschemabench);
    return test_summary();
}
