/*
 * sample_filter.h -- the random-sampling half of the sampler: temperature, min_p, top_k and
 * top_p turn a processed row into a set of kept tokens with unnormalised weights, and one
 * uniform number picks a token from it by inverse CDF. Internal to src/sample.
 *
 * Invariants: the kept set always contains the row's argmax (lowest id among equal maxima),
 * whose weight is exactly 1, so total >= 1. Weights come from di_sample_exp and are summed in
 * a fixed order (sample_vec.h's block order over the whole row; increasing id over a list),
 * so the distribution is bit-identical at every SIMD level.
 */
#ifndef DI_SAMPLE_FILTER_H
#define DI_SAMPLE_FILTER_H

#include "deepinfer.h"

#include <stdint.h>

/* Buffers the filter fills, each [vocab] (carved from the sampler's scratch). */
typedef struct di_filter_work {
    float *w;       /* weights exp((x - max) * (1 / T)) of kept tokens */
    uint64_t *keys; /* ranking keys (see sample_filter.c); also the block sums of a full row */
    uint64_t *tmp;  /* the radix sort's second buffer, the kept-id bitmap */
    int32_t *ids;   /* kept ids, increasing */
} di_filter_work;

/* The distribution to draw from: token id has probability w[id] / total. */
typedef struct di_sample_dist {
    const int32_t *ids; /* [n] kept ids, increasing; NULL: every id < n, w[id] = 0 if dropped */
    int64_t n;
    const float *w;          /* [vocab]; NULL when ids is: recomputed a block at a time */
    const double *block_sum; /* when ids is NULL: [ceil(n / DI_SAMPLE_BLOCK)] block sums */
    double total;            /* sum of the kept weights: block order, or increasing id in ids */
    const float *x;          /* the row and the weights' parameters, to recompute them */
    float max, inv_t, cutoff;
} di_sample_dist;

/* Applies temperature, min_p, top_k, top_p (in that order) to row x[vocab] whose maximum is
 * max (finite). p->temperature must be >= DI_SAMPLING_GREEDY_EPS. */
void di_sample_filter(const di_sampling_params *p, const float *x, int64_t vocab, float max,
                      const di_filter_work *work, di_sample_dist *out);

/* Writes the weights of a full-row d (ids and w NULL) to w[d->n]: the filter does not store
 * them. */
void di_sample_dist_weights(const di_sample_dist *d, float *w);

/* The token where the running sum of weights first exceeds u * total, u in [0, 1). Over a
 * list the running sum adds the weights in increasing id. Over a full row it adds whole
 * blocks' sums while they stay at or below u * total, then the weights of the block where the
 * sum would pass it, in increasing id (a block whose own running sum stays at or below, by
 * rounding, yields its last kept token). */
int32_t di_sample_draw(const di_sample_dist *d, double u);

#endif /* DI_SAMPLE_FILTER_H */
