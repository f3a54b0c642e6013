/*
 * args.h -- what every `deepinfer` command shares: a table-driven option parser over
 * getopt_long, one-line error reporting, and model loading.
 *
 * Conventions (all commands):
 *   - exit code 0: success; 1: the library or the system failed; 2: bad command line
 *     (unknown option, missing or malformed value, value out of range);
 *   - an error is exactly one line on stderr, "deepinfer <cmd>: <what is wrong>", and
 *     nothing is written to stdout;
 *   - -h / --help prints the command's usage on stdout and exits 0.
 *
 * Parsing functions return CLI_CONTINUE when the command should go on, otherwise the exit
 * code to return (the message has already been printed).
 */
#ifndef DI_CLI_ARGS_H
#define DI_CLI_ARGS_H

#include "deepinfer.h"

#include <stdbool.h>
#include <stdint.h>

#define CLI_LEN(a) (sizeof(a) / sizeof((a)[0]))

enum { CLI_CONTINUE = -1, CLI_EXIT_OK = 0, CLI_EXIT_FAILURE = 1, CLI_EXIT_USAGE = 2 };

typedef enum {
    CLI_OPT_FLAG,   /* no value; dest is bool *                 */
    CLI_OPT_STRING, /* dest is const char ** (points into argv) */
    CLI_OPT_INT,    /* dest is int64_t *, checked against [min, max] */
    CLI_OPT_DOUBLE, /* dest is double *, finite                 */
} cli_opt_kind;

typedef struct cli_opt {
    const char *name; /* long name without "--", e.g. "max-tokens" */
    cli_opt_kind kind;
    void *dest;
    int64_t min, max; /* CLI_OPT_INT only */
} cli_opt;

/* Parses argv[1..argc) (argv[0] is the command name) into the options' destinations, which
 * keep their defaults when an option is absent. -h / --help is built in and prints usage. */
int cli_parse(const char *cmd, const char *usage, const cli_opt *opts, int n_opts, int argc,
              char **argv);

/* "deepinfer <cmd>: <message>" on stderr; returns code. */
int cli_error(int code, const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Reports a required option that is absent (exit code 2). */
int cli_missing(const char *cmd, const char *option);

/* Reports a failed library call with di_last_error() (exit code 1). */
int cli_lib_error(const char *cmd, di_status st);

/* Checks --format: sets *json for "json", accepts "text". */
int cli_parse_format(const char *cmd, const char *format, bool *json);

/* The model folder a command uses: `given` (--model) if set, else the bundled default model
 * (models/deepseek-v4-tiny), looked for in $DEEPINFER_MODEL, next to the program
 * (<bin>/../models, <bin>/../share/deepinfer/models), in the install prefix and in the
 * source tree the program was built from. Returns NULL after printing an error (exit 2). */
const char *cli_model_dir(const char *cmd, const char *given);

/* Reads a whole file ("-": standard input), NUL-terminated, into *out (malloc'ed; the caller
 * frees) and its length into *len; false when it cannot be read. */
bool cli_read_file(const char *path, char **out, size_t *len);

/* Checks --device with the library's di_device_parse (absent, "cpu", "cuda" or "cuda:N");
 * else a usage error (exit 2) before anything is loaded. */
int cli_check_device(const char *cmd, const char *device);

/* Loads the model in dir on `device` (NULL: the CPU; see --device) with n_threads threads
 * (0: all cores) and reads its info. */
int cli_load_model(const char *cmd, const char *dir, const char *device, int64_t n_threads,
                   di_model **model, di_model_info *info);

/* The --device line of every model command's usage. */
#define CLI_DEVICE_HELP "cpu (default), cuda or cuda:N (a CUDA GPU)"

/* Monotonic wall-clock time in seconds. */
double cli_now(void);

#endif /* DI_CLI_ARGS_H */
