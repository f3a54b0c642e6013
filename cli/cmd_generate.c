/*
 * cmd_generate.c -- `deepinfer generate`: continues a prompt of token ids.
 *
 * The request runs through the engine (di_engine_*: one request, --n completions sharing the
 * prompt's KV): the prompt is prefilled in one step, then one token per step. Sampling
 * follows vLLM's SamplingParams (--temperature 0, the default, is greedy: argmax, lowest id
 * on ties; otherwise --top-p / --top-k / --min-p / penalties and a seeded draw). A request
 * without --seed gets one drawn by the engine; it is reported ("seed" in JSON) so the run
 * can be repeated exactly.
 *
 * Generation stops at the model's eos_token_id (finish_reason "stop"; the eos id is part of
 * the output) unless --ignore-eos, at a --stop string (matched on the text, removed from
 * it; needs a tokenizer), or after --max-tokens tokens ("length"). Prompt + max_tokens must
 * fit the model's context.
 *
 * --prompt TEXT tokenizes the text with the model folder's tokenizer (or --tokenizer), adding
 * BOS as the tokenizer's config says; --chat first renders the text as one user message
 * through the chat template (which writes BOS itself, so no BOS is added again) with the
 * generation prompt. Output then also carries the generated text (special tokens skipped,
 * as vLLM and the OpenAI API return it).
 *
 * Speeds: prefill tok/s = prompt tokens / time to the first token; decode tok/s = the later
 * tokens / their time (the first generated token comes out of the prefill).
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
    "usage: deepinfer generate [--model DIR] (--ids \"3 17 42\" | --ids-file F | --prompt TEXT)\n"
    "                          [--chat] [--tokenizer PATH] [--max-tokens N] [sampling]\n"
    "                          [--ignore-eos] [--format text|json] [--threads N]\n"
    "\n"
    "Generates a continuation of a prompt (greedy by default).\n"
    "\n"
    "options:\n"
    "  --model DIR       checkpoint folder (config.json + *.safetensors);\n"
    "                    default: the bundled model (models/deepseek-v4-tiny)\n"
    "  --ids \"A B ..\"    prompt token ids separated by spaces            [or --ids-file]\n"
    "  --ids-file F      file of whitespace-separated prompt token ids\n"
    "  --prompt TEXT     prompt text, tokenized with the model's tokenizer (BOS added as its\n"
    "                    tokenizer_config.json says)\n"
    "  --chat            render --prompt as a user message through the chat template first\n"
    "  --tokenizer PATH  tokenizer.json or a folder with it (and tokenizer_config.json);\n"
    "                    default: the model folder\n"
    "  --max-tokens N    tokens to generate at most (default 128)\n"
    "  --temperature T   0 = greedy (default); > 0: sample\n"
    "  --top-p P         nucleus sampling: keep the smallest set of mass >= P (default 1)\n"
    "  --top-k K         keep the K most likely tokens (default -1: off)\n"
    "  --min-p P         drop tokens below P * p_max (default 0)\n"
    "  --repetition-penalty R, --presence-penalty P, --frequency-penalty F\n"
    "                    vLLM's penalties (defaults 1, 0, 0)\n"
    "  --seed S          random seed (default: drawn, and reported in JSON)\n"
    "  --logprobs N      report the chosen token's logprob and the top N (JSON)\n"
    "  --prompt-logprobs N\n"
    "                    report each prompt token's logprob and the top N (JSON, vLLM's\n"
    "                    \"prompt_logprobs\": [null, {\"<id>\": {\"logprob\", \"rank\"?}}, ...];\n"
    "                    rank, 1-based, on the top N entries)\n"
    "  --stop STR        stop at this text (repeatable; removed from the text)\n"
    "  --grammar GBNF, --grammar-file FILE, --json-schema FILE, --regex RE\n"
    "                    constrained generation: the output follows this GBNF grammar\n"
    "                    (llama.cpp's format, start rule \"root\"), is a JSON document\n"
    "                    valid under this JSON Schema, or fully matches this regex; it\n"
    "                    finishes (\"stop\") once nothing more can follow (one of them)\n"
    "  --n N             completions of the prompt (default 1; JSON adds \"choices\")\n"
    "  --ignore-eos      do not stop at the end-of-sequence token\n"
    "  --format FMT      text (default): the generated ids on one line (the text instead\n"
    "                    with --prompt), a speed summary on stderr; json: one object\n"
    "                    {ids, [text,] finish_reason, usage, timing}\n"
    "  --threads N       compute threads; 0 = all cores (default)\n"
    "  --device D        " CLI_DEVICE_HELP "\n"
    "  --batch-invariant, --no-batch-invariant\n"
    "                    results independent of the batch (default), or the faster\n"
    "                    batch-size-dependent kernels (results may differ in the last bits)\n"
    "  -h, --help        show this help\n"
    "\n"
    "exit status: 0 ok, 1 failure (model, memory), 2 bad command line\n";

#define GEN_MAX_STOP  16
#define GEN_MAX(a, b) ((a) > (b) ? (a) : (b))

typedef struct gen_options {
    const char *model_dir, *ids_text, *ids_file, *format, *prompt, *tokenizer, *device;
    const char *grammar, *grammar_file; /* GBNF text, or a file of it */
    const char *json_schema_file, *regex;
    char *grammar_buf, *schema_buf; /* the files' contents, owned */
    int64_t max_tokens, threads, top_k, seed, logprobs, prompt_logprobs, n;
    double temperature, top_p, min_p, rep_pen, pres_pen, freq_pen;
    const char *stop[GEN_MAX_STOP];
    int64_t n_stop;
    bool ignore_eos, json, chat;
    bool batch_invariant, no_batch_invariant;
} gen_options;

