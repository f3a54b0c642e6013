/*
 * cuda_attention.cu -- MLA attention in absorbed form over the latent cache, on the GPU,
 * split along the KV axis.
 *
 * The math is backend.h's: for head h and query t (key count L = pos0 + t + 1)
 *     s_j = scale * (q_lat . c_kv[j] + q_rope . k_rope[j]),   out = sum_j softmax(s)_j c_kv[j]
 * The keys are the cached latents themselves, so a block takes HG heads of one query
 * and reads each key tile once for all of them (the latent cache is shared by all heads).
 * Not all heads: in fp32, 128 heads x 512 latent accumulators would fill an SM's whole
 * register file. In fp32 on the SIMT units decode is compute-bound (NOTES.md), so the inner
 * loops are tiled for shared-memory reads per FMA: each query element read serves four keys
 * in the scores, each weight pair all of a thread's columns in the weighted sum.
 *
 * Design stance: the KV axis is cut into fixed chunks of DI_CUDA_ATTN_CHUNK keys. A chunk is
 * reduced by an online softmax over tiles of ATT_BJ keys into a state (m, l, acc[R]); the
 * chunk states of a query are then folded in chunk order by one merge rule (merge_coeffs,
 * merge_acc) and normalized (finalize). Two schedules run that same arithmetic:
 *   split:      one block per (query, head group, chunk) writes its chunk state to scratch,
 *               and the query's last block to finish folds them -- many blocks, for decode;
 *   sequential: one block per (query, head group) walks its chunks and folds as it goes --
 *               no scratch, for prefill or when the scratch is too small.
 * Every value that crosses between the two is produced by the same device function with
 * explicitly rounded operations, so both schedules give the same bits (tested).
 *
 * Invariant (batch invariance): chunk and tile boundaries are multiples of constants from
 * key 0, and a score's reduction order depends only on (R, rope_dim), so a query's result
 * depends only on its own key count, never on n_tokens, the other queries or the schedule.
 * Limits: R <= DI_CUDA_ATTN_MAX_R, rope_dim <= DI_CUDA_ATTN_MAX_DR (checked by the caller).
 */
#include "backend/cuda/cuda_internal.cuh"

#include <cuda_pipeline.h>
#include <math.h>

#define ATT_THREADS 256
#define ATT_WARPS   (ATT_THREADS / 32)
#define ATT_BJ      32 /* keys per tile; == warp size (one lane per key in the softmax) */
#define ATT_COLS    (DI_CUDA_ATTN_MAX_R / ATT_THREADS) /* latent columns per thread */

/* Heads per block, HG (a template parameter): 8 (one warp per head in the softmax), or 2 or 4
 * when the (query, 8-head group) blocks cannot fill the device -- a decode step of a few
 * sequences. A block's time is mostly its instruction chain (each of its threads computes HG
 * heads' scores and weighted sums), so at batch 1 eight blocks of 2 heads finish about four
 * times sooner than two of 8; the smallest HG whose blocks fit one wave of the device
 * (heads_per_block). Every head's arithmetic is the same for any HG (a score's lanes and
 * butterfly, a head's softmax, a column's key order), so HG never changes the bits (tested).
 * Thread x's accumulator k is head k % HG, latent column x + (k / HG) * ATT_THREADS: one c_kv
 * element read from shared memory serves all the block's heads. */
#define ATT_HG_WIDE     8
#define ATT_HG_MID      4
#define ATT_HG_NARROW   2
#define ATT_MAXE(HG)    (ATT_COLS * (HG)) /* accumulators per thread */
#define ATT_HEAD(k, HG) ((k) % (HG))
#define ATT_COL(k, HG)  ((int)threadIdx.x + ((k) / (HG)) * ATT_THREADS)

/* ---------------------------------------------------------------------------------------- */
/* The arithmetic shared by both schedules                                                    */
/* ---------------------------------------------------------------------------------------- */

/* Folding a chunk state (m_c, l_c, acc_c) into the running state (m, l, acc):
 *   m' = max(m, m_c), a = exp(m - m'), b = exp(m_c - m'), l' = l a + l_c b, acc' = acc a + acc_c b
 * The running state starts at (-inf, 0, 0), so the first fold copies the chunk exactly. */
