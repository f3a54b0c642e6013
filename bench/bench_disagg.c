/*
 * bench_disagg.c -- inter-token latency of running decodes while long prompts arrive, with
 * the unified engine or the disaggregated prefill/decode workers (not a test; never run by
 * ctest). See bench/README.md, "Disaggregated prefill/decode".
 *
 *   bench_disagg --model DIR [--mode unified|disagg] [--threads T] [--prefill-threads P]
 *                [--decoders D] [--gen-len G] [--long-len L] [--longs N] [--long-every K]
 *                [--max-prefill-tokens C] [--seed X]
 *
 * D short requests (16-token prompts, G tokens each, greedy) decode; each time the first of
 * them has produced K more tokens, a long request (an L-token prompt, 4 tokens) arrives, N
 * in all. Arrivals are tied to tokens, not time, so both modes see the same request pattern.
 * Prints one JSON object: the short requests' inter-token latency (time between successive
 * token deliveries of one request) percentiles, the long requests' TTFT, the wall time and
 * the engine's stats (each worker's steps and busy seconds in disagg mode).
 */
#include "deepinfer.h"
#include "bench_samples.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct opts {
    const char *model, *mode;
    int64_t threads, prefill_threads, decoders, gen_len, long_len, longs, long_every,
        max_prefill_tokens, seed;
} opts;

static int run(const opts *o, di_model *model, const di_model_info *info, json_t *out) {
    di_engine_params ep = di_engine_default_params();
    ep.n_threads = (int32_t)o->threads;
    ep.disaggregate = strcmp(o->mode, "disagg") == 0;
    ep.prefill_threads = (int32_t)o->prefill_threads;
    ep.max_prefill_tokens = o->max_prefill_tokens;
    ep.max_model_len = o->long_len + 16 + o->gen_len;
    ep.enable_prefix_cache = false;
    di_engine *e;
    if (di_engine_create(model, &ep, &e) != DI_OK) {
        fprintf(stderr, "bench_disagg: %s\n", di_last_error());
        return 1;
    }
    int64_t n_req = o->decoders + o->longs;
    int32_t *prompt = malloc((size_t)o->long_len * sizeof(int32_t));
    double *last = calloc((size_t)n_req, sizeof(double)), *submit = calloc((size_t)n_req, 8);
    bool *got = calloc((size_t)n_req, sizeof(bool));
    int64_t cap = di_engine_output_cap(e) + n_req;
    di_engine_output *outs = calloc((size_t)cap, sizeof *outs);
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = 0;
    sp.ignore_eos = true;
    samples itl = {0}, ttft_long = {0};
    int64_t added = 0, first_tokens = 0, next_long_at = o->long_every, tokens = 0;
    int rc = 0;
    double t0 = now_s();
    for (; added < o->decoders; added++) {
        for (int k = 0; k < 16; k++)
            prompt[k] = rand_id(info->vocab_size);
        sp.max_tokens = o->gen_len;
        di_engine_request q = {
            .prompt_ids = prompt, .n_prompt_ids = 16, .sampling = &sp, .id = (uint64_t)added};
        submit[added] = now_s();
        if (di_engine_add_request(e, &q) != DI_OK) rc = 1;
    }
    while (rc == 0 && di_engine_has_unfinished(e)) {
        if (added < n_req && first_tokens >= next_long_at) {
            for (int64_t k = 0; k < o->long_len; k++)
                prompt[k] = rand_id(info->vocab_size);
            sp.max_tokens = 4;
            di_engine_request q = {.prompt_ids = prompt,
                                   .n_prompt_ids = o->long_len,
                                   .sampling = &sp,
                                   .id = (uint64_t)added};
            submit[added] = now_s();
            if (di_engine_add_request(e, &q) != DI_OK) rc = 1;
            added++;
            next_long_at += o->long_every;
        }
        int64_t n = 0;
        if (di_engine_step(e, outs, cap, &n) != DI_OK) {
            fprintf(stderr, "bench_disagg: %s\n", di_last_error());
            rc = 1;
            break;
        }
        double t = now_s();
        for (int64_t i = 0; i < n; i++) {
            int64_t id = (int64_t)outs[i].id;
            if (outs[i].n_tokens == 0) continue;
            tokens += outs[i].n_tokens;
            bool is_long = id >= o->decoders;
            if (!got[id] && is_long) push(&ttft_long, t - submit[id]);
            if (got[id] && !is_long) push(&itl, (t - last[id]) / (double)outs[i].n_tokens);
            if (id == 0) first_tokens += outs[i].n_tokens;
            got[id] = true;
            last[id] = t;
        }
    }
    double wall = now_s() - t0;
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    json_object_set_new(out, "mode", json_string(o->mode));
    json_object_set_new(out, "wall_s", json_real(wall));
    json_object_set_new(out, "output_tokens", json_integer(tokens));
    json_object_set_new(out, "decode_itl_s", percentiles(&itl));
    json_object_set_new(out, "long_ttft_s", percentiles(&ttft_long));
    json_object_set_new(
        out, "stats",
        json_pack("{s:I, s:I, s:I, s:f, s:f, s:f}", "n_steps", (json_int_t)st.n_steps,
                  "n_prefill_steps", (json_int_t)st.n_prefill_steps, "n_decode_steps",
                  (json_int_t)st.n_decode_steps, "time_prefill_busy_s", st.time_prefill_busy_s,
                  "time_decode_busy_s", st.time_decode_busy_s, "time_device_s",
                  st.time_device_s));
    free(itl.v);
    free(ttft_long.v);
    free(outs);
    free(got);
    free(submit);
    free(last);
    free(prompt);
    di_engine_free(e);
    return rc;
}

