/*
 * cuda_sample.cu -- seeded sampling on the device (backend.h's sample_rows): for each row the
 * token the host sampler (src/sample) would choose with the row's temperature, min_p, top_k
 * and top_p (no logit processor or logprobs), bit for bit, and the greedy token for
 * temperature 0.
 *
 * One block per row. The block finds the row's maximum and its first index (and whether a
 * NaN or +inf is present: di_cuda_block_row_max, as argmax_rows); a row the host sampler would
 * reject (NaN, +inf, every logit -inf) gives -1, so that the caller hands that row to the host
 * sampler, which reports it. Then:
 *   - temperature and min_p only (the full-row draw): the threads compute the weights' block
 *     sums (one block of DI_SAMPLE_BLOCK ids per thread at a time, in the host's lane order),
 *     and thread 0 adds them in order, draws u from Philox and walks the blocks
 *     (sample_full_row.h: the host's arithmetic, each operation rounded once);
 *   - top_k or top_p (the filtered draw, sample_mass.h's exact integer masses): top_k's cut is
 *     the k-th smallest ranking key among the tokens at or above min_p's cutoff, top_p's the
 *     key of the first token whose running mass (ranking order) reaches need, both found by
 *     a radix select over the 64-bit keys -- 8 bits a pass, from the top, counting (top_k) or
 *     adding masses (top_p) per digit in shared memory, stopping once one token is left --
 *     with no sort. The draw: each thread sums the kept masses of a contiguous run of ids, a
 *     block scan gives each run's start, and the thread whose run holds the target walks it.
 *     Every sum is an exact integer, so the atomics' order does not matter.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "sample/sample_full_row.h"
#include "sample/sample_mass.h"
#include "sample/sampler.h"

#include <float.h>
#include <math.h>

#define SR_THREADS 1024
#define SR_WARPS   (SR_THREADS / 32)
#define SR_SUBS    4 /* sub-histograms (warp % SR_SUBS): fewer same-address atomics */
#define SR_BINS    256
/* Shared memory of the filtered draw: per sub-histogram and digit a count and a mass in two
 * halves (the masses' high and low 32 bits, summed apart: no overflow for 2^20 tokens). */
#define SR_HIST_BYTES (SR_SUBS * SR_BINS * (4 + 8 + 8))

int64_t di_cuda_sample_launches; /* cuda_backend.h: draws launched (for tests) */

struct sr_hist {
    unsigned *cnt;          /* [SR_SUBS][SR_BINS] */
    unsigned long long *hi; /* [SR_SUBS][SR_BINS]: sums of mass >> 32 */
    unsigned long long *lo; /* [SR_SUBS][SR_BINS]: sums of mass & 0xffffffff */
};

/* The block's sum of v (every thread's), returned to every thread. */
static __device__ ds_u128 block_sum_u128(ds_u128 v) {
    __shared__ unsigned long long wh[SR_WARPS], wl[SR_WARPS];
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
        for (int w = 0; w < SR_WARPS; w++)
            t += ((ds_u128)wh[w] << 64) | wl[w];
        total = t;
    }
    __syncthreads();
    const ds_u128 t = total;
    __syncthreads(); /* total may be rewritten by the next call */
    return t;
}

