/*
 * test_constrained.c -- constrained generation through the engine, on the bundled trained
 * model (models/deepseek-v4-tiny, CPU): what comes out follows the grammar.
 *
 * References: the grammar matcher run over the output text from the start (an independent
 * pass over the whole text, not the token-by-token state the engine kept), and jansson for
 * outputs of llama.cpp's json.gbnf that finished. Also: a grammar with a single possible
 * answer under greedy decoding, a bad grammar's error, and batch invariance with a grammar
 * (the same tokens alone and beside other requests). With a CUDA device, everything again
 * with the model on the GPU (constrained rows are sampled on the host from downloaded logits).
 */
#include "backend/backend.h"
#include "constrain/grammar.h"
#include "constrain/matcher.h"
#include "core/core.h"
#include "engine_util.h"

#include <jansson.h>

#define MODEL_DIR DI_SOURCE_DIR "/models/deepseek-v4-tiny"
#define JSON_GBNF DI_SHARED_DIR "/grammars/llama.cpp/json.gbnf"

static di_model *model;

static bool text_follows(const char *grammar, const char *text, int64_t n, bool *complete) {
    di_grammar *g = NULL;
    di_matcher *m = NULL;
    bool ok = di_grammar_from_gbnf(grammar, strlen(grammar), &g) == DI_OK &&
              di_matcher_create(g, &m) == DI_OK && di_matcher_accept(m, text, (size_t)n);
    *complete = ok && di_matcher_can_end(m);
    di_matcher_free(m);
    di_grammar_free(g);
    return ok;
}

static di_engine_params params(void) {
    di_engine_params ep = di_engine_default_params();
    ep.max_model_len = 512;
    ep.max_running = 8;
    ep.n_threads = 2;
    return ep;
}

TEST(json_grammar_sampled) {
    char *grammar = NULL;
    size_t len;
    if (di_read_file(JSON_GBNF, &grammar, &len) != DI_OK) SKIP("no " JSON_GBNF);
    const char *prompts[] = {"The configuration file says",
                             "Return the data as JSON:", "deb http://deb.debian.org/debian"};
    eu_result res[3][2];
    eu_req reqs[3];
    memset(res, 0, sizeof res);
    for (int i = 0; i < 3; i++) {
        di_sampling_params sp = di_sampling_default_params();
        sp.temperature = 0.9f;
        sp.top_p = 0.95f;
        sp.seed = 100 + i;
        sp.max_tokens = 160;
        sp.n = 2;
        sp.grammar = grammar;
        reqs[i] =
            (eu_req){.text = prompts[i], .sp = sp, .arrive = 0, .abort_at = -1, .res = res[i]};
    }
    di_engine_params ep = params();
    CHECK(eu_run_fresh(model, &ep, reqs, 3));
    int finished_json = 0;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) {
            eu_result *r = &res[i][k];
            bool complete;
            CHECK(r->finished && r->n > 0);
            CHECK_MSG(text_follows(grammar, r->text, r->text_len, &complete),
                      "output %d.%d does not follow json.gbnf: %.*s", i, k, (int)r->text_len,
                      r->text);
            if (r->reason == DI_ENGINE_FINISH_STOP) {
                CHECK_MSG(complete, "stopped before the grammar's end: %.*s", (int)r->text_len,
                          r->text);
                json_error_t err;
                json_t *j = json_loadb(r->text, (size_t)r->text_len, 0, &err);
                CHECK_MSG(j && json_is_object(j), "not a JSON object: %.*s (%s)", (int)r->text_len,
                          r->text, err.text);
                json_decref(j);
                finished_json++;
            } else {
                CHECK(r->reason == DI_ENGINE_FINISH_LENGTH);
            }
            printf("  %s %.*s\n", di_engine_finish_str(r->reason),
                   (int)(r->text_len > 100 ? 100 : r->text_len), r->text);
        }
    printf("  %d of 6 outputs finished as complete JSON objects\n", finished_json);
    di_free(grammar);
}

