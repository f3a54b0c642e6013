/*
 * cuda_moe.cu -- MoE routing on the device (backend.h's moe_route): expert selection by
 * di_router_select's rules (src/moe/router.c) and the stable grouping of the (token, slot)
 * entries by expert, so a MoE layer needs no host round trip.
 *
 * Two launches. select_kernel: one block per token; a thread per expert computes the score
 * (double intermediates rounded to float, as the host does: softmax's sum is added by one
 * thread in expert order, so it is the host's sum), the selection key (score + bias), the
 * group limit (one thread per group, the host's loops), then top_k rounds of an argmax
 * (highest key, lowest id on ties: the host's rule) and the weights in double by one thread.
 * The scores use the device's double exp, which may differ from the host libm's in the last
 * double bit; after rounding to float that almost never shows, and when it does it moves a
 * weight by one float ulp (or, on an exact tie, which expert wins) -- within the goldens'
 * tolerance, and the tests compare the results with the host's. NaN keys rank lowest here
 * (the host's scan keeps a NaN it starts on); a NaN router logit is a broken model anyway.
 *
 * group_kernel: one block; the threads count the entries per expert (shared-memory atomics),
 * block scans give the offsets and the active list, and one warp then places the entries
 * 32 at a time in entry order (__match_any_sync finds each entry's rank among the same
 * expert's), so tokens stay in order inside an expert (the host's counting sort, the same
 * rows) in nk / 32 steps instead of one thread walking all nk entries per expert.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

#define RT_THREADS                                                                                 \
    32 /* select_kernel: experts per pass of a thread loop (one warp: the                          \
          argmax rounds' barriers cost little, and E is only 64..384) */
#define RG_THREADS                                                                                 \
    1024 /* group_kernel: at most one thread per expert (launched with the                         \
            power of two >= E, at least a warp) */

struct route_args {
    di_router_params r; /* bias: device memory or NULL */
    int64_t n;
    const float *logits;
    int32_t *ids; /* [n K] selected ids (the rows_of buffer, overwritten by group_kernel) */
    float *w;
};

/* Is (ka, ia) ahead of (kb, ib) in the selection order? ib < 0 is "no candidate". NaN keys
 * rank lowest. */
static __device__ __forceinline__ bool ahead(float ka, int ia, float kb, int ib) {
    if (ia < 0) return false;
    if (ib < 0) return true;
    if (isnan(kb)) return !isnan(ka) || ia < ib;
    if (isnan(ka)) return false;
    return ka > kb || (ka == kb && ia < ib);
}

