/*
 * cmd_batch.c -- `deepinfer batch`: runs an OpenAI Batch API input file (JSONL of
 * /v1/completions and /v1/chat/completions requests) through the engine and writes one
 * result line per request, in the order requests finish.
 *
 * Flow:
 *   1. The output file is opened first (an unwritable path fails before the model loads) and
 *      scanned: results already there are skipped, a truncated last line is cut off
 *      (batch_out.h has the durability policy).
 *   2. The input is read whole and each line's custom_id noted, so that a repeated custom_id
 *      is an error for every occurrence after the first, the same in every run.
 *   3. Lines are parsed (src/batch/batch_parse.c), their prompts resolved and checked
 *      (batch_prompt.c) and queued into the engine, at most a window of sequences ahead of
 *      what it is running (2 x --max-running), so that memory does not grow with the input.
 *      A line that fails any check becomes an error line at once; the run goes on.
 *   4. di_engine_step until everything is done; a line's result is written when all its
 *      samples have finished (batch_result.c).
 *
 * Every line is either written completely or not at all, and a rerun on the same output
 * writes exactly the missing ones: a killed run resumes with nothing lost or duplicated.
 * Requests without a seed that sample (temperature > 0) get a fresh seed in each run, so
 * only the seeded or greedy ones are reproducible across a resume.
 */
#define _POSIX_C_SOURCE 200809L /* fileno, stat */
#include "args.h"
#include "batch_out.h"
#include "batch_progress.h"
#include "batch_prompt.h"
#include "batch_result.h"
#include "commands.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char *const k_usage =
    "usage: deepinfer batch [--model DIR] --input IN.jsonl --output OUT.jsonl [options]\n"
    "\n"
    "Runs an OpenAI Batch API file of /v1/completions and /v1/chat/completions requests and\n"
    "writes one result line per request to OUT.jsonl as requests finish. Rerunning with the\n"
    "same output file skips the requests already there (a killed run resumes).\n"
    "\n"
    "options:\n"
    "  --model DIR             checkpoint folder (config.json + *.safetensors);\n"
    "                          default: the bundled model (models/deepseek-v4-tiny)\n"
    "  --input FILE            requests, one JSON object per line                  [required]\n"
    "  --output FILE           results (appended; created if absent)               [required]\n"
    "  --tokenizer PATH        tokenizer.json or a folder with it (and tokenizer_config.json\n"
    "                          with the chat template); default: the model folder\n"
    "  --threads N             compute threads; 0 = all cores (default)\n"
    "  --device D              " CLI_DEVICE_HELP "\n"
    "  --max-batch-tokens N    tokens per engine step (default: the engine's, 2048)\n"
    "  --max-prefill-tokens N  prompt tokens per step (default: 512 on the CPU; on a GPU,\n"
    "                          --max-batch-tokens)\n"
    "  --max-running N         sequences per step (default: the engine's, 64)\n"
    "  --max-model-len N       prompt + output limit (default: the context, at most 4096)\n"
    "  --kv-memory SIZE        KV cache pool, e.g. 512M, 4G (default: what the running\n"
    "                          sequences need, at most 1G on the CPU, half the GPU's free)\n"
    "  --no-prefix-cache       do not reuse the KV of shared prompt prefixes\n"
    "  --disaggregate          separate prefill and decode workers (own threads each; the\n"
    "                          workers' steps and busy seconds are reported at the end)\n"
    "  --prefill-threads N     with --disaggregate: the prefill worker's share of --threads\n"
    "                          (default half; the decode worker gets the rest, at least 1)\n"
    "  --overlap, --no-overlap schedule the next step while this one runs (default on a\n"
    "                          GPU, where the next decode step is queued behind the running\n"
    "                          one; off on the CPU); not with --disaggregate\n"
    "  --batch-invariant, --no-batch-invariant\n"
    "                          results independent of the batch (default), or the faster\n"
    "                          batch-size-dependent kernels (may differ in the last bits)\n"
    "  --progress-interval S   seconds between progress lines when stderr is not a terminal\n"
    "                          (default 10; 0 = after every finished request)\n"
    "  --sync-interval S       seconds between fdatasync of the output (default 1)\n"
    "  --quiet                 no progress output\n"
    "  -h, --help              show this help\n"
    "\n"
    "exit status: 0 ok (failed requests are error lines, not failures), 1 failure (model,\n"
    "files, memory), 2 bad command line\n";