TEST(json_schema_and_regex) {
    /* a schema with required keys, an enum, a bounded array and a pattern: every finished
     * output parses (jansson) and has them, in the schema's order */
    const char *schema = "{\"type\": \"object\", \"properties\": {"
                         "\"name\": {\"type\": \"string\", \"maxLength\": 10},"
                         "\"arch\": {\"enum\": [\"amd64\", \"arm64\", \"riscv64\"]},"
                         "\"deps\": {\"type\": \"array\", \"items\": {\"type\": \"string\", "
                         "\"pattern\": \"^[a-z]+$\"}, "
                         "\"maxItems\": 2}}, \"required\": [\"name\", \"arch\", \"deps\"], "
                         "\"additionalProperties\": false}";
    eu_result res[4][1];
    eu_req reqs[4];
    memset(res, 0, sizeof res);
    for (int i = 0; i < 4; i++) {
        di_sampling_params sp = di_sampling_default_params();
        sp.temperature = 0.6f;
        sp.seed = 11 + i;
        sp.max_tokens = 200;
        if (i < 3)
            sp.json_schema = schema;
        else
            sp.regex = "[0-9]{1,2}\\.[0-9]{1,2}-[0-9]";
        reqs[i] = (eu_req){.text = i == 3 ? "Version " : "Package:",
                           .sp = sp,
                           .arrive = 0,
                           .abort_at = -1,
                           .res = res[i]};
    }
    di_engine_params ep = params();
    CHECK(eu_run_fresh(model, &ep, reqs, 4));
    for (int i = 0; i < 3; i++) {
        eu_result *r = &res[i][0];
        printf("  %s %.*s\n", di_engine_finish_str(r->reason), (int)r->text_len, r->text);
        if (r->reason != DI_ENGINE_FINISH_STOP) continue; /* a long name may run out of tokens */
        json_error_t err;
        json_t *j = json_loadb(r->text, (size_t)r->text_len, 0, &err);
        CHECK_MSG(j && json_is_object(j), "not JSON: %.*s", (int)r->text_len, r->text);
        if (!j) continue;
        const char *arch = json_string_value(json_object_get(j, "arch"));
        const json_t *deps = json_object_get(j, "deps");
        CHECK(json_object_size(j) == 3 && json_is_string(json_object_get(j, "name")));
        CHECK(strlen(json_string_value(json_object_get(j, "name"))) <= 10);
        CHECK(arch &&
              (!strcmp(arch, "amd64") || !strcmp(arch, "arm64") || !strcmp(arch, "riscv64")));
        CHECK(json_is_array(deps) && json_array_size(deps) <= 2);
        for (size_t k = 0; json_is_array(deps) && k < json_array_size(deps); k++) {
            const char *d = json_string_value(json_array_get(deps, k));
            CHECK(d && *d && strspn(d, "abcdefghijklmnopqrstuvwxyz") == strlen(d));
        }
        const char *keys[3] = {"name", "arch", "deps"};
        size_t k = 0;
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) CHECK(k < 3 && !strcmp(key, keys[k++]));
        json_decref(j);
    }
    eu_result *r = &res[3][0];
    printf("  %s %.*s\n", di_engine_finish_str(r->reason), (int)r->text_len, r->text);
    CHECK(r->reason == DI_ENGINE_FINISH_STOP);
    int a, b, c, n = 0;
    char tail;
    CHECK(sscanf(r->text, "%d.%d-%d%n%c", &a, &b, &c, &n, &tail) == 3 && n == r->text_len);
}

TEST(single_answer_greedy) {
    /* two possible answers; greedy decoding picks one, and the request ends right there */
    const char *grammar = "root ::= (\"yes\" | \"no\") \".\"\n";
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = 0.0f;
    sp.max_tokens = 50;
    sp.grammar = grammar;
    eu_result res[1];
    memset(res, 0, sizeof res);
    eu_req rq = {
        .text = "Is the sky blue? Answer:", .sp = sp, .arrive = 0, .abort_at = -1, .res = res};
    di_engine_params ep = params();
    CHECK(eu_run_fresh(model, &ep, &rq, 1));
    CHECK(res[0].reason == DI_ENGINE_FINISH_STOP);
    CHECK_MSG((res[0].text_len == 4 && memcmp(res[0].text, "yes.", 4) == 0) ||
                  (res[0].text_len == 3 && memcmp(res[0].text, "no.", 3) == 0),
              "got \"%.*s\"", (int)res[0].text_len, res[0].text);
}