static __device__ __forceinline__ void merge_coeffs(float m, float l, float m_c, float l_c,
                                                    float *a, float *b, float *m_out,
                                                    float *l_out) {
    const float mn = fmaxf(m, m_c);
    *a = expf(m - mn);
    *b = expf(m_c - mn);
    *m_out = mn;
    *l_out = __fmaf_rn(l, *a, __fmul_rn(l_c, *b));
}

static __device__ __forceinline__ float merge_acc(float acc, float acc_c, float a, float b) {
    return __fmaf_rn(acc, a, __fmul_rn(acc_c, b));
}

static __device__ __forceinline__ float finalize(float acc, float l) {
    return __fmul_rn(acc, __fdiv_rn(1.0f, l));
}

/* Shared-memory layout of the main kernel, in floats. */
struct att_smem {
    float *q, *qr;            /* [HG][R], [HG][dr]: the block's queries (zero for absent heads) */
    float *ckv, *kr;          /* [BJ][R], [BJ][dr]: the current key tile */
    float *p;                 /* [BJ][HG]: scores, then softmax weights (16-byte aligned) */
    float *m_c, *l_c, *alpha; /* [HG] chunk state and the current tile's rescale */
    float *m_run, *l_run, *ca, *cb; /* [HG] running state and merge coefficients */
};

template <int HG> static __host__ __device__ int64_t att_smem_floats(int64_t R, int64_t dr) {
    static_assert(HG <= ATT_WARPS && ATT_BJ == 32, "layout assumptions");
    return HG * R + HG * dr + ATT_BJ * R + ATT_BJ * dr + HG * ATT_BJ + 7 * HG;
}

template <int HG> static __device__ att_smem att_carve(float *base, int64_t R, int64_t dr) {
    att_smem s;
    s.p = base; /* first, so that its rows of HG floats are 8- or 16-byte aligned */
    s.q = s.p + HG * ATT_BJ;
    s.qr = s.q + HG * R;
    s.ckv = s.qr + HG * dr;
    s.kr = s.ckv + ATT_BJ * R;
    s.m_c = s.kr + ATT_BJ * dr;
    s.l_c = s.m_c + HG;
    s.alpha = s.l_c + HG;
    s.m_run = s.alpha + HG;
    s.l_run = s.m_run + HG;
    s.ca = s.l_run + HG;
    s.cb = s.ca + HG;
    return s;
}

/* Starts copying n floats from global to shared memory with the whole block: 16-byte
 * asynchronous copies (cp.async: no registers, every copy of the thread in flight at once)
 * when both sides allow it, else one float at a time. The caller commits and waits once for
 * all its copies (load_tile), then its barrier follows. */
static __device__ __forceinline__ void block_copy_async(float *dst, const float *src, int64_t n) {
    if ((((uintptr_t)src | (uintptr_t)dst) & 15u) == 0 && (n & 3) == 0) {
        for (int64_t i = threadIdx.x; i < n / 4; i += ATT_THREADS)
            __pipeline_memcpy_async(dst + 4 * i, src + 4 * i, 16);
    } else {
        for (int64_t i = threadIdx.x; i < n; i += ATT_THREADS)
            dst[i] = __ldg(src + i);
    }
}

/* Physical cache row of logical key j (backend.h's di_mla_attn_row). */
static __device__ __forceinline__ int64_t att_row(const di_mla_attn_params &p, int64_t j) {
    if (!p.block_table) return j;
    return (int64_t)p.block_table[j / p.block_size] * p.block_size + j % p.block_size;
}

/* Starts copying n floats of one row with one warp (cp.async where both sides allow it,
 * else plain loads); the caller commits and waits once for all its rows, so the rows of a
 * tile are in flight together (a wait per row cost one memory latency per row). */
static __device__ __forceinline__ void warp_copy_async(float *dst, const float *src, int64_t n,
                                                       int lane) {
    if ((((uintptr_t)src | (uintptr_t)dst) & 15u) == 0 && (n & 3) == 0) {
        for (int64_t i = lane; i < n / 4; i += 32)
            __pipeline_memcpy_async(dst + 4 * i, src + 4 * i, 16);
    } else {
        for (int64_t i = lane; i < n; i += 32)
            dst[i] = __ldg(src + i);
    }
}

