/*
 * bench_sampler.c -- cost of choosing one token at DeepSeek's vocabulary (129,280), per
 * sampling configuration (not a test; never run by ctest).
 *
 *   bench_sampler [step_ms]      (step_ms: a decode step time in milliseconds)
 *
 * Prints ns per sample and that cost as a percentage of a decode step: of step_ms when given,
 * else of nominal 10 ms and 1 ms steps (nothing else is measured). The row is random with a
 * few hundred boosted tokens, roughly as peaked as a language model's (and, for the last
 * configuration, nearly flat, as a model with random weights gives); the position changes
 * every call, so each call is an independent draw. DI_SIMD=scalar measures the portable
 * kernels instead of the vector ones (the tokens are the same).
 */
#include "core/core.h"
#include "sample/sample_vec.h"
#include "sample/sampler.h"

#include <stdio.h>
#include <stdlib.h>

#define VOCAB     129280
#define N_HISTORY 512

static uint64_t g_state = 88172645463325252ull;
static double rnd01(void) {
    g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_state >> 11) * (1.0 / 9007199254740992.0);
}

static void make_row(float *x) {
    for (int64_t i = 0; i < VOCAB; i++)
        x[i] = (float)(rnd01() * 8.0 - 4.0);
    for (int i = 0; i < 300; i++)
        x[(int64_t)(rnd01() * VOCAB)] += 10.0f;
}

/* Times calls for about 0.3 s after a warm-up; returns ns per call. */
static double time_config(const di_sampling_params *p, di_sample_input in, void *scratch) {
    di_sample_result r;
    for (int i = 0; i < 20; i++)
        di_sampler_sample(p, &in, scratch, &r);
    int64_t calls = 0;
    double t0 = di_time_now(), t;
    do {
        for (int i = 0; i < 20; i++, calls++) {
            in.position = calls;
            if (di_sampler_sample(p, &in, scratch, &r) != DI_OK) {
                fprintf(stderr, "bench_sampler: %s\n", di_last_error());
                exit(1);
            }
        }
        t = di_time_now() - t0;
    } while (t < 0.3);
    return t / (double)calls * 1e9;
}

int main(int argc, char **argv) {
    double steps_ms[2] = {10.0, 1.0};
    int n_steps = 2;
    if (argc > 1) {
        steps_ms[0] = atof(argv[1]);
        n_steps = 1;
        if (!(steps_ms[0] > 0.0)) {
            fprintf(stderr, "usage: bench_sampler [step_ms > 0]\n");
            return 2;
        }
    }
    float *x = malloc(sizeof(float) * VOCAB);
    void *scratch = malloc(di_sampler_scratch_size(VOCAB));
    static int32_t ids[N_HISTORY], counts[N_HISTORY];
    for (int i = 0; i < N_HISTORY; i++) {
        ids[i] = (int32_t)(i * 251 % VOCAB);
        counts[i] = i % 3;
    }
    di_token_counts history = {ids, counts, N_HISTORY, 256};
    make_row(x);
    /* A nearly flat row, as a model with random weights gives: top_p keeps most tokens. */
    float *flat = malloc(sizeof(float) * VOCAB);
    for (int64_t i = 0; i < VOCAB; i++)
        flat[i] = (float)(rnd01() * 0.2 - 0.1);

    di_sampling_params base = di_sampling_default_params();
    struct {
        const char *name;
        di_sampling_params p;
        bool with_history;
        bool flat;
    } cfg[7];
    for (int i = 0; i < 7; i++)
        cfg[i].p = base, cfg[i].with_history = false, cfg[i].flat = false;
    cfg[0].name = "greedy (temperature 0)";
    cfg[0].p.temperature = 0.0f;
    cfg[1].name = "temperature 0.8";
    cfg[1].p.temperature = 0.8f;
    cfg[2].name = "top_k 50";
    cfg[2].p.top_k = 50;
    cfg[3].name = "top_p 0.9";
    cfg[3].p.top_p = 0.9f;
    cfg[4].name = "top_k 50 + top_p 0.9 + penalties";
    cfg[4].p.top_k = 50;
    cfg[4].p.top_p = 0.9f;
    cfg[4].p.repetition_penalty = 1.1f;
    cfg[4].p.presence_penalty = 0.2f;
    cfg[4].p.frequency_penalty = 0.2f;
    cfg[4].with_history = true;
    cfg[5].name = "temperature 0.8 + logprobs 5";
    cfg[5].p.temperature = 0.8f;
    cfg[5].p.logprobs = 5;
    cfg[6].name = "top_p 0.95, flat row";
    cfg[6].p.top_p = 0.95f;
    cfg[6].flat = true;

    printf("sampler, vocab %d, kernels %s\n", VOCAB, di_sample_kernels_active()->name);
    printf("  %-36s %10s", "configuration", "ns/sample");
    for (int s = 0; s < n_steps; s++)
        printf("  %% of %g ms", steps_ms[s]);
    printf("\n");
    for (int i = 0; i < 7; i++) {
        di_sample_input in = {cfg[i].flat ? flat : x, VOCAB,
                              cfg[i].with_history ? &history : NULL, 1, 42, 0, 0, NULL};
        double ns = time_config(&cfg[i].p, in, scratch);
        printf("  %-36s %10.0f", cfg[i].name, ns);
        for (int s = 0; s < n_steps; s++)
            printf("  %8.3f%%", 100.0 * ns / (steps_ms[s] * 1e6));
        printf("\n");
    }
    free(x);
    free(flat);
    free(scratch);
    return 0;
}
