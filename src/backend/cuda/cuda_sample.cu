/*
 * cuda_sample.cu -- seeded sampling on the device (backend.h's sample_rows): for each row the
 * token the host sampler (src/sample) would choose with the row's temperature, min_p, top_k
 * and top_p (no logit processor or logprobs), bit for bit, and the greedy token for
 * temperature 0.
 *
 * A row is drawn by its group: for a call of at most SR_CLUSTER_ROWS rows (a decode step of
 * a few sequences) a thread-block cluster of SR_CLUSTER 512-thread blocks (sm_90), block r
 * taking the r-th slice of the row's sum blocks (DI_SAMPLE_BLOCK ids each); for up to
 * `pair_rows` rows (64 by default) a cluster of two; for more, one 1024-thread block. One
 * block walked a nearly flat 102,400-id row in 0.38 ms (a third of a batch-1 step), eight
 * blocks in 0.15 ms; but at 64 rows the 512 blocks of 8-block clusters took four waves and
 * were slower than 64 blocks (NOTES.md, twentieth round), while pairs (128 blocks, one wave)
 * took a 4-layer sampled step of 64 sequences from 2.27 to 2.19 ms (twenty-first round). What
 * a cluster's blocks must agree on goes through distributed shared memory: each block reads
 * every block's value and combines them in rank order, so all hold the same result. Both
 * shapes are one template (sr_group: with one block the exchanges are the block's own).
 *
 * The group finds the row's maximum and its first index (and whether a NaN or +inf is
 * present: di_cuda_block_row_max, as argmax_rows); a row the host sampler would reject (NaN,
 * +inf, every logit -inf) gives -1, so that the caller hands that row to the host sampler,
 * which reports it. Then:
 *   - temperature and min_p only (the full-row draw): each block computes its slice's
 *     weight sums (one sum block per thread at a time, in the host's lane order), block 0
 *     gathers them, and its thread 0 adds them in order, draws u from Philox and walks the
 *     blocks (sample_full_row.h: the host's arithmetic, each operation rounded once);
 *   - top_k or top_p (the filtered draw, sample_mass.h's exact integer masses): top_k's cut is
 *     the k-th smallest ranking key among the tokens at or above min_p's cutoff, top_p's the
 *     key of the first token whose running mass (ranking order) reaches need, both found by
 *     a radix select over the 64-bit keys -- 8 bits a pass, from the top, counting (top_k) or
 *     adding masses (top_p) per digit in each block's shared memory, the digits summed over
 *     the group, stopping once one token is left -- with no sort. The draw: each thread sums
 *     the kept masses of a contiguous run of its block's slice, a block scan and the blocks'
 *     totals give each run's start, and the thread whose run holds the target walks it.
 *     Every sum is an exact integer, so the order of additions (atomics, blocks) does not
 *     matter.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "sample/sample_full_row.h"
#include "sample/sample_mass.h"
#include "sample/sampler.h"

#include <cooperative_groups.h>
#include <float.h>
#include <math.h>

namespace cg = cooperative_groups;

#define SR_CLUSTER      8  /* blocks per row in a cluster (a portable cluster size) */
#define SR_CLUSTER_ROWS 16 /* most rows drawn by clusters (128 blocks: one wave) */
/* Threads per block: 1024 for a row's one block, 512 in a cluster (126 registers each) */
template <int CL> constexpr int sr_threads = CL > 1 ? 512 : 1024;
#define SR_SUBS 4 /* sub-histograms (warp % SR_SUBS): fewer same-address atomics */
#define SR_BINS 256
/* Shared memory of the filtered draw: per sub-histogram and digit a count and a mass in two
 * halves (the masses' high and low 32 bits, summed apart: no overflow for 2^20 tokens). */
#define SR_HIST_BYTES (SR_SUBS * SR_BINS * (4 + 8 + 8))
#define SR_SMEM_MAX   (36 * 1024) /* dynamic: 48 KiB without opting in, less the static */

