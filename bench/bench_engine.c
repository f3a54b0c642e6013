/*
 * bench_engine.c -- serving throughput and latency of the engine (not a test; never run by
 * ctest). Driven by bench/engine_throughput.py, which sweeps it and draws the plots.
 *
 *   bench_engine --model DIR [--mode engine|context] [--concurrency C] [--requests N]
 *                [--prompt-len P] [--gen-len G] [--shared-prefix S] [--threads T]
 *                [--max-running M] [--max-batch-tokens B] [--max-prefill-tokens F]
 *                [--no-prefix-cache] [--seed X]
 *                [--no-batch-invariant] [--overlap] [--device cpu|cuda|cuda:N]
 *                [--temperature T] [--top-p P] [--warmup]
 *
 * engine:  a closed loop over di_engine: C requests in flight, a new one submitted as soon as
 *          one finishes, N in all. Each prompt is S ids shared by every request (a "system
 *          prompt", for the prefix cache) then P ids of its own; greedy (or sampled with
 *          --temperature / --top-p, seed = the request's index), ignore_eos, G tokens.
 *          --overlap runs the engine's overlap loop (forward on a compute thread).
 *          --warmup first runs C requests of the same prompt length for 2 tokens, untimed:
 *          the kernels' first launches and the decode graph of C sequences happen there, as
 *          a serving engine's happen before its first client (transformers' side of
 *          bench/gpu_vs_transformers.py runs a warm-up generate too).
 * context: the one-request-at-a-time baseline: di_context prefill, then G - 1 single-token
 *          evals, request after request (what `deepinfer generate` does).
 *
 * Prints one JSON object: output tokens/s over the wall time; TTFT (submission to the step
 * that returned the first token) and inter-token latency (time between a request's token
 * deliveries) percentiles; the engine's stats (scheduler / device / post-process seconds);
 * the compute wait (engine mode): the share of the wall time during which no forward ran,
 * i.e. the thread that drives the forward (the compute thread with --overlap) sat idle
 * between steps waiting for scheduling, post-processing and the client loop;
 * and, for the roofline, pure-decode steps bucketed by batch size: [batch, steps, mean s,
 * mean routed-expert loads per step] (the engine's n_expert_loads; 0 where not counted).
 * --device runs the model there (di_model_params.device; default the CPU).
 */
#include "deepinfer.h"
#include "bench_samples.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct bench_opts {
    const char *model, *mode, *device;
    int64_t concurrency, requests, prompt_len, gen_len, shared_prefix, threads, max_running,
        max_batch_tokens, max_prefill_tokens, seed;
    bool no_prefix_cache, no_batch_invariant, overlap, warmup;
    double temperature, top_p;
} bench_opts;

/* Request i's prompt: the shared prefix, then its own ids. */
static void make_prompt(const bench_opts *o, const int32_t *prefix, int64_t vocab, int32_t *out) {
    memcpy(out, prefix, (size_t)o->shared_prefix * sizeof(int32_t));
    for (int64_t k = 0; k < o->prompt_len; k++)
        out[o->shared_prefix + k] = rand_id(vocab);
}

/* ---------------------------------------------------------------------------------------- */
/* Engine mode                                                                                */
/* ---------------------------------------------------------------------------------------- */

typedef struct req_time {
    double submit, last;
    bool got_first;
} req_time;

/* Pure-decode steps by batch size (index = tokens generated in the step). */
typedef struct step_buckets {
    int64_t *count;
    double *seconds;
    double *expert_loads; /* the engine's n_expert_loads over those steps (0: not counted) */
    int64_t cap;
} step_buckets;

/* A request's sampling: greedy, or --temperature / --top-p; ignore_eos, max_tokens new ones. */
static di_sampling_params request_sampling(const bench_opts *o, int64_t max_tokens) {
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = (float)o->temperature;
    sp.top_p = (float)o->top_p;
    sp.ignore_eos = true;
    sp.max_tokens = max_tokens;
    return sp;
}

