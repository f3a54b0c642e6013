/*
 * cuda_moe.cu -- MoE routing on the device (backend.h's moe_route): expert selection by
 * di_router_select's rules (src/moe/router.c) and the stable grouping of the (token, slot)
 * entries by expert, so a MoE layer needs no host round trip.
 *
 * Selection (select_token): one warp per token; lane l takes experts l, l + 32, ... . It
 * computes the scores (double intermediates rounded to float, as the host does: softmax's sum
 * is added by one lane in expert order, so it is the host's sum; its max is the host scan's
 * result, found by a butterfly), the selection keys (score + bias), the group limit (a lane
 * per group, the host's loops), then top_k rounds of a warp argmax (highest key, lowest id on
 * ties: the host's rule, as one integer max: order_key; a lane keeps its experts' taken flags
 * in a bit mask) and the weights in double (each selected slot's lane, the normalising sum
 * added in slot order by each). Only warp barriers: at one token the selection was a chain
 * of block barriers and one-thread loops of 9 us on the H200, on the routed experts'
 * critical path. Hash routing (V4's first layers, hash_table set): the token's row of the
 * table replaces the selection; scores and weights are computed the same way.
 * The scores use the device's double exp, which may differ from the host libm's in the last
 * double bit; after rounding to float that almost never shows, and when it does it moves a
 * weight by one float ulp (or, on an exact tie, which expert wins) -- within the goldens'
 * tolerance, and the tests compare the results with the host's. NaN keys rank lowest here
 * (the host's scan keeps a NaN it starts on); a NaN router logit is a broken model anyway.
 *
 * Grouping (group_entries): one block; the threads count the entries per expert
 * (shared-memory atomics), block scans give the offsets and the active list, and one warp
 * then places the entries 32 at a time in entry order (__match_any_sync finds each entry's
 * rank among the same expert's), so tokens stay in order inside an expert (the host's
 * counting sort, the same rows) in nk / 32 steps instead of one thread walking all nk entries
 * per expert.
 *
 * Launches: a call of at most one block's warps of tokens (a decode step of a few sequences:
 * 8 for up to 243 experts, fewer for more, as the warps' scratch allows) is one kernel,
 * route_small_kernel, which selects and then groups; a larger one is route_kernel (a warp
 * per token), whose last block to finish its selections groups them all
 * (di_cuda_last_to_arrive): one launch where a selection
 * kernel and a grouping kernel took 6.3 and 6.5 us at 64 tokens on the H200. Grouping is
 * one block either way, so the rows are the same.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

#define RT_MAX_WARPS 8          /* tokens per selection block */
#define RT_SMEM      (40 << 10) /* its scratch: at most 40 KiB of the 48 KiB of shared memory */
#define RG_THREADS                                                                                 \
    1024 /* grouping: at most this many threads, at least one per expert and a warp */

struct route_args {
    di_router_params r; /* bias: device memory or NULL */
    int64_t n;
    const float *logits;
    int32_t *ids; /* [n K] selected ids (the rows_of buffer, overwritten by the grouping) */
    float *w;
    const int32_t *hash_table, *tokens; /* hash routing: the ids are given (backend.h) */
};

/* Expert i with selection key k as one integer whose order is the selection order: a
 * higher key first, on equal keys (-0 == +0) the lower id, NaN keys last, and 0 ("no
 * candidate") below all. The key's bits are made monotonic (sign flipped for positive
 * values, all bits for negative ones), plus one so that NaN's 0 sits below -inf. One
 * 64-bit max per butterfly step instead of a chain of comparisons. */
static __device__ __forceinline__ unsigned long long order_key(float k, int i) {
    uint32_t u = 0;
    if (!isnan(k)) {
        const uint32_t b = __float_as_uint(k == 0.0f ? 0.0f : k);
        u = (b & 0x80000000u ? ~b : b | 0x80000000u) + 1u;
    }
    return (unsigned long long)u << 32 | (0xFFFFFFFFu - (uint32_t)i);
}