typedef struct batch_options {
    const char *model_dir, *input, *output, *tokenizer, *kv_memory, *device;
    int64_t threads, max_batch_tokens, max_prefill_tokens, max_running, max_model_len;
    int64_t prefill_threads;
    int64_t kv_bytes;
    double progress_interval, sync_interval;
    bool no_prefix_cache, disaggregate, quiet;
    bool batch_invariant, no_batch_invariant;
    bool overlap, no_overlap;
} batch_options;

/* One non-blank input line. */
typedef struct batch_line {
    size_t off, len;
    int64_t lineno;     /* 1-based */
    char *custom_id;    /* NULL when none could be read */
    int64_t first_line; /* > 0: the custom_id already appeared on that line */
} batch_line;

typedef struct batch_input {
    char *text; /* the whole file, owned */
    batch_line *lines;
    int64_t n_lines;
} batch_input;

/* Lines queued in the engine sit in slots. An engine request id is
 *     serial << 32 | slot << 10 | prompt index
 * with serial counting entries, so an id is never reused (the engine may still know a
 * finished request for a while). */
#define BATCH_PROMPT_BITS 10
#define BATCH_SLOT_BITS   22
typedef struct batch_run {
    const char *cmd;
    di_engine *engine;
    batch_prompts prompts;
    batch_out out;
    batch_progress progress;
    batch_result_ctx rctx;
    char model_name[256]; /* the model folder's name, as valid UTF-8 */
    batch_entry **slots;  /* [n_slots]; NULL = free */
    uint32_t *serials;    /* [n_slots] serial of the entry in each slot */
    int32_t n_slots;
    uint32_t next_serial;
    int64_t inflight_seqs, window;
    di_engine_output *outputs; /* [out_cap] */
    int64_t out_cap;
    bool write_failed;
    char write_error[320];
} batch_run;

/* ---------------------------------------------------------------------------------------- */
/* Options                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* "512M", "4G", "1.5GiB", "1048576" -> bytes (binary multiples). */
static bool parse_size(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0) || !isfinite(v)) return false;
    double mult = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mult = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mult = 1024.0 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        mult = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 't':
    case 'T':
        mult = 1024.0 * 1024 * 1024 * 1024;
        end++;
        break;
    default:
        break;
    }
    if (mult > 1 && *end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return false;
    double bytes = v * mult;
    if (bytes < 1 || bytes > 9.0e18) return false;
    *out = (int64_t)bytes;
    return true;
}