TEST(bad_grammar_is_refused) {
    di_engine *e = NULL;
    di_engine_params ep = params();
    CHECK(di_engine_create(model, &ep, &e) == DI_OK);
    if (!e) return;
    di_sampling_params sp = di_sampling_default_params();
    sp.grammar = "root ::= item\n";
    di_engine_request rq = {.prompt_text = "hello", .sampling = &sp, .id = 7};
    CHECK(di_engine_add_request(e, &rq) == DI_ERR_INVALID_ARG);
    CHECK_MSG(strstr(di_last_error(), "request 7: grammar: line 1:10: undefined rule \"item\""),
              "%s", di_last_error());
    sp.grammar = "root ::= \"a\" \"b\n";
    CHECK(di_engine_add_request(e, &rq) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "unterminated string literal"));
    sp.grammar = NULL;
    sp.json_schema = "{\"type\": \"object\", \"properties\": {\"a\": {\"$ref\": \"#/nope\"}}}";
    CHECK(di_engine_add_request(e, &rq) == DI_ERR_INVALID_ARG);
    CHECK_MSG(strstr(di_last_error(),
                     "request 7: json_schema: /properties/a: a $ref that points nowhere"),
              "%s", di_last_error());
    sp.json_schema = NULL;
    sp.regex = "a(?=b)";
    CHECK(di_engine_add_request(e, &rq) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "request 7: regex: offset 2: look-around"));
    sp.grammar = "root ::= \"x\"\n";
    CHECK(di_engine_add_request(e, &rq) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "at most one of grammar, json_schema and regex"));
    CHECK(!di_engine_has_unfinished(e));
    di_engine_free(e);
}

TEST(batch_invariant_with_grammar) {
    /* a word list: the same request alone, then beside three others, gives the same tokens */
    const char *grammar = "root ::= word (\", \" word){2,6} \".\"\nword ::= [a-z]{1,12}\n";
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = 0.8f;
    sp.seed = 5;
    sp.max_tokens = 60;
    sp.grammar = grammar;
    eu_result alone[1], mixed[4][1];
    memset(alone, 0, sizeof alone);
    memset(mixed, 0, sizeof mixed);
    eu_req a = {.text = "A list of packages:", .sp = sp, .arrive = 0, .abort_at = -1, .res = alone};
    di_engine_params ep = params();
    CHECK(eu_run_fresh(model, &ep, &a, 1));
    eu_req many[4];
    const char *others[] = {"Debian is", "apt-get install", "The kernel"};
    many[0] = a;
    many[0].res = mixed[0];
    for (int i = 1; i < 4; i++) {
        di_sampling_params so = di_sampling_default_params();
        so.temperature = 0.7f;
        so.seed = 50 + i;
        so.max_tokens = 40;
        if (i == 2) so.grammar = grammar;
        many[i] = (eu_req){
            .text = others[i - 1], .sp = so, .arrive = i - 1, .abort_at = -1, .res = mixed[i]};
    }
    CHECK(eu_run_fresh(model, &ep, many, 4));
    CHECK(alone[0].n == mixed[0][0].n);
    CHECK(memcmp(alone[0].tokens, mixed[0][0].tokens, (size_t)alone[0].n * sizeof(int32_t)) == 0);
    bool complete;
    CHECK(text_follows(grammar, alone[0].text, alone[0].text_len, &complete));
    CHECK(text_follows(grammar, mixed[2][0].text, mixed[2][0].text_len, &complete));
    printf("  %s: %.*s\n", di_engine_finish_str(alone[0].reason), (int)alone[0].text_len,
           alone[0].text);
}

static bool load(const char *device) {
    di_model_params mp = di_model_default_params();
    mp.n_threads = 2;
    mp.device = device;
    if (di_model_load(MODEL_DIR, &mp, &model) != DI_OK) {
        printf("cannot load %s on %s: %s\n", MODEL_DIR, device, di_last_error());
        return false;
    }
    return true;
}

/* The same tests with the model on the GPU (each a check of this one). */
TEST(all_on_cuda) {
    di_backend be;
    if (di_backend_cuda_init(&be, 0, 16) != DI_OK) SKIP("%s", di_last_error());
    di_backend_free(&be);
    if (!load("cuda")) {
        CHECK(false);
        return;
    }
    test_json_grammar_sampled();
    test_cur_skipped = 0; /* a skip of that one (no json.gbnf) must not hide the others */
    test_json_schema_and_regex();
    test_single_answer_greedy();
    test_bad_grammar_is_refused();
    test_batch_invariant_with_grammar();
    di_model_free(model);
    model = NULL;
}

int main(void) {
    if (!load("cpu")) return 1;
    RUN(json_grammar_sampled);
    RUN(json_schema_and_regex);
    RUN(single_answer_greedy);
    RUN(bad_grammar_is_refused);
    RUN(batch_invariant_with_grammar);
    di_model_free(model);
    model = NULL;
    RUN(all_on_cuda);
    return test_summary();
}