int64_t di_cuda_sample_launches;         /* cuda_backend.h: draws launched (for tests) */
int64_t di_cuda_sample_cluster_launches; /* ... of them by clusters */

struct sr_hist {
    unsigned *cnt;          /* [SR_SUBS][SR_BINS] */
    unsigned long long *hi; /* [SR_SUBS][SR_BINS]: sums of mass >> 32 */
    unsigned long long *lo; /* [SR_SUBS][SR_BINS]: sums of mass & 0xffffffff */
};

/* The warp's inclusive prefix of v in lane order (128 bits as two 64-bit shuffles). */
static __device__ __forceinline__ ds_u128 warp_scan_u128(ds_u128 v) {
    const int lane = threadIdx.x & 31;
    for (int off = 1; off < 32; off <<= 1) {
        const unsigned long long h =
            __shfl_up_sync(0xffffffffu, (unsigned long long)(v >> 64), off);
        const unsigned long long l = __shfl_up_sync(0xffffffffu, (unsigned long long)v, off);
        if (lane >= off) v += ((ds_u128)h << 64) | l;
    }
    return v;
}

/* The block's exclusive prefix of v in thread order (thread 0 gets 0, T threads); *all the
 * block's sum, in every thread. */
template <int T> static __device__ ds_u128 block_scan_u128(ds_u128 v, ds_u128 *all) {
    __shared__ unsigned long long wh[T / 32], wl[T / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const ds_u128 inc = warp_scan_u128(v);
    if (lane == 31) wh[warp] = (unsigned long long)(inc >> 64), wl[warp] = (unsigned long long)inc;
    __syncthreads();
    ds_u128 before = 0, sum = 0; /* the earlier warps' sums; all warps' */
    for (int w = 0; w < T / 32; w++) {
        const ds_u128 s = ((ds_u128)wh[w] << 64) | wl[w];
        if (w < warp) before += s;
        sum += s;
    }
    __syncthreads(); /* wh / wl may be rewritten by the next call */
    *all = sum;
    return before + inc - v;
}

/* The block's sum of v (every thread's), returned to every thread. */
template <int T> static __device__ ds_u128 block_sum_u128(ds_u128 v) {
    __shared__ unsigned long long wh[T / 32], wl[T / 32];
    __shared__ ds_u128 total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* a warp's sum of the halves: 32 x 2^64 fits neither, so add as 128 bits */
    for (int off = 16; off >= 1; off >>= 1) {
        const unsigned long long h =
            __shfl_xor_sync(0xffffffffu, (unsigned long long)(v >> 64), off);
        const unsigned long long l = __shfl_xor_sync(0xffffffffu, (unsigned long long)v, off);
        v += ((ds_u128)h << 64) | l;
    }
    if (lane == 0) wh[warp] = (unsigned long long)(v >> 64), wl[warp] = (unsigned long long)v;
    __syncthreads();
    if (threadIdx.x == 0) {
        ds_u128 t = 0;
        for (int w = 0; w < T / 32; w++)
            t += ((ds_u128)wh[w] << 64) | wl[w];
        total = t;
    }
    __syncthreads();
    const ds_u128 t = total;
    __syncthreads(); /* total may be rewritten by the next call */
    return t;
}

/* A row's group of CL blocks (one block, or a cluster): this block's rank and its slice
 * [lo, hi) of the row's ids, whole sum blocks of DI_SAMPLE_BLOCK ids ([b0, b1) of nb). With
 * one block the exchanges below are the block's own barriers and shared memory. */
template <int CL> struct sr_group {
    unsigned rank;
    int64_t nb, b0, b1, lo, hi;
    __device__ void sync() const {
        if constexpr (CL > 1)
            cg::this_cluster().sync();
        else
            __syncthreads();
    }
    /* block r's copy of this block's shared variable p */
    template <class X> __device__ X *at(X *p, unsigned r) const {
        if constexpr (CL > 1)
            return cg::this_cluster().map_shared_rank(p, r);
        else
            return p;
    }
};

template <int CL> static __device__ sr_group<CL> sr_group_of(int64_t V) {
    sr_group<CL> c;
    if constexpr (CL > 1)
        c.rank = cg::this_cluster().block_rank();
    else
        c.rank = 0;
    c.nb = (V + DI_SAMPLE_BLOCK - 1) / DI_SAMPLE_BLOCK;
    c.b0 = c.nb * c.rank / CL;
    c.b1 = c.nb * (c.rank + 1) / CL;
    c.lo = min(c.b0 * DI_SAMPLE_BLOCK, V);
    c.hi = min(c.b1 * DI_SAMPLE_BLOCK, V);
    return c;
}

/* Every block's v (thread 0's; block-uniform), exchanged over the group: *all the sum over
 * the blocks; returns the sum over the blocks of lower rank. The same in every thread. */
template <int CL>
static __device__ ds_u128 group_sum_u128(const sr_group<CL> &c, ds_u128 v, ds_u128 *all) {
    if constexpr (CL == 1) {
        *all = v;
        return 0;
    } else {
        __shared__ ds_u128 slot;
        if (threadIdx.x == 0) slot = v;
        c.sync();
        ds_u128 before = 0, sum = 0;
        for (unsigned r = 0; r < CL; r++) {
            const ds_u128 x = *c.at(&slot, r);
            if (r < c.rank) before += x;
            sum += x;
        }
        c.sync(); /* every block has read the slots before one is rewritten or leaves */
        *all = sum;
        return before;
    }
}

/* The row's maximum, its first index and whether it holds a NaN or +inf: each block's slice
 * (di_cuda_block_row_max), combined in rank order by the same rule (the larger value, on a
 * tie the lower index), so the whole row's, in every block. */
template <int CL>
static __device__ di_cuda_row_max group_row_max(const sr_group<CL> &c, const float *row) {
    const di_cuda_row_max m = di_cuda_block_row_max<sr_threads<CL>>(row + c.lo, c.hi - c.lo);
    if constexpr (CL == 1) {
        return m;
    } else {
        __shared__ float smax;
        __shared__ int64_t sfirst;
        __shared__ int sbad;
        if (threadIdx.x == 0)
            smax = m.max, sfirst = m.first < 0 ? -1 : c.lo + m.first, sbad = m.bad;
        c.sync();
        di_cuda_row_max r = {-INFINITY, -1, false};
        for (unsigned k = 0; k < CL; k++) {
            const float v = *c.at(&smax, k);
            const int64_t i = *c.at(&sfirst, k);
            r.bad |= *c.at(&sbad, k) != 0;
            if (i >= 0 && row_max_ahead(v, i, r.max, r.first)) r.max = v, r.first = i;
        }
        c.sync();
        return r;
    }
}

/* A token's integer mass (sample_mass.h): 0 below min_p's cutoff. */
static __device__ __forceinline__ uint64_t sr_mass(float x, float max, float inv_t, float cutoff) {
    return ds_mass(ds_weight(x, max, inv_t, cutoff));
}

/* Token i's mass if it is kept (a candidate whose key is at most lim), else 0. */
static __device__ __forceinline__ uint64_t sr_kept_mass(float x, int64_t i, float max, float inv_t,
                                                        float cutoff, uint64_t lim) {
    return x >= cutoff && ds_rank_key(x, (int32_t)i) <= lim ? sr_mass(x, max, inv_t, cutoff) : 0;
}

/* Adds this lane's token (when `in`) to digit d of sub-histogram sub: the warp's lanes of
 * one digit are added once, by their first lane (a nearly flat row puts most tokens in one
 * digit, and 32 atomics on one address would queue). Every lane of the warp calls it. */
template <bool MASS>
static __device__ __forceinline__ void warp_add(const sr_hist &h, int sub, bool in, int d,
                                                uint64_t m) {
    const int lane = threadIdx.x & 31;
    unsigned pending = __ballot_sync(0xffffffffu, in);
    while (pending) {
        const int leader = __ffs(pending) - 1;
        const int dl = __shfl_sync(0xffffffffu, d, leader);
        const bool mine = in && d == dl;
        const unsigned grp = __ballot_sync(0xffffffffu, mine);
        if (MASS) { /* 32 masses below 2^52 as three 32-bit sums: bits 32.., 16..31, 0..15 */
            const unsigned hs = __reduce_add_sync(0xffffffffu, mine ? (unsigned)(m >> 32) : 0u);
            const unsigned ms =
                __reduce_add_sync(0xffffffffu, mine ? (unsigned)(m >> 16) & 0xffffu : 0u);
            const unsigned ls = __reduce_add_sync(0xffffffffu, mine ? (unsigned)m & 0xffffu : 0u);
            if (lane == leader) {
                if (hs) atomicAdd(&h.hi[sub * SR_BINS + dl], (unsigned long long)hs);
                atomicAdd(&h.lo[sub * SR_BINS + dl],
                          ((unsigned long long)ms << 16) + (unsigned long long)ls);
            }
        }
        if (lane == leader) atomicAdd(&h.cnt[sub * SR_BINS + dl], (unsigned)__popc(grp));
        pending &= ~grp;
    }
}

/* The radix select: the ranking key (smaller = better) of the token where, walking the
 * candidates with key <= lim in ranking order, the running count reaches `rank` (MASS false:
 * the rank-th best) or the running mass reaches `need` (MASS true: top_p's last kept token).
 * Each pass histograms the next 8 bits of the keys that share the bits chosen so far (each
 * block its slice, into its shared memory), then every block sums each digit over the group's
 * blocks and finds the digit, from the smallest, where the running count or mass reaches the
 * target -- the same integers in every block, so the same digit. A digit holding a single
 * token ends the search with one more pass that reads that token's key (in the one block
 * whose slice holds it, exchanged as a sum). The target is always reached (rank <= the
 * candidates; need <= their mass). */
template <int CL, bool MASS>
static __device__ uint64_t radix_select(const sr_group<CL> &c, const float *x, float max,
                                        float inv_t, float cutoff, uint64_t lim, uint64_t rank,
                                        ds_u128 need, const sr_hist &h) {
    constexpr int T = sr_threads<CL>;
    __shared__ uint64_t s_prefix;
    __shared__ int s_shift;            /* the bits below the chosen prefix; -1: one token left */
    __shared__ ds_u128 s_before;       /* count or mass of the tokens before the prefix's */
    __shared__ unsigned s_dc[SR_BINS]; /* a pass's count per digit ... */
    __shared__ ds_u128 s_dv[SR_BINS];  /* ... and its count or mass (MASS) */
    const int sub = (threadIdx.x >> 5) % SR_SUBS;
    if (threadIdx.x == 0) s_prefix = 0, s_shift = 64, s_before = 0;
    __syncthreads();
    while (s_shift > 0) {
        const int top = s_shift; /* keys whose bits above `top` equal the prefix's */
        const int shift = top - 8;
        const uint64_t prefix = s_prefix;
        for (int i = threadIdx.x; i < SR_SUBS * SR_BINS; i += T) {
            h.cnt[i] = 0;
            if (MASS) h.hi[i] = 0, h.lo[i] = 0;
        }
        __syncthreads();
        /* a uniform loop (every lane of a warp takes part in warp_add) */
        for (int64_t i0 = c.lo; i0 < c.hi; i0 += T) {
            const int64_t i = i0 + threadIdx.x;
            const float xi = i < c.hi ? x[i] : -INFINITY;
            const uint64_t key = xi >= cutoff ? ds_rank_key(xi, (int32_t)i) : UINT64_MAX;
            const bool in = xi >= cutoff && key <= lim && (top >= 64 || !((key ^ prefix) >> top));
            const uint64_t m = MASS && in ? sr_mass(xi, max, inv_t, cutoff) : 0;
            warp_add<MASS>(h, sub, in, in ? (int)(key >> shift) & 255 : -1, m);
        }
        c.sync(); /* every block's histogram is complete */
        /* Each digit's count and mass over the sub-histograms of every block (thread d), then
         * warp 0 finds the digit where the running count or mass reaches the target: lane l
         * sums digits 8 l .. 8 l + 7, a scan over the lanes, and the first lane to reach it
         * walks its 8. */
        if (threadIdx.x < SR_BINS) {
            const int d = threadIdx.x;
            unsigned cnt = 0;
            ds_u128 v = 0;
            for (unsigned r = 0; r < CL; r++) {
                const unsigned *rc = c.at(h.cnt, r);
                const unsigned long long *rh = c.at(h.hi, r), *rl = c.at(h.lo, r);
                for (int sb = 0; sb < SR_SUBS; sb++) {
                    cnt += rc[sb * SR_BINS + d];
                    if (MASS) v += ((ds_u128)rh[sb * SR_BINS + d] << 32) + rl[sb * SR_BINS + d];
                }
            }
            s_dc[d] = cnt;
            s_dv[d] = MASS ? v : (ds_u128)cnt;
        }
        c.sync(); /* every block has read the histograms: the next pass may clear them */
        if (threadIdx.x < 32) {
            const int lane = threadIdx.x;
            const ds_u128 target = MASS ? need : (ds_u128)rank, base = s_before;
            ds_u128 mine = 0;
            for (int j = 0; j < 8; j++)
                mine += s_dv[8 * lane + j];
            const ds_u128 inc = warp_scan_u128(mine);
            const unsigned reach = __ballot_sync(0xffffffffu, base + inc >= target);
            /* reach != 0: the target is always reached (rank <= the candidates, need <= their
             * mass); were it not, the last digit is taken */
            const int first = reach ? __ffs(reach) - 1 : 31;
            if (lane == first) {
                ds_u128 acc = base + inc - mine;
                int d = 8 * lane;
                for (; d < 8 * lane + 7 && acc + s_dv[d] < target; d++)
                    acc += s_dv[d];
                s_before = acc;
                s_prefix = prefix | ((uint64_t)d << shift);
                s_shift = s_dc[d] == 1 ? -1 : shift;
            }
        }
        __syncthreads();
        if (s_shift < 0) { /* one token left: its key, from the block whose slice holds it */
            __shared__ uint64_t s_found;
            if (threadIdx.x == 0) s_found = 0;
            __syncthreads();
            const uint64_t p2 = s_prefix;
            for (int64_t i = c.lo + threadIdx.x; i < c.hi; i += T) {
                const float xi = x[i];
                if (!(xi >= cutoff)) continue;
                const uint64_t key = ds_rank_key(xi, (int32_t)i);
                if (key <= lim && (top >= 64 || !((key ^ p2) >> top)) &&
                    ((key >> shift) & 255) == ((p2 >> shift) & 255))
                    s_found = key;
            }
            __syncthreads();
            const uint64_t found = s_found;
            __syncthreads(); /* read by all before a later call could reset it */
            /* 0 in every block but one (a real key is never 0: its logit's bits) */
            ds_u128 key;
            group_sum_u128(c, (ds_u128)found, &key);
            return (uint64_t)key;
        }
    }
    const uint64_t prefix = s_prefix;
    __syncthreads();
    return prefix;
}

/* The filtered draw of the group's row: sample_mass.h's definition. Returns the token in one
 * thread of one block, -1 elsewhere. */
template <int CL>
static __device__ int32_t filtered_draw(const sr_group<CL> &c, const float *x, int64_t V, float max,
                                        float inv_t, float cutoff, const di_sample_row &r,
                                        const sr_hist &h) {
    constexpr int T = sr_threads<CL>;
    uint64_t lim = UINT64_MAX; /* kept: candidates with key <= lim */
    if (r.top_k > 0 && r.top_k < V) {
        ds_u128 n = 0, all;
        for (int64_t i = c.lo + threadIdx.x; i < c.hi; i += T)
            n += x[i] >= cutoff;
        group_sum_u128(c, block_sum_u128<T>(n), &all);
        if (all > (ds_u128)r.top_k)
            lim = radix_select<CL, false>(c, x, max, inv_t, cutoff, lim, (uint64_t)r.top_k, 0, h);
    }
    if (r.top_p < 1.0f) {
        ds_u128 m = 0, all;
        for (int64_t i = c.lo + threadIdx.x; i < c.hi; i += T)
            m += sr_kept_mass(x[i], i, max, inv_t, cutoff, lim);
        group_sum_u128(c, block_sum_u128<T>(m), &all);
        lim = radix_select<CL, true>(c, x, max, inv_t, cutoff, lim, 0, ds_top_p_need(r.top_p, all),
                                     h);
    }
    /* The draw: thread j's run [i0, i1) of the block's slice, its kept mass, the runs before
     * it in this block and in the blocks before this one. */
    const int64_t per = (c.hi - c.lo + T - 1) / T;
    const int64_t i0 = min(c.lo + (int64_t)threadIdx.x * per, c.hi), i1 = min(i0 + per, c.hi);
    ds_u128 mine = 0;
    for (int64_t i = i0; i < i1; i++)
        mine += sr_kept_mass(x[i], i, max, inv_t, cutoff, lim);
    ds_u128 block_total, total;
    const ds_u128 in_block = block_scan_u128<T>(mine, &block_total);
    const ds_u128 before = group_sum_u128(c, block_total, &total) + in_block;
    const ds_u128 target =
        ds_draw_target(ds_philox_uniform(r.seed, r.sample_index, r.position, 0), total);
    if (before <= target && target < before + mine) { /* one thread: the run that passes it */
        ds_u128 acc = before; /* a token of no mass never passes the target */
        for (int64_t i = i0; i < i1; i++)
            if ((acc += sr_kept_mass(x[i], i, max, inv_t, cutoff, lim)) > target) return (int32_t)i;
    }
    return -1;
}

/* Group x of CL blocks: row x's draw. The blocks agree on every branch (the row's maximum,
 * its parameters), so every block takes part in every group barrier. */
template <int CL>
__global__ void __launch_bounds__(sr_threads<CL>)
    sample_rows_kernel(const float *x, int64_t V, const di_sample_row *rows, int32_t *out) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    constexpr int T = sr_threads<CL>;
    extern __shared__ double bsum[]; /* [ceil(V / DI_SAMPLE_BLOCK)]; or the histograms */
    const sr_group<CL> c = sr_group_of<CL>(V);
    const int64_t t = blockIdx.x / CL;
    const float *row = x + t * V;
    const int tid = threadIdx.x;
    const di_cuda_row_max m = group_row_max(c, row);
    const di_sample_row r = rows[t];
    if (m.bad || m.first < 0 || r.temperature < DI_SAMPLING_GREEDY_EPS) { /* group-uniform */
        if (c.rank == 0 && tid == 0) out[t] = m.bad || m.first < 0 ? -1 : (int32_t)m.first;
        return;
    }
    const float bv = m.max;
    const float inv_t = __fdiv_rn(1.0f, r.temperature);
    /* min_p's cutoff, the host's expression (max + T ln(min_p), its logarithm from the host) */
    float cutoff = -FLT_MAX;
    if (r.min_p > 0.0f) {
        const float cm = __fadd_rn(bv, __fmul_rn(r.temperature, r.log_min_p));
        cutoff = cm > cutoff ? cm : cutoff;
    }
    if (ds_filtered(r.top_k, r.top_p, V)) {
        unsigned char *sm = reinterpret_cast<unsigned char *>(bsum);
        const sr_hist h = {reinterpret_cast<unsigned *>(sm),
                           reinterpret_cast<unsigned long long *>(sm + SR_SUBS * SR_BINS * 4),
                           reinterpret_cast<unsigned long long *>(sm + SR_SUBS * SR_BINS * 12)};
        /* -1 unless the one thread that finds the token writes it, after group barriers
         * (they order the two writes) */
        if (c.rank == 0 && tid == 0) out[t] = -1;
        const int32_t tok = filtered_draw(c, row, V, bv, inv_t, cutoff, r, h);
        if (tok >= 0) out[t] = tok;
        return;
    }

    /* The weights' block sums (each block its slice's), gathered by block 0, then the draw
     * (its thread 0). */
    for (int64_t b = c.b0 + tid; b < c.b1; b += T) {
        const int64_t b0 = b * DI_SAMPLE_BLOCK;
        bsum[b] = ds_block_sum(row, b0, min(b0 + DI_SAMPLE_BLOCK, V), bv, inv_t, cutoff);
    }
    c.sync();
    if constexpr (CL > 1) {
        if (c.rank == 0)
            for (unsigned k = 1; k < CL; k++) {
                const double *rb = c.at(bsum, k);
                for (int64_t b = c.nb * k / CL + tid; b < c.nb * (k + 1) / CL; b += T)
                    bsum[b] = rb[b];
            }
        c.sync(); /* block 0 has read every block's sums before any leaves */
    }
    if (c.rank != 0 || tid != 0) return;
    double total = 0.0;
    for (int64_t b = 0; b < c.nb; b++)
        total = __dadd_rn(total, bsum[b]);
    const double u = ds_philox_uniform(r.seed, r.sample_index, r.position, 0);
    out[t] = ds_draw_full_row(row, V, bv, inv_t, cutoff, bsum, __dmul_rn(u, total));
}

