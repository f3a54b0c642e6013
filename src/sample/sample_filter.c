/*
 * sample_filter.c -- temperature, min_p, top_k, top_p and the inverse-CDF draw (see
 * sample_filter.h).
 *
 * Design stance: never sort the vocabulary. Every filter is a cut in one total order, "higher
 * logit first, then lower id", encoded as a 64-bit key so that smaller key = better token:
 *   - min_p is a logit threshold: p >= min_p * p_max  <=>  x >= max + T * ln(min_p);
 *   - top_k is a partial selection: a heap of k keys for small k, quickselect otherwise;
 *   - top_p without top_k histograms the tokens' exact masses (sample_mass.h) by their
 *     weight's float exponent (plus 3 mantissa bits), finds the bucket where the cumulative
 *     mass from the top reaches top_p's need (weights rise with logits, so the tokens at or
 *     above it are a prefix of the order that holds the nucleus), and sorts only those -- by
 *     a stable radix sort on the logit's order when there are many (a nearly flat row keeps
 *     most of the vocabulary): they come in increasing id, so equal logits stay in id order,
 *     which is the keys' own order, and the result is the comparison sort's.
 * Whole-row passes (weights, threshold searches) are sample_vec.h's kernels, bit-identical at
 * every SIMD level. Without top_k and top_p the kept tokens are summed and drawn from in block
 * order over the full row (sample_full_row.h); with either, top_p's cut and the draw use the
 * exact integer masses of sample_mass.h (any order of additions, the same result: what lets a
 * GPU find the same token). Either way the result is a function of the row and the uniform
 * alone.
 */
#include "core/core.h"
#include "sample/sample_filter.h"
#include "sample/sample_full_row.h"
#include "sample/sample_mass.h"
#include "sample/sample_vec.h"
#include "sample/sampler.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define HEAP_MAX_K   1024 /* above this, top_k uses quickselect over all kept keys */
#define RADIX_MIN    4096 /* longer key lists (in id order) sort by radix, id lists by bitmap */
#define INSERTION_N  24   /* sorts shorter than this use insertion sort */
#define N_BUCKETS    1024 /* weight buckets: bits >> 20 of a float in [0, 1] is <= 1016 */
#define BUCKET_SHIFT 20

/* ---------------------------------------------------------------------------------------- */
/* Ranking keys                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* The ranking key (smaller = better: a higher logit, then a lower id) is sample_mass.h's
 * ds_rank_key, shared with devices; ds_key_id reads its id back. */

/* ---------------------------------------------------------------------------------------- */
/* Sorting (ascending; inline comparisons instead of qsort's callback)                        */
/* ---------------------------------------------------------------------------------------- */

/* Quicksort with a median-of-three pivot down to INSERTION_N, heapsort past a depth limit,
 * insertion sort at the leaves. Defines sort_<name>(T *a, int64_t n). */