/* Loads the tile of keys [j0, j0 + nv) into shared memory and waits for it (and for any
 * earlier asynchronous copy of the thread). A tile inside one block of a paged cache (or of
 * a contiguous cache) is one contiguous copy; otherwise each warp copies whole rows, their
 * places looked up first (blocks smaller than a tile: every tile spans several). Either
 * way the same values arrive. */
static __device__ __forceinline__ void load_tile(const di_mla_attn_params &p, const att_smem &s,
                                                 int64_t j0, int nv) {
    const int64_t R = p.kv_lora_rank, dr = p.rope_dim;
    if (!p.block_table || j0 % p.block_size + nv <= p.block_size) {
        const int64_t r0 = att_row(p, j0);
        block_copy_async(s.ckv, p.c_kv + r0 * R, (int64_t)nv * R);
        block_copy_async(s.kr, p.k_rope + r0 * dr, (int64_t)nv * dr);
        __pipeline_commit();
        __pipeline_wait_prior(0); /* also the queries' copies (mla_attn_kernel) */
        return;
    }
    /* The rows' places first, all at once (one table read per row, in parallel), so that
     * each warp's copies do not wait for a table read per row. */
    __shared__ int64_t tile_rows[ATT_BJ];
    if ((int)threadIdx.x < nv) tile_rows[threadIdx.x] = att_row(p, j0 + threadIdx.x);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = warp; r < nv; r += ATT_WARPS) {
        const int64_t row = tile_rows[r];
        warp_copy_async(s.ckv + r * R, p.c_kv + row * R, R, lane);
        warp_copy_async(s.kr + r * dr, p.k_rope + row * dr, dr, lane);
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
}

/* Head strides of q_lat and out (backend.h: 0 means n_tokens * R). */
static __device__ __forceinline__ int64_t att_q_hs(const di_mla_attn_params &p) {
    return p.q_lat_hstride ? p.q_lat_hstride : p.n_tokens * p.kv_lora_rank;
}
static __device__ __forceinline__ int64_t att_out_hs(const di_mla_attn_params &p) {
    return p.out_hstride ? p.out_hstride : p.n_tokens * p.kv_lora_rank;
}

/* One chunk, keys [jb, je), for the block's query and heads (queries already in s.q/s.qr):
 * leaves the chunk's (m, l) in s.m_c / s.l_c and its accumulators in acc (thread x's
 * accumulator k is head ATT_HEAD(k, HG), latent column ATT_COL(k, HG)). */