__global__ void __launch_bounds__(RT_THREADS) select_kernel(const route_args a) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    __shared__ float score[DI_CUDA_ROUTE_MAX_E], key[DI_CUDA_ROUTE_MAX_E];
    __shared__ double ex[DI_CUDA_ROUTE_MAX_E];
    __shared__ float gscore[DI_CUDA_ROUTE_MAX_E];
    __shared__ unsigned char taken[DI_CUDA_ROUTE_MAX_E];
    __shared__ double red_d;
    __shared__ float red_k[RT_THREADS / 32];
    __shared__ int red_i[RT_THREADS / 32];
    __shared__ int sel[64];
    const di_router_params &r = a.r;
    __shared__ float lg[DI_CUDA_ROUTE_MAX_E]; /* the token's logits, read once in parallel */
    const int E = (int)r.n_experts, K = (int)r.top_k, tid = threadIdx.x;
    const int64_t t = blockIdx.x;
    for (int i = tid; i < E; i += RT_THREADS)
        lg[i] = a.logits[t * E + i];
    __syncthreads();

    /* Scores (router.c: compute_scores). */
    if (r.score == DI_SCORE_SOFTMAX) {
        if (tid == 0) { /* the host's max scan (its order only matters with NaNs) */
            double mx = lg[0];
            for (int i = 1; i < E; i++)
                if (lg[i] > mx) mx = lg[i];
            red_d = mx;
        }
        __syncthreads();
        const double mx = red_d;
        for (int i = tid; i < E; i += RT_THREADS)
            ex[i] = exp((double)lg[i] - mx);
        __syncthreads();
        if (tid == 0) { /* the host's sum, in expert order */
            double sum = 0.0;
            for (int i = 0; i < E; i++)
                sum += ex[i];
            red_d = sum;
        }
        __syncthreads();
        const double sum = red_d;
        for (int i = tid; i < E; i += RT_THREADS)
            score[i] = (float)(ex[i] / sum);
    } else if (r.score == DI_SCORE_SIGMOID) {
        for (int i = tid; i < E; i += RT_THREADS)
            score[i] = (float)(1.0 / (1.0 + exp(-(double)lg[i])));
    } else {
        for (int i = tid; i < E; i += RT_THREADS) {
            const double x = lg[i];
            const double sp = x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x));
            score[i] = (float)sqrt(sp);
        }
    }
    for (int i = tid; i < E; i += RT_THREADS) {
        key[i] = score[i] + (r.bias ? r.bias[i] : 0.0f);
        taken[i] = 0;
    }
    __syncthreads();

    /* Group limit (router.c: limit_groups): one thread per group, the host's loops. */
    const bool grouped = r.method != DI_TOPK_GREEDY && r.n_group > 1 && r.topk_group < r.n_group;
    if (grouped) {
        const int G = (int)r.n_group, size = E / G;
        for (int g = tid; g < G; g += RT_THREADS) {
            const float *k = key + g * size;
            float v;
            if (r.method == DI_TOPK_NOAUX_TC) {
                if (size < 2) {
                    v = k[0];
                } else {
                    float b1 = k[0] > k[1] ? k[0] : k[1], b2 = k[0] > k[1] ? k[1] : k[0];
                    for (int i = 2; i < size; i++) {
                        if (k[i] > b1) {
                            b2 = b1;
                            b1 = k[i];
                        } else if (k[i] > b2) {
                            b2 = k[i];
                        }
                    }
                    v = b1 + b2;
                }
            } else {
                v = k[0];
                for (int i = 1; i < size; i++)
                    if (k[i] > v) v = k[i];
            }
            gscore[g] = v;
        }
        __syncthreads();
        for (int g = tid; g < G; g += RT_THREADS) {
            int rank = 0;
            for (int j = 0; j < G; j++)
                if (gscore[j] > gscore[g] || (gscore[j] == gscore[g] && j < g)) rank++;
            taken[g] = rank < r.topk_group; /* reused as "group kept" until the selection */
        }
        __syncthreads();
        for (int i = tid; i < E; i += RT_THREADS)
            if (!taken[i / size]) key[i] = -INFINITY;
        __syncthreads();
        for (int i = tid; i < E; i += RT_THREADS)
            taken[i] = 0;
        __syncthreads();
    }

    /* top_k rounds of an argmax over the untaken experts. */
    const int lane = tid & 31, warp = tid >> 5;
    for (int j = 0; j < K; j++) {
        float bk = 0.0f;
        int bi = -1;
        for (int i = tid; i < E; i += RT_THREADS)
            if (!taken[i] && ahead(key[i], i, bk, bi)) bk = key[i], bi = i;
        for (int off = 16; off >= 1; off >>= 1) {
            const float ok = __shfl_xor_sync(0xffffffffu, bk, off);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
            if (ahead(ok, oi, bk, bi)) bk = ok, bi = oi;
        }
        if (lane == 0) red_k[warp] = bk, red_i[warp] = bi;
        __syncthreads();
        if (tid == 0) {
            float ck = red_k[0];
            int ci = red_i[0];
            for (int w = 1; w < RT_THREADS / 32; w++)
                if (ahead(red_k[w], red_i[w], ck, ci)) ck = red_k[w], ci = red_i[w];
            sel[j] = ci;
            taken[ci] = 1;
        }
        __syncthreads();
    }

    /* Weights (router.c: compute_weights), in double by one thread. */
    if (tid == 0) {
        double denom = 1.0;
        if (r.norm_topk_prob) {
            double sum = 0.0;
            for (int j = 0; j < K; j++)
                sum += score[sel[j]];
            denom = sum + 1e-20;
        }
        for (int j = 0; j < K; j++) {
            a.ids[t * K + j] = sel[j];
            a.w[t * K + j] =
                (float)((double)score[sel[j]] / denom * (double)r.routed_scaling_factor);
        }
    }
}

