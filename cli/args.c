/*
 * args.c -- option parsing and error reporting shared by the commands (see args.h).
 *
 * The parser builds a getopt_long table from the command's cli_opt array, with getopt's own
 * messages turned off so that every complaint has our one-line format and names the option.
 * Numbers are parsed strictly: the whole value must be a number, in range.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "args.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CLI_MAX_OPTS     32
#define CLI_OPT_VAL_BASE 256 /* getopt "val" of opts[i] is CLI_OPT_VAL_BASE + i */

/* ---------------------------------------------------------------------------------------- */
/* Errors                                                                                     */
/* ---------------------------------------------------------------------------------------- */

int cli_error(int code, const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "deepinfer %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

int cli_missing(const char *cmd, const char *option) {
    return cli_error(CLI_EXIT_USAGE, cmd, "missing required option --%s (see --help)", option);
}

int cli_lib_error(const char *cmd, di_status st) {
    const char *msg = di_last_error();
    if (!msg || !*msg) msg = di_status_str(st);
    return cli_error(CLI_EXIT_FAILURE, cmd, "%s", msg);
}

int cli_parse_format(const char *cmd, const char *format, bool *json) {
    *json = false;
    if (!strcmp(format, "json"))
        *json = true;
    else if (strcmp(format, "text") != 0)
        return cli_error(CLI_EXIT_USAGE, cmd, "--format: \"%s\" is not one of text, json", format);
    return CLI_CONTINUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Values                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static int parse_int(const char *cmd, const cli_opt *o, const char *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0')
        return cli_error(CLI_EXIT_USAGE, cmd, "--%s: \"%s\" is not an integer", o->name, s);
    if (errno == ERANGE || v < o->min || v > o->max)
        return cli_error(CLI_EXIT_USAGE, cmd, "--%s: %s is out of range [%lld, %lld]", o->name, s,
                         (long long)o->min, (long long)o->max);
    *(int64_t *)o->dest = v;
    return CLI_CONTINUE;
}

static int parse_double(const char *cmd, const cli_opt *o, const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v))
        return cli_error(CLI_EXIT_USAGE, cmd, "--%s: \"%s\" is not a number", o->name, s);
    *(double *)o->dest = v;
    return CLI_CONTINUE;
}