template <int HG>
static __device__ __forceinline__ void attn_chunk(const di_mla_attn_params &p, const att_smem &s,
                                                  int64_t jb, int64_t je,
                                                  float (&acc)[ATT_MAXE(HG)]) {
    const int R = (int)p.kv_lora_rank, dr = (int)p.rope_dim;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int k = 0; k < ATT_MAXE(HG); k++)
        acc[k] = 0.0f;
    if (tid < HG) {
        s.m_c[tid] = -INFINITY;
        s.l_c[tid] = 0.0f;
    }
    for (int64_t j0 = jb; j0 < je; j0 += ATT_BJ) {
        const int nv = (int)min((int64_t)ATT_BJ, je - j0);
        __syncthreads(); /* the previous tile's readers are done */
        load_tile(p, s, j0, nv);
        __syncthreads();

        /* Scores: warp w takes keys w, w + 8, w + 16, w + 24 together (each query element
         * read from shared memory serves four keys, each key element all heads); lanes
         * split the dot products (element i on lane i % 32, in order), then the xor
         * butterfly. A score's order is the same as one key at a time. */
        {
            constexpr int KPW = ATT_BJ / ATT_WARPS; /* keys per warp */
            float sc[KPW][HG];
#pragma unroll
            for (int kk = 0; kk < KPW; kk++)
#pragma unroll
                for (int h = 0; h < HG; h++)
                    sc[kk][h] = 0.0f;
            for (int i = lane; i < R; i += 32) {
                float kv[KPW];
#pragma unroll
                for (int kk = 0; kk < KPW; kk++) /* rows past nv hold stale data, unused */
                    kv[kk] = s.ckv[(warp + kk * ATT_WARPS) * R + i];
#pragma unroll
                for (int h = 0; h < HG; h++) {
                    const float qv = s.q[h * R + i];
#pragma unroll
                    for (int kk = 0; kk < KPW; kk++)
                        sc[kk][h] = fmaf(qv, kv[kk], sc[kk][h]);
                }
            }
            for (int i = lane; i < dr; i += 32) {
                float kv[KPW];
#pragma unroll
                for (int kk = 0; kk < KPW; kk++)
                    kv[kk] = s.kr[(warp + kk * ATT_WARPS) * dr + i];
#pragma unroll
                for (int h = 0; h < HG; h++) {
                    const float qv = s.qr[h * dr + i];
#pragma unroll
                    for (int kk = 0; kk < KPW; kk++)
                        sc[kk][h] = fmaf(qv, kv[kk], sc[kk][h]);
                }
            }
#pragma unroll
            for (int kk = 0; kk < KPW; kk++) {
                const int jj = warp + kk * ATT_WARPS;
#pragma unroll
                for (int h = 0; h < HG; h++) {
#pragma unroll
                    for (int off = 16; off >= 1; off >>= 1)
                        sc[kk][h] += __shfl_xor_sync(0xffffffffu, sc[kk][h], off);
                    if (lane == h)
                        s.p[jj * HG + h] = jj < nv ? __fmul_rn(sc[kk][h], p.scale) : -INFINITY;
                }
            }
        }
        __syncthreads();

        /* Online softmax: warp h takes head h, lane j key j. */
        if (warp < HG) {
            const int h = warp;
            const float sj = s.p[lane * HG + h], mc = s.m_c[h], lc = s.l_c[h];
            float mt = sj;
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1)
                mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
            const float mn = fmaxf(mc, mt);
            const float pj = lane < nv ? expf(sj - mn) : 0.0f;
            float ps = pj;
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1)
                ps += __shfl_xor_sync(0xffffffffu, ps, off);
            __syncwarp();
            s.p[lane * HG + h] = pj;
            if (lane == 0) {
                const float a = expf(mc - mn);
                s.alpha[h] = a;
                s.m_c[h] = mn;
                s.l_c[h] = __fmaf_rn(lc, a, ps);
            }
        }
        __syncthreads();

        /* acc = acc * alpha + sum_j p_j c_kv[j], keys in order; each key's weights (broadcasts
         * of HG floats: two float4, one float4 or one float2) serve all of the thread's
         * columns. */
        float v[ATT_COLS][HG];
#pragma unroll
        for (int c = 0; c < ATT_COLS; c++)
#pragma unroll
            for (int h = 0; h < HG; h++)
                v[c][h] = __fmul_rn(acc[c * HG + h], s.alpha[h]);
        for (int j = 0; j < nv; j++) {
            float pj[HG];
            if constexpr (HG == 8) {
                const float4 pa = reinterpret_cast<const float4 *>(s.p + j * HG)[0];
                const float4 pb = reinterpret_cast<const float4 *>(s.p + j * HG)[1];
                pj[0] = pa.x, pj[1] = pa.y, pj[2] = pa.z, pj[3] = pa.w;
                pj[4] = pb.x, pj[5] = pb.y, pj[6] = pb.z, pj[7] = pb.w;
            } else if constexpr (HG == 4) {
                const float4 pa = reinterpret_cast<const float4 *>(s.p + j * HG)[0];
                pj[0] = pa.x, pj[1] = pa.y, pj[2] = pa.z, pj[3] = pa.w;
            } else {
                static_assert(HG == 2, "weights read as one float2");
                const float2 pa = reinterpret_cast<const float2 *>(s.p + j * HG)[0];
                pj[0] = pa.x, pj[1] = pa.y;
            }
#pragma unroll
            for (int c = 0; c < ATT_COLS; c++) {
                const int i = (int)threadIdx.x + c * ATT_THREADS;
                if (i < R) { /* columns past R: v is never stored */
                    const float kv = s.ckv[j * R + i];
#pragma unroll
                    for (int h = 0; h < HG; h++)
                        v[c][h] = __fmaf_rn(pj[h], kv, v[c][h]);
                }
            }
        }
#pragma unroll
        for (int c = 0; c < ATT_COLS; c++)
#pragma unroll
            for (int h = 0; h < HG; h++)
                acc[c * HG + h] = v[c][h];
    }
    __syncthreads(); /* m_c / l_c final for every thread */
}

