/*
 * test_chat_template.c -- chat templates against transformers' renderings, plus the error
 * paths and hostile templates the interpreter must survive.
 *
 * The goldens (tests/data/chat/goldens.json, from tools/make_chat_goldens.py) hold, per case,
 * the template (a DeepSeek one from the shared tokenizer folder, or inline text), the
 * messages / tools / extra variables, and either the exact expected text or "error".
 * Every case must match byte for byte, or fail when transformers failed.
 */
#include "deepinfer.h"
#include "test.h"

#include <jansson.h>

#define GOLDENS    DI_SOURCE_DIR "/tests/data/chat/goldens.json"
#define SHARED_TOK DI_SHARED_DIR "/tokenizers/deepseek-v3"

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

static char *shared_path(const char *rel) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", DI_SHARED_DIR, rel);
    return buf[k];
}

/* Loads the template a golden case names (NULL with a message on failure). */
static di_chat_template *load_case_template(const json_t *doc, const json_t *c) {
    const char *name = json_string_value(json_object_get(c, "template"));
    di_chat_template *t = NULL;
    di_status st;
    if (!strcmp(name, "inline")) {
        const char *specials = json_string_value(json_object_get(doc, "specials_of_inline"));
        st = di_chat_template_from_text(json_string_value(json_object_get(c, "text")),
                                        shared_path(specials), &t);
    } else {
        const json_t *spec = json_object_get(json_object_get(doc, "templates"), name);
        const char *cfg = json_string_value(json_object_get(spec, "config"));
        if (cfg) {
            st = di_chat_template_load(shared_path(cfg), &t);
        } else {
            char *text = read_text(shared_path(json_string_value(json_object_get(spec, "jinja"))));
            const char *sp = json_string_value(json_object_get(spec, "specials"));
            st = text ? di_chat_template_from_text(text, shared_path(sp), &t) : DI_ERR_IO;
            free(text);
        }
    }
    if (st != DI_OK && strcmp(name, "inline") != 0)
        printf("  cannot load template %s: %s\n", name, di_last_error());
    return st == DI_OK ? t : NULL;
}

static char *dump(const json_t *j) {
    return j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
}

/* Renders one case; returns 1 if it agrees with the golden. */
static int check_case(const json_t *doc, const json_t *c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *tname = json_string_value(json_object_get(c, "template"));
    const json_t *expected = json_object_get(c, "expected");
    di_chat_template *t = load_case_template(doc, c);
    char *out = NULL;
    di_status st = DI_ERR_FORMAT; /* a template that does not parse is a failure */
    if (t) {
        char *msgs = dump(json_object_get(c, "messages"));
        char *tools = dump(json_object_get(c, "tools"));
        char *extra = dump(json_object_get(c, "extra"));
        di_chat_render_params p = {.messages_json = msgs,
                                   .tools_json = tools,
                                   .extra_json = extra,
                                   .add_generation_prompt =
                                       json_is_true(json_object_get(c, "add_generation_prompt"))};
        st = di_chat_template_render_ex(t, &p, &out);
        free(msgs);
        free(tools);
        free(extra);
        di_chat_template_free(t);
    }
    int ok;
    if (!expected) {
        ok = st != DI_OK;
        if (!ok) printf("  %s %s: expected an error, got \"%s\"\n", tname, name, out);
    } else {
        ok = st == DI_OK && strlen(out) == json_string_length(expected) &&
             !memcmp(out, json_string_value(expected), json_string_length(expected));
        if (!ok && st != DI_OK)
            printf("  %s %s: error %s\n", tname, name, di_last_error());
        else if (!ok)
            printf("  %s %s:\n    got      \"%s\"\n    expected \"%s\"\n", tname, name, out,
                   json_string_value(expected));
    }
    di_free(out);
    return ok;
}

TEST(goldens) {
    json_error_t err;
    json_t *doc = json_load_file(GOLDENS, 0, &err);
    /* The goldens are committed: an unreadable file is a failure, not a skip. */
    CHECK_MSG(doc != NULL, "%s: %s", GOLDENS, err.text);
    if (!doc) return;
    FILE *probe = fopen(SHARED_TOK "/tokenizer_config.json", "rb");
    if (!probe) {
        json_decref(doc);
        SKIP("shared tokenizer folder %s is absent", SHARED_TOK);
    }
    fclose(probe);
    const json_t *cases = json_object_get(doc, "cases");
    size_t n = json_array_size(cases), n_ok = 0, n_err = 0;
    for (size_t i = 0; i < n; i++) {
        n_ok += (size_t)check_case(doc, json_array_get(cases, i));
        n_err += json_object_get(json_array_get(cases, i), "error") != NULL;
    }
    printf("  %zu/%zu golden cases match (%zu of them expected errors)\n", n_ok, n, n_err);
    CHECK(n > 0);
    CHECK_EQ_INT(n_ok, n);
    json_decref(doc);
}

/* ---- error messages and hostile templates ------------------------------------------------- */