/* One completion. */
typedef struct gen_sample {
    int32_t *ids; /* [max_tokens], owned; the first n are the generated tokens */
    int64_t n;
    di_engine_logprobs *lp; /* [max_tokens] with --logprobs, owned (top arrays below) */
    int32_t *top_ids;       /* [max_tokens][logprobs] */
    float *top_lp;
    char *text; /* streamed text (when the engine has a tokenizer), owned */
    int64_t text_len;
    const char *finish_reason;
} gen_sample;

typedef struct gen_result {
    gen_sample *s; /* [n] */
    int64_t n_samples;
    int64_t seed, cached_tokens;
    bool has_text;
    double prefill_s, decode_s;
    int64_t n_decoded; /* tokens after the first of sample 0 */
    /* --prompt-logprobs: positions 1 .. n_prompt - 1 (copied from sample 0's first output) */
    di_engine_logprobs *plp; /* [n_plp], owned (top arrays below) */
    int32_t *plp_ids;        /* [n_plp][prompt_logprobs] */
    float *plp_vals;
    int64_t n_plp;
} gen_result;

/* ---------------------------------------------------------------------------------------- */
/* Options and checks                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* Takes every --stop STR / --stop=STR out of argv (the table parser keeps one value per
 * option); returns the new argc, or -1 after an error. */
static int take_stops(const char *cmd, int argc, char **argv, gen_options *o) {
    int out = 0;
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        if (i > 0 && strcmp(argv[i], "--stop") == 0) {
            if (i + 1 >= argc) return cli_error(CLI_EXIT_USAGE, cmd, "--stop needs a value"), -1;
            v = argv[++i];
        } else if (i > 0 && strncmp(argv[i], "--stop=", 7) == 0) {
            v = argv[i] + 7;
        } else {
            argv[out++] = argv[i];
            continue;
        }
        if (o->n_stop == GEN_MAX_STOP)
            return cli_error(CLI_EXIT_USAGE, cmd, "at most %d --stop strings", GEN_MAX_STOP), -1;
        if (!*v) return cli_error(CLI_EXIT_USAGE, cmd, "--stop: empty string"), -1;
        o->stop[o->n_stop++] = v;
    }
    return out;
}