/* --warmup: o->concurrency requests of 2 tokens (at most gen_len), run to the end. Their
 * prompts come from a random stream of their own, so the timed prompts are the ones a run
 * without a warm-up draws (the shared prefix, if any, stays cached, as in a running server). */
static int warm_up(di_engine *e, const bench_opts *o, const int32_t *prefix, int64_t vocab,
                   int32_t *prompt, di_engine_output *outs, int64_t cap) {
    const uint64_t timed_rng = g_rng;
    g_rng = ~timed_rng;
    di_sampling_params sp = request_sampling(o, o->gen_len < 2 ? o->gen_len : 2);
    for (int64_t i = 0; i < o->concurrency; i++) {
        make_prompt(o, prefix, vocab, prompt);
        sp.seed = o->requests + i; /* seeds the timed requests do not use */
        di_engine_request q = {.prompt_ids = prompt,
                               .n_prompt_ids = o->shared_prefix + o->prompt_len,
                               .sampling = &sp,
                               .id = (uint64_t)i};
        if (di_engine_add_request(e, &q) != DI_OK) return 1;
    }
    g_rng = timed_rng;
    while (di_engine_has_unfinished(e)) {
        int64_t n = 0;
        if (di_engine_step(e, outs, cap, &n) != DI_OK) return 1;
    }
    return 0;
}