static int parse_options(const char *cmd, int argc, char **argv, batch_options *o) {
    *o = (batch_options){.progress_interval = 10, .sync_interval = 1};
    const cli_opt opts[] = {
        {"model", CLI_OPT_STRING, &o->model_dir, 0, 0},
        {"input", CLI_OPT_STRING, &o->input, 0, 0},
        {"output", CLI_OPT_STRING, &o->output, 0, 0},
        {"tokenizer", CLI_OPT_STRING, &o->tokenizer, 0, 0},
        {"threads", CLI_OPT_INT, &o->threads, 0, 4096},
        {"device", CLI_OPT_STRING, &o->device, 0, 0},
        {"max-batch-tokens", CLI_OPT_INT, &o->max_batch_tokens, 1, INT32_MAX},
        {"max-prefill-tokens", CLI_OPT_INT, &o->max_prefill_tokens, 1, INT32_MAX},
        {"max-running", CLI_OPT_INT, &o->max_running, 1, 65536},
        {"max-model-len", CLI_OPT_INT, &o->max_model_len, 1, INT32_MAX},
        {"kv-memory", CLI_OPT_STRING, &o->kv_memory, 0, 0},
        {"no-prefix-cache", CLI_OPT_FLAG, &o->no_prefix_cache, 0, 0},
        {"disaggregate", CLI_OPT_FLAG, &o->disaggregate, 0, 0},
        {"prefill-threads", CLI_OPT_INT, &o->prefill_threads, 1, 4096},
        {"progress-interval", CLI_OPT_DOUBLE, &o->progress_interval, 0, 0},
        {"sync-interval", CLI_OPT_DOUBLE, &o->sync_interval, 0, 0},
        {"quiet", CLI_OPT_FLAG, &o->quiet, 0, 0},
        {"batch-invariant", CLI_OPT_FLAG, &o->batch_invariant, 0, 0},
        {"no-batch-invariant", CLI_OPT_FLAG, &o->no_batch_invariant, 0, 0},
        {"overlap", CLI_OPT_FLAG, &o->overlap, 0, 0},
        {"no-overlap", CLI_OPT_FLAG, &o->no_overlap, 0, 0},
    };
    int rc = cli_parse(cmd, k_usage, opts, (int)CLI_LEN(opts), argc, argv);
    if (rc != CLI_CONTINUE) return rc;
    if ((rc = cli_check_device(cmd, o->device)) != CLI_CONTINUE) return rc;
    if (o->batch_invariant && o->no_batch_invariant)
        return cli_error(CLI_EXIT_USAGE, cmd,
                         "--batch-invariant and --no-batch-invariant exclude each other");
    if (o->overlap && o->no_overlap)
        return cli_error(CLI_EXIT_USAGE, cmd, "--overlap and --no-overlap exclude each other");
    if (o->overlap && o->disaggregate)
        return cli_error(CLI_EXIT_USAGE, cmd, "--overlap and --disaggregate exclude each other");
    if (o->prefill_threads && !o->disaggregate)
        return cli_error(CLI_EXIT_USAGE, cmd, "--prefill-threads needs --disaggregate");
    if (!(o->model_dir = cli_model_dir(cmd, o->model_dir))) return CLI_EXIT_USAGE;
    if (!o->input) return cli_missing(cmd, "input");
    if (!o->output) return cli_missing(cmd, "output");
    if (o->kv_memory && !parse_size(o->kv_memory, &o->kv_bytes))
        return cli_error(CLI_EXIT_USAGE, cmd,
                         "--kv-memory \"%s\": expected a size such as 512M, 4G or 1073741824",
                         o->kv_memory);
    if (o->progress_interval < 0 || o->sync_interval < 0)
        return cli_error(CLI_EXIT_USAGE, cmd, "--progress-interval / --sync-interval must be >= 0");
    return CLI_CONTINUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Input                                                                                      */
/* ---------------------------------------------------------------------------------------- */

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

/* Splits the input into lines and notes custom_ids and their repeats. */
static int load_input(const char *cmd, const char *path, batch_input *in) {
    size_t len;
    if (!cli_read_file(path, &in->text, &len))
        return cli_error(CLI_EXIT_FAILURE, cmd, "--input %s: cannot read: %s", path,
                         strerror(errno));
    int64_t cap = 0;
    batch_set seen = {0}; /* custom_id -> line of its first occurrence */
    int64_t lineno = 0;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(in->text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - in->text) : len;
        lineno++;
        if (!is_blank(in->text + at, end - at)) {
            if (in->n_lines == cap) {
                cap = cap ? cap * 2 : 256;
                batch_line *l = realloc(in->lines, (size_t)cap * sizeof *l);
                if (!l) {
                    batch_set_free(&seen);
                    return cli_error(CLI_EXIT_FAILURE, cmd, "out of memory");
                }
                in->lines = l;
            }
            batch_line *l = &in->lines[in->n_lines++];
            *l = (batch_line){.off = at, .len = end - at, .lineno = lineno};
            l->custom_id = di_batch_line_custom_id(in->text + at, end - at);
            int64_t first = 0;
            if (l->custom_id && !batch_set_put(&seen, l->custom_id, lineno, &first)) {
                if (first < 0) {
                    batch_set_free(&seen);
                    return cli_error(CLI_EXIT_FAILURE, cmd, "out of memory");
                }
                l->first_line = first;
            }
        }
        at = nl ? end + 1 : len;
    }
    batch_set_free(&seen);
    return CLI_CONTINUE;
}

