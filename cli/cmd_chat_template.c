/*
 * cmd_chat_template.c -- `deepinfer chat-template`: renders a model's chat template for a
 * conversation and prints the prompt exactly (no newline added), as transformers'
 * tokenizer.apply_chat_template(..., tokenize=False) would return it.
 *
 *   chat-template --model DIR --messages FILE.json [--add-generation-prompt]
 *                 [--template FILE.jinja] [--tools FILE.json] [--extra JSON]
 *
 * The messages file holds a JSON array of {"role", "content", ...}, or an object
 * {"messages": [...], "tools": [...]}; "-" reads it from stdin. --model DIR reads
 * DIR/tokenizer_config.json (or the file itself when given a .json); --template replaces the
 * config's template text, keeping its special tokens. --extra adds template variables, e.g.
 * '{"thinking": true}' for DeepSeek-V3.1. Errors are one line on stderr (args.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "args.h"
#include "commands.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_usage =
    "usage: deepinfer chat-template --model DIR --messages FILE.json [options]\n"
    "\n"
    "Renders the model's chat template (tokenizer_config.json) for a conversation and prints\n"
    "the prompt text exactly, with no newline added.\n"
    "\n"
    "  --model DIR                model folder (or its tokenizer_config.json)\n"
    "  --messages FILE            JSON array of messages, or {\"messages\": [...], \"tools\":\n"
    "                             [...]}; - reads stdin\n"
    "  --add-generation-prompt    end with the assistant's turn header\n"
    "  --template FILE.jinja      use this template text instead of the model's\n"
    "  --tools FILE               JSON array of tool schemas\n"
    "  --extra JSON               extra template variables, e.g. '{\"thinking\": true}'\n";

/* A whole file, or stdin for "-" (malloc'd, NUL-terminated); NULL when it cannot be read. */
static char *slurp(const char *path) {
    char *text = NULL;
    size_t len;
    return cli_read_file(path, &text, &len) ? text : NULL;
}

static int load_template(const char *cmd, const char *model, const char *template_path,
                         di_chat_template **t) {
    di_status st;
    if (template_path) {
        char *text = slurp(template_path);
        if (!text) return cli_error(1, cmd, "%s: cannot read", template_path);
        st = di_chat_template_from_text(text, model, t);
        free(text);
    } else {
        st = di_chat_template_load(model, t);
    }
    return st == DI_OK ? CLI_CONTINUE : cli_lib_error(cmd, st);
}

int cmd_chat_template(int argc, char **argv) {
    const char *cmd = "chat-template";
    const char *model = NULL, *messages_path = NULL, *template_path = NULL, *tools_path = NULL;
    const char *extra = NULL;
    bool agp = false;
    const cli_opt opts[] = {
        {"model", CLI_OPT_STRING, &model, 0, 0},
        {"messages", CLI_OPT_STRING, &messages_path, 0, 0},
        {"add-generation-prompt", CLI_OPT_FLAG, &agp, 0, 0},
        {"template", CLI_OPT_STRING, &template_path, 0, 0},
        {"tools", CLI_OPT_STRING, &tools_path, 0, 0},
        {"extra", CLI_OPT_STRING, &extra, 0, 0},
    };
    int rc = cli_parse(cmd, k_usage, opts, (int)CLI_LEN(opts), argc, argv);
    if (rc != CLI_CONTINUE) return rc;
    if (!model && !template_path) return cli_missing(cmd, "model");
    if (!messages_path) return cli_missing(cmd, "messages");

    char *messages = slurp(messages_path), *tools = NULL, *out = NULL;
    if (!messages) return cli_error(1, cmd, "%s: cannot read", messages_path);
    if (tools_path && !(tools = slurp(tools_path))) {
        free(messages);
        return cli_error(1, cmd, "%s: cannot read", tools_path);
    }
    di_chat_template *t = NULL;
    rc = load_template(cmd, model, template_path, &t);
    if (rc == CLI_CONTINUE) {
        di_chat_render_params p = {.messages_json = messages,
                                   .tools_json = tools,
                                   .extra_json = extra,
                                   .add_generation_prompt = agp};
        di_status st = di_chat_template_render_ex(t, &p, &out);
        rc = st == DI_OK ? CLI_EXIT_OK : cli_lib_error(cmd, st);
    }
    if (rc == CLI_EXIT_OK && fwrite(out, 1, strlen(out), stdout) != strlen(out))
        rc = cli_error(1, cmd, "cannot write the output");
    di_free(out);
    di_chat_template_free(t);
    free(messages);
    free(tools);
    return rc;
}