/* A warp's selection scratch in shared memory, for E experts. */
struct select_smem {
    double *ex;    /* [E] softmax numerators */
    float *score;  /* [E] */
    float *key;    /* [E] selection keys; past the group limit -inf */
    float *gscore; /* [E] (the first n_group used) */
    int *sel;      /* [64] selected ids in slot order */
};

static __host__ __device__ int64_t select_smem_bytes(int64_t E) {
    /* rounded to 16 bytes: the next warp's slice starts with doubles (an odd E would
     * misalign them) */
    const int64_t bytes =
        E * (int64_t)(sizeof(double) + 3 * sizeof(float)) + 64 * (int64_t)sizeof(int);
    return (bytes + 15) / 16 * 16;
}

static __device__ select_smem select_carve(char *base, int64_t E) {
    select_smem s;
    s.ex = reinterpret_cast<double *>(base); /* first: 8-byte aligned */
    s.score = reinterpret_cast<float *>(s.ex + E);
    s.key = s.score + E;
    s.gscore = s.key + E;
    s.sel = reinterpret_cast<int *>(s.gscore + E);
    return s;
}

/* The K slots' ids (s.sel) and weights (router.c: compute_weights), in double; the sum in
 * slot order by every lane. */
static __device__ void select_weights(const route_args &a, int64_t t, const select_smem &s,
                                      int32_t *ids) {
    const di_router_params &r = a.r;
    const int K = (int)r.top_k, lane = threadIdx.x & 31;
    double denom = 1.0;
    if (r.norm_topk_prob) {
        double sum = 0.0;
        for (int j = 0; j < K; j++)
            sum += s.score[s.sel[j]];
        denom = sum + 1e-20;
    }
    for (int j = lane; j < K; j += 32) {
        ids[j] = s.sel[j];
        a.w[t * K + j] =
            (float)((double)s.score[s.sel[j]] / denom * (double)r.routed_scaling_factor);
    }
    __syncwarp(); /* the scratch is reused by the warp's next token */
}

/* Selects token t's experts with the calling warp (router.c's rules; see the top of the
 * file): ids[j] and a.w[t K + j] for its K slots (ids: global or shared memory). */