static void free_input(batch_input *in) {
    for (int64_t i = 0; i < in->n_lines; i++)
        di_free(in->lines[i].custom_id);
    free(in->lines);
    free(in->text);
}

/* A line's result is keyed by its custom_id when it is the first with it, else by line. */
static bool line_keyed(const batch_line *l) {
    return !l->custom_id || l->first_line > 0;
}

static bool already_done(const batch_out *out, const batch_line *l) {
    if (!line_keyed(l)) return batch_set_has(&out->done_ids, l->custom_id);
    char key[48];
    batch_line_key(l->lineno, key, sizeof key);
    return batch_set_has(&out->done_lines, key);
}

/* ---------------------------------------------------------------------------------------- */
/* Results                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static void write_line(batch_run *r, char *text) {
    if (!text) {
        r->write_failed = true;
        snprintf(r->write_error, sizeof r->write_error, "out of memory building a result");
        return;
    }
    if (!r->write_failed &&
        !batch_out_write_line(&r->out, text, r->write_error, sizeof r->write_error))
        r->write_failed = true;
    free(text);
    r->progress.done++;
    r->progress.done_here++;
    batch_out_maybe_sync(&r->out, cli_now());
    batch_progress_update(&r->progress, r->progress.interval_s <= 0);
}

static void write_error(batch_run *r, const batch_line *l, const char *custom_id,
                        const di_batch_error *err) {
    r->progress.errors++;
    write_line(r, batch_error_line(l->lineno, custom_id, line_keyed(l), err->code, err->message));
}

/* All samples of the entry in slot finished: write its line and free the slot. */
static void finish_entry(batch_run *r, int32_t slot) {
    batch_entry *e = r->slots[slot];
    if (e->failed) {
        r->progress.errors++;
        write_line(r, batch_error_line(e->line, e->req.custom_id, e->line_keyed, e->error.code,
                                       e->error.message));
    } else {
        write_line(r, batch_result_line(e, &r->rctx));
    }
    r->inflight_seqs -= (int64_t)e->n_prompts * e->n;
    batch_entry_free(e);
    free(e);
    r->slots[slot] = NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Queueing                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static int32_t free_slot(const batch_run *r) {
    for (int32_t i = 0; i < r->n_slots; i++)
        if (!r->slots[i]) return i;
    return -1;
}

static uint64_t engine_id(const batch_run *r, int32_t slot, int32_t prompt) {
    return (uint64_t)r->serials[slot] << 32 | (uint64_t)slot << BATCH_PROMPT_BITS |
           (uint32_t)prompt;
}

/* Adds the entry's prompts to the engine. On a failure after some were added, those are
 * aborted and the entry becomes an error line when their abort records arrive. */
static void submit(batch_run *r, batch_entry *e, int32_t slot, int32_t **ids, int64_t *n_ids) {
    r->slots[slot] = e;
    r->serials[slot] = ++r->next_serial;
    r->inflight_seqs += (int64_t)e->n_prompts * e->n;
    for (int32_t p = 0; p < e->n_prompts; p++) {
        di_engine_request q = {.prompt_ids = ids[p],
                               .n_prompt_ids = n_ids[p],
                               .sampling = &e->req.sampling,
                               .id = engine_id(r, slot, p),
                               .id_str = e->req.custom_id};
        di_status st = di_engine_add_request(r->engine, &q);
        if (st == DI_OK) continue;
        e->failed = true;
        snprintf(e->error.code, sizeof e->error.code, "%s",
                 st == DI_ERR_INVALID_ARG || st == DI_ERR_NOT_FOUND || st == DI_ERR_RANGE ||
                         st == DI_ERR_UNSUPPORTED
                     ? "invalid_parameter"
                     : "engine_error");
        snprintf(e->error.message, sizeof e->error.message, "%s", di_last_error());
        e->n_open -= (e->n_prompts - p) * e->n; /* never queued: nothing will report them */
        for (int32_t k = 0; k < p; k++)
            di_engine_abort(r->engine, engine_id(r, slot, k));
        break;
    }
    if (e->n_open == 0) finish_entry(r, slot);
}

/* Parses and checks one line; queues it, or writes its error line. Returns false when it
 * must wait for room in the window (nothing done then). */
static bool queue_line(batch_run *r, const batch_line *l, const char *text) {
    di_batch_error err;
    if (l->first_line > 0) {
        snprintf(err.code, sizeof err.code, "duplicate_custom_id");
        snprintf(err.message, sizeof err.message,
                 "custom_id \"%.200s\" already appears on line %lld", l->custom_id,
                 (long long)l->first_line);
        write_error(r, l, l->custom_id, &err);
        return true;
    }
    batch_entry *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err.code, sizeof err.code, "internal_error");
        snprintf(err.message, sizeof err.message, "out of memory");
        write_error(r, l, l->custom_id, &err);
        return true;
    }
    e->line = l->lineno;
    e->line_keyed = line_keyed(l);
    if (di_batch_parse_line(text, l->len, &e->req, &err) != DI_OK) {
        write_error(r, l, e->req.custom_id, &err);
        batch_entry_free(e);
        free(e);
        return true;
    }
    int32_t np = e->req.endpoint == DI_BATCH_CHAT ? 1 : e->req.n_prompts;
    int64_t seqs = (int64_t)np * e->req.sampling.n;
    int32_t slot = free_slot(r);
    if (slot < 0 || (r->inflight_seqs > 0 && r->inflight_seqs + seqs > r->window)) {
        batch_entry_free(e);
        free(e);
        return false;
    }
    int32_t **ids = calloc((size_t)np, sizeof(int32_t *));
    int64_t *n_ids = calloc((size_t)np, sizeof(int64_t));
    bool ok = ids && n_ids && batch_entry_init(e, np, e->req.sampling.n);
    if (!ok) {
        snprintf(err.code, sizeof err.code, "internal_error");
        snprintf(err.message, sizeof err.message, "out of memory");
    } else {
        ok = batch_prompts_resolve(&r->prompts, &e->req, ids, n_ids, &err);
    }
    if (ok) {
        submit(r, e, slot, ids, n_ids);
        for (int32_t p = 0; p < np; p++)
            free(ids[p]);
    } else {
        write_error(r, l, e->req.custom_id, &err);
        batch_entry_free(e);
        free(e);
    }
    free(ids);
    free(n_ids);
    return true;
}