static int parse_options(const char *cmd, int argc, char **argv, gen_options *o) {
    *o = (gen_options){.format = "text",
                       .max_tokens = 128,
                       .top_k = -1,
                       .seed = -1,
                       .logprobs = -1,
                       .prompt_logprobs = -1,
                       .n = 1,
                       .top_p = 1.0,
                       .rep_pen = 1.0};
    argc = take_stops(cmd, argc, argv, o);
    if (argc < 0) return CLI_EXIT_USAGE;
    const cli_opt opts[] = {
        {"model", CLI_OPT_STRING, &o->model_dir, 0, 0},
        {"ids", CLI_OPT_STRING, &o->ids_text, 0, 0},
        {"ids-file", CLI_OPT_STRING, &o->ids_file, 0, 0},
        {"prompt", CLI_OPT_STRING, &o->prompt, 0, 0},
        {"chat", CLI_OPT_FLAG, &o->chat, 0, 0},
        {"tokenizer", CLI_OPT_STRING, &o->tokenizer, 0, 0},
        {"max-tokens", CLI_OPT_INT, &o->max_tokens, 1, INT32_MAX},
        {"temperature", CLI_OPT_DOUBLE, &o->temperature, 0, 0},
        {"top-p", CLI_OPT_DOUBLE, &o->top_p, 0, 0},
        {"top-k", CLI_OPT_INT, &o->top_k, -1, INT32_MAX},
        {"min-p", CLI_OPT_DOUBLE, &o->min_p, 0, 0},
        {"repetition-penalty", CLI_OPT_DOUBLE, &o->rep_pen, 0, 0},
        {"presence-penalty", CLI_OPT_DOUBLE, &o->pres_pen, 0, 0},
        {"frequency-penalty", CLI_OPT_DOUBLE, &o->freq_pen, 0, 0},
        {"seed", CLI_OPT_INT, &o->seed, -1, INT64_MAX},
        {"logprobs", CLI_OPT_INT, &o->logprobs, 0, DI_SAMPLING_MAX_LOGPROBS},
        {"prompt-logprobs", CLI_OPT_INT, &o->prompt_logprobs, 0, DI_SAMPLING_MAX_LOGPROBS},
        {"n", CLI_OPT_INT, &o->n, 1, 1024},
        {"ignore-eos", CLI_OPT_FLAG, &o->ignore_eos, 0, 0},
        {"grammar", CLI_OPT_STRING, &o->grammar, 0, 0},
        {"grammar-file", CLI_OPT_STRING, &o->grammar_file, 0, 0},
        {"json-schema", CLI_OPT_STRING, &o->json_schema_file, 0, 0},
        {"regex", CLI_OPT_STRING, &o->regex, 0, 0},
        {"format", CLI_OPT_STRING, &o->format, 0, 0},
        {"threads", CLI_OPT_INT, &o->threads, 0, 4096},
        {"device", CLI_OPT_STRING, &o->device, 0, 0},
        {"batch-invariant", CLI_OPT_FLAG, &o->batch_invariant, 0, 0},
        {"no-batch-invariant", CLI_OPT_FLAG, &o->no_batch_invariant, 0, 0},
    };
    int rc = cli_parse(cmd, k_usage, opts, (int)CLI_LEN(opts), argc, argv);
    if (rc != CLI_CONTINUE) return rc;
    if ((rc = cli_check_device(cmd, o->device)) != CLI_CONTINUE) return rc;
    if (o->batch_invariant && o->no_batch_invariant)
        return cli_error(CLI_EXIT_USAGE, cmd,
                         "--batch-invariant and --no-batch-invariant exclude each other");
    if (!(o->model_dir = cli_model_dir(cmd, o->model_dir))) return CLI_EXIT_USAGE;
    if (o->prompt && (o->ids_text || o->ids_file))
        return cli_error(CLI_EXIT_USAGE, cmd, "--prompt cannot be combined with --ids/--ids-file");
    if (o->chat && !o->prompt) return cli_error(CLI_EXIT_USAGE, cmd, "--chat needs --prompt");
    const int n_constraints = !!o->grammar + !!o->grammar_file + !!o->json_schema_file + !!o->regex;
    if (o->tokenizer && !o->prompt && o->n_stop == 0 && n_constraints == 0)
        return cli_error(CLI_EXIT_USAGE, cmd, "--tokenizer needs --prompt, --stop or a constraint");
    if (n_constraints > 1)
        return cli_error(CLI_EXIT_USAGE, cmd,
                         "--grammar, --grammar-file, --json-schema and --regex exclude each other");
    if (o->json_schema_file) {
        size_t len;
        if (!cli_read_file(o->json_schema_file, &o->schema_buf, &len))
            return cli_error(CLI_EXIT_USAGE, cmd, "--json-schema %s: cannot read it",
                             o->json_schema_file);
    }
    if (o->grammar_file) {
        size_t len;
        if (!cli_read_file(o->grammar_file, &o->grammar_buf, &len))
            return cli_error(CLI_EXIT_USAGE, cmd, "--grammar-file %s: cannot read it",
                             o->grammar_file);
        o->grammar = o->grammar_buf;
    }
    if (o->temperature < 0)
        return cli_error(CLI_EXIT_USAGE, cmd, "--temperature %g: must be >= 0", o->temperature);
    return cli_parse_format(cmd, o->format, &o->json);
}