/* The block's exclusive prefix of v in thread order (thread 0 gets 0); *all the sum. */
static __device__ ds_u128 block_scan_u128(ds_u128 v, ds_u128 *all) {
    __shared__ unsigned long long wh[SR_WARPS], wl[SR_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    ds_u128 inc = v; /* the warp's inclusive scan */
    for (int off = 1; off < 32; off <<= 1) {
        const unsigned long long h =
            __shfl_up_sync(0xffffffffu, (unsigned long long)(inc >> 64), off);
        const unsigned long long l = __shfl_up_sync(0xffffffffu, (unsigned long long)inc, off);
        if (lane >= off) inc += ((ds_u128)h << 64) | l;
    }
    if (lane == 31) wh[warp] = (unsigned long long)(inc >> 64), wl[warp] = (unsigned long long)inc;
    __syncthreads();
    ds_u128 before = 0, sum = 0; /* the earlier warps' sums; all warps' */
    for (int w = 0; w < SR_WARPS; w++) {
        const ds_u128 s = ((ds_u128)wh[w] << 64) | wl[w];
        if (w < warp) before += s;
        sum += s;
    }
    __syncthreads(); /* wh / wl may be rewritten by the next call */
    *all = sum;
    return before + inc - v;
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
 * Each pass histograms the next 8 bits of the keys that share the bits chosen so far and
 * finds the digit, from the smallest, where the running count or mass reaches the target. A
 * digit holding a single token ends the search with one more pass that reads that token's
 * key. The target is always reached (rank <= the candidates; need <= their mass). */
template <bool MASS>
static __device__ uint64_t radix_select(const float *x, int64_t V, float max, float inv_t,
                                        float cutoff, uint64_t lim, uint64_t rank, ds_u128 need,
                                        const sr_hist &h) {
    __shared__ uint64_t s_prefix, s_found;
    __shared__ int s_shift;            /* the bits below the chosen prefix; -1: one token left */
    __shared__ ds_u128 s_before;       /* count or mass of the tokens before the prefix's */
    __shared__ unsigned s_dc[SR_BINS]; /* a pass's count per digit ... */
    __shared__ ds_u128 s_dv[SR_BINS];  /* ... and its count or mass (MASS) */
    const int sub = (threadIdx.x >> 5) % SR_SUBS;
    if (threadIdx.x == 0) s_prefix = 0, s_shift = 64, s_before = 0, s_found = 0;
    __syncthreads();
    while (s_shift > 0) {
        const int top = s_shift; /* keys whose bits above `top` equal the prefix's */
        const int shift = top - 8;
        const uint64_t prefix = s_prefix;
        for (int i = threadIdx.x; i < SR_SUBS * SR_BINS; i += SR_THREADS) {
            h.cnt[i] = 0;
            if (MASS) h.hi[i] = 0, h.lo[i] = 0;
        }
        __syncthreads();
        /* a uniform loop (every lane of a warp takes part in warp_add) */
        for (int64_t i0 = 0; i0 < V; i0 += SR_THREADS) {
            const int64_t i = i0 + threadIdx.x;
            const float xi = i < V ? x[i] : -INFINITY;
            const uint64_t key = xi >= cutoff ? ds_rank_key(xi, (int32_t)i) : UINT64_MAX;
            const bool in = xi >= cutoff && key <= lim && (top >= 64 || !((key ^ prefix) >> top));
            const uint64_t m = MASS && in ? sr_mass(xi, max, inv_t, cutoff) : 0;
            warp_add<MASS>(h, sub, in, in ? (int)(key >> shift) & 255 : -1, m);
        }
        __syncthreads();
        /* Each digit's count and mass over the sub-histograms (thread d), then warp 0 finds
         * the digit where the running count or mass reaches the target: lane l sums digits
         * 8 l .. 8 l + 7, a scan over the lanes, and the first lane to reach it walks its 8. */
        if (threadIdx.x < SR_BINS) {
            const int d = threadIdx.x;
            unsigned c = 0;
            ds_u128 v = 0;
            for (int s = 0; s < SR_SUBS; s++) {
                c += h.cnt[s * SR_BINS + d];
                if (MASS) v += ((ds_u128)h.hi[s * SR_BINS + d] << 32) + h.lo[s * SR_BINS + d];
            }
            s_dc[d] = c;
            s_dv[d] = MASS ? v : (ds_u128)c;
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            const int lane = threadIdx.x;
            const ds_u128 target = MASS ? need : (ds_u128)rank, base = s_before;
            ds_u128 mine = 0;
            for (int j = 0; j < 8; j++)
                mine += s_dv[8 * lane + j];
            ds_u128 inc = mine;
            for (int off = 1; off < 32; off <<= 1) {
                const unsigned long long hh =
                    __shfl_up_sync(0xffffffffu, (unsigned long long)(inc >> 64), off);
                const unsigned long long ll =
                    __shfl_up_sync(0xffffffffu, (unsigned long long)inc, off);
                if (lane >= off) inc += ((ds_u128)hh << 64) | ll;
            }
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
        if (s_shift < 0) { /* one token left: its key */
            const int t2 = top, sh = shift;
            const uint64_t p2 = s_prefix;
            for (int64_t i = threadIdx.x; i < V; i += SR_THREADS) {
                const float xi = x[i];
                if (!(xi >= cutoff)) continue;
                const uint64_t key = ds_rank_key(xi, (int32_t)i);
                if (key <= lim && (t2 >= 64 || !((key ^ p2) >> t2)) &&
                    ((key >> sh) & 255) == ((p2 >> sh) & 255))
                    s_found = key;
            }
            __syncthreads();
            const uint64_t found = s_found;
            __syncthreads(); /* read by all before a later call could reset it */
            return found;
        }
    }
    const uint64_t prefix = s_prefix;
    __syncthreads();
    return prefix;
}

/* The filtered draw of one row (the block's): sample_mass.h's definition. */
static __device__ int32_t filtered_draw(const float *x, int64_t V, float max, float inv_t,
                                        float cutoff, const di_sample_row &r, const sr_hist &h) {
    uint64_t lim = UINT64_MAX; /* kept: candidates with key <= lim */
    if (r.top_k > 0 && r.top_k < V) {
        ds_u128 c = 0;
        for (int64_t i = threadIdx.x; i < V; i += SR_THREADS)
            c += x[i] >= cutoff;
        if (block_sum_u128(c) > (ds_u128)r.top_k)
            lim = radix_select<false>(x, V, max, inv_t, cutoff, lim, (uint64_t)r.top_k, 0, h);
    }
    if (r.top_p < 1.0f) {
        ds_u128 m = 0;
        for (int64_t i = threadIdx.x; i < V; i += SR_THREADS)
            m += sr_kept_mass(x[i], i, max, inv_t, cutoff, lim);
        const ds_u128 need = ds_top_p_need(r.top_p, block_sum_u128(m));
        lim = radix_select<true>(x, V, max, inv_t, cutoff, lim, 0, need, h);
    }
    /* The draw: thread j's run of ids [i0, i1), their kept mass, the runs before it. */
    const int64_t per = (V + SR_THREADS - 1) / SR_THREADS;
    const int64_t i0 = min((int64_t)threadIdx.x * per, V), i1 = min(i0 + per, V);
    ds_u128 mine = 0;
    for (int64_t i = i0; i < i1; i++)
        mine += sr_kept_mass(x[i], i, max, inv_t, cutoff, lim);
    ds_u128 total;
    const ds_u128 before = block_scan_u128(mine, &total);
    const ds_u128 target =
        ds_draw_target(ds_philox_uniform(r.seed, r.sample_index, r.position, 0), total);
    __shared__ int32_t s_tok;
    if (threadIdx.x == 0) s_tok = -1;
    __syncthreads();
    if (before <= target && target < before + mine) { /* one thread: the run that passes it */
        ds_u128 acc = before; /* a token of no mass never passes the target */
        for (int64_t i = i0; i < i1; i++)
            if ((acc += sr_kept_mass(x[i], i, max, inv_t, cutoff, lim)) > target) {
                s_tok = (int32_t)i;
                break;
            }
    }
    __syncthreads();
    const int32_t tok = s_tok;
    __syncthreads(); /* read by all before a later call could reset it */
    return tok;
}

__global__ void __launch_bounds__(SR_THREADS)
    sample_rows_kernel(const float *x, int64_t V, const di_sample_row *rows, int32_t *out) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    extern __shared__ double bsum[]; /* [ceil(V / DI_SAMPLE_BLOCK)]; or the histograms */
    const float *row = x + (int64_t)blockIdx.x * V;
    const int tid = threadIdx.x;
    const di_cuda_row_max m = di_cuda_block_row_max<SR_THREADS>(row, V);
    const di_sample_row r = rows[blockIdx.x];
    if (m.bad || m.first < 0 || r.temperature < DI_SAMPLING_GREEDY_EPS) { /* block-uniform */
        if (tid == 0) out[blockIdx.x] = m.bad || m.first < 0 ? -1 : (int32_t)m.first;
        return;
    }
    const float bv = m.max;
    const float inv_t = __fdiv_rn(1.0f, r.temperature);
    /* min_p's cutoff, the host's expression (max + T ln(min_p), its logarithm from the host) */
    float cutoff = -FLT_MAX;
    if (r.min_p > 0.0f) {
        const float c = __fadd_rn(bv, __fmul_rn(r.temperature, r.log_min_p));
        cutoff = c > cutoff ? c : cutoff;
    }
    if ((r.top_k > 0 && r.top_k < V) || r.top_p < 1.0f) {
        unsigned char *sm = reinterpret_cast<unsigned char *>(bsum);
        const sr_hist h = {reinterpret_cast<unsigned *>(sm),
                           reinterpret_cast<unsigned long long *>(sm + SR_SUBS * SR_BINS * 4),
                           reinterpret_cast<unsigned long long *>(sm + SR_SUBS * SR_BINS * 12)};
        const int32_t tok = filtered_draw(row, V, bv, inv_t, cutoff, r, h);
        if (tid == 0) out[blockIdx.x] = tok;
        return;
    }

    /* The weights' block sums, then the draw (thread 0). */
    const int64_t nb = (V + DI_SAMPLE_BLOCK - 1) / DI_SAMPLE_BLOCK;
    for (int64_t b = tid; b < nb; b += SR_THREADS) {
        const int64_t b0 = b * DI_SAMPLE_BLOCK;
        bsum[b] = ds_block_sum(row, b0, min(b0 + DI_SAMPLE_BLOCK, V), bv, inv_t, cutoff);
    }
    __syncthreads();
    if (tid != 0) return;
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++)
        total = __dadd_rn(total, bsum[b]);
    const double u = ds_philox_uniform(r.seed, r.sample_index, r.position, 0);
    out[blockIdx.x] = ds_draw_full_row(row, V, bv, inv_t, cutoff, bsum, __dmul_rn(u, total));
}

cudaError_t di_cuda_launch_sample_rows(const float *x, int64_t n, int64_t V,
                                       const di_sample_row *rows, int32_t *out,
                                       cudaStream_t stream) {
    if (n <= 0 || V <= 0) return cudaSuccess;
    size_t smem = (size_t)((V + DI_SAMPLE_BLOCK - 1) / DI_SAMPLE_BLOCK) * sizeof(double);
    smem = smem > SR_HIST_BYTES ? smem : SR_HIST_BYTES;
    /* 48 KiB of shared memory without opting in, less the kernel's own (under 12 KiB):
     * vocabularies up to DI_SAMPLE_DEVICE_MAX_VOCAB (32 KiB of block sums; the engine sends
     * none larger: di_sampler_device_draw); larger ones give -1 (the host sampler's rows) */
    if (smem > 36 * 1024 || V > DI_SAMPLE_DEVICE_MAX_VOCAB)
        return cudaMemsetAsync(out, 0xff, (size_t)n * sizeof *out, stream);
    di_cuda_sample_launches++;
    return di_cuda_launch(sample_rows_kernel, (unsigned)n, SR_THREADS, smem, stream, x, V, rows,
                          out);
}