/* Inclusive block scan of v over the block's threads (Hillis-Steele in shared memory). */
static __device__ int block_scan(int v, int *buf) {
    const int tid = threadIdx.x;
    buf[tid] = v;
    __syncthreads();
    for (int d = 1; d < (int)blockDim.x; d <<= 1) {
        const int add = tid >= d ? buf[tid - d] : 0;
        __syncthreads();
        buf[tid] += add;
        __syncthreads();
    }
    const int r = buf[tid];
    __syncthreads();
    return r;
}

__global__ void __launch_bounds__(RG_THREADS)
    group_kernel(int E, int K, int nk, int32_t *ids_rows, int32_t *offsets, int32_t *active,
                 int32_t *src) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    extern __shared__ int32_t ids[]; /* [nk] */
    __shared__ int buf[RG_THREADS];
    __shared__ int next[RG_THREADS]; /* per expert: its count, then its next free row */
    const int e = threadIdx.x;
    if (e < E) next[e] = 0;
    for (int i = e; i < nk; i += (int)blockDim.x)
        ids[i] = ids_rows[i];
    __syncthreads();
    for (int i = e; i < nk; i += (int)blockDim.x) /* counts: the order does not matter */
        atomicAdd(&next[ids[i]], 1);
    __syncthreads();
    const int cnt = e < E ? next[e] : 0;
    const int end = block_scan(cnt, buf);
    const int act = block_scan(e < E && cnt > 0 ? 1 : 0, buf);
    if (e < E) {
        offsets[e] = end - cnt;
        next[e] = end - cnt;
        if (cnt > 0) active[act] = e; /* slot act - 1 of the list after the count */
        if (e == E - 1) {
            offsets[E] = end;
            active[0] = act;
        }
    }
    __syncthreads();
    /* Placement in entry order, 32 entries at a time by one warp (stable: an entry's row is
     * its expert's next free row plus the count of the same expert's entries before it
     * among the 32; that group's first lane then advances the expert's next row). */
    if (e >= 32) return;
    const unsigned below = (1u << e) - 1u;
    for (int i0 = 0; i0 < nk; i0 += 32) {
        const int i = i0 + e;
        const int x = i < nk ? ids[i] : -1 - e; /* past the end: a key of its own */
        const unsigned same = __match_any_sync(0xffffffffu, x);
        if (i < nk) {
            const int g = next[x] + __popc(same & below);
            src[g] = i / K;
            ids_rows[i] = g;
        }
        __syncwarp();
        if (i < nk && (same & below) == 0) next[x] += __popc(same);
        __syncwarp();
    }
}

cudaError_t di_cuda_launch_moe_route(const di_moe_route_params *p, cudaStream_t stream) {
    const int64_t E = p->router.n_experts, K = p->router.top_k, nk = p->n * K;
    if (p->n <= 0) return cudaSuccess;
    if (E > DI_CUDA_ROUTE_MAX_E || K > 64 || nk > DI_CUDA_ROUTE_MAX_ENTRIES)
        return cudaErrorNotSupported;
    route_args a;
    a.r = p->router;
    a.n = p->n;
    a.logits = p->logits;
    a.ids = p->rows_of;
    a.w = p->w;
    cudaError_t err = di_cuda_launch(select_kernel, (unsigned)p->n, RT_THREADS, 0, stream, a);
    if (err != cudaSuccess) return err;
    int threads = 32;
    while (threads < E)
        threads *= 2;
    return di_cuda_launch(group_kernel, 1, threads, (size_t)nk * sizeof(int32_t), stream, (int)E,
                          (int)K, (int)nk, p->rows_of, p->offsets, p->active, p->src);
}
