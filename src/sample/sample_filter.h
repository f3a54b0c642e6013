/*
 * sample_filter.h -- the random-sampling half of the sampler: temperature, min_p, top_k and
 * top_p turn a processed row into a set of kept tokens with unnormalised weights, and one
 * uniform number picks a token from it by inverse CDF. Internal to src/sample.
 *
 * Invariants: the kept set always contains the row's argmax (lowest id among equal maxima),
 * whose weight is exactly 1, so total >= 1 (mass 2^52). Weights come from di_sample_exp and
 * are summed in a fixed order over the whole row (sample_vec.h's block order) or exactly as
 * integers over a list (sample_mass.h), so the distribution is bit-identical at every SIMD
 * level and on a GPU.
 */
#ifndef DI_SAMPLE_FILTER_H
#define DI_SAMPLE_FILTER_H

#include "deepinfer.h"
#include "sample/sample_mass.h"

#include <stdint.h>

/* Buffers the filter fills, each [vocab] (carved from the sampler's scratch). */
typedef struct di_filter_work {
    float *w;       /* weights exp((x - max) * (1 / T)) of kept tokens */
    uint64_t *keys; /* ranking keys (see sample_filter.c); also the block sums of a full row */
    uint64_t *tmp;  /* the radix sort's second buffer, the kept-id bitmap */
    int32_t *ids;   /* kept ids, increasing */
} di_filter_work;

/* The distribution to draw from. A full row (ids NULL: temperature and min_p only): token id
 * has probability w[id] / total, summed in block order. A list (top_k or top_p): kept id has
 * probability ds_mass(w[id]) / mass_total, exactly (sample_mass.h). */
typedef struct di_sample_dist {
    const int32_t *ids; /* [n] kept ids, increasing; NULL: every id < n, w[id] = 0 if dropped */
    int64_t n;
    const float *w;          /* [vocab]; NULL when ids is: recomputed a block at a time */
    const double *block_sum; /* when ids is NULL: [ceil(n / DI_SAMPLE_BLOCK)] block sums */
    double total;            /* a full row's: the kept weights' sum, block order */
    ds_u128 mass_total;      /* a list's: the kept ids' integer masses, exactly */
    const float *x;          /* the row and the weights' parameters, to recompute them */
    float max, inv_t, cutoff;
} di_sample_dist;

/* Applies temperature, min_p, top_k, top_p (in that order) to row x[vocab] whose maximum is
 * max (finite). p->temperature must be >= DI_SAMPLING_GREEDY_EPS; vocab below
 * DI_SAMPLE_MASS_MAX_VOCAB (the masses' 128-bit sums). */
void di_sample_filter(const di_sampling_params *p, const float *x, int64_t vocab, float max,
                      const di_filter_work *work, di_sample_dist *out);

/* Writes the weights of a full-row d (ids and w NULL) to w[d->n]: the filter does not store
 * them. */
void di_sample_dist_weights(const di_sample_dist *d, float *w);

/* The token where the running sum of weights first exceeds u * total, u in [0, 1). Over a
 * list: the running integer mass, in increasing id, passing floor(u x mass_total)
 * (sample_mass.h). Over a full row it adds whole blocks' sums while they stay at or below u *
 * total, then the weights of the block where the sum would pass it, in increasing id (a block
 * whose own running sum stays at or below, by rounding, yields its last kept token). */
int32_t di_sample_draw(const di_sample_dist *d, double u);

#endif /* DI_SAMPLE_FILTER_H */
