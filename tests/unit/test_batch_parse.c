/*
 * test_batch_parse.c -- the OpenAI Batch API line parser (src/batch/batch_parse.c): every
 * field reaches di_sampling_params, null means the default, and every kind of bad line gives
 * its error code with a message naming the field (and still the custom_id when it has one).
 */
#include "batch/batch_parse.h"
#include "test.h"

static di_status parse(const char *line, di_batch_request *r, di_batch_error *e) {
    return di_batch_parse_line(line, strlen(line), r, e);
}

/* Parses a line that must fail with code; checks the message contains want. */
static void expect_error(const char *line, const char *code, const char *want) {
    di_batch_request r;
    di_batch_error e;
    di_status st = parse(line, &r, &e);
    CHECK_MSG(st != DI_OK, "accepted: %s", line);
    CHECK_MSG(!strcmp(e.code, code), "code %s, expected %s for %s", e.code, code, line);
    CHECK_MSG(strstr(e.message, want) != NULL, "message \"%s\" lacks \"%s\"", e.message, want);
    di_batch_request_free(&r);
}

#define CL(body)                                                                                   \
    "{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": " body "}"
#define CH(body)                                                                                   \
    "{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", "             \
    "\"body\": " body "}"

TEST(completion_fields) {
    di_batch_request r;
    di_batch_error e;
    const char *line =
        CL("{\"model\": \"m\", \"prompt\": \"hi\", \"max_tokens\": 7, "
           "\"temperature\": 0.5, \"top_p\": 0.9, \"n\": 3, \"stop\": \"END\", "
           "\"seed\": 42, \"logprobs\": 2, \"presence_penalty\": 0.5, "
           "\"frequency_penalty\": -0.5, \"logit_bias\": {\"17\": -100, \"3\": 2.5}, "
           "\"top_k\": 5, \"min_p\": 0.1, \"repetition_penalty\": 1.2, "
           "\"min_tokens\": 2, \"ignore_eos\": true, \"stop_token_ids\": [9, 8], "
           "\"prompt_logprobs\": 1, \"user\": \"u\", \"stream\": false}");
    CHECK_EQ_INT(parse(line, &r, &e), DI_OK);
    CHECK(!strcmp(r.custom_id, "a"));
    CHECK(!strcmp(r.model, "m"));
    CHECK_EQ_INT(r.endpoint, DI_BATCH_COMPLETIONS);
    CHECK_EQ_INT(r.n_prompts, 1);
    CHECK(r.prompts[0].text && !strcmp(r.prompts[0].text, "hi"));
    const di_sampling_params *p = &r.sampling;
    CHECK(r.max_tokens_set);
    CHECK_EQ_INT(p->max_tokens, 7);
    CHECK_NEAR(p->temperature, 0.5, 1e-7);
    CHECK_NEAR(p->top_p, 0.9, 1e-7);
    CHECK_EQ_INT(p->n, 3);
    CHECK_EQ_INT(p->n_stop, 1);
    CHECK(!strcmp(p->stop[0], "END"));
    CHECK_EQ_INT(p->seed, 42);
    CHECK_EQ_INT(p->logprobs, 2);
    CHECK_NEAR(p->presence_penalty, 0.5, 1e-7);
    CHECK_NEAR(p->frequency_penalty, -0.5, 1e-7);
    CHECK_EQ_INT(p->n_logit_bias, 2);
    CHECK_EQ_INT(p->logit_bias[0].id, 17);
    CHECK_NEAR(p->logit_bias[0].bias, -100, 0);
    CHECK_EQ_INT(p->logit_bias[1].id, 3);
    CHECK_EQ_INT(p->top_k, 5);
    CHECK_NEAR(p->min_p, 0.1, 1e-7);
    CHECK_NEAR(p->repetition_penalty, 1.2, 1e-6);
    CHECK_EQ_INT(p->min_tokens, 2);
    CHECK(p->ignore_eos);
    CHECK_EQ_INT(p->n_stop_token_ids, 2);
    CHECK_EQ_INT(p->stop_token_ids[1], 8);
    CHECK_EQ_INT(p->prompt_logprobs, 1);
    di_batch_request_free(&r);
}

