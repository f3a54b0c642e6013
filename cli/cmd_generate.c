/*
 * cmd_generate.c -- `deepinfer generate`: continues a prompt of token ids.
 *
 * The prompt is prefilled in one di_context_eval call (logits of its last position only),
 * then each generated token is fed back in its own call. Decoding is greedy (argmax, lowest
 * id on ties); --temperature other than 0 is refused until sampling exists.
 *
 * Generation stops at the model's eos_token_id (finish_reason "stop"; the eos id is part of
 * the output) unless --ignore-eos, or after --max-tokens tokens ("length"). The last token
 * is never fed back, so the context needs prompt + max_tokens - 1 positions; it is created
 * with prompt + max_tokens, which must fit the model's context.
 *
 * --prompt TEXT tokenizes the text with the model folder's tokenizer (or --tokenizer), adding
 * BOS as the tokenizer's config says; --chat first renders the text as one user message
 * through the chat template (which writes BOS itself, so no BOS is added again) with the
 * generation prompt. Output then also carries the generated text (special tokens skipped,
 * as vLLM and the OpenAI API return it).
 *
 * Speeds: prefill tok/s = prompt tokens / prefill time; decode tok/s = tokens fed back one at
 * a time / their time (the first generated token comes out of the prefill).
 */
#include "args.h"
#include "commands.h"
#include "ids.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const k_usage =
    "usage: deepinfer generate --model DIR (--ids \"3 17 42\" | --ids-file F | --prompt TEXT)\n"
    "                          [--chat] [--tokenizer PATH] [--max-tokens N] [--temperature 0]\n"
    "                          [--ignore-eos] [--format text|json] [--threads N]\n"
    "\n"
    "Generates a continuation of a prompt (greedy decoding).\n"
    "\n"
    "options:\n"
    "  --model DIR       checkpoint folder (config.json + *.safetensors)   [required]\n"
    "  --ids \"A B ..\"    prompt token ids separated by spaces            [or --ids-file]\n"
    "  --ids-file F      file of whitespace-separated prompt token ids\n"
    "  --prompt TEXT     prompt text, tokenized with the model's tokenizer (BOS added as its\n"
    "                    tokenizer_config.json says)\n"
    "  --chat            render --prompt as a user message through the chat template first\n"
    "  --tokenizer PATH  tokenizer.json or a folder with it (and tokenizer_config.json);\n"
    "                    default: the model folder\n"
    "  --max-tokens N    tokens to generate at most (default 128)\n"
    "  --temperature T   0 = greedy (default; the only value supported for now)\n"
    "  --ignore-eos      do not stop at the end-of-sequence token\n"
    "  --format FMT      text (default): the generated ids on one line (the text instead\n"
    "                    with --prompt), a speed summary on stderr; json: one object\n"
    "                    {ids, [text,] finish_reason, usage, timing}\n"
    "  --threads N       compute threads; 0 = all cores (default)\n"
    "  -h, --help        show this help\n"
    "\n"
    "exit status: 0 ok, 1 failure (model, memory), 2 bad command line\n";

typedef struct gen_options {
    const char *model_dir, *ids_text, *ids_file, *format, *prompt, *tokenizer;
    int64_t max_tokens, threads;
    double temperature;
    bool ignore_eos, json, chat;
} gen_options;

typedef struct gen_result {
    int32_t *ids; /* [max_tokens], owned; the first n are the generated tokens */
    int64_t n;
    const char *finish_reason; /* "stop" or "length" */
    double prefill_s, decode_s;
    int64_t n_decoded; /* tokens fed back one at a time (n - 1) */
} gen_result;

/* ---------------------------------------------------------------------------------------- */
/* Options and checks                                                                         */
/* ---------------------------------------------------------------------------------------- */