/* ---------------------------------------------------------------------------------------- */
/* Kernels                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* Chunk-state slot (t, h, c) of the split scratch: [m, l, acc[R]]. */
static __device__ __forceinline__ int64_t slot_at(const di_mla_attn_params &p, int64_t t, int64_t h,
                                                  int64_t c, int64_t cmax) {
    return ((t * p.n_heads + h) * cmax + c) * (p.kv_lora_rank + 2);
}
static __device__ __forceinline__ float *slot(float *partial, const di_mla_attn_params &p,
                                              int64_t t, int64_t h, int64_t c, int64_t cmax) {
    return partial + slot_at(p, t, h, c, cmax);
}

/* Key count of query t (its position from memory for queries of several sequences). */
static __device__ __forceinline__ int64_t att_keys(const di_mla_attn_params &p, int64_t t) {
    return p.q_pos ? (int64_t)p.q_pos[t] + 1 : p.pos0 + t + 1;
}

/* Folds the chunk states (t, h, 0 .. n_chunks) of the split scratch in chunk order for
 * latent column i: the sequential schedule's merges, so the same bits. The states were
 * written by other blocks: read through L2 (__ldcg), past this SM's L1. */
static __device__ __forceinline__ float fold_chunks(const float *partial,
                                                    const di_mla_attn_params &p, int64_t t,
                                                    int64_t h, int64_t n_chunks, int64_t cmax,
                                                    int i) {
    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int64_t c = 0; c < n_chunks; c++) {
        const float *sl = partial + slot_at(p, t, h, c, cmax);
        float a, b;
        merge_coeffs(m, l, __ldcg(sl), __ldcg(sl + 1), &a, &b, &m, &l);
        acc = merge_acc(acc, __ldcg(sl + 2 + i), a, b);
    }
    return finalize(acc, l);
}

/* blockIdx.x = t * n_groups + head group. Split: blockIdx.y = y of gridDim.y = S takes chunks
 * y, y + S, y + 2S, ... of its query, each written to its own slot (a chunk's state does not
 * depend on which block computed it); the last of the query's blocks to finish (a counter per
 * blockIdx.x, reset by that block for the next launch) folds all its chunk states in order
 * and writes the output -- no second kernel. A query of one chunk has one block, which
 * folds in place. Sequential (gridDim.y = 1, split = 0): the block walks all chunks and folds
 * them in order. */
template <int HG>
__global__ void __launch_bounds__(ATT_THREADS, 2) /* 2 blocks of <= 93 KiB per SM */
    mla_attn_kernel(const di_mla_attn_params p_in, float *partial, int *counters, int split,
                    int64_t cmax) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    extern __shared__ float smem[];
    di_mla_attn_params p = p_in;
    const int R = (int)p.kv_lora_rank, dr = (int)p.rope_dim, tid = threadIdx.x;
    const att_smem s = att_carve<HG>(smem, R, dr);
    const int64_t n_groups = (p.n_heads + HG - 1) / HG;
    const int64_t t = blockIdx.x / n_groups, h0 = (blockIdx.x % n_groups) * HG;
    const int64_t L = att_keys(p_in, t),
                  n_chunks = (L + DI_CUDA_ATTN_CHUNK - 1) / DI_CUDA_ATTN_CHUNK;
    if (p_in.q_pos) { /* a query of its own sequence: its position and table from memory */
        p.pos0 = L - 1 - t;
        p.block_table = p_in.q_tables + p_in.q_table_off[t];
    }
    const int64_t c_first = split ? blockIdx.y : 0, c_step = split ? gridDim.y : 1;
    if (c_first >= n_chunks) return; /* shorter queries have fewer chunks */
    if (split && n_chunks > cmax) {  /* past the scratch (a caller broke max_keys): fail */
        if (tid == 0) __trap();
        return;
    }
    const bool to_slots = split && n_chunks > 1; /* else this block folds in place */

    /* The queries by asynchronous copies (all in flight, no registers); the first key tile's
     * wait covers them (attn_chunk), its barrier makes them visible to the block. */
    for (int i = tid; i < HG * R; i += ATT_THREADS) {
        const int64_t h = h0 + i / R;
        if (h < p.n_heads)
            __pipeline_memcpy_async(s.q + i, p.q_lat + h * att_q_hs(p) + t * R + i % R, 4);
        else
            s.q[i] = 0.0f;
    }
    if (p.q_cos) { /* unrotated: each pair read, rotated (the rope op's arithmetic), stored */
        const int half = dr / 2;
        for (int i = tid; i < HG * half; i += ATT_THREADS) {
            const int hh = i / half, k = i % half;
            const int ia = p.q_rope_interleaved ? 2 * k : k;
            const int ib = p.q_rope_interleaved ? 2 * k + 1 : k + half;
            float *qa = s.qr + hh * dr + ia, *qb = s.qr + hh * dr + ib;
            if (h0 + hh < p.n_heads) {
                const float *q = p.q_rope + t * p.q_rope_tstride + (h0 + hh) * p.q_rope_hstride;
                di_cuda_rope_pair(q[ia], q[ib], p.q_cos[t * half + k], p.q_sin[t * half + k], qa,
                                  qb);
            } else {
                *qa = *qb = 0.0f;
            }
        }
    } else {
        for (int i = tid; i < HG * dr; i += ATT_THREADS) {
            const int64_t h = h0 + i / dr;
            if (h < p.n_heads)
                __pipeline_memcpy_async(
                    s.qr + i, p.q_rope + t * p.q_rope_tstride + h * p.q_rope_hstride + i % dr, 4);
            else
                s.qr[i] = 0.0f;
        }
    }
    __pipeline_commit();
    if (tid < HG) {
        s.m_run[tid] = -INFINITY;
        s.l_run[tid] = 0.0f;
    }

    float run[ATT_MAXE(HG)];
