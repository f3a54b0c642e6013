/*
 * ids.h -- token id lists given on the command line ("3 17 42") or in a file.
 *
 * The accepted text is decimal non-negative integers separated by whitespace. Anything else
 * is an error whose message names the offending item and its position, e.g.
 *   item 2 "4x" is not a token id (expected non-negative integers separated by spaces)
 */
#ifndef DI_CLI_IDS_H
#define DI_CLI_IDS_H

#include "deepinfer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cli_ids {
    int32_t *v; /* [n], owned (cli_ids_free) */
    int64_t n;
} cli_ids;

/* Parses text into out (which must be empty). On failure writes a message to err and leaves
 * out empty. An empty list is an error. */
bool cli_ids_parse(const char *text, cli_ids *out, char *err, size_t err_size);

/* Reads a whole file and parses it like cli_ids_parse. */
bool cli_ids_read_file(const char *path, cli_ids *out, char *err, size_t err_size);

/* Checks every id is in [0, vocab_size); names the first one that is not. */
bool cli_ids_check_range(const cli_ids *ids, int64_t vocab_size, char *err, size_t err_size);

void cli_ids_free(cli_ids *ids);

/* Tokenizes len bytes of text into out (a new array). Returns DI_OK, DI_ERR_OUT_OF_MEMORY, or
 * DI_ERR_INVALID_ARG when the tokenizer fails (di_last_error() says why). */
di_status cli_ids_encode(const di_tokenizer *tok, const char *text, size_t len, bool add_special,
                         cli_ids *out);

/* For the commands: takes the ids from --ids TEXT or --ids-file PATH (exactly one of them
 * must be given). Returns CLI_CONTINUE or an exit code after printing the error. */
int cli_ids_from_options(const char *cmd, const char *ids_text, const char *ids_file, cli_ids *out);

#endif /* DI_CLI_IDS_H */