/* ---------------------------------------------------------------------------------------- */
/* The loop                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Hands one step's records to their entries. */
static int take_outputs(batch_run *r, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const di_engine_output *o = &r->outputs[i];
        int32_t slot = (int32_t)((o->id >> BATCH_PROMPT_BITS) & ((1u << BATCH_SLOT_BITS) - 1));
        int32_t prompt = (int32_t)(o->id & ((1u << BATCH_PROMPT_BITS) - 1));
        if (slot >= r->n_slots || !r->slots[slot] || r->serials[slot] != (uint32_t)(o->id >> 32))
            continue;
        r->progress.tokens += o->n_tokens;
        if (!batch_entry_add_output(r->slots[slot], prompt, o))
            return cli_error(CLI_EXIT_FAILURE, r->cmd, "out of memory");
        if (r->slots[slot]->n_open == 0) finish_entry(r, slot);
    }
    return CLI_CONTINUE;
}

static int run_all(batch_run *r, const batch_input *in) {
    int64_t next = 0;
    for (;;) {
        while (next < in->n_lines && !r->write_failed) {
            const batch_line *l = &in->lines[next];
            if (already_done(&r->out, l)) {
                next++;
                continue;
            }
            if (r->inflight_seqs >= r->window) break; /* full: no need to parse it yet */
            if (!queue_line(r, l, in->text + l->off)) break;
            next++;
        }
        if (r->write_failed) return cli_error(CLI_EXIT_FAILURE, r->cmd, "%s", r->write_error);
        if (!di_engine_has_unfinished(r->engine)) {
            if (next >= in->n_lines) break;
            if (r->inflight_seqs > 0)
                return cli_error(CLI_EXIT_FAILURE, r->cmd,
                                 "internal error: requests in flight but the engine is idle");
            continue;
        }
        int64_t n = 0;
        di_status st = di_engine_step(r->engine, r->outputs, r->out_cap, &n);
        if (st != DI_OK) return cli_lib_error(r->cmd, st);
        int rc = take_outputs(r, n);
        if (rc != CLI_CONTINUE) return rc;
        batch_progress_update(&r->progress, false);
    }
    return r->write_failed ? cli_error(CLI_EXIT_FAILURE, r->cmd, "%s", r->write_error)
                           : CLI_CONTINUE;
}