#define DEFINE_SORT(name, T)                                                                       \
    static void sift_##name(T *a, int64_t n, int64_t i) {                                          \
        for (;;) {                                                                                 \
            int64_t l = 2 * i + 1, r = l + 1, m = i;                                               \
            if (l < n && a[l] > a[m]) m = l;                                                       \
            if (r < n && a[r] > a[m]) m = r;                                                       \
            if (m == i) return;                                                                    \
            T t_ = a[i];                                                                           \
            a[i] = a[m];                                                                           \
            a[m] = t_;                                                                             \
            i = m;                                                                                 \
        }                                                                                          \
    }                                                                                              \
    static void sort_rec_##name(T *a, int64_t n, int depth) {                                      \
        while (n >= INSERTION_N) {                                                                 \
            if (depth-- == 0) { /* heapsort */                                                     \
                for (int64_t i = n / 2 - 1; i >= 0; i--)                                           \
                    sift_##name(a, n, i);                                                          \
                for (int64_t e = n - 1; e > 0; e--) {                                              \
                    T t_ = a[0];                                                                   \
                    a[0] = a[e];                                                                   \
                    a[e] = t_;                                                                     \
                    sift_##name(a, e, 0);                                                          \
                }                                                                                  \
                return;                                                                            \
            }                                                                                      \
            T x = a[0], y = a[n / 2], z = a[n - 1];                                                \
            T pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));       \
            int64_t i = 0, j = n - 1;                                                              \
            while (i <= j) {                                                                       \
                while (a[i] < pivot)                                                               \
                    i++;                                                                           \
                while (a[j] > pivot)                                                               \
                    j--;                                                                           \
                if (i <= j) {                                                                      \
                    T t_ = a[i];                                                                   \
                    a[i++] = a[j];                                                                 \
                    a[j--] = t_;                                                                   \
                }                                                                                  \
            }                                                                                      \
            /* recurse into the smaller side, loop on the larger */                                \
            if (j + 1 < n - i) {                                                                   \
                sort_rec_##name(a, j + 1, depth);                                                  \
                a += i;                                                                            \
                n -= i;                                                                            \
            } else {                                                                               \
                sort_rec_##name(a + i, n - i, depth);                                              \
                n = j + 1;                                                                         \
            }                                                                                      \
        }                                                                                          \
        for (int64_t i = 1; i < n; i++) {                                                          \
            T v = a[i];                                                                            \
            int64_t j = i;                                                                         \
            for (; j > 0 && a[j - 1] > v; j--)                                                     \
                a[j] = a[j - 1];                                                                   \
            a[j] = v;                                                                              \
        }                                                                                          \
    }                                                                                              \
    static void sort_##name(T *a, int64_t n) {                                                     \
        int depth = 2;                                                                             \
        for (int64_t m = n; m > 1; m >>= 1)                                                        \
            depth += 2;                                                                            \
        sort_rec_##name(a, n, depth);                                                              \
    }

DEFINE_SORT(u64, uint64_t)
DEFINE_SORT(i32, int32_t)

/* Sorts keys[c] ascending when they were made in increasing id order: a stable LSD radix
 * sort on the upper 32 bits (the logit's order, 8 bits a pass; a pass whose byte is the same
 * for every key moves nothing and is skipped) leaves equal logits in increasing id, i.e. the
 * order of the whole key. tmp[c] is scratch. */