/* The sampling parameters of the options (validated by the library). */
static di_sampling_params sampling_of(const gen_options *o) {
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = (float)o->temperature;
    sp.top_p = (float)o->top_p;
    sp.top_k = (int32_t)o->top_k;
    sp.min_p = (float)o->min_p;
    sp.repetition_penalty = (float)o->rep_pen;
    sp.presence_penalty = (float)o->pres_pen;
    sp.frequency_penalty = (float)o->freq_pen;
    sp.seed = o->seed;
    sp.logprobs = (int32_t)o->logprobs;
    sp.prompt_logprobs = (int32_t)o->prompt_logprobs;
    sp.n = (int32_t)o->n;
    sp.max_tokens = o->max_tokens;
    sp.ignore_eos = o->ignore_eos;
    sp.stop = o->stop;
    sp.n_stop = o->n_stop;
    sp.grammar = o->grammar;
    sp.json_schema = o->schema_buf;
    sp.regex = o->regex;
    return sp;
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

/* Appends one step's output of a completion to its result. */
static void take_output(const di_engine_output *out, const gen_options *o, gen_sample *g) {
    for (int64_t t = 0; t < out->n_tokens && g->n < o->max_tokens; t++, g->n++) {
        g->ids[g->n] = out->tokens[t];
        if (g->lp && out->logprobs) {
            const di_engine_logprobs *l = &out->logprobs[t];
            int64_t N = o->logprobs, k = g->n;
            g->lp[k] = *l;
            g->lp[k].top_ids = g->top_ids + k * N;
            g->lp[k].top_logprobs = g->top_lp + k * N;
            memcpy(g->top_ids + k * N, l->top_ids, (size_t)l->n_top * sizeof(int32_t));
            memcpy(g->top_lp + k * N, l->top_logprobs, (size_t)l->n_top * sizeof(float));
        }
    }
    if (out->text && out->text_len > 0) {
        char *t = realloc(g->text, (size_t)(g->text_len + out->text_len + 1));
        if (t) {
            memcpy(t + g->text_len, out->text, (size_t)out->text_len);
            g->text_len += out->text_len;
            t[g->text_len] = '\0';
            g->text = t;
        }
    }
    if (out->finished) g->finish_reason = di_engine_finish_str(out->finish_reason);
}

/* Copies the prompt logprobs of an output (sample 0's first one carries them). */
static bool take_prompt_logprobs(const di_engine_output *out, gen_result *r) {
    int64_t n = out->n_prompt_logprobs, N = DI_SAMPLING_MAX_LOGPROBS;
    if (!out->prompt_logprobs || r->plp) return true;
    r->plp = calloc((size_t)GEN_MAX(n, 1), sizeof *r->plp);
    r->plp_ids = malloc((size_t)(GEN_MAX(n, 1) * N) * sizeof(int32_t));
    r->plp_vals = malloc((size_t)(GEN_MAX(n, 1) * N) * sizeof(float));
    if (!r->plp || !r->plp_ids || !r->plp_vals) return false;
    for (int64_t i = 0; i < n; i++) {
        const di_engine_logprobs *l = &out->prompt_logprobs[i];
        r->plp[i] = *l;
        r->plp[i].top_ids = r->plp_ids + i * N;
        r->plp[i].top_logprobs = r->plp_vals + i * N;
        memcpy(r->plp_ids + i * N, l->top_ids, (size_t)l->n_top * sizeof(int32_t));
        memcpy(r->plp_vals + i * N, l->top_logprobs, (size_t)l->n_top * sizeof(float));
    }
    r->n_plp = n;
    return true;
}

/* Runs the request through an engine; returns CLI_CONTINUE or an exit code. */
static int generate(const char *cmd, di_model *model, const cli_ids *prompt, const gen_options *o,
                    const di_tokenizer *tok, gen_result *r) {
    r->n_samples = o->n;
    r->s = calloc((size_t)o->n, sizeof *r->s);
    bool ok = r->s != NULL;
    for (int64_t i = 0; ok && i < o->n; i++) {
        gen_sample *g = &r->s[i];
        g->finish_reason = "length";
        ok = (g->ids = malloc((size_t)o->max_tokens * sizeof(int32_t))) != NULL;
        if (ok && o->logprobs >= 0) {
            size_t N = (size_t)DI_SAMPLING_MAX_LOGPROBS;
            g->lp = calloc((size_t)o->max_tokens, sizeof *g->lp);
            g->top_ids = malloc((size_t)o->max_tokens * N * sizeof(int32_t));
            g->top_lp = malloc((size_t)o->max_tokens * N * sizeof(float));
            ok = g->lp && g->top_ids && g->top_lp;
        }
    }
    if (!ok) return cli_error(CLI_EXIT_FAILURE, cmd, "out of memory");

    di_engine_params ep = di_engine_default_params();
    ep.n_threads = (int32_t)o->threads;
    ep.batch_invariant = !o->no_batch_invariant;
    ep.max_model_len = prompt->n + o->max_tokens;
    ep.max_running = (int32_t)o->n;
    /* the whole prompt in one step, as a single-sequence prefill would run it */
    ep.max_batch_tokens = ep.max_prefill_tokens = GEN_MAX(prompt->n + o->n, 64);
    /* text (and stop strings) through the engine's tokenizer when there is one */
    if (tok)
        ep.tokenizer = tok; /* the one that tokenized the prompt: loaded once */
    else if (o->n_stop > 0)
        ep.tokenizer_path = o->tokenizer ? o->tokenizer : o->model_dir;
    di_engine *e = NULL;
    di_status st = di_engine_create(model, &ep, &e);
    if (st) return cli_lib_error(cmd, st);
    di_sampling_params sp = sampling_of(o);
    di_engine_request rq = {.prompt_ids = prompt->v, .n_prompt_ids = prompt->n, .sampling = &sp};
    st = di_engine_add_request(e, &rq);
    int64_t cap = o->n + 1;
    di_engine_output *outs = calloc((size_t)cap, sizeof *outs);
    if (!outs) st = DI_ERR_OUT_OF_MEMORY;
    double t0 = cli_now(), t_first = -1;
    char req_err[300] = "";
    while (st == DI_OK && !req_err[0] && di_engine_has_unfinished(e)) {
        int64_t n = 0;
        st = di_engine_step(e, outs, cap, &n);
        for (int64_t k = 0; st == DI_OK && k < n; k++) {
            gen_sample *g = &r->s[outs[k].sample_index];
            if (outs[k].finish_reason == DI_ENGINE_FINISH_ERROR) {
                snprintf(req_err, sizeof req_err, "%s", outs[k].error);
                break;
            }
            take_output(&outs[k], o, g);
            if (!take_prompt_logprobs(&outs[k], r)) st = DI_ERR_OUT_OF_MEMORY;
            r->seed = outs[k].seed;
            r->has_text = r->has_text || outs[k].text != NULL;
            if (outs[k].sample_index == 0) r->cached_tokens = outs[k].usage.cached_tokens;
            if (t_first < 0 && outs[k].n_tokens > 0) t_first = cli_now();
        }
    }
    double t1 = cli_now();
    if (t_first < 0) t_first = t1;
    r->prefill_s = t_first - t0;
    r->decode_s = t1 - t_first;
    r->n_decoded = r->s[0].n > 0 ? r->s[0].n - 1 : 0;
    free(outs);
    di_engine_free(e);
    if (st != DI_OK) return cli_lib_error(cmd, st);
    if (req_err[0]) return cli_error(CLI_EXIT_FAILURE, cmd, "%s", req_err);
    return CLI_CONTINUE;
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
    st = cli_ids_encode(*tok, text, strlen(text), add_special, out);
    di_free(rendered);
    if (st != DI_OK) return cli_lib_error(cmd, st);
    if (out->n == 0) return cli_error(CLI_EXIT_USAGE, cmd, "--prompt: the prompt has no tokens");
    return CLI_CONTINUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Output                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static double per_second(int64_t n, double seconds) {
    return seconds > 0 ? (double)n / seconds : 0.0;
}

/* [{id, logprob, top: [{id, logprob}, ...]}, ...] */
static json_t *logprobs_json(const gen_sample *g) {
    json_t *arr = json_array();
    for (int64_t t = 0; t < g->n; t++) {
        const di_engine_logprobs *l = &g->lp[t];
        json_t *top = json_array();
        for (int32_t j = 0; j < l->n_top; j++)
            json_array_append_new(top, json_pack("{s:i, s:f}", "id", (int)l->top_ids[j], "logprob",
                                                 (double)l->top_logprobs[j]));
        json_array_append_new(arr, json_pack("{s:i, s:f, s:o}", "id", (int)l->token, "logprob",
                                             (double)l->logprob, "top", top));
    }
    return arr;
}

/* vLLM's prompt_logprobs: [null, {"<id>": {"logprob", "rank"?}, ...}, ...]; the prompt token's
 * entry first, rank (1-based) on the top entries. */
static double finite_lp(float v) { /* JSON has no infinity: -9999.0, as vLLM writes it */
    return v >= -9999.0f ? (double)v : -9999.0;
}

static json_t *prompt_logprobs_json(const gen_result *r) {
    json_t *arr = json_array();
    json_array_append_new(arr, json_null());
    for (int64_t i = 0; i < r->n_plp; i++) {
        const di_engine_logprobs *l = &r->plp[i];
        json_t *pos = json_object();
        char key[16];
        snprintf(key, sizeof key, "%d", (int)l->token);
        json_object_set_new(pos, key, json_pack("{s:f}", "logprob", finite_lp(l->logprob)));
        for (int32_t j = 0; j < l->n_top; j++) {
            snprintf(key, sizeof key, "%d", (int)l->top_ids[j]);
            json_object_set_new(pos, key,
                                json_pack("{s:f, s:i}", "logprob", finite_lp(l->top_logprobs[j]),
                                          "rank", (int)(j + 1)));
        }
        json_array_append_new(arr, pos);
    }
    return arr;
}

/* One completion's fields: ids, [text,] finish_reason, [logprobs]. */
static json_t *sample_json(const gen_result *r, const gen_sample *g) {
    json_t *ids = json_array();
    for (int64_t i = 0; i < g->n; i++)
        json_array_append_new(ids, json_integer(g->ids[i]));
    json_t *o = json_pack("{s:o}", "ids", ids);
    if (o && r->has_text) json_object_set_new(o, "text", json_string(g->text ? g->text : ""));
    if (o) json_object_set_new(o, "finish_reason", json_string(g->finish_reason));
    if (o && g->lp) json_object_set_new(o, "logprobs", logprobs_json(g));
    return o;
}

static int print_json(const char *cmd, const gen_result *r, int64_t n_prompt) {
    const gen_sample *g = &r->s[0];
    int64_t completion = 0;
    for (int64_t i = 0; i < r->n_samples; i++)
        completion += r->s[i].n;
    json_t *usage =
        json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)n_prompt, "completion_tokens",
                  (json_int_t)completion, "cached_tokens", (json_int_t)r->cached_tokens);
    json_t *timing = json_pack("{s:f, s:f, s:f, s:f}", "prefill_s", r->prefill_s, "decode_s",
                               r->decode_s, "prefill_tok_s", per_second(n_prompt, r->prefill_s),
                               "decode_tok_s", per_second(r->n_decoded, r->decode_s));
    json_t *o = sample_json(r, g);
    if (o) {
        json_object_set_new(o, "usage", usage);
        json_object_set_new(o, "timing", timing);
        json_object_set_new(o, "seed", json_integer((json_int_t)r->seed));
        if (r->plp) json_object_set_new(o, "prompt_logprobs", prompt_logprobs_json(r));
    }
    if (o && r->n_samples > 1) {
        json_t *choices = json_array();
        for (int64_t i = 0; i < r->n_samples; i++)
            json_array_append_new(choices, sample_json(r, &r->s[i]));
        json_object_set_new(o, "choices", choices);
    }
    int rc = o ? json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : -1;
    json_decref(o);
    if (rc != 0) return cli_error(CLI_EXIT_FAILURE, cmd, "cannot write JSON to stdout");
    putchar('\n');
    return CLI_EXIT_OK;
}