int main(int argc, char **argv) {
    opts o = {.mode = "unified",
              .threads = 2,
              .decoders = 4,
              .gen_len = 96,
              .long_len = 1000,
              .longs = 4,
              .long_every = 16,
              .max_prefill_tokens = 512,
              .seed = 1};
    struct {
        const char *name;
        int64_t *dest;
    } ints[] = {{"--threads", &o.threads},
                {"--prefill-threads", &o.prefill_threads},
                {"--decoders", &o.decoders},
                {"--gen-len", &o.gen_len},
                {"--long-len", &o.long_len},
                {"--longs", &o.longs},
                {"--long-every", &o.long_every},
                {"--max-prefill-tokens", &o.max_prefill_tokens},
                {"--seed", &o.seed}};
    for (int i = 1; i < argc; i++) {
        bool done = false;
        if (i + 1 < argc && !strcmp(argv[i], "--model")) {
            o.model = argv[++i];
            done = true;
        } else if (i + 1 < argc && !strcmp(argv[i], "--mode")) {
            o.mode = argv[++i];
            done = true;
        }
        for (size_t k = 0; !done && k < sizeof ints / sizeof ints[0]; k++)
            if (i + 1 < argc && !strcmp(argv[i], ints[k].name)) {
                *ints[k].dest = strtoll(argv[++i], NULL, 10);
                done = true;
            }
        if (!done) {
            fprintf(stderr, "usage: bench_disagg --model DIR [--mode unified|disagg] [--threads T] "
                            "[--prefill-threads P] [--decoders D] [--gen-len G] [--long-len L] "
                            "[--longs N] [--long-every K] [--max-prefill-tokens C] [--seed X]\n");
            return 2;
        }
    }
    if (!o.model || (strcmp(o.mode, "unified") && strcmp(o.mode, "disagg")) || o.decoders < 1 ||
        o.long_len < 1 || o.gen_len < 2) {
        fprintf(stderr, "bench_disagg: need --model, --mode unified|disagg, --decoders >= 1, "
                        "--long-len >= 1 and --gen-len >= 2\n");
        return 2;
    }
    g_rng = (uint64_t)o.seed;
    di_model_params mp = di_model_default_params();
    mp.n_threads = (int32_t)o.threads;
    di_model *model;
    if (di_model_load(o.model, &mp, &model) != DI_OK) {
        fprintf(stderr, "bench_disagg: %s\n", di_last_error());
        return 1;
    }
    di_model_info info;
    di_model_get_info(model, &info);
    json_t *out = json_object();
    int rc = run(&o, model, &info, out);
    if (rc == 0) {
        char *s = json_dumps(out, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
    }
    json_decref(out);
    di_model_free(model);
    return rc;
}
