/*
 * cmd_perplexity.c -- `deepinfer perplexity`: how well the model predicts a text, as
 * llama.cpp's perplexity tool measures it.
 *
 * The text is tokenized once (BOS added as the tokenizer's config says) and cut into
 * consecutive chunks of --ctx tokens. Each chunk is evaluated from an empty context and
 * every token of it except the first is scored by the log-probability the model gave it
 * at the previous position (so the first token of each chunk is context only). The result
 * is ppl = exp(mean negative log-likelihood) over all scored tokens. Log-softmax is taken in
 * double precision, so the figure is as exact as the logits.
 *
 * --ids-file scores a sequence of token ids directly (no tokenizer needed).
 */
#include "args.h"
#include "commands.h"
#include "ids.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_usage =
    "usage: deepinfer perplexity [--model DIR] (--file F | --ids-file F) [--ctx N]\n"
    "                            [--format text|json] [--threads N]\n"
    "\n"
    "Perplexity of the model on a text: the text is cut into chunks of --ctx tokens, each\n"
    "evaluated from an empty context; every token but a chunk's first is scored.\n"
    "\n"
    "options:\n"
    "  --model DIR      checkpoint folder with its tokenizer.json;\n"
    "                   default: the bundled model (models/deepseek-v4-tiny)\n"
    "  --file F         UTF-8 text file                                   [or --ids-file]\n"
    "  --ids-file F     file of whitespace-separated token ids (no tokenizer needed)\n"
    "  --ctx N          tokens per chunk (default 512, at most the model's context)\n"
    "  --format FMT     text (default) or json: {\"tokens\", \"ppl\", \"vocab_size\"}\n"
    "  --threads N      compute threads; 0 = all cores (default)\n"
    "  --device D       " CLI_DEVICE_HELP "\n"
    "  -h, --help       show this help\n"
    "\n"
    "exit status: 0 ok, 1 failure (model, memory, file), 2 bad command line\n";

static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

typedef struct ppl_options {
    const char *model_dir, *file, *ids_file, *format, *device;
    int64_t ctx, threads;
    bool json;
} ppl_options;

/* -log softmax(row)[target], in double. */
static double token_nll(const float *row, int64_t vocab, int32_t target) {
    double mx = row[0];
    for (int64_t i = 1; i < vocab; i++)
        if (row[i] > mx) mx = row[i];
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; i++) sum += exp((double)row[i] - mx);
    return -(((double)row[target] - mx) - log(sum));
}