static const char *base_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    const char *s = path + n;
    while (s > path && s[-1] != '/')
        s--;
    return s;
}

static di_engine_params engine_params(const batch_options *o) {
    di_engine_params ep = di_engine_default_params();
    ep.n_threads = (int32_t)o->threads;
    if (o->max_batch_tokens) ep.max_batch_tokens = o->max_batch_tokens;
    if (o->max_prefill_tokens)
        ep.max_prefill_tokens = o->max_prefill_tokens; /* else the engine's */
    if (o->max_running) ep.max_running = (int32_t)o->max_running;
    if (o->max_model_len) ep.max_model_len = o->max_model_len;
    if (o->kv_bytes) ep.kv_memory_bytes = o->kv_bytes;
    ep.enable_prefix_cache = !o->no_prefix_cache;
    ep.disaggregate = o->disaggregate;
    ep.prefill_threads = (int32_t)o->prefill_threads;
    ep.batch_invariant = !o->no_batch_invariant;
    /* On a GPU the overlap loop is the engine's device loop (engine.c): 2-11 % more output
     * tokens/s on the H200 (src/backend/cuda/NOTES.md, nineteenth round). */
    const bool on_device = o->device && strncmp(o->device, "cuda", 4) == 0;
    ep.overlap = o->overlap || (on_device && !o->no_overlap && !o->disaggregate);
    ep.tokenizer_path = o->tokenizer;
    return ep;
}

