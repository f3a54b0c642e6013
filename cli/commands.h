/*
 * commands.h -- the subcommands of the `deepinfer` program. Each lives in its own cli/cmd_*.c
 * file, parses its own arguments (every one has -h), and returns the process exit code.
 * Commands use the public header only.
 */
#ifndef DI_CLI_COMMANDS_H
#define DI_CLI_COMMANDS_H

typedef int (*di_cmd_fn)(int argc, char **argv);

typedef struct {
    const char *name;
    di_cmd_fn fn;
    const char *summary;
} di_cli_command;

int cmd_info(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);
int cmd_batch(int argc, char **argv);

#endif /* DI_CLI_COMMANDS_H */
