/*
 * bench_samples.h -- what the engine benchmarks (bench_engine.c, bench_disagg.c) share: a
 * growable list of latency samples with its percentiles as JSON, a wall clock, and the
 * seeded random token ids of their prompts. Header-only (static inline), as each benchmark
 * is one program.
 */
#ifndef DI_BENCH_SAMPLES_H
#define DI_BENCH_SAMPLES_H

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct samples {
    double *v;
    int64_t n, cap;
} samples;

static inline void push(samples *s, double x) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->v = realloc(s->v, (size_t)s->cap * sizeof(double));
        if (!s->v) abort();
    }
    s->v[s->n++] = x;
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline json_t *percentiles(samples *s) {
    if (s->n == 0) return json_null();
    qsort(s->v, (size_t)s->n, sizeof(double), cmp_double);
    double sum = 0;
    for (int64_t i = 0; i < s->n; i++)
        sum += s->v[i];
#define PCT(p) s->v[(int64_t)((p) / 100.0 * (double)(s->n - 1) + 0.5)]
    return json_pack("{s:f, s:f, s:f, s:f, s:f}", "mean", sum / (double)s->n, "p50", PCT(50), "p90",
                     PCT(90), "p99", PCT(99), "max", s->v[s->n - 1]);
#undef PCT
}

static inline double now_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng; /* the prompts' random stream (each program seeds it) */
static inline int32_t rand_id(int64_t vocab) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)(2 + (g_rng >> 33) % (uint64_t)(vocab - 2));
}

/* Request i's prompt: the shared prefix, then its own ids. */
#endif /* DI_BENCH_SAMPLES_H */