/* Model, engine, tokenizer; then the loop. */
static int serve(const char *cmd, const batch_options *o, const batch_input *in, batch_run *r) {
    di_model *model;
    di_model_info info;
    int rc = cli_load_model(cmd, o->model_dir, o->device, o->threads, &model, &info);
    if (rc != CLI_CONTINUE) return rc;
    di_engine_params ep = engine_params(o);
    int64_t max_len = ep.max_model_len > 0 ? ep.max_model_len
                                           : (info.max_context < 4096 ? info.max_context : 4096);
    batch_prompts_init(&r->prompts, o->model_dir, o->tokenizer, info.vocab_size, max_len);
    if (r->prompts.tok) ep.tokenizer = r->prompts.tok; /* one tokenizer for both */
    di_status st = di_engine_create(model, &ep, &r->engine);
    if (st != DI_OK) {
        rc = cli_lib_error(cmd, st);
        batch_prompts_free(&r->prompts);
        di_model_free(model);
        return rc;
    }
    snprintf(r->model_name, sizeof r->model_name, "%s", base_name(o->model_dir));
    batch_utf8_sanitize(r->model_name);
    r->rctx = (batch_result_ctx){
        .tok = r->prompts.tok, .model_name = r->model_name, .created = (int64_t)time(NULL)};
    int32_t max_running = ep.max_running > 0 ? ep.max_running : 64;
    r->window = 2 * (int64_t)max_running > 16 ? 2 * (int64_t)max_running : 16;
    r->n_slots = (int32_t)r->window; /* < 2^BATCH_SLOT_BITS: --max-running <= 65536 */
    r->slots = calloc((size_t)r->n_slots, sizeof *r->slots);
    r->serials = calloc((size_t)r->n_slots, sizeof *r->serials);
    r->out_cap = di_engine_output_cap(r->engine);
    r->outputs = calloc((size_t)(r->out_cap > 0 ? r->out_cap : 1), sizeof *r->outputs);
    if (!r->slots || !r->serials || !r->outputs)
        rc = cli_error(CLI_EXIT_FAILURE, cmd, "out of memory");
    if (rc == CLI_CONTINUE) rc = run_all(r, in);
    if (rc == CLI_CONTINUE && o->disaggregate && !o->quiet) {
        di_engine_stats es;
        di_engine_get_stats(r->engine, &es);
        fprintf(stderr,
                "batch: prefill worker %lld steps, %.3f s busy; decode worker %lld steps, "
                "%.3f s busy; %.3f s in all\n",
                (long long)es.n_prefill_steps, es.time_prefill_busy_s, (long long)es.n_decode_steps,
                es.time_decode_busy_s, es.time_total_s);
    }
    for (int32_t i = 0; r->slots && i < r->n_slots; i++)
        if (r->slots[i]) {
            batch_entry_free(r->slots[i]);
            free(r->slots[i]);
        }
    free(r->slots);
    free(r->serials);
    free(r->outputs);
    di_engine_free(r->engine); /* before the tokenizer it borrows */
    batch_prompts_free(&r->prompts);
    di_model_free(model);
    return rc;
}

static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

int cmd_batch(int argc, char **argv) {
    const char *cmd = "batch";
    batch_options o;
    int rc = parse_options(cmd, argc, argv, &o);
    if (rc != CLI_CONTINUE) return rc;
    if (same_file(o.input, o.output))
        return cli_error(CLI_EXIT_USAGE, cmd, "--output %s is the input file", o.output);
    batch_input in = {0};
    rc = load_input(cmd, o.input, &in);
    if (rc != CLI_CONTINUE) {
        free_input(&in);
        return rc;
    }
    batch_run r = {.cmd = cmd};
    char err[320];
    if (!batch_out_open(&r.out, o.output, o.sync_interval, err, sizeof err)) {
        free_input(&in);
        return cli_error(CLI_EXIT_FAILURE, cmd, "%s", err);
    }
    int64_t done = 0;
    for (int64_t i = 0; i < in.n_lines; i++)
        done += already_done(&r.out, &in.lines[i]);
    batch_progress_init(&r.progress, in.n_lines, done, o.progress_interval, o.quiet);
    if (done > 0 && !o.quiet)
        fprintf(stderr, "batch: resuming: %lld of %lld requests already have a result in %s\n",
                (long long)done, (long long)in.n_lines, o.output);
    rc = serve(cmd, &o, &in, &r);
    if (!batch_out_close(&r.out, err, sizeof err) && rc == CLI_CONTINUE)
        rc = cli_error(CLI_EXIT_FAILURE, cmd, "%s", err);
    if (rc == CLI_CONTINUE) batch_progress_finish(&r.progress);
    free_input(&in);
    return rc == CLI_CONTINUE ? CLI_EXIT_OK : rc;
}
