/*
 * cmd_logits.c -- `deepinfer logits`: runs a token sequence through the model in one
 * di_context_eval call and writes the logits of every position to a file, float32
 * little-endian, row-major [n_ids][vocab_size], no header (numpy.fromfile-friendly).
 *
 * The output file is opened before the model is loaded, so an unwritable path fails fast;
 * if anything fails after that, the partial file is removed.
 */
#include "args.h"
#include "commands.h"
#include "ids.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_usage =
    "usage: deepinfer logits [--model DIR] (--ids \"3 17 42\" | --ids-file F) --out FILE\n"
    "                        [--threads N] [--device D]\n"
    "\n"
    "Evaluates the token ids as one sequence and writes the logits of every position to FILE:\n"
    "float32 little-endian, row-major [n_ids][vocab_size], no header.\n"
    "\n"
    "options:\n"
    "  --model DIR      checkpoint folder (config.json + *.safetensors);\n"
    "                   default: the bundled model (models/deepseek-v4-tiny)\n"
    "  --ids \"A B ..\"   token ids separated by spaces                    [or --ids-file]\n"
    "  --ids-file F     file of whitespace-separated token ids\n"
    "  --out FILE       output file                                       [required]\n"
    "  --threads N      compute threads; 0 = all cores (default)\n"
    "  --device D       " CLI_DEVICE_HELP "\n"
    "  -h, --help       show this help\n"
    "\n"
    "exit status: 0 ok, 1 failure (model, memory, file), 2 bad command line\n";

/* Byte-swaps each float of a row in place when the host is big-endian. */
static void row_to_little_endian(float *row, int64_t n) {
    const uint32_t one = 1;
    if (*(const unsigned char *)&one == 1) return; /* little-endian host */
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &row[i], 4);
        u = (u >> 24) | ((u >> 8) & 0xFF00u) | ((u << 8) & 0xFF0000u) | (u << 24);
        memcpy(&row[i], &u, 4);
    }
}

/* One fwrite per row, then fclose (which reports a late write error, e.g. a full disk). */
static int write_rows(const char *cmd, const char *path, FILE *f, float *logits, int64_t n_rows,
                      int64_t vocab) {
    for (int64_t r = 0; r < n_rows; r++) {
        float *row = logits + r * vocab;
        row_to_little_endian(row, vocab);
        if (fwrite(row, sizeof(float), (size_t)vocab, f) != (size_t)vocab) {
            int e = errno;
            fclose(f);
            return cli_error(CLI_EXIT_FAILURE, cmd, "cannot write \"%s\": %s", path, strerror(e));
        }
    }
    if (fclose(f) != 0)
        return cli_error(CLI_EXIT_FAILURE, cmd, "cannot write \"%s\": %s", path, strerror(errno));
    return CLI_EXIT_OK;
}

/* Evaluates ids in a fresh context; fills logits [ids->n][vocab]. */
static int eval_all(const char *cmd, di_model *model, const cli_ids *ids, int64_t threads,
                    float *logits) {
    di_context_params cp = di_context_default_params();
    cp.max_tokens = ids->n;
    cp.n_threads = (int32_t)threads;
    di_context *ctx;
    di_status st = di_context_create(model, &cp, &ctx);
    if (st != DI_OK) return cli_lib_error(cmd, st);
    st = di_context_eval(ctx, ids->v, ids->n, logits, ids->n);
    di_context_free(ctx);
    return st != DI_OK ? cli_lib_error(cmd, st) : CLI_CONTINUE;
}

/* Everything after the output file is open; returns the exit code, f is closed. */
static int run(const char *cmd, const char *model_dir, const char *device, const cli_ids *ids,
               int64_t threads, const char *out_path, FILE *f) {
    di_model *model;
    di_model_info info;
    int rc = cli_load_model(cmd, model_dir, device, threads, &model, &info);
    if (rc != CLI_CONTINUE) {
        fclose(f);
        return rc;
    }
    char err[256];
    float *logits = NULL;
    if (!cli_ids_check_range(ids, info.vocab_size, err, sizeof err)) {
        rc = cli_error(CLI_EXIT_USAGE, cmd, "%s", err);
    } else if ((uint64_t)ids->n > SIZE_MAX / sizeof(float) / (uint64_t)info.vocab_size ||
               !(logits = malloc((size_t)ids->n * (size_t)info.vocab_size * sizeof(float)))) {
        rc = cli_error(CLI_EXIT_FAILURE, cmd, "out of memory for %lld x %lld logits",
                       (long long)ids->n, (long long)info.vocab_size);
    } else {
        rc = eval_all(cmd, model, ids, threads, logits);
    }
    if (rc == CLI_CONTINUE)
        rc = write_rows(cmd, out_path, f, logits, ids->n, info.vocab_size);
    else
        fclose(f);
    free(logits);
    di_model_free(model);
    return rc;
}

int cmd_logits(int argc, char **argv) {
    const char *cmd = "logits";
    const char *model_dir = NULL, *ids_text = NULL, *ids_file = NULL, *out_path = NULL;
    const char *device = NULL;
    int64_t threads = 0;
    const cli_opt opts[] = {
        {"model", CLI_OPT_STRING, &model_dir, 0, 0},   {"ids", CLI_OPT_STRING, &ids_text, 0, 0},
        {"ids-file", CLI_OPT_STRING, &ids_file, 0, 0}, {"out", CLI_OPT_STRING, &out_path, 0, 0},
        {"threads", CLI_OPT_INT, &threads, 0, 4096},   {"device", CLI_OPT_STRING, &device, 0, 0},
    };
    int rc = cli_parse(cmd, k_usage, opts, (int)CLI_LEN(opts), argc, argv);
    if (rc != CLI_CONTINUE) return rc;
    if (!(model_dir = cli_model_dir(cmd, model_dir))) return CLI_EXIT_USAGE;
    if (!out_path) return cli_missing(cmd, "out");
    if ((rc = cli_check_device(cmd, device)) != CLI_CONTINUE) return rc;
    cli_ids ids = {0};
    if ((rc = cli_ids_from_options(cmd, ids_text, ids_file, &ids)) != CLI_CONTINUE) return rc;

    FILE *f = fopen(out_path, "wb");
    if (!f) {
        rc = cli_error(CLI_EXIT_FAILURE, cmd, "cannot write \"%s\": %s", out_path, strerror(errno));
    } else {
        rc = run(cmd, model_dir, device, &ids, threads, out_path, f);
        if (rc != CLI_EXIT_OK) remove(out_path); /* no partial output */
    }
    cli_ids_free(&ids);
    return rc;
}
