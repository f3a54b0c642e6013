/*
 * fuzz_chat_template.c -- libFuzzer target: the input is the text of a Jinja chat template,
 * rendered for a small fixed conversation (system, user, assistant with reasoning, tool call,
 * tool output, user) with and without the generation prompt.
 *
 * Parsing and rendering must return a status for any input, never crash, and finish within
 * the interpreter's bounds (steps, sizes, depth); on success the output is a string.
 */
#include "deepinfer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char k_messages[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"Be brief.\"},"
    "{\"role\": \"user\", \"content\": \"Hi {{ x }} <\xef\xbd\x9cUser\xef\xbd\x9c>\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>hmm</think>Hello\"},"
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}}]},"
    "{\"role\": \"tool\", \"content\": \"42\"},"
    "{\"role\": \"user\", \"content\": \"\xe4\xbd\xa0\xe5\xa5\xbd\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    text[size] = '\0';
    di_chat_template *t = NULL;
    if (di_chat_template_from_text(text, NULL, &t) == DI_OK) {
        for (int agp = 0; agp < 2; agp++) {
            char *out = NULL;
            di_chat_render_params p = {.messages_json = k_messages,
                                       .extra_json = "{\"bos_token\": \"<s>\", \"thinking\": true}",
                                       .add_generation_prompt = agp != 0};
            if (di_chat_template_render_ex(t, &p, &out) == DI_OK && !out) abort();
            di_free(out);
        }
        di_chat_template_free(t);
    }
    free(text);
    return 0;
}