/* Reads and tokenizes the text file into out. */
static int tokenize_file(const char *cmd, const ppl_options *o, cli_ids *out) {
    FILE *f = fopen(o->file, "rb");
    if (!f) return cli_error(CLI_EXIT_FAILURE, cmd, "cannot open \"%s\"", o->file);
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    size_t got;
    while (text && (got = fread(text + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *bigger = realloc(text, cap *= 2);
            if (!bigger) free(text);
            text = bigger;
        }
    }
    fclose(f);
    if (!text) return cli_error(CLI_EXIT_FAILURE, cmd, "out of memory");
    di_tokenizer *tok = NULL;
    di_status st = di_tokenizer_load(o->model_dir, &tok);
    if (st != DI_OK) {
        free(text);
        return cli_lib_error(cmd, st);
    }
    st = cli_ids_encode(tok, text, len, true, out);
    free(text);
    di_tokenizer_free(tok);
    return st != DI_OK ? cli_lib_error(cmd, st) : CLI_CONTINUE;
}

/* Scores ids chunk by chunk; writes the count of scored tokens and their total NLL. */
static int score(const char *cmd, di_model *model, const di_model_info *info, const cli_ids *ids,
                 const ppl_options *o, int64_t *n_scored, double *nll) {
    int64_t ctx_len = min_i64(o->ctx, info->max_context);
    float *logits = malloc((size_t)ctx_len * (size_t)info->vocab_size * sizeof(float));
    if (!logits) return cli_error(CLI_EXIT_FAILURE, cmd, "out of memory for %lld logits rows",
                                  (long long)ctx_len);
    di_context_params cp = di_context_default_params();
    cp.max_tokens = ctx_len;
    cp.n_threads = (int32_t)o->threads;
    di_context *c = NULL;
    di_status st = di_context_create(model, &cp, &c);
    *n_scored = 0;
    *nll = 0.0;
    for (int64_t start = 0; st == DI_OK && start + 1 < ids->n; start += ctx_len) {
        int64_t n = min_i64(ctx_len, ids->n - start);
        if (n < 2) break;
        di_context_reset(c);
        st = di_context_eval(c, ids->v + start, n, logits, n);
        for (int64_t t = 0; st == DI_OK && t + 1 < n; t++) {
            *nll += token_nll(logits + t * info->vocab_size, info->vocab_size,
                              ids->v[start + t + 1]);
            (*n_scored)++;
        }
    }
    di_context_free(c);
    free(logits);
    return st != DI_OK ? cli_lib_error(cmd, st) : CLI_CONTINUE;
}

static int run(const char *cmd, const ppl_options *o) {
    di_model *model;
    di_model_info info;
    int rc = cli_load_model(cmd, o->model_dir, o->device, o->threads, &model, &info);
    if (rc != CLI_CONTINUE) return rc;
    cli_ids ids = {0};
    rc = o->file ? tokenize_file(cmd, o, &ids) : cli_ids_from_options(cmd, NULL, o->ids_file, &ids);
    char err[256];
    if (rc == CLI_CONTINUE && !cli_ids_check_range(&ids, info.vocab_size, err, sizeof err))
        rc = cli_error(CLI_EXIT_USAGE, cmd, "%s", err);
    if (rc == CLI_CONTINUE && ids.n < 2)
        rc = cli_error(CLI_EXIT_USAGE, cmd, "the input has %lld tokens; at least 2 are needed",
                       (long long)ids.n);
    int64_t n_scored = 0;
    double nll = 0.0;
    if (rc == CLI_CONTINUE) rc = score(cmd, model, &info, &ids, o, &n_scored, &nll);
    if (rc == CLI_CONTINUE) {
        double ppl = exp(nll / (double)n_scored);
        if (o->json)
            printf("{\"tokens\": %lld, \"ppl\": %.6f, \"vocab_size\": %lld}\n",
                   (long long)n_scored, ppl, (long long)info.vocab_size);
        else
            printf("perplexity %.4f over %lld tokens (chunks of %lld)\n", ppl,
                   (long long)n_scored, (long long)min_i64(o->ctx, info.max_context));
        rc = CLI_EXIT_OK;
    }
    cli_ids_free(&ids);
    di_model_free(model);
    return rc;
}

int cmd_perplexity(int argc, char **argv) {
    const char *cmd = "perplexity";
    ppl_options o = {.format = "text", .ctx = 512};
    const cli_opt opts[] = {
        {"model", CLI_OPT_STRING, &o.model_dir, 0, 0},
        {"file", CLI_OPT_STRING, &o.file, 0, 0},
        {"ids-file", CLI_OPT_STRING, &o.ids_file, 0, 0},
        {"ctx", CLI_OPT_INT, &o.ctx, 2, INT32_MAX},
        {"format", CLI_OPT_STRING, &o.format, 0, 0},
        {"threads", CLI_OPT_INT, &o.threads, 0, 4096},
        {"device", CLI_OPT_STRING, &o.device, 0, 0},
    };
    int rc = cli_parse(cmd, k_usage, opts, (int)CLI_LEN(opts), argc, argv);
    if (rc != CLI_CONTINUE) return rc;
    if ((rc = cli_check_device(cmd, o.device)) != CLI_CONTINUE) return rc;
    if (!(o.model_dir = cli_model_dir(cmd, o.model_dir))) return CLI_EXIT_USAGE;
    if (!o.file == !o.ids_file)
        return cli_error(CLI_EXIT_USAGE, cmd, "give exactly one of --file and --ids-file");
    rc = cli_parse_format(cmd, o.format, &o.json);
    if (rc != CLI_CONTINUE) return rc;
    return run(cmd, &o);
}