static di_status render_text(const char *tmpl_text, char **out) {
    di_chat_template *t = NULL;
    *out = NULL;
    di_status st = di_chat_template_from_text(tmpl_text, NULL, &t);
    if (st != DI_OK) return st;
    st = di_chat_template_render(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", true, NULL, out);
    di_chat_template_free(t);
    return st;
}

static void expect_error(const char *tmpl_text, di_status want, const char *substr) {
    char *out = NULL;
    di_status st = render_text(tmpl_text, &out);
    CHECK_MSG(st == want, "template %.60s: status %s, want %s (%s)", tmpl_text, di_status_str(st),
              di_status_str(want), di_last_error());
    if (substr)
        CHECK_MSG(strstr(di_last_error(), substr) != NULL, "message \"%s\" lacks \"%s\"",
                  di_last_error(), substr);
    di_free(out);
}

TEST(syntax_errors_name_line_and_column) {
    expect_error("ok\n{% if true %}\n{{ 1 + }}", DI_ERR_FORMAT, "line 3:");
    expect_error("{% for x in y %}{% endif %}", DI_ERR_FORMAT, "line 1:");
    expect_error("{{ x | nosuch }}", DI_ERR_FORMAT, "no filter named 'nosuch'");
    expect_error("{% include 'x' %}", DI_ERR_FORMAT, "not supported");
    expect_error("{{ 'unterminated }}", DI_ERR_FORMAT, "unterminated string");
    expect_error("{# never closed", DI_ERR_FORMAT, "#}");
    expect_error("{% continue %}", DI_ERR_FORMAT, "outside of a loop");
}

TEST(runtime_errors_are_clear) {
    expect_error("{{ raise_exception('roles must alternate') }}", DI_ERR_INVALID_ARG,
                 "roles must alternate");
    expect_error("{{ messages[0].nope.deeper }}", DI_ERR_INVALID_ARG, "has no attribute 'nope'");
    expect_error("{{ 'a' + none }}", DI_ERR_INVALID_ARG, "unsupported operand");
    expect_error("{{ 1 // 0 }}", DI_ERR_INVALID_ARG, "by zero");
    expect_error("{{ 9223372036854775807 + 1 }}", DI_ERR_RANGE, "overflow");
}

TEST(hostile_templates_terminate) {
    /* Work bound: 10^5 x 10^5 iterations. */
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                 DI_ERR_RANGE, "steps");
    /* Exponential string growth. */
    expect_error("{% set ns = namespace(s='ab') %}{% for i in range(100) %}"
                 "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 DI_ERR_RANGE, "limit");
    expect_error("{{ 'x' * 10000000000 }}", DI_ERR_RANGE, "limit");
    /* Unbounded recursion. */
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", DI_ERR_RANGE, "macro");
    /* Output size. */
    expect_error("{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}", DI_ERR_RANGE,
                 "limit");
    /* Deep nesting must not exhaust the stack. */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 8);
    size_t k = 0;
    k += (size_t)sprintf(deep, "{{ ");
    for (size_t i = 0; i < depth; i++)
        deep[k++] = '(';
    deep[k++] = '1';
    for (size_t i = 0; i < depth; i++)
        deep[k++] = ')';
    strcpy(deep + k, " }}");
    expect_error(deep, DI_ERR_FORMAT, "nested deeper");
    char *nots = malloc(4 * depth + 16);
    k = (size_t)sprintf(nots, "{{ ");
    for (size_t i = 0; i < depth; i++)
        k += (size_t)sprintf(nots + k, "not ");
    strcpy(nots + k, "1 }}");
    expect_error(nots, DI_ERR_FORMAT, "nested deeper");
    free(nots);
    k = 0;
    for (size_t i = 0; i < 5000; i++)
        k += (size_t)sprintf(deep + k, "{%% if 1 %%}");
    deep[k] = '\0';
    expect_error(deep, DI_ERR_FORMAT, NULL);
    free(deep);
}

TEST(load_paths_and_json_errors) {
    di_chat_template *t = NULL;
    char *out = NULL;
    if (di_chat_template_load(SHARED_TOK, &t) != DI_OK) SKIP("shared tokenizer folder absent");
    CHECK(strstr(di_chat_template_text(t), "ns.system_prompt") != NULL);
    CHECK(di_chat_template_render(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", true, NULL,
                                  &out) == DI_OK);
    CHECK(out && !strcmp(out, "<\xef\xbd\x9c"
                              "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
                              "<\xef\xbd\x9cUser\xef\xbd\x9c>hi<\xef\xbd\x9c"
                              "Assistant\xef\xbd\x9c>"));
    di_free(out);
    out = NULL;
    /* The object form of the messages argument. */
    CHECK(di_chat_template_render(t, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                                  false, NULL, &out) == DI_OK);
    di_free(out);
    out = NULL;
    CHECK(di_chat_template_render(t, "[{\"role\": ", false, NULL, &out) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "messages: invalid JSON") != NULL);
    CHECK(di_chat_template_render(t, "{\"nomessages\": 1}", false, NULL, &out) ==
          DI_ERR_INVALID_ARG);
    CHECK(out == NULL);
    di_chat_template_free(t);
    CHECK(di_chat_template_load(SHARED_TOK "/templates/deepseek-ai-DeepSeek-V3.1.jinja", &t) ==
          DI_OK);
    CHECK(di_chat_template_render(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", false, NULL,
                                  &out) == DI_OK);
    CHECK(out && !strncmp(out, "<\xef\xbd\x9cUser", 6)); /* no bos_token without a config */
    di_free(out);
    di_chat_template_free(t);
    CHECK(di_chat_template_load("/nonexistent/dir/tokenizer_config.json", &t) != DI_OK);
    CHECK(strstr(di_last_error(), "/nonexistent/dir/tokenizer_config.json") != NULL);
}

int main(void) {
    RUN(goldens);
    RUN(syntax_errors_name_line_and_column);
    RUN(runtime_errors_are_clear);
    RUN(hostile_templates_terminate);
    RUN(load_paths_and_json_errors);
    return test_summary();
}