TEST(defaults_and_nulls) {
    di_batch_request r;
    di_batch_error e;
    CHECK_EQ_INT(parse(CL("{\"prompt\": \"x\", \"max_tokens\": null, \"temperature\": null, "
                          "\"stop\": null, \"seed\": null, \"logprobs\": null}") "\r",
                       &r, &e),
                 DI_OK);
    di_sampling_params d = di_sampling_default_params();
    CHECK(!r.max_tokens_set);
    CHECK_NEAR(r.sampling.temperature, d.temperature, 0);
    CHECK_EQ_INT(r.sampling.seed, -1);
    CHECK_EQ_INT(r.sampling.logprobs, -1);
    CHECK_EQ_INT(r.sampling.n_stop, 0);
    CHECK(r.model == NULL);
    di_batch_request_free(&r);
}

TEST(prompt_forms) {
    di_batch_request r;
    di_batch_error e;
    CHECK_EQ_INT(parse(CL("{\"prompt\": [3, 17, 42]}"), &r, &e), DI_OK);
    CHECK_EQ_INT(r.n_prompts, 1);
    CHECK_EQ_INT(r.prompts[0].n_ids, 3);
    CHECK_EQ_INT(r.prompts[0].ids[2], 42);
    CHECK(r.prompts[0].text == NULL);
    di_batch_request_free(&r);
    CHECK_EQ_INT(
        parse(CL("{\"prompt\": [\"a\", [1, 2], \"b\"], \"stop\": [\"x\", \"yy\"]}"), &r, &e),
        DI_OK);
    CHECK_EQ_INT(r.n_prompts, 3);
    CHECK(!strcmp(r.prompts[0].text, "a"));
    CHECK_EQ_INT(r.prompts[1].n_ids, 2);
    CHECK(!strcmp(r.prompts[2].text, "b"));
    CHECK_EQ_INT(r.sampling.n_stop, 2);
    di_batch_request_free(&r);
}

TEST(chat_fields) {
    di_batch_request r;
    di_batch_error e;
    CHECK_EQ_INT(parse(CH("{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, "
                          "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
                          "\"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}], \"max_tokens\": 3, "
                          "\"max_completion_tokens\": 5, \"logprobs\": true, \"top_logprobs\": 4, "
                          "\"chat_template_kwargs\": {\"thinking\": true}}"),
                       &r, &e),
                 DI_OK);
    CHECK_EQ_INT(r.endpoint, DI_BATCH_CHAT);
    CHECK_EQ_INT(r.sampling.max_tokens, 5);
    CHECK(r.chat_logprobs);
    CHECK_EQ_INT(r.sampling.logprobs, 4);
    CHECK(strstr(r.messages_json, "\"content\":\"a\\nb\"") != NULL);
    CHECK(r.template_kwargs_json && strstr(r.template_kwargs_json, "thinking"));
    di_batch_request_free(&r);
    CHECK_EQ_INT(parse(CH("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
                          "\"logprobs\": true}"),
                       &r, &e),
                 DI_OK);
    CHECK_EQ_INT(r.sampling.logprobs, 0);
    di_batch_request_free(&r);
}

TEST(envelope_errors) {
    expect_error("not json", "invalid_json_line", "not valid JSON");
    expect_error("[1, 2]", "invalid_json_line", "JSON object");
    expect_error("{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
                 "\"body\": {\"prompt\": \"\xff\"}}",
                 "invalid_utf8", "UTF-8");
    expect_error("{\"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {}}",
                 "missing_required_parameter", "custom_id");
    expect_error("{\"custom_id\": \"a\", \"url\": \"/v1/completions\", \"body\": {}}",
                 "missing_required_parameter", "method");
    expect_error("{\"custom_id\": \"a\", \"method\": \"GET\", \"url\": \"/v1/completions\", "
                 "\"body\": {}}",
                 "invalid_method", "POST");
    expect_error("{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", "
                 "\"body\": {}}",
                 "invalid_url", "url");
    expect_error("{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/completions\"}",
                 "missing_required_parameter", "body");
    expect_error("{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
                 "\"body\": {}, \"extra\": 1}",
                 "unknown_parameter", "extra");
    expect_error("{\"custom_id\": \"a\", \"custom_id\": \"b\"}", "invalid_json_line", "JSON");
}

