/*
 * sample_filter.c -- temperature, min_p, top_k, top_p and the inverse-CDF draw (see
 * sample_filter.h).
 *
 * Design stance: never sort the vocabulary. Every filter is a cut in one total order, "higher
 * logit first, then lower id", encoded as a 64-bit key so that smaller key = better token:
 *   - min_p is a logit threshold: p >= min_p * p_max  <=>  x >= max + T * ln(min_p);
 *   - top_k is a partial selection: a heap of k keys for small k, quickselect otherwise;
 *   - top_p without top_k histograms the weights by their float exponent (plus 3 mantissa
 *     bits), finds the bucket where the cumulative mass crosses top_p, and sorts only the
 *     tokens at or above that bucket.
 * The kept tokens are then summed and drawn from in increasing id, a fixed order, so the
 * result is a function of the row and the uniform alone.
 */
#include "core/core.h"
#include "sample/sample_filter.h"
#include "sample/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define HEAP_MAX_K   1024 /* above this, top_k uses quickselect over all kept keys */
#define N_BUCKETS    1024 /* weight buckets: bits >> 20 of a float in [0, 1] is <= 1016 */
#define BUCKET_SHIFT 20

/* ---------------------------------------------------------------------------------------- */
/* Ranking keys                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* Maps a float to a uint32 that orders like the float (NaN excluded by the callers). */
static uint32_t float_order(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* Smaller key = better: higher logit first, then lower id. */
static uint64_t rank_key(float x, int32_t id) {
    return ((uint64_t)~float_order(x) << 32) | (uint32_t)id;
}

static int32_t key_id(uint64_t key) {
    return (int32_t)(uint32_t)key;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* ---------------------------------------------------------------------------------------- */
/* top_k: partial selection                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Restores the max-heap property (root = worst kept key) below index i. */
static void heap_sift_down(uint64_t *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l] > h[m]) m = l;
        if (r < n && h[r] > h[m]) m = r;
        if (m == i) return;
        uint64_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void heap_sift_up(uint64_t *h, int64_t i) {
    while (i > 0 && h[(i - 1) / 2] < h[i]) {
        uint64_t t = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

/* The k best keys among tokens with x >= cutoff, unordered, via a heap of size k. Scanning in
 * increasing id, a later token ties with the heap's worst only with a larger id, so once the
 * heap is full a token enters only if its logit is strictly greater. */
static int64_t topk_heap(const float *x, int64_t n, float cutoff, int64_t k, uint64_t *h) {
    int64_t size = 0;
    float worst = cutoff;
    for (int64_t i = 0; i < n; i++) {
        if (!(x[i] >= worst)) continue;
        if (size < k) {
            h[size] = rank_key(x[i], (int32_t)i);
            heap_sift_up(h, size++);
            if (size == k) worst = nextafterf(x[key_id(h[0])], INFINITY);
        } else {
            h[0] = rank_key(x[i], (int32_t)i);
            heap_sift_down(h, k, 0);
            worst = nextafterf(x[key_id(h[0])], INFINITY);
        }
    }
    return size;
}

/* Partially orders a[0, n) so that a[0, k) holds its k smallest keys (keys are distinct). */
static void select_smallest(uint64_t *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint64_t x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
        uint64_t pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot)
                i++;
            while (a[j] > pivot)
                j--;
            if (i <= j) {
                uint64_t t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            return;
    }
}

/* The k best keys among tokens with x >= cutoff, unordered. */
static int64_t topk_keys(const float *x, int64_t n, float cutoff, int64_t k, uint64_t *keys) {
    if (k <= HEAP_MAX_K) return topk_heap(x, n, cutoff, k, keys);
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        if (x[i] >= cutoff) keys[c++] = rank_key(x[i], (int32_t)i);
    if (c > k) select_smallest(keys, c, k);
    return DI_MIN(c, k);
}

/* ---------------------------------------------------------------------------------------- */
/* top_p                                                                                      */
/* ---------------------------------------------------------------------------------------- */

/* Given keys[c] sorted best first with weights w, the length of the shortest prefix whose
 * mass reaches top_p of total: a token is kept while the mass before it is < top_p * total. */
static int64_t nucleus_prefix(const uint64_t *keys, int64_t c, const float *w, double total,
                              float top_p) {
    double target = (double)top_p * total, acc = 0.0;
    int64_t r = 0;
    while (r < c && acc < target)
        acc += w[key_id(keys[r++])];
    return r;
}

static int32_t weight_bucket(float w) {
    uint32_t b;
    memcpy(&b, &w, sizeof b);
    return (int32_t)(b >> BUCKET_SHIFT);
}

/* top_p over every token with w > 0 (no top_k): histogram of mass by weight bucket, then a
 * sort of only the tokens at or above the bucket where the mass crosses top_p. Writes the
 * kept keys, best first, and returns their count. */
static int64_t nucleus_full(const float *x, const float *w, int64_t n, double total, float top_p,
                            uint64_t *keys) {
    double mass[N_BUCKETS] = {0};
    for (int64_t i = 0; i < n; i++)
        if (w[i] > 0.0f) mass[weight_bucket(w[i])] += w[i];
    double target = (double)top_p * total, acc = 0.0;
    int32_t cut = N_BUCKETS - 1;
    while (cut > 0 && (acc += mass[cut]) < target)
        cut--;
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        if (w[i] > 0.0f && weight_bucket(w[i]) >= cut) keys[c++] = rank_key(x[i], (int32_t)i);
    qsort(keys, (size_t)c, sizeof *keys, cmp_u64);
    return nucleus_prefix(keys, c, w, total, top_p);
}

/* ---------------------------------------------------------------------------------------- */
/* The kept set                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* Weights of every token (0 below cutoff); returns their sum in increasing id. */
static double weights_full(const float *x, int64_t n, float max, float t, float cutoff, float *w) {
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        w[i] = x[i] >= cutoff ? expf((x[i] - max) / t) : 0.0f;
        total += w[i];
    }
    return total;
}

/* Turns keys[c] into increasing ids and sums their weights in that order. */
static void finish_list(const uint64_t *keys, int64_t c, const di_filter_work *work,
                        di_sample_dist *out) {
    for (int64_t j = 0; j < c; j++)
        work->ids[j] = key_id(keys[j]);
    qsort(work->ids, (size_t)c, sizeof *work->ids, cmp_i32);
    double total = 0.0;
    for (int64_t j = 0; j < c; j++)
        total += work->w[work->ids[j]];
    out->ids = work->ids;
    out->n = c;
    out->total = total;
}

/* top_k, then top_p on what it kept. */
static void filter_topk(const di_sampling_params *p, const float *x, int64_t n, float max,
                        float cutoff, const di_filter_work *work, di_sample_dist *out) {
    int64_t c = topk_keys(x, n, cutoff, p->top_k, work->keys);
    double total = 0.0;
    for (int64_t j = 0; j < c; j++) {
        int32_t id = key_id(work->keys[j]);
        work->w[id] = expf((x[id] - max) / p->temperature);
        total += work->w[id];
    }
    if (p->top_p < 1.0f) {
        qsort(work->keys, (size_t)c, sizeof *work->keys, cmp_u64);
        c = nucleus_prefix(work->keys, c, work->w, total, p->top_p);
    }
    finish_list(work->keys, c, work, out);
}

void di_sample_filter(const di_sampling_params *p, const float *x, int64_t vocab, float max,
                      const di_filter_work *work, di_sample_dist *out) {
    const float t = p->temperature;
    float cutoff = -FLT_MAX; /* drops -inf (and NaN: comparisons with it are false) */
    if (p->min_p > 0.0f) cutoff = DI_MAX(cutoff, max + t * logf(p->min_p));
    out->w = work->w;
    if (p->top_k > 0 && p->top_k < vocab) {
        filter_topk(p, x, vocab, max, cutoff, work, out);
        return;
    }
    double total = weights_full(x, vocab, max, t, cutoff, work->w);
    if (p->top_p < 1.0f) {
        int64_t c = nucleus_full(x, work->w, vocab, total, p->top_p, work->keys);
        finish_list(work->keys, c, work, out);
        return;
    }
    out->ids = NULL;
    out->n = vocab;
    out->total = total;
}

int32_t di_sample_draw(const di_sample_dist *d, double u) {
    const double target = u * d->total;
    double acc = 0.0;
    int32_t last = -1;
    for (int64_t j = 0; j < d->n; j++) {
        int32_t id = d->ids ? d->ids[j] : (int32_t)j;
        float w = d->w[id];
        if (!(w > 0.0f)) continue;
        acc += w;
        last = id;
        if (acc > target) return id;
    }
    return last; /* only when rounding left target at or above the final sum */
}