bool di_cuda_sample_setup(void) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = SR_CLUSTER;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(SR_CLUSTER);
    cfg.blockDim = dim3(sr_threads<SR_CLUSTER>);
    cfg.dynamicSmemBytes = SR_SMEM_MAX;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    const cudaError_t err =
        cudaOccupancyMaxActiveClusters(&clusters, sample_rows_kernel<SR_CLUSTER>, &cfg);
    (void)cudaGetLastError();
    return err == cudaSuccess && clusters > 0;
}

cudaError_t di_cuda_launch_sample_rows(const float *x, int64_t n, int64_t V,
                                       const di_sample_row *rows, int32_t *out, bool clusters,
                                       int64_t pair_rows, cudaStream_t stream) {
    if (n <= 0 || V <= 0) return cudaSuccess;
    size_t smem = (size_t)((V + DI_SAMPLE_BLOCK - 1) / DI_SAMPLE_BLOCK) * sizeof(double);
    smem = smem > SR_HIST_BYTES ? smem : SR_HIST_BYTES;
    /* 48 KiB of shared memory without opting in, less the kernel's own (under 12 KiB):
     * vocabularies up to DI_SAMPLE_DEVICE_MAX_VOCAB (32 KiB of block sums; the engine sends
     * none larger: di_sampler_device_draw); larger ones give -1 (the host sampler's rows) */
    if (smem > SR_SMEM_MAX || V > DI_SAMPLE_DEVICE_MAX_VOCAB)
        return cudaMemsetAsync(out, 0xff, (size_t)n * sizeof *out, stream);
    di_cuda_sample_launches++;
    if (clusters && n <= SR_CLUSTER_ROWS && V >= SR_CLUSTER * DI_SAMPLE_BLOCK) {
        di_cuda_sample_cluster_launches++;
        return di_cuda_launch_cluster(
            sample_rows_kernel<SR_CLUSTER>, dim3((unsigned)(SR_CLUSTER * n)),
            dim3(sr_threads<SR_CLUSTER>), smem, stream, dim3(SR_CLUSTER, 1, 1), x, V, rows, out);
    }
    if (clusters && n <= pair_rows && V >= 2 * DI_SAMPLE_BLOCK) {
        di_cuda_sample_cluster_launches++;
        return di_cuda_launch_cluster(sample_rows_kernel<2>, dim3((unsigned)(2 * n)),
                                      dim3(sr_threads<2>), smem, stream, dim3(2, 1, 1), x, V, rows,
                                      out);
    }
    return di_cuda_launch(sample_rows_kernel<1>, (unsigned)n, sr_threads<1>, smem, stream, x, V,
                          rows, out);
}