static __device__ void select_token(const route_args &a, int64_t t, const select_smem &s,
                                    int32_t *ids) {
    const di_router_params &r = a.r;
    const int E = (int)r.n_experts, K = (int)r.top_k, lane = threadIdx.x & 31;
    const float *lg = a.logits + t * E;

    /* Scores (router.c: compute_scores). */
    if (r.score == DI_SCORE_SOFTMAX) {
        /* The host scans mx = lg[0], then takes lg[i] > mx: its result is NaN when lg[0] is
         * NaN, else the largest non-NaN logit -- which fmax's butterfly finds. */
        double mx = -INFINITY;
        for (int i = lane; i < E; i += 32)
            mx = fmax(mx, (double)lg[i]);
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1)
            mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if (isnan(lg[0])) mx = NAN;
        for (int i = lane; i < E; i += 32)
            s.ex[i] = exp((double)lg[i] - mx);
        __syncwarp();
        double sum = 0.0;
        if (lane == 0) /* the host's sum, in expert order (unrolled: the loads run ahead) */
#pragma unroll 16
            for (int i = 0; i < E; i++)
                sum += s.ex[i];
        sum = __shfl_sync(0xffffffffu, sum, 0);
        for (int i = lane; i < E; i += 32)
            s.score[i] = (float)(s.ex[i] / sum);
    } else if (r.score == DI_SCORE_SIGMOID) {
        for (int i = lane; i < E; i += 32)
            s.score[i] = (float)(1.0 / (1.0 + exp(-(double)lg[i])));
    } else {
        for (int i = lane; i < E; i += 32) {
            const double x = lg[i];
            const double sp = x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x));
            s.score[i] = (float)sqrt(sp);
        }
    }
    if (a.hash_table) { /* hash routing: the token's row of the table, in slot order */
        const int32_t *row = a.hash_table + (int64_t)a.tokens[t] * K;
        for (int j = lane; j < K; j += 32)
            s.sel[j] = row[j];
        __syncwarp();
        select_weights(a, t, s, ids);
        return;
    }
    for (int i = lane; i < E; i += 32)
        s.key[i] = s.score[i] + (r.bias ? r.bias[i] : 0.0f);
    __syncwarp();

    /* Group limit (router.c: limit_groups): a lane per group, the host's loops. */
    const bool grouped = r.method != DI_TOPK_GREEDY && r.n_group > 1 && r.topk_group < r.n_group;
    if (grouped) {
        const int G = (int)r.n_group, size = E / G;
        for (int g = lane; g < G; g += 32) {
            const float *k = s.key + g * size;
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
            s.gscore[g] = v;
        }
        __syncwarp();
        unsigned dropped = 0; /* bit g / 32 of lane g % 32's groups */
        for (int g = lane; g < G; g += 32) {
            int rank = 0;
            for (int j = 0; j < G; j++)
                if (s.gscore[j] > s.gscore[g] || (s.gscore[j] == s.gscore[g] && j < g)) rank++;
            if (rank >= r.topk_group) dropped |= 1u << (g / 32);
        }
        for (int g = lane; g < G; g += 32)
            if (dropped >> (g / 32) & 1u)
                for (int i = g * size; i < (g + 1) * size; i++)
                    s.key[i] = -INFINITY;
        __syncwarp();
    }

    /* top_k rounds of a warp argmax over the untaken experts; lane l's expert l + 32 m is
     * taken when bit m of its mask is set (E <= 1024: 32 bits). */
    unsigned taken = 0;
    for (int j = 0; j < K; j++) {
        unsigned long long best = 0;
        for (int i = lane, m = 0; i < E; i += 32, m++)
            if (!(taken >> m & 1u)) best = max(best, order_key(s.key[i], i));
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1)
            best = max(best, __shfl_xor_sync(0xffffffffu, best, off));
        const int bi = (int)(0xFFFFFFFFu - (uint32_t)best); /* K <= E: never "none" */
        if (bi % 32 == lane) taken |= 1u << (bi / 32);
        if (lane == 0) s.sel[j] = bi;
    }
    __syncwarp();
    select_weights(a, t, s, ids);
}

/* Inclusive block scans of two counts a and b over the block's threads (at most RG_THREADS, a
 * multiple of 32): each warp's by shuffles, then the warps' totals added in from shared
 * memory -- two barriers, where a Hillis-Steele scan took two per doubling (at one token the
 * routing is a chain of such latencies on the MoE layer's critical path). Integers: the
 * same results in any order. */
static __device__ void block_scan2(int &a, int &b) {
    __shared__ int totals[2][RG_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int pa = __shfl_up_sync(0xffffffffu, a, d), pb = __shfl_up_sync(0xffffffffu, b, d);
        if (lane >= d) a += pa, b += pb;
    }
    if (lane == 31) totals[0][warp] = a, totals[1][warp] = b;
    __syncthreads();
    for (int w = 0; w < warp; w++)
        a += totals[0][w], b += totals[1][w];
    __syncthreads(); /* totals is free for the next call */
}

/* Groups the nk entries (ids: [nk] expert ids in shared memory) by expert with the whole
 * block (blockDim.x >= E, at most RG_THREADS): offsets, the active list, src and rows_of. */
static __device__ void group_entries(int E, int K, int nk, const int32_t *ids, int32_t *rows_of,
                                     int32_t *offsets, int32_t *active, int32_t *src) {
    __shared__ int next[RG_THREADS]; /* per expert: its count, then its next free row */
    const int e = threadIdx.x;
    if (e < E) next[e] = 0;
    __syncthreads();
    for (int i = e; i < nk; i += (int)blockDim.x) /* counts: the order does not matter */
        atomicAdd(&next[ids[i]], 1);
    __syncthreads();
    const int cnt = e < E ? next[e] : 0;
    int end = cnt, act = e < E && cnt > 0 ? 1 : 0;
    block_scan2(end, act);
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
            rows_of[i] = g;
        }
        __syncwarp();
        if (i < nk && (same & below) == 0) next[x] += __popc(same);
        __syncwarp();
    }
}