static void sort_keys_made_in_id_order(uint64_t *keys, int64_t c, uint64_t *tmp) {
    if (c < RADIX_MIN) {
        sort_u64(keys, c);
        return;
    }
    uint64_t *src = keys, *dst = tmp;
    for (int shift = 32; shift < 64; shift += 8) {
        int64_t start[257] = {0};
        for (int64_t i = 0; i < c; i++)
            start[((src[i] >> shift) & 255u) + 1]++;
        if (start[((src[0] >> shift) & 255u) + 1] == c) continue;
        for (int b = 0; b < 256; b++)
            start[b + 1] += start[b];
        for (int64_t i = 0; i < c; i++)
            dst[start[(src[i] >> shift) & 255u]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != keys) memcpy(keys, src, (size_t)c * sizeof *keys);
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
static int64_t topk_heap(const di_sample_kernels *kern, const float *x, int64_t n, float cutoff,
                         int64_t k, uint64_t *h) {
    int64_t size = 0;
    float worst = cutoff;
    for (int64_t i = 0; (i = kern->next_at_least(x, i, n, worst)) < n; i++) {
        if (size < k) {
            h[size] = ds_rank_key(x[i], (int32_t)i);
            heap_sift_up(h, size++);
            if (size == k) worst = nextafterf(x[ds_key_id(h[0])], INFINITY);
        } else {
            h[0] = ds_rank_key(x[i], (int32_t)i);
            heap_sift_down(h, k, 0);
            worst = nextafterf(x[ds_key_id(h[0])], INFINITY);
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

/* The k best keys among tokens with x >= cutoff, unordered. ids[n] is free scratch. */
static int64_t topk_keys(const di_sample_kernels *kern, const float *x, int64_t n, float cutoff,
                         int64_t k, uint64_t *keys, int32_t *ids) {
    if (k <= HEAP_MAX_K) return topk_heap(kern, x, n, cutoff, k, keys);
    int64_t c = kern->collect_at_least(x, n, cutoff, ids);
    for (int64_t j = 0; j < c; j++)
        keys[j] = ds_rank_key(x[ids[j]], ids[j]);
    if (c > k) select_smallest(keys, c, k);
    return DI_MIN(c, k);
}

/* ---------------------------------------------------------------------------------------- */
/* top_p                                                                                      */
/* ---------------------------------------------------------------------------------------- */

/* Given keys[c] sorted best first with weights w, the length of the shortest prefix whose
 * mass reaches need: a token is kept while the mass before it is below need (sample_mass.h;
 * all c when the keys' mass stays below it). */
static int64_t nucleus_prefix(const uint64_t *keys, int64_t c, const float *w, ds_u128 need) {
    ds_u128 acc = 0;
    int64_t r = 0;
    while (r < c && acc < need)
        acc += ds_mass(w[ds_key_id(keys[r++])]);
    return r;
}

static int32_t weight_bucket(float w) {
    uint32_t b;
    memcpy(&b, &w, sizeof b);
    return (int32_t)(b >> BUCKET_SHIFT);
}

/* top_p over every token with w > 0 (no top_k), need = ceil(top_p x the row's mass): a
 * histogram of the masses by weight bucket finds the lowest bucket whose tokens and those of
 * the buckets above reach need. Weights rise with logits, so the tokens of those buckets are
 * a prefix of the ranking order that holds the nucleus; only they are ranked (sorted: by
 * radix when there are many, as a nearly flat row keeps most of the vocabulary). Writes the
 * kept keys, best first, and returns their count. cand[n] is scratch. */
static int64_t nucleus_full(const di_sample_kernels *kern, const float *x, const float *w,
                            int64_t n, float top_p, uint64_t *keys, uint64_t *tmp, int32_t *cand) {
    ds_u128 mass[N_BUCKETS] = {0}, total = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t m = ds_mass(w[i]);
        mass[weight_bucket(w[i])] += m;
        total += m;
    }
    const ds_u128 need = ds_top_p_need(top_p, total);
    ds_u128 acc = 0;
    int32_t cut = N_BUCKETS - 1;
    while (cut > 0 && (acc += mass[cut]) < need)
        cut--;
    /* the tokens of buckets >= cut: w >= the smallest float of bucket cut (w >= 0) */
    uint32_t tb = (uint32_t)cut << BUCKET_SHIFT;
    float thr;
    memcpy(&thr, &tb, sizeof thr);
    const int64_t nc = kern->collect_at_least(w, n, thr, cand);
    for (int64_t j = 0; j < nc; j++)
        keys[j] = ds_rank_key(x[cand[j]], cand[j]);
    sort_keys_made_in_id_order(keys, nc, tmp);
    return nucleus_prefix(keys, nc, w, need);
}

/* ---------------------------------------------------------------------------------------- */
/* The kept set                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* Turns keys[c] (ids below n) into increasing ids -- a sort, or for long lists a bitmap of
 * the ids read in order -- and sums their weights in that order. */
static void finish_list(const uint64_t *keys, int64_t c, int64_t n, const di_filter_work *work,
                        di_sample_dist *out) {
    if (c < RADIX_MIN) {
        for (int64_t j = 0; j < c; j++)
            work->ids[j] = ds_key_id(keys[j]);
        sort_i32(work->ids, c);
    } else {
        uint64_t *bits = work->tmp;
        const int64_t words = (n + 63) / 64;
        memset(bits, 0, (size_t)words * sizeof *bits);
        for (int64_t j = 0; j < c; j++) {
            const int32_t id = ds_key_id(keys[j]);
            bits[id >> 6] |= 1ull << (id & 63);
        }
        int64_t k = 0;
        for (int64_t wd = 0; wd < words; wd++)
            for (uint64_t b = bits[wd]; b; b &= b - 1)
                work->ids[k++] = (int32_t)(wd * 64 + __builtin_ctzll(b));
    }
    ds_u128 total = 0;
    for (int64_t j = 0; j < c; j++)
        total += ds_mass(work->w[work->ids[j]]);
    out->ids = work->ids;
    out->n = c;
    out->block_sum = NULL;
    out->mass_total = total;
}

/* top_k, then top_p on what it kept. */
static void filter_topk(const di_sample_kernels *kern, const di_sampling_params *p, const float *x,
                        int64_t n, float max, float cutoff, const di_filter_work *work,
                        di_sample_dist *out) {
    int64_t c = topk_keys(kern, x, n, cutoff, p->top_k, work->keys, work->ids);
    const float inv_t = 1.0f / p->temperature;
    ds_u128 total = 0;
    for (int64_t j = 0; j < c; j++) {
        int32_t id = ds_key_id(work->keys[j]);
        work->w[id] = ds_weight(x[id], max, inv_t, cutoff);
        total += ds_mass(work->w[id]);
    }
    if (p->top_p < 1.0f) {
        sort_u64(work->keys, c);
        c = nucleus_prefix(work->keys, c, work->w, ds_top_p_need(p->top_p, total));
    }
    finish_list(work->keys, c, n, work, out);
}

void di_sample_filter(const di_sampling_params *p, const float *x, int64_t vocab, float max,
                      const di_filter_work *work, di_sample_dist *out) {
    const di_sample_kernels *kern = di_sample_kernels_active();
    const float t = p->temperature;
    float cutoff = -FLT_MAX; /* drops -inf (and NaN: comparisons with it are false) */
    if (p->min_p > 0.0f) cutoff = DI_MAX(cutoff, max + t * logf(p->min_p));
    out->w = work->w;
    if (p->top_k > 0 && p->top_k < vocab) {
        filter_topk(kern, p, x, vocab, max, cutoff, work, out);
        return;
    }
    /* The block sums borrow the keys' space: top_p reads them (through total) before it
     * writes keys, and the full-row draw needs no keys. Without top_p the weights are not
     * stored: the draw recomputes those of one block. */
    double *block_sum = (double *)work->keys;
    const bool keep_w = p->top_p < 1.0f;
    double total =
        kern->weights(x, vocab, max, 1.0f / t, cutoff, keep_w ? work->w : NULL, block_sum);
    if (keep_w) {
        int64_t c =
            nucleus_full(kern, x, work->w, vocab, p->top_p, work->keys, work->tmp, work->ids);
        finish_list(work->keys, c, vocab, work, out);
        return;
    }
    out->ids = NULL;
    out->n = vocab;
    out->w = NULL;
    out->block_sum = block_sum;
    out->total = total;
    out->x = x;
    out->max = max;
    out->inv_t = 1.0f / t;
    out->cutoff = cutoff;
}

/* The weights of ids [b0, end) of a full row into wb[end - b0], as the filter computed them
 * (the kernels' weights are elementwise, so a slice gives the same values). */
static void block_weights(const di_sample_dist *d, int64_t b0, int64_t end, float *wb) {
    double bs;
    di_sample_kernels_active()->weights(d->x + b0, end - b0, d->max, d->inv_t, d->cutoff, wb, &bs);
}

void di_sample_dist_weights(const di_sample_dist *d, float *w) {
    for (int64_t b0 = 0; b0 < d->n; b0 += DI_SAMPLE_BLOCK)
        block_weights(d, b0, DI_MIN(b0 + DI_SAMPLE_BLOCK, d->n), w + b0);
}

/* The list draw (sample_mass.h): the first id, increasing, whose running mass passes
 * floor(u x the kept mass), which is below that mass, so there always is one. */
static int32_t draw_list(const di_sample_dist *d, double u) {
    const ds_u128 target = ds_draw_target(u, d->mass_total);
    ds_u128 acc = 0;
    for (int64_t j = 0; j < d->n; j++) {
        acc += ds_mass(d->w[d->ids[j]]);
        if (acc > target) return d->ids[j];
    }
    return -1; /* unreachable: target < mass_total */
}

int32_t di_sample_draw(const di_sample_dist *d, double u) {
    if (d->ids) return draw_list(d, u);
    const double target = u * d->total;
    /* whole blocks first, then the ids of one block (sample_full_row.h, shared with devices) */
    return ds_draw_full_row(d->x, d->n, d->max, d->inv_t, d->cutoff, d->block_sum, target);
}