TEST(body_errors) {
    expect_error(CL("{}"), "missing_required_parameter", "prompt");
    expect_error(CH("{}"), "missing_required_parameter", "messages");
    expect_error(CL("{\"prompt\": \"x\", \"bogus\": 1}"), "unknown_parameter", "\"bogus\"");
    expect_error(CL("{\"prompt\": \"x\", \"messages\": []}"), "unknown_parameter", "messages");
    expect_error(CH("{\"messages\": [{\"role\": \"user\"}], \"prompt\": \"x\"}"),
                 "unknown_parameter", "prompt");
    expect_error(CL("{\"prompt\": \"x\", \"max_tokens\": 0}"), "invalid_parameter", "max_tokens");
    expect_error(CL("{\"prompt\": \"x\", \"max_tokens\": 1.5}"), "invalid_parameter", "integer");
    expect_error(CL("{\"prompt\": \"x\", \"top_p\": 1.5}"), "invalid_parameter", "top_p");
    expect_error(CL("{\"prompt\": \"x\", \"temperature\": -1}"), "invalid_parameter",
                 "temperature");
    expect_error(CL("{\"prompt\": \"x\", \"temperature\": \"hot\"}"), "invalid_parameter",
                 "number");
    expect_error(CL("{\"prompt\": \"x\", \"presence_penalty\": 3}"), "invalid_parameter",
                 "presence_penalty");
    expect_error(CL("{\"prompt\": \"x\", \"n\": 0}"), "invalid_parameter", "body.n");
    expect_error(CL("{\"prompt\": \"x\", \"logprobs\": 21}"), "invalid_parameter", "logprobs");
    expect_error(CL("{\"prompt\": \"x\", \"logprobs\": true}"), "invalid_parameter", "logprobs");
    expect_error(CL("{\"prompt\": \"x\", \"stop\": [\"\"]}"), "invalid_parameter", "stop");
    expect_error(CL("{\"prompt\": \"x\", \"stop\": 5}"), "invalid_parameter", "stop");
    expect_error(CL("{\"prompt\": \"x\", \"logit_bias\": {\"x\": 1}}"), "invalid_parameter",
                 "logit_bias");
    expect_error(CL("{\"prompt\": \"x\", \"logit_bias\": {\"5\": 101}}"), "invalid_parameter",
                 "logit_bias");
    expect_error(CL("{\"prompt\": \"x\", \"stop_token_ids\": [-1]}"), "invalid_parameter",
                 "stop_token_ids");
    expect_error(CL("{\"prompt\": \"x\", \"seed\": -5}"), "invalid_parameter", "seed");
    expect_error(CL("{\"prompt\": \"x\", \"min_tokens\": 9, \"max_tokens\": 3}"),
                 "invalid_parameter", "min_tokens");
    expect_error(CL("{\"prompt\": \"x\", \"stream\": true}"), "invalid_parameter", "stream");
    expect_error(CL("{\"prompt\": []}"), "invalid_prompt", "empty");
    expect_error(CL("{\"prompt\": [1, -2]}"), "invalid_prompt", "prompt[1]");
    expect_error(CL("{\"prompt\": [\"a\", 3]}"), "invalid_parameter", "prompt[1]");
    expect_error(CL("{\"prompt\": 5}"), "invalid_parameter", "prompt");
    expect_error(CH("{\"messages\": []}"), "invalid_parameter", "messages");
    expect_error(CH("{\"messages\": [{\"content\": \"x\"}]}"), "invalid_parameter", "role");
    expect_error(
        CH("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}"),
        "invalid_parameter", "content[0]");
    expect_error(CH("{\"messages\": [{\"role\": \"user\"}], \"top_logprobs\": 2}"),
                 "invalid_parameter", "top_logprobs");
    expect_error(CH("{\"messages\": [{\"role\": \"user\"}], \"max_completion_tokens\": -1}"),
                 "invalid_parameter", "max_tokens");
}