static int run_engine(const bench_opts *o, di_model *model, const di_model_info *info,
                      json_t *out) {
    di_engine_params ep = di_engine_default_params();
    ep.n_threads = (int32_t)o->threads;
    if (o->max_running) ep.max_running = (int32_t)o->max_running;
    if (o->max_batch_tokens) ep.max_batch_tokens = o->max_batch_tokens;
    if (o->max_prefill_tokens) ep.max_prefill_tokens = o->max_prefill_tokens; /* engine caps it */
    ep.enable_prefix_cache = !o->no_prefix_cache;
    ep.batch_invariant = !o->no_batch_invariant;
    ep.overlap = o->overlap;
    di_engine *e;
    if (di_engine_create(model, &ep, &e) != DI_OK) {
        fprintf(stderr, "bench_engine: %s\n", di_last_error());
        return 1;
    }
    int64_t plen = o->shared_prefix + o->prompt_len;
    int32_t *prefix = malloc((size_t)(o->shared_prefix + 1) * sizeof(int32_t));
    int32_t *prompt = malloc((size_t)plen * sizeof(int32_t));
    req_time *rt = calloc((size_t)o->requests, sizeof *rt);
    int64_t cap = di_engine_output_cap(e);
    di_engine_output *outs = calloc((size_t)cap, sizeof *outs);
    step_buckets sb = {.cap = ep.max_running + 1};
    sb.count = calloc((size_t)sb.cap, sizeof(int64_t));
    sb.seconds = calloc((size_t)sb.cap, sizeof(double));
    sb.expert_loads = calloc((size_t)sb.cap, sizeof(double));
    for (int64_t k = 0; k < o->shared_prefix; k++)
        prefix[k] = rand_id(info->vocab_size);
    di_sampling_params sp = request_sampling(o, o->gen_len);
    samples ttft = {0}, itl = {0};
    int rc = o->warmup ? warm_up(e, o, prefix, info->vocab_size, prompt, outs, cap) : 0;
    if (rc) fprintf(stderr, "bench_engine: warm-up: %s\n", di_last_error());
    di_engine_stats st0; /* the warm-up's share of the engine's counters, subtracted below */
    di_engine_get_stats(e, &st0);
    int64_t submitted = 0, finished = 0, in_flight = 0, tokens = 0;
    int64_t prev_prompt_tokens = st0.n_prompt_tokens;
    int64_t prev_loads = st0.n_expert_loads; /* without --overlap a step's delta is that step's */
    double t0 = now_s();
    while (finished < o->requests && rc == 0) {
        while (in_flight < o->concurrency && submitted < o->requests) {
            make_prompt(o, prefix, info->vocab_size, prompt);
            sp.seed = submitted;
            di_engine_request q = {.prompt_ids = prompt,
                                   .n_prompt_ids = plen,
                                   .sampling = &sp,
                                   .id = (uint64_t)submitted};
            rt[submitted].submit = now_s();
            if (di_engine_add_request(e, &q) != DI_OK) {
                fprintf(stderr, "bench_engine: %s\n", di_last_error());
                rc = 1;
                break;
            }
            submitted++;
            in_flight++;
        }
        int64_t n = 0;
        double ts = now_s();
        if (rc || di_engine_step(e, outs, cap, &n) != DI_OK) {
            rc = 1;
            break;
        }
        double te = now_s();
        di_engine_stats st;
        di_engine_get_stats(e, &st);
        int64_t step_tokens = 0;
        for (int64_t i = 0; i < n; i++) {
            req_time *r = &rt[outs[i].id];
            if (outs[i].n_tokens > 0) {
                step_tokens += outs[i].n_tokens;
                if (!r->got_first)
                    push(&ttft, te - r->submit);
                else
                    push(&itl, (te - r->last) / (double)outs[i].n_tokens);
                r->got_first = true;
                r->last = te;
            }
            if (outs[i].finished) {
                finished++;
                in_flight--;
            }
        }
        tokens += step_tokens;
        if (st.n_prompt_tokens == prev_prompt_tokens && step_tokens > 0 && step_tokens < sb.cap) {
            sb.count[step_tokens]++;
            sb.seconds[step_tokens] += te - ts;
            sb.expert_loads[step_tokens] += (double)(st.n_expert_loads - prev_loads);
        }
        prev_prompt_tokens = st.n_prompt_tokens;
        prev_loads = st.n_expert_loads;
    }
    double wall = now_s() - t0;
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    st.n_steps -= st0.n_steps;
    st.n_prompt_tokens -= st0.n_prompt_tokens;
    st.n_generated_tokens -= st0.n_generated_tokens;
    st.prefix_cache_hit_tokens -= st0.prefix_cache_hit_tokens;
    st.n_preemptions -= st0.n_preemptions;
    st.time_schedule_s -= st0.time_schedule_s;
    st.time_device_s -= st0.time_device_s;
    st.time_postprocess_s -= st0.time_postprocess_s;
    st.time_total_s -= st0.time_total_s;
    json_t *steps = json_array();
    for (int64_t b = 1; b < sb.cap; b++)
        if (sb.count[b])
            json_array_append_new(steps,
                                  json_pack("[I, I, f, f]", (json_int_t)b, (json_int_t)sb.count[b],
                                            sb.seconds[b] / (double)sb.count[b],
                                            sb.expert_loads[b] / (double)sb.count[b]));
    json_object_set_new(out, "wall_s", json_real(wall));
    json_object_set_new(out, "output_tokens", json_integer(tokens));
    json_object_set_new(out, "output_tok_s", json_real(wall > 0 ? (double)tokens / wall : 0));
    json_object_set_new(out, "ttft_s", percentiles(&ttft));
    json_object_set_new(out, "itl_s", percentiles(&itl));
    json_object_set_new(
        out, "stats",
        json_pack("{s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f}", "n_steps",
                  (json_int_t)st.n_steps, "n_prompt_tokens", (json_int_t)st.n_prompt_tokens,
                  "n_generated_tokens", (json_int_t)st.n_generated_tokens,
                  "prefix_cache_hit_tokens", (json_int_t)st.prefix_cache_hit_tokens,
                  "n_preemptions", (json_int_t)st.n_preemptions, "time_schedule_s",
                  st.time_schedule_s, "time_device_s", st.time_device_s, "time_postprocess_s",
                  st.time_postprocess_s, "time_total_s", st.time_total_s));
    json_object_set_new(out, "decode_steps", steps);
    /* The compute thread (with --overlap; else the caller, which runs the forward inline) is
     * busy exactly during the forwards (time_device_s); the rest of the loop's wall time it
     * waits for the scheduler, post-processing and this loop's own request handling. */
    const double wait = wall - st.time_device_s;
    json_object_set_new(out, "compute_wait_s", json_real(wait));
    json_object_set_new(out, "compute_wait_frac", json_real(wall > 0 ? wait / wall : 0));
    free(ttft.v);
    free(itl.v);
    free(sb.count);
    free(sb.seconds);
    free(sb.expert_loads);
    free(outs);
    free(rt);
    free(prompt);
    free(prefix);
    di_engine_free(e);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* One request at a time over di_context                                                      */
/* ---------------------------------------------------------------------------------------- */

static int32_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

static int run_context(const bench_opts *o, di_model *model, const di_model_info *info,
                       json_t *out) {
    int64_t plen = o->shared_prefix + o->prompt_len;
    int32_t *prefix = malloc((size_t)(o->shared_prefix + 1) * sizeof(int32_t));
    int32_t *prompt = malloc((size_t)plen * sizeof(int32_t));
    float *logits = malloc((size_t)info->vocab_size * sizeof(float));
    for (int64_t k = 0; k < o->shared_prefix; k++)
        prefix[k] = rand_id(info->vocab_size);
    di_context_params cp = di_context_default_params();
    cp.max_tokens = plen + o->gen_len;
    cp.n_threads = (int32_t)o->threads;
    di_context *ctx;
    if (di_context_create(model, &cp, &ctx) != DI_OK) {
        fprintf(stderr, "bench_engine: %s\n", di_last_error());
        return 1;
    }
    samples ttft = {0}, itl = {0};
    int64_t tokens = 0;
    double t0 = now_s();
    for (int64_t r = 0; r < o->requests; r++) {
        make_prompt(o, prefix, info->vocab_size, prompt);
        di_context_reset(ctx);
        double ts = now_s();
        if (di_context_eval(ctx, prompt, plen, logits, 1) != DI_OK) break;
        double last = now_s();
        push(&ttft, last - ts);
        tokens++;
        for (int64_t g = 1; g < o->gen_len; g++) {
            int32_t tok = argmax(logits, info->vocab_size);
            if (di_context_eval(ctx, &tok, 1, logits, 1) != DI_OK) break;
            double t = now_s();
            push(&itl, t - last);
            last = t;
            tokens++;
        }
    }
    double wall = now_s() - t0;
    json_object_set_new(out, "wall_s", json_real(wall));
    json_object_set_new(out, "output_tokens", json_integer(tokens));
    json_object_set_new(out, "output_tok_s", json_real(wall > 0 ? (double)tokens / wall : 0));
    json_object_set_new(out, "ttft_s", percentiles(&ttft));
    json_object_set_new(out, "itl_s", percentiles(&itl));
    free(ttft.v);
    free(itl.v);
    di_context_free(ctx);
    free(logits);
    free(prompt);
    free(prefix);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Main                                                                                       */
/* ---------------------------------------------------------------------------------------- */

static int usage(void) {
    fprintf(stderr,
            "usage: bench_engine --model DIR [--mode engine|context] [--concurrency C] "
            "[--requests N] [--prompt-len P] [--gen-len G] [--shared-prefix S] "
            "[--threads T] [--max-running M] [--max-batch-tokens B] [--max-prefill-tokens F] "
            "[--no-prefix-cache] [--seed X] [--no-batch-invariant] [--overlap] "
            "[--device cpu|cuda|cuda:N] [--temperature T] [--top-p P] [--warmup]\n");
    return 2;
}

int main(int argc, char **argv) {
    bench_opts o = {.mode = "engine",
                    .concurrency = 1,
                    .requests = 8,
                    .prompt_len = 32,
                    .gen_len = 32,
                    .seed = 1,
                    .top_p = 1.0};
    struct {
        const char *name;
        int64_t *dest;
    } ints[] = {{"--concurrency", &o.concurrency},
                {"--requests", &o.requests},
                {"--prompt-len", &o.prompt_len},
                {"--gen-len", &o.gen_len},
                {"--shared-prefix", &o.shared_prefix},
                {"--threads", &o.threads},
                {"--max-running", &o.max_running},
                {"--max-batch-tokens", &o.max_batch_tokens},
                {"--max-prefill-tokens", &o.max_prefill_tokens},
                {"--seed", &o.seed}};
    for (int i = 1; i < argc; i++) {
        bool done = false;
        if (!strcmp(argv[i], "--no-prefix-cache")) {
            o.no_prefix_cache = done = true;
        } else if (!strcmp(argv[i], "--no-batch-invariant")) {
            o.no_batch_invariant = done = true;
        } else if (!strcmp(argv[i], "--warmup")) {
            o.warmup = done = true;
        } else if (!strcmp(argv[i], "--overlap")) {
            o.overlap = done = true;
        } else if (i + 1 < argc && !strcmp(argv[i], "--model")) {
            o.model = argv[++i];
            done = true;
        } else if (i + 1 < argc && !strcmp(argv[i], "--mode")) {
            o.mode = argv[++i];
            done = true;
        } else if (i + 1 < argc && !strcmp(argv[i], "--device")) {
            o.device = argv[++i];
            done = true;
        } else if (i + 1 < argc && !strcmp(argv[i], "--temperature")) {
            o.temperature = strtod(argv[++i], NULL);
            done = true;
        } else if (i + 1 < argc && !strcmp(argv[i], "--top-p")) {
            o.top_p = strtod(argv[++i], NULL);
            done = true;
        }
        for (size_t k = 0; !done && k < sizeof ints / sizeof ints[0]; k++)
            if (i + 1 < argc && !strcmp(argv[i], ints[k].name)) {
                *ints[k].dest = strtoll(argv[++i], NULL, 10);
                done = true;
            }
        if (!done) return usage();
    }
    if (!o.model || o.concurrency < 1 || o.requests < 1 || o.prompt_len < 1 || o.gen_len < 1 ||
        o.shared_prefix < 0 || (strcmp(o.mode, "engine") && strcmp(o.mode, "context")) ||
        o.temperature < 0 || !(o.top_p > 0 && o.top_p <= 1))
        return usage();
    g_rng = (uint64_t)o.seed;
    di_model_params mp = di_model_default_params();
    mp.n_threads = (int32_t)o.threads;
    mp.device = o.device;
    di_model *model;
    di_model_info info;
    if (di_model_load(o.model, &mp, &model) != DI_OK || di_model_get_info(model, &info) != DI_OK) {
        fprintf(stderr, "bench_engine: %s\n", di_last_error());
        return 1;
    }
    json_t *out =
        json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:b, s:b, s:b, s:f, s:f}", "model",
                  o.model, "mode", o.mode, "device", o.device ? o.device : "cpu", "concurrency",
                  (json_int_t)o.concurrency, "requests", (json_int_t)o.requests, "prompt_len",
                  (json_int_t)o.prompt_len, "gen_len", (json_int_t)o.gen_len, "shared_prefix",
                  (json_int_t)o.shared_prefix, "prefix_cache", !o.no_prefix_cache,
                  "batch_invariant", !o.no_batch_invariant, "overlap", o.overlap, "temperature",
                  o.temperature, "top_p", o.top_p);
    json_object_set_new(out, "warmup", json_boolean(o.warmup && !strcmp(o.mode, "engine")));
    int rc = !strcmp(o.mode, "engine") ? run_engine(&o, model, &info, out)
                                       : run_context(&o, model, &info, out);
    if (rc == 0) {
        json_dumpf(out, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
        putchar('\n');
    }
    json_decref(out);
    di_model_free(model);
    return rc;
}
