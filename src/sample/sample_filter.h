/*
 * sample_filter.h -- the random-sampling half of the sampler: temperature, min_p, top_k and
 * top_p turn a processed row into a set of kept tokens with unnormalised weights, and one
 * uniform number picks a token from it by inverse CDF. Internal to src/sample.
 *
 * Invariants: the kept set always contains the row's argmax (lowest id among equal maxima),
 * whose weight is exactly 1, so total >= 1; weights are summed in increasing token id.
 */
#ifndef DI_SAMPLE_FILTER_H
#define DI_SAMPLE_FILTER_H

#include "deepinfer.h"

#include <stdint.h>

/* Buffers the filter fills, each [vocab] (carved from the sampler's scratch). */
typedef struct di_filter_work {
    float *w;       /* weights exp((x - max) / T) of kept tokens */
    uint64_t *keys; /* ranking keys (see sample_filter.c) */
    int32_t *ids;   /* kept ids, increasing */
} di_filter_work;

/* The distribution to draw from: token id has probability w[id] / total. */
typedef struct di_sample_dist {
    const int32_t *ids; /* [n] kept ids, increasing; NULL: every id < n, w[id] = 0 if dropped */
    int64_t n;
    const float *w; /* [vocab] */
    double total;   /* sum of the kept weights in increasing id */
} di_sample_dist;

/* Applies temperature, min_p, top_k, top_p (in that order) to row x[vocab] whose maximum is
 * max (finite). p->temperature must be >= DI_SAMPLING_GREEDY_EPS. */
void di_sample_filter(const di_sampling_params *p, const float *x, int64_t vocab, float max,
                      const di_filter_work *work, di_sample_dist *out);

/* The token where the running sum of weights first exceeds u * total, u in [0, 1). */
int32_t di_sample_draw(const di_sample_dist *d, double u);

#endif /* DI_SAMPLE_FILTER_H */