#pragma unroll
    for (int k = 0; k < ATT_MAXE(HG); k++)
        run[k] = 0.0f;
    for (int64_t c = c_first; c < n_chunks; c += c_step) {
        float acc[ATT_MAXE(HG)];
        const int64_t jb = c * DI_CUDA_ATTN_CHUNK;
        attn_chunk<HG>(p, s, jb, min(L, jb + DI_CUDA_ATTN_CHUNK), acc);
        if (to_slots) {
#pragma unroll
            for (int k = 0; k < ATT_MAXE(HG); k++)
                if (ATT_COL(k, HG) < R && h0 + ATT_HEAD(k, HG) < p.n_heads)
                    slot(partial, p, t, h0 + ATT_HEAD(k, HG), c, cmax)[2 + ATT_COL(k, HG)] = acc[k];
            if (tid < HG && h0 + tid < p.n_heads) {
                float *sl = slot(partial, p, t, h0 + tid, c, cmax);
                sl[0] = s.m_c[tid];
                sl[1] = s.l_c[tid];
            }
            /* The next chunk resets m_c / l_c in the same threads (tid < HG) that read
             * them here, before any barrier: program order is enough. */
        } else {
            if (tid < HG)
                merge_coeffs(s.m_run[tid], s.l_run[tid], s.m_c[tid], s.l_c[tid], &s.ca[tid],
                             &s.cb[tid], &s.m_run[tid], &s.l_run[tid]);
            __syncthreads();
#pragma unroll
            for (int k = 0; k < ATT_MAXE(HG); k++)
                if (ATT_COL(k, HG) < R)
                    run[k] =
                        merge_acc(run[k], acc[k], s.ca[ATT_HEAD(k, HG)], s.cb[ATT_HEAD(k, HG)]);
        }
    }
    if (to_slots) {
        /* The last block of this (query, head group) to write its slots folds them. */
        if (!di_cuda_last_to_arrive(&counters[blockIdx.x], (int)min((int64_t)gridDim.y, n_chunks)))
            return;
#pragma unroll
        for (int k = 0; k < ATT_MAXE(HG); k++) {
            const int64_t h = h0 + ATT_HEAD(k, HG);
            if (ATT_COL(k, HG) < R && h < p.n_heads)
                p.out[h * att_out_hs(p) + t * R + ATT_COL(k, HG)] =
                    fold_chunks(partial, p, t, h, n_chunks, cmax, ATT_COL(k, HG));
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < ATT_MAXE(HG); k++) {
        const int64_t h = h0 + ATT_HEAD(k, HG);
        if (ATT_COL(k, HG) < R && h < p.n_heads)
            p.out[h * att_out_hs(p) + t * R + ATT_COL(k, HG)] =
                finalize(run[k], s.l_run[ATT_HEAD(k, HG)]);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Launcher                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Most chunks of any query of the call: from the positions, or for queries of several
 * sequences (positions in device memory) from the caller's bound max_keys (0: unknown). */
static int64_t n_chunks_max(const di_mla_attn_params *p, int64_t max_keys) {
    const int64_t keys = p->q_pos ? max_keys : p->pos0 + p->n_tokens;
    return (keys + DI_CUDA_ATTN_CHUNK - 1) / DI_CUDA_ATTN_CHUNK;
}

int64_t di_cuda_attn_partial_floats(const di_mla_attn_params *p, int64_t max_keys) {
    return p->n_tokens * p->n_heads * n_chunks_max(p, max_keys) * (p->kv_lora_rank + 2);
}

template <int HG> static cudaError_t att_allow(void) {
    const int64_t floats = att_smem_floats<HG>(DI_CUDA_ATTN_MAX_R, DI_CUDA_ATTN_MAX_DR);
    return cudaFuncSetAttribute(mla_attn_kernel<HG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(floats * (int64_t)sizeof(float)));
}

cudaError_t di_cuda_attn_setup(void) {
    cudaError_t err = att_allow<ATT_HG_WIDE>();
    if (err == cudaSuccess) err = att_allow<ATT_HG_MID>();
    return err == cudaSuccess ? att_allow<ATT_HG_NARROW>() : err;
}

/* Heads per block: the fewest (2, then 4) whose blocks fit in one wave of the device, two
 * per SM (H200, 16 heads: a decode step of up to 33 sequences takes 2, up to 66 4), else 8
 * (each key tile read from shared memory serves more heads). From the call's shape only (a
 * captured graph replays it). */
static int heads_per_block(const di_cuda_attn_launch *a) {
    const int forced = a->heads_per_block;
    if (forced == ATT_HG_WIDE || forced == ATT_HG_MID || forced == ATT_HG_NARROW) return forced;
    for (int hg = ATT_HG_NARROW; hg < ATT_HG_WIDE; hg *= 2)
        if (a->p.n_tokens * ((a->p.n_heads + hg - 1) / hg) <= 2 * (int64_t)a->n_sms) return hg;
    return ATT_HG_WIDE;
}

/* The kernel of HG heads per block over grid, with its shared memory for the call's shape. */
template <int HG>
static cudaError_t att_launch(const di_cuda_attn_launch *a, dim3 grid, bool split, int64_t cmax) {
    const size_t smem =
        (size_t)att_smem_floats<HG>(a->p.kv_lora_rank, a->p.rope_dim) * sizeof(float);
    return di_cuda_launch(mla_attn_kernel<HG>, grid, ATT_THREADS, smem, a->stream, a->p, a->partial,
                          a->counters, split ? 1 : 0, cmax);
}

cudaError_t di_cuda_launch_mla_attention(const di_cuda_attn_launch *a) {
    const di_mla_attn_params *p = &a->p;
    if (p->n_tokens <= 0 || p->n_heads <= 0 || p->kv_lora_rank <= 0) return cudaSuccess;
    const int hg = heads_per_block(a);
    const int64_t n_groups = (p->n_heads + hg - 1) / hg;
    const int64_t cmax = n_chunks_max(p, a->max_keys);
    bool split = a->split && a->partial && a->counters && cmax > 0 &&
                 di_cuda_attn_partial_floats(p, a->max_keys) <= a->partial_floats &&
                 p->n_tokens * n_groups <= a->n_counters;
    /* Split blocks per query: enough for one wave of the device at two blocks per SM (2 x
     * the SMs, as heads_per_block counts), never more than the chunks. Depends only on the
     * call's shape (a captured graph replays it). One block per query walks its chunks in
     * place: the same bits without the scratch's traffic. */
    int64_t S = 1;
    if (split) {
        const int64_t want =
            (2 * (int64_t)a->n_sms + p->n_tokens * n_groups - 1) / (p->n_tokens * n_groups);
        S = want < 1 ? 1 : want > cmax ? cmax : want;
    }
    if (S == 1) split = false;
    const dim3 grid((unsigned)(p->n_tokens * n_groups), (unsigned)S);
    switch (hg) {
    case ATT_HG_WIDE:
        return att_launch<ATT_HG_WIDE>(a, grid, split, cmax);
    case ATT_HG_MID:
        return att_launch<ATT_HG_MID>(a, grid, split, cmax);
    default:
        return att_launch<ATT_HG_NARROW>(a, grid, split, cmax);
    }
}