/* One line per completion: its text (with --prompt) or its ids. */
static int print_text(const gen_result *r, int64_t n_prompt, bool as_text) {
    int64_t total = 0;
    for (int64_t k = 0; k < r->n_samples; k++) {
        const gen_sample *g = &r->s[k];
        total += g->n;
        if (as_text) {
            fputs(g->text ? g->text : "", stdout);
        } else {
            for (int64_t i = 0; i < g->n; i++)
                printf("%s%d", i ? " " : "", (int)g->ids[i]);
        }
        putchar('\n');
    }
    fprintf(stderr, "prompt %lld tok (%.1f tok/s), generated %lld tok (%.1f tok/s)\n",
            (long long)n_prompt, per_second(n_prompt, r->prefill_s), (long long)total,
            per_second(r->n_decoded, r->decode_s));
    return CLI_EXIT_OK;
}

static void result_free(gen_result *r) {
    for (int64_t i = 0; r->s && i < r->n_samples; i++) {
        free(r->s[i].ids);
        free(r->s[i].lp);
        free(r->s[i].top_ids);
        free(r->s[i].top_lp);
        free(r->s[i].text);
    }
    free(r->s);
    free(r->plp);
    free(r->plp_ids);
    free(r->plp_vals);
}

/* ---------------------------------------------------------------------------------------- */
/* Command                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* tok: the tokenizer of a text prompt, or NULL for a prompt of ids. */
static int run(const char *cmd, const gen_options *o, const cli_ids *prompt,
               const di_tokenizer *tok) {
    di_model *model;
    di_model_info info;
    int rc = cli_load_model(cmd, o->model_dir, o->device, o->threads, &model, &info);
    if (rc != CLI_CONTINUE) return rc;
    gen_result r = {0};
    rc = check_request(cmd, prompt, o, &info);
    if (rc == CLI_CONTINUE) rc = generate(cmd, model, prompt, o, tok, &r);
    if (rc == CLI_CONTINUE)
        rc =
            o->json ? print_json(cmd, &r, prompt->n) : print_text(&r, prompt->n, tok && r.has_text);
    result_free(&r);
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
    free(o.grammar_buf);
    free(o.schema_buf);
    return rc;
}