/* Warp w < warps of block b selects tokens (b warps + w) + k gridDim.x warps, k = 0, 1, ...;
 * the last block to finish groups every entry (the block has at least E threads). Shared
 * memory: the selecting warps' scratch, then (reused) the nk ids. `arrivals` is zero
 * between launches: the last block resets it. */
__global__ void __launch_bounds__(RG_THREADS)
    route_kernel(const route_args a, int warps, int *arrivals, int32_t *offsets, int32_t *active,
                 int32_t *src) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    extern __shared__ __align__(16) char route_smem[];
    const int E = (int)a.r.n_experts, K = (int)a.r.top_k, warp = threadIdx.x >> 5;
    if (warp < warps) {
        const select_smem s = select_carve(route_smem + warp * select_smem_bytes(E), E);
        for (int64_t t = (int64_t)blockIdx.x * warps + warp; t < a.n;
             t += (int64_t)gridDim.x * warps)
            select_token(a, t, s, a.ids + t * K);
    }
    /* the block to write its ids last groups everyone's */
    if (!di_cuda_last_to_arrive(arrivals, (int)gridDim.x)) return;
    const int nk = (int)(a.n * K);
    int32_t *ids = reinterpret_cast<int32_t *>(route_smem); /* the scratch is done with */
    for (int i = threadIdx.x; i < nk; i += (int)blockDim.x)
        ids[i] = __ldcg(a.ids + i); /* from L2: other blocks wrote them */
    __syncthreads();
    group_entries(E, K, nk, ids, a.ids, offsets, active, src);
}

/* One block for a call of at most its warps of tokens: warp t selects token t into shared
 * memory, then the block groups. Shared memory: the warps' selection scratch, then the ids. */
__global__ void __launch_bounds__(RG_THREADS)
    route_small_kernel(const route_args a, int32_t *offsets, int32_t *active, int32_t *src) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    extern __shared__ __align__(16) char route_smem[];
    const int E = (int)a.r.n_experts, K = (int)a.r.top_k, warp = threadIdx.x >> 5;
    const int64_t per_warp = select_smem_bytes(E);
    int32_t *ids = reinterpret_cast<int32_t *>(route_smem + a.n * per_warp);
    if (warp < a.n)
        select_token(a, warp, select_carve(route_smem + warp * per_warp, E), ids + warp * K);
    __syncthreads();
    group_entries(E, K, (int)(a.n * K), ids, a.ids, offsets, active, src);
}

cudaError_t di_cuda_launch_moe_route(const di_moe_route_params *p, int *arrivals,
                                     cudaStream_t stream) {
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
    a.hash_table = p->hash_table;
    a.tokens = p->tokens;
    int threads = 32; /* grouping: a thread per expert, a power of two */
    while (threads < E)
        threads *= 2;
    /* Warps of a selection block: as many as fit the scratch, at most 8 (7 at 256 experts,
     * one at 1024). */
    const int64_t per_warp = select_smem_bytes(E);
    int64_t warps = RT_SMEM / per_warp;
    warps = warps > RT_MAX_WARPS ? RT_MAX_WARPS : warps;
    const size_t ids_bytes = (size_t)nk * sizeof(int32_t);
    if (p->n <= warps && (size_t)(p->n * per_warp) + ids_bytes <= (size_t)RT_SMEM) {
        const int block = threads > 32 * (int)p->n ? threads : 32 * (int)p->n;
        return di_cuda_launch(route_small_kernel, 1, block, (size_t)(p->n * per_warp) + ids_bytes,
                              stream, a, p->offsets, p->active, p->src);
    }
    const int64_t blocks = (p->n + warps - 1) / warps;
    const size_t scratch = (size_t)(warps * per_warp);
    return di_cuda_launch(route_kernel, (unsigned)blocks,
                          (unsigned)(threads > 32 * warps ? threads : 32 * warps),
                          scratch > ids_bytes ? scratch : ids_bytes, stream, a, (int)warps,
                          arrivals, p->offsets, p->active, p->src);
}