TEST(grammar_fields) {
    di_batch_request r;
    di_batch_error e;
    CHECK(parse(CL("{\"prompt\": \"x\", \"structured_outputs\": {\"grammar\": \"root ::= "
                   "\\\"a\\\"\"}}"),
                &r, &e) == DI_OK);
    CHECK(r.sampling.grammar && !strcmp(r.sampling.grammar, "root ::= \"a\""));
    di_batch_request_free(&r);
    CHECK(parse(CH("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
                   "\"guided_grammar\": \"root ::= [0-9]+\"}"),
                &r, &e) == DI_OK);
    CHECK(r.sampling.grammar && !strcmp(r.sampling.grammar, "root ::= [0-9]+"));
    di_batch_request_free(&r);
    CHECK(parse(CL("{\"prompt\": \"x\", \"structured_outputs\": null}"), &r, &e) == DI_OK);
    CHECK(r.sampling.grammar == NULL);
    di_batch_request_free(&r);
    CHECK(
        parse(
            CL("{\"prompt\": \"x\", \"structured_outputs\": {\"json\": {\"type\": \"integer\"}}}"),
            &r, &e) == DI_OK);
    CHECK(r.sampling.json_schema && !strcmp(r.sampling.json_schema, "{\"type\":\"integer\"}"));
    di_batch_request_free(&r);
    CHECK(parse(CL("{\"prompt\": \"x\", \"guided_choice\": [\"yes\", \"n\\\"o\"]}"), &r, &e) ==
          DI_OK);
    CHECK(r.sampling.grammar && !strcmp(r.sampling.grammar, "root ::= \"yes\" | \"n\\\"o\"\n"));
    di_batch_request_free(&r);
    CHECK(parse(CL("{\"prompt\": \"x\", \"guided_regex\": \"[0-9]+\"}"), &r, &e) == DI_OK);
    CHECK(r.sampling.regex && !strcmp(r.sampling.regex, "[0-9]+"));
    di_batch_request_free(&r);
    CHECK(
        parse(CH("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"response_format\": "
                 "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"schema\": "
                 "{\"type\": \"array\"}}}}"),
              &r, &e) == DI_OK);
    CHECK(r.sampling.json_schema && !strcmp(r.sampling.json_schema, "{\"type\":\"array\"}"));
    di_batch_request_free(&r);
    CHECK(
        parse(CH("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"response_format\": "
                 "{\"type\": \"json_object\"}}"),
              &r, &e) == DI_OK);
    CHECK(r.sampling.json_schema && !strcmp(r.sampling.json_schema, "{\"type\":\"object\"}"));
    di_batch_request_free(&r);
    expect_error(CL("{\"prompt\": \"x\", \"structured_outputs\": {\"structural_tag\": {}}}"),
                 "invalid_parameter", "structured_outputs.structural_tag is not supported");
    expect_error(CL("{\"prompt\": \"x\", \"response_format\": {\"type\": \"xml\"}}"),
                 "invalid_parameter", "response_format.type \"xml\" is not supported");
    expect_error(CL("{\"prompt\": \"x\", \"guided_choice\": []}"), "invalid_parameter",
                 "non-empty list of strings");
    expect_error(CL("{\"prompt\": \"x\", \"guided_grammar\": 3}"), "invalid_parameter",
                 "guided_grammar must be a string");
    expect_error(CL("{\"prompt\": \"x\", \"guided_grammar\": \"a\", "
                    "\"structured_outputs\": {\"grammar\": \"b\"}}"),
                 "invalid_parameter", "only one structured output constraint");
}

TEST(custom_id_kept_on_error) {
    di_batch_request r;
    di_batch_error e;
    CHECK(parse(CL("{\"prompt\": \"x\", \"top_p\": 9}"), &r, &e) != DI_OK);
    CHECK(r.custom_id && !strcmp(r.custom_id, "a"));
    di_batch_request_free(&r);
    const char *line = "{\"custom_id\": \"zz\", \"body\": 1}";
    char *id = di_batch_line_custom_id(line, strlen(line));
    CHECK(id && !strcmp(id, "zz"));
    di_free(id);
    CHECK(di_batch_line_custom_id("{\"custom_id\": 5}", 16) == NULL);
    CHECK(di_batch_line_custom_id("garbage", 7) == NULL);
}

int main(void) {
    RUN(completion_fields);
    RUN(defaults_and_nulls);
    RUN(prompt_forms);
    RUN(chat_fields);
    RUN(envelope_errors);
    RUN(body_errors);
    RUN(grammar_fields);
    RUN(custom_id_kept_on_error);
    return test_summary();
}