static int store_value(const char *cmd, const cli_opt *o, const char *value) {
    switch (o->kind) {
    case CLI_OPT_FLAG:
        *(bool *)o->dest = true;
        return CLI_CONTINUE;
    case CLI_OPT_STRING:
        *(const char **)o->dest = value;
        return CLI_CONTINUE;
    case CLI_OPT_INT:
        return parse_int(cmd, o, value);
    case CLI_OPT_DOUBLE:
        return parse_double(cmd, o, value);
    }
    return CLI_CONTINUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Parsing                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* The getopt_long table: the command's options, then --help, then the terminator. */
static void build_table(const cli_opt *opts, int n_opts, struct option *table) {
    for (int i = 0; i < n_opts; i++) {
        table[i] = (struct option){opts[i].name,
                                   opts[i].kind == CLI_OPT_FLAG ? no_argument : required_argument,
                                   NULL, CLI_OPT_VAL_BASE + i};
    }
    table[n_opts] = (struct option){"help", no_argument, NULL, 'h'};
    table[n_opts + 1] = (struct option){NULL, 0, NULL, 0};
}

/* getopt returned '?': name what it did not recognise. */
static int report_unknown(const char *cmd, char **argv) {
    if (optopt > 0 && optopt < CLI_OPT_VAL_BASE)
        return cli_error(CLI_EXIT_USAGE, cmd, "unknown option \"-%c\" (see --help)", optopt);
    const char *arg = argv[optind - 1];
    size_t len = strcspn(arg, "="); /* "--foo=bar" is reported as "--foo" */
    return cli_error(CLI_EXIT_USAGE, cmd, "unknown option \"%.*s\" (see --help)", (int)len, arg);
}

static int report_missing_value(const char *cmd, const cli_opt *opts, int n_opts) {
    int i = optopt - CLI_OPT_VAL_BASE;
    if (i >= 0 && i < n_opts)
        return cli_error(CLI_EXIT_USAGE, cmd, "option --%s needs a value", opts[i].name);
    return cli_error(CLI_EXIT_USAGE, cmd, "an option needs a value (see --help)");
}

int cli_parse(const char *cmd, const char *usage, const cli_opt *opts, int n_opts, int argc,
              char **argv) {
    struct option table[CLI_MAX_OPTS + 2];
    if (n_opts > CLI_MAX_OPTS) return cli_error(CLI_EXIT_FAILURE, cmd, "too many options");
    build_table(opts, n_opts, table);

    opterr = 0; /* we print our own messages */
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", table, NULL)) != -1) {
        if (c == 'h') {
            fputs(usage, stdout);
            return CLI_EXIT_OK;
        }
        if (c == '?') return report_unknown(cmd, argv);
        if (c == ':') return report_missing_value(cmd, opts, n_opts);
        int rc = store_value(cmd, &opts[c - CLI_OPT_VAL_BASE], optarg);
        if (rc != CLI_CONTINUE) return rc;
    }
    if (optind < argc)
        return cli_error(CLI_EXIT_USAGE, cmd, "unexpected argument \"%s\" (see --help)",
                         argv[optind]);
    return CLI_CONTINUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Library helpers                                                                            */
/* ---------------------------------------------------------------------------------------- */

int cli_check_device(const char *cmd, const char *device) {
    int cuda_device;
    if (di_device_parse(device, &cuda_device) == DI_OK) return CLI_CONTINUE;
    return cli_error(CLI_EXIT_USAGE, cmd, "--device \"%s\": expected cpu, cuda or cuda:N", device);
}

int cli_load_model(const char *cmd, const char *dir, const char *device, int64_t n_threads,
                   di_model **model, di_model_info *info) {
    int rc = cli_check_device(cmd, device);
    if (rc != CLI_CONTINUE) return rc;
    di_model_params mp = di_model_default_params();
    mp.n_threads = (int32_t)n_threads;
    mp.device = device;
    di_status st = di_model_load(dir, &mp, model);
    if (st != DI_OK) return cli_lib_error(cmd, st);
    st = di_model_get_info(*model, info);
    if (st != DI_OK) {
        rc = cli_lib_error(cmd, st);
        di_model_free(*model);
        *model = NULL;
        return rc;
    }
    return CLI_CONTINUE;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------- */
/* The default model                                                                          */
/* ---------------------------------------------------------------------------------------- */

#define CLI_DEFAULT_MODEL "deepseek-v4-tiny"

static bool has_config(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    return access(path, R_OK) == 0;
}

const char *cli_model_dir(const char *cmd, const char *given) {
    static char found[4096];
    if (given) return given;
    const char *env = getenv("DEEPINFER_MODEL");
    if (env && *env) {
        if (has_config(env)) return env;
        cli_error(CLI_EXIT_USAGE, cmd, "DEEPINFER_MODEL=%s: no config.json there", env);
        return NULL;
    }
    /* Relative to the program, so a build tree or an installed tree works wherever it is. */
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        const char *rel[] = {"../models/", "../share/deepinfer/models/", "models/"};
        for (size_t i = 0; i < CLI_LEN(rel); i++) {
            snprintf(found, sizeof found, "%s/%s%s", exe, rel[i], CLI_DEFAULT_MODEL);
            if (has_config(found)) return found;
        }
    }
    const char *fixed[] = {DI_INSTALL_DATA_DIR "/models/" CLI_DEFAULT_MODEL,
                           DI_SOURCE_DIR_CLI "/models/" CLI_DEFAULT_MODEL};
    for (size_t i = 0; i < CLI_LEN(fixed); i++)
        if (has_config(fixed[i])) return fixed[i];
    cli_error(CLI_EXIT_USAGE, cmd,
              "no --model given and the bundled model \"%s\" was not found (set "
              "DEEPINFER_MODEL or pass --model DIR)",
              CLI_DEFAULT_MODEL);
    return NULL;
}

/* See args.h. */
bool cli_read_file(const char *path, char **out, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return false;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    bool ok = buf && !ferror(f);
    if (f != stdin) fclose(f);
    if (!ok) {
        free(buf);
        if (!errno) errno = EIO;
        return false;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return true;
}
