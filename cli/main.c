/*
 * main.c -- entry point of the `deepinfer` program: dispatches to a subcommand.
 */
#include "commands.h"

#include <stdio.h>
#include <string.h>

static const di_cli_command g_commands[] = {
    {"info", cmd_info, "describe a checkpoint: architecture, parameters, dtypes, memory"},
    {"logits", cmd_logits, "write float32 logits for every position of a token sequence"},
    {"generate", cmd_generate, "generate a continuation of a prompt"},
    {"perplexity", cmd_perplexity, "perplexity of the model on a text file"},
    {"tokenize", cmd_tokenize, "text to token ids with a tokenizer.json or model folder"},
    {"detokenize", cmd_detokenize, "token ids to text"},
    {"chat-template", cmd_chat_template, "render a model's chat template for a conversation"},
    {"batch", cmd_batch, "run an OpenAI Batch API file of completions through the engine"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: deepinfer <command> [options]   (deepinfer <command> -h for help)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        fprintf(f, "  %-14s %s\n", g_commands[i].name, g_commands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        if (!strcmp(argv[1], g_commands[i].name)) return g_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "deepinfer: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