static int parse_options(const char *cmd, int argc, char **argv, gen_options *o) {
    *o = (gen_options){.format = "text", .max_tokens = 128};
    const cli_opt opts[] = {
        {"model", CLI_OPT_STRING, &o->model_dir, 0, 0},
        {"ids", CLI_OPT_STRING, &o->ids_text, 0, 0},
        {"ids-file", CLI_OPT_STRING, &o->ids_file, 0, 0},
        {"prompt", CLI_OPT_STRING, &o->prompt, 0, 0},
        {"chat", CLI_OPT_FLAG, &o->chat, 0, 0},
        {"tokenizer", CLI_OPT_STRING, &o->tokenizer, 0, 0},
        {"max-tokens", CLI_OPT_INT, &o->max_tokens, 1, INT32_MAX},
        {"temperature", CLI_OPT_DOUBLE, &o->temperature, 0, 0},
        {"ignore-eos", CLI_OPT_FLAG, &o->ignore_eos, 0, 0},
        {"format", CLI_OPT_STRING, &o->format, 0, 0},
        {"threads", CLI_OPT_INT, &o->threads, 0, 4096},
    };
    int rc = cli_parse(cmd, k_usage, opts, (int)CLI_LEN(opts), argc, argv);
    if (rc != CLI_CONTINUE) return rc;
    if (!o->model_dir) return cli_missing(cmd, "model");
    if (o->prompt && (o->ids_text || o->ids_file))
        return cli_error(CLI_EXIT_USAGE, cmd, "--prompt cannot be combined with --ids/--ids-file");
    if (o->chat && !o->prompt) return cli_error(CLI_EXIT_USAGE, cmd, "--chat needs --prompt");
    if (o->tokenizer && !o->prompt)
        return cli_error(CLI_EXIT_USAGE, cmd, "--tokenizer needs --prompt");
    if (o->temperature < 0)
        return cli_error(CLI_EXIT_USAGE, cmd, "--temperature %g: must be >= 0", o->temperature);
    if (o->temperature > 0)
        return cli_error(CLI_EXIT_USAGE, cmd,
                         "--temperature %g: sampling is not available yet; only "
                         "--temperature 0 (greedy decoding) is supported",
                         o->temperature);
    return cli_parse_format(cmd, o->format, &o->json);
}

/* Ids within the vocabulary, prompt + max_tokens within the model's context. */
static int check_request(const char *cmd, const cli_ids *prompt, const gen_options *o,
                         const di_model_info *info) {
    char err[256];
    if (!cli_ids_check_range(prompt, info->vocab_size, err, sizeof err))
        return cli_error(CLI_EXIT_USAGE, cmd, "%s", err);
    if (prompt->n + o->max_tokens > info->max_context)
        return cli_error(CLI_EXIT_USAGE, cmd,
                         "prompt (%lld tokens) + --max-tokens %lld = %lld exceeds the model's "
                         "context of %lld tokens",
                         (long long)prompt->n, (long long)o->max_tokens,
                         (long long)(prompt->n + o->max_tokens), (long long)info->max_context);
    return CLI_CONTINUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Decoding                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Greedy choice: the highest logit, the lowest id on ties. */
static int32_t argmax(const float *logits, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return (int32_t)best;
}

/* Prefill, then greedy decoding into r. logits: [vocab_size] scratch. */
static di_status decode(di_context *ctx, const cli_ids *prompt, const gen_options *o,
                        const di_model_info *info, float *logits, gen_result *r) {
    double t0 = cli_now();
    di_status st = di_context_eval(ctx, prompt->v, prompt->n, logits, 1);
    r->prefill_s = cli_now() - t0;
    r->finish_reason = "length";
    t0 = cli_now();
    while (st == DI_OK) {
        int32_t tok = argmax(logits, info->vocab_size);
        r->ids[r->n++] = tok;
        if (!o->ignore_eos && tok == info->eos_token_id) {
            r->finish_reason = "stop";
            break;
        }
        if (r->n == o->max_tokens) break;
        st = di_context_eval(ctx, &tok, 1, logits, 1);
        r->n_decoded++;
    }
    r->decode_s = cli_now() - t0;
    return st;
}

/* Creates the context and runs decode(); returns CLI_CONTINUE or an exit code. */
static int generate(const char *cmd, di_model *model, const cli_ids *prompt, const gen_options *o,
                    const di_model_info *info, gen_result *r) {
    float *logits = malloc((size_t)info->vocab_size * sizeof(float));
    r->ids = malloc((size_t)o->max_tokens * sizeof(int32_t));
    if (!logits || !r->ids) {
        free(logits);
        return cli_error(CLI_EXIT_FAILURE, cmd, "out of memory");
    }
    di_context_params cp = di_context_default_params();
    cp.max_tokens = prompt->n + o->max_tokens;
    cp.n_threads = (int32_t)o->threads;
    di_context *ctx = NULL;
    di_status st = di_context_create(model, &cp, &ctx);
    if (st == DI_OK) {
        st = decode(ctx, prompt, o, info, logits, r);
        di_context_free(ctx);
    }
    free(logits);
    return st != DI_OK ? cli_lib_error(cmd, st) : CLI_CONTINUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Text prompts                                                                               */
/* ---------------------------------------------------------------------------------------- */

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The --chat prompt: the text as one user message through the chat template of the tokenizer
 * folder (or the model folder), with the generation prompt. *out is freed with di_free. */
static int render_chat(const char *cmd, const gen_options *o, char **out) {
    const char *dir = o->tokenizer && is_dir(o->tokenizer) ? o->tokenizer : o->model_dir;
    di_chat_template *tmpl = NULL;
    di_status st = di_chat_template_load(dir, &tmpl);
    if (st != DI_OK) return cli_lib_error(cmd, st);
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", o->prompt);
    char *msgs_json = msgs ? json_dumps(msgs, 0) : NULL;
    json_decref(msgs);
    if (!msgs_json) {
        di_chat_template_free(tmpl);
        return cli_error(CLI_EXIT_USAGE, cmd, "--prompt: not valid UTF-8 text");
    }
    st = di_chat_template_render(tmpl, msgs_json, true, NULL, out);
    free(msgs_json);
    di_chat_template_free(tmpl);
    return st != DI_OK ? cli_lib_error(cmd, st) : CLI_CONTINUE;
}

/* Tokenizes --prompt (after the chat template with --chat) into out; *tok stays loaded for
 * decoding the output. */
static int tokenize_prompt(const char *cmd, const gen_options *o, di_tokenizer **tok,
                           cli_ids *out) {
    di_status st = di_tokenizer_load(o->tokenizer ? o->tokenizer : o->model_dir, tok);
    if (st != DI_OK) return cli_lib_error(cmd, st);
    char *rendered = NULL;
    if (o->chat) {
        int rc = render_chat(cmd, o, &rendered);
        if (rc != CLI_CONTINUE) return rc;
    }
    const char *text = rendered ? rendered : o->prompt;
    bool add_special = !o->chat; /* the chat template writes BOS itself */
    int64_t n = di_tokenizer_encode(*tok, text, strlen(text), add_special, NULL, 0);
    if (n < 0 && n != DI_TOK_ERROR) {
        out->v = malloc((size_t)(-n) * sizeof(int32_t));
        n = out->v ? di_tokenizer_encode(*tok, text, strlen(text), add_special, out->v, -n)
                   : DI_TOK_ERROR;
    }
    di_free(rendered);
    if (n == DI_TOK_ERROR) return cli_lib_error(cmd, DI_ERR_INVALID_ARG);
    out->n = n;
    if (n == 0) return cli_error(CLI_EXIT_USAGE, cmd, "--prompt: the prompt has no tokens");
    return CLI_CONTINUE;
}

/* The generated text (special tokens skipped); NULL on failure. Caller frees. */
static char *decode_text(const di_tokenizer *tok, const gen_result *r) {
    int64_t need = di_tokenizer_decode(tok, r->ids, r->n, true, NULL, 0);
    if (need == DI_TOK_ERROR) return NULL;
    int64_t cap = need < 0 ? -need : need;
    char *text = malloc((size_t)cap + 1);
    if (!text) return NULL;
    int64_t got = di_tokenizer_decode(tok, r->ids, r->n, true, text, cap);
    if (got < 0) {
        free(text);
        return NULL;
    }
    text[got] = '\0';
    return text;
}

/* ---------------------------------------------------------------------------------------- */
/* Output                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static double per_second(int64_t n, double seconds) {
    return seconds > 0 ? (double)n / seconds : 0.0;
}

static int print_json(const char *cmd, const gen_result *r, int64_t n_prompt, const char *text) {
    json_t *ids = json_array();
    for (int64_t i = 0; i < r->n; i++)
        json_array_append_new(ids, json_integer(r->ids[i]));
    json_t *usage = json_pack("{s:I, s:I}", "prompt_tokens", (json_int_t)n_prompt,
                              "completion_tokens", (json_int_t)r->n);
    json_t *timing = json_pack("{s:f, s:f, s:f, s:f}", "prefill_s", r->prefill_s, "decode_s",
                               r->decode_s, "prefill_tok_s", per_second(n_prompt, r->prefill_s),
                               "decode_tok_s", per_second(r->n_decoded, r->decode_s));
    json_t *o = json_pack("{s:o, s:s, s:o, s:o}", "ids", ids, "finish_reason", r->finish_reason,
                          "usage", usage, "timing", timing);
    if (o && text) json_object_set_new(o, "text", json_string(text));
    int rc = o ? json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : -1;
    json_decref(o);
    if (rc != 0) return cli_error(CLI_EXIT_FAILURE, cmd, "cannot write JSON to stdout");
    putchar('\n');
    return CLI_EXIT_OK;
}

static int print_text(const gen_result *r, int64_t n_prompt, const char *text) {
    if (text) {
        fputs(text, stdout);
    } else {
        for (int64_t i = 0; i < r->n; i++)
            printf("%s%d", i ? " " : "", (int)r->ids[i]);
    }
    putchar('\n');
    fprintf(stderr, "prompt %lld tok (%.1f tok/s), generated %lld tok (%.1f tok/s)\n",
            (long long)n_prompt, per_second(n_prompt, r->prefill_s), (long long)r->n,
            per_second(r->n_decoded, r->decode_s));
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Command                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static int run(const char *cmd, const gen_options *o, const cli_ids *prompt,
               const di_tokenizer *tok) {
    di_model *model;
    di_model_info info;
    int rc = cli_load_model(cmd, o->model_dir, o->threads, &model, &info);
    if (rc != CLI_CONTINUE) return rc;
    gen_result r = {0};
    rc = check_request(cmd, prompt, o, &info);
    if (rc == CLI_CONTINUE) rc = generate(cmd, model, prompt, o, &info, &r);
    char *text = NULL;
    if (rc == CLI_CONTINUE && tok && !(text = decode_text(tok, &r)))
        rc = cli_lib_error(cmd, DI_ERR_INTERNAL);
    if (rc == CLI_CONTINUE)
        rc = o->json ? print_json(cmd, &r, prompt->n, text) : print_text(&r, prompt->n, text);
    free(text);
    free(r.ids);
    di_model_free(model);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    const char *cmd = "generate";
    gen_options o;
    int rc = parse_options(cmd, argc, argv, &o);
    if (rc != CLI_CONTINUE) return rc;
    cli_ids prompt = {0};
    di_tokenizer *tok = NULL;
    if (o.prompt)
        rc = tokenize_prompt(cmd, &o, &tok, &prompt);
    else
        rc = cli_ids_from_options(cmd, o.ids_text, o.ids_file, &prompt);
    if (rc == CLI_CONTINUE) rc = run(cmd, &o, &prompt, tok);
    cli_ids_free(&prompt);
    di_tokenizer_free(tok);
    return rc;
}
