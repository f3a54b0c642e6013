/*
 * cuda_tc_wide.cu -- y = W x on the tensor cores for many tokens: plain BF16 products and
 * products per head (MLA's W_UV and W_UK^T, grid z the head) of at least
 * DI_CUDA_TC_WIDE_MIN_N tokens (default 9), bitwise the sums of the tensor-core GEMV
 * (cuda_tc_gemv.cu) in a work shape that shares the activations; also grouped expert
 * products of at least DI_CUDA_TC_WIDE_GROUPED (default 9) tokens per expert on average (a
 * prefill), a few blocks per weight tile sharing its expert's token chunks, their rows read
 * in place through the routing's row list where the caller gives one (p.x_rows: a prefill's
 * routed gate / up need no gather launch before them; 61 us a MoE layer at 1024 tokens).
 *
 * Why: in the GEMV a block's warps take different K runs of the same rows, so every warp
 * loads and splits its own copy of the activations into bf16 parts. At 64 tokens that made
 * a product bound by instruction issue at a quarter occupancy (Nsight Compute on the H200:
 * q_proj 3072 x 2048, 31.5 us for 12.6 MB, about 200 instructions per 12 mma). Here a block is
 * one K run of 8 warps x 32 rows (GLU: 16 gate + 16 up rows per warp) for 32 tokens: the
 * block's threads split each slab of activations once into shared memory, already in the
 * mma's B layout, and every warp reads its fragments from there (one 16-byte load per term
 * and token group serves two m-tiles).
 *
 * The same bits as the GEMV, by construction: the same K runs (tc_ks, from the weight's
 * shape), each warp walking its run's chunks in order with the same mma sequence per
 * accumulator (chunk by chunk; per chunk, for each term, the chunk's two mma steps), the same
 * split of x, and the ks partial sums added by the same tree (tc_tree_sum). The ks K runs of
 * a tile are one thread-block cluster (sm_90): each block leaves its partial sums in its
 * shared memory, and after a cluster barrier block q adds the q-th share of the tile's
 * elements from all ks blocks' shared memory, in run order, and applies the epilogue (GLU,
 * accumulate). No scratch, no atomics. With one K run a block stores directly.
 * test_cuda_ops checks the equality bitwise against the GEMV's one-token results.
 *
 * On sm_90a (WG, the default there: DI_CUDA_TC_WGMMA) the block's two warpgroups run the
 * products as wgmma m64nNk16 (N = 8 x the token groups with tokens): each warp's weight
 * fragments stay in its registers exactly as above, and the tensor cores read the
 * activations' parts straight from shared memory, staged in wgmma's K-major core-matrix
 * layout instead of the mma's fragments (H200: 1-7 % faster at 256-1024 tokens, the same at
 * 64; the kernel is latency-bound -- NOTES.md, twenty-second round). Why the bits stay the
 * GEMV's: on Hopper a k16 step of wgmma and of mma.sync m16n8k16 are the same fused dot-add
 * of the 16 products and the accumulator, independent of the order of the 16 pairs
 * (bench/probe_wgmma.cu checks both on the device); each k-step here holds the mma step's
 * 16 (weight, activation) pairs, from the same accumulator, in the same sequence.
 */
#include "backend/cuda/cuda_tc.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define TW_WARPS   8 /* warps per block, 32 rows each (GLU: 16 output rows) */
#define TW_THREADS (32 * TW_WARPS)
#define TW_TOKENS  32 /* tokens per block: TW_NG groups of 8 */
#define TW_NG      (TW_TOKENS / 8)
#define TW_SLAB    8 /* chunks of activations staged in shared memory at a time */
#define TW_TERMS   3 /* most bf16 parts per activation */
#define TW_SMEM    (TW_NG * TW_SLAB * TW_TERMS * 32 * (int)sizeof(uint4)) /* 48 KiB */
/* Floats per token of the partial-sum tile: 256 rows and 4 more, so that a warp's stores
 * (row g, token 2 tig) fall in 32 different banks. */
#define TW_PSTRIDE (2 * TW_WARPS * 16 + 4)
#define TW_SU      (TW_NG * TW_SLAB * 32 / TW_THREADS) /* fragments a thread stages per slab: 4 */
static_assert(TW_SU * TW_THREADS == TW_NG * TW_SLAB * 32, "whole units per thread");
static_assert(TW_TOKENS * TW_PSTRIDE * sizeof(float) <= (size_t)TW_SMEM,
              "the partial sums reuse the fragments' shared memory");

/* wgmma exists on sm_90a only; elsewhere a WG kernel runs the mma.sync path (same sums). */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TW_WGMMA 1
#else
#define TW_WGMMA 0
#endif

/* WG's shared memory: one 1 KiB tile per (slab chunk cc, part s, k-step h) holding the step's
 * 16 k-slots of the 32 tokens as bf16, K-major without swizzle: token group j's two 8 x 8
 * core matrices (slots 0-7, 8-15) at j 256 + kb 128 bytes, token n's 8 slots in 16 bytes at
 * 16 n. Slot 2 tig + e of core kb holds what the mma's B register kb of lane (n, tig) holds. */
#define TW_TILE_BYTES 1024
static_assert(TW_SLAB * TW_TERMS * 2 * TW_TILE_BYTES == TW_SMEM, "WG's tiles fill the space");
static __device__ __forceinline__ int tw_tile(int cc, int s, int h) {
    return ((cc * TW_TERMS + s) * 2 + h) * TW_TILE_BYTES;
}

#if TW_WGMMA /* (used only there) */
/* A shared-memory matrix descriptor, no swizzle: the start address, the byte offsets between
 * core matrices along K (128) and along N (256), each >> 4. */
static __device__ __forceinline__ uint64_t tw_desc(const void *tile) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(tile);
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(128 >> 4) << 16 |
           (uint64_t)(256 >> 4) << 32;
}

/* Keeps the compiler from moving the accumulators across the asynchronous wgmma's reads and
 * writes. */
static __device__ __forceinline__ void tw_fence_acc(float (&acc)[2][TW_NG][4]) {
#pragma unroll
    for (int e = 0; e < 2 * TW_NG * 4; e++)
        asm volatile("" : "+f"((&acc[0][0][0])[e])::"memory");
}
#endif

/* d (m-tile rows of this warp x 8 NG tokens) += A B for one k16 step of the warpgroup: a0-a3
 * the mma's A registers, B the tile at desc. */
template <int NG>
static __device__ __forceinline__ void tw_wgmma(float (&d)[TW_NG][4], uint32_t a0, uint32_t a1,
                                                uint32_t a2, uint32_t a3, uint64_t desc) {
#if TW_WGMMA
    if constexpr (NG == 1)
        asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1, 1, 1, 0;"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc)
                     : "memory");
    else if constexpr (NG == 2)
        asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1, 0;"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                       "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc)
                     : "memory");
    else if constexpr (NG == 3)
        asm volatile("wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, %16, 1, 1, 1, 0;"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                       "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),
                       "+f"(d[2][2]), "+f"(d[2][3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc)
                     : "memory");
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
                     "{%16,%17,%18,%19}, %20, 1, 1, 1, 0;"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                       "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),
                       "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),
                       "+f"(d[3][3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc)
                     : "memory");
#else
    __trap(); /* never called without wgmma (tw_kernel's WG is false there) */
#endif
}

/* WG's version of one chunk's mma (tw_chunk_mma): per term, per k-step, one wgmma per m-tile
 * for the first NGA token groups, then a wait for them all (the next chunk's weights replace
 * the A registers; the last chunk's tiles are restaged after the slab). The same sequence
 * per accumulator. tb: the shared memory. */
template <int NGA>
static __device__ __forceinline__ void tw_chunk_wgmma(float (&acc)[2][TW_NG][4],
                                                      const uint4 (&a)[2][2], const char *tb,
                                                      int cc, int terms) {
#if TW_WGMMA
    tw_fence_acc(acc);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int s = 0; s < TW_TERMS; s++) {
        if (s >= terms) break; /* uniform: 2 or 3 terms */
        const uint64_t d0 = tw_desc(tb + tw_tile(cc, s, 0)), d1 = tw_desc(tb + tw_tile(cc, s, 1));
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
            tw_wgmma<NGA>(acc[mt], a[mt][0].x, a[mt][1].x, a[mt][0].y, a[mt][1].y, d0);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
            tw_wgmma<NGA>(acc[mt], a[mt][0].z, a[mt][1].z, a[mt][0].w, a[mt][1].w, d1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    tw_fence_acc(acc);
#else
    __trap(); /* never called without wgmma (tw_kernel's WG is false there) */
#endif
}

/* One chunk's mma for the first NGA token groups: per accumulator (m-tile mt, group j) the
 * GEMV's sequence -- for each term, the chunk's two k-steps -- but the accumulators'
 * sequences interleaved: each k-step runs over every (j, mt) before the next, so 2 NGA
 * independent mma are in flight where a loop over j, then terms, had two (the SASS showed a
 * NOP between every pair of dependent mma). The same sums in the same order per accumulator.
 * b: the chunk's B fragments (staged), cc: its place in the slab. */
template <int NGA>
static __device__ __forceinline__ void tw_chunk_mma(float (&acc)[2][TW_NG][4],
                                                    const uint4 (&a)[2][2], const uint4 *sb, int cc,
                                                    int lane, int terms) {
#pragma unroll
    for (int s = 0; s < TW_TERMS; s++) {
        if (s >= terms) break; /* uniform: 2 or 3 terms */
        uint4 b[NGA];
#pragma unroll
        for (int j = 0; j < NGA; j++)
            b[j] = sb[((j * TW_SLAB + cc) * TW_TERMS + s) * 32 + lane];
#pragma unroll
        for (int j = 0; j < NGA; j++)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                mma_bf16(acc[mt][j], a[mt][0].x, a[mt][1].x, a[mt][0].y, a[mt][1].y, b[j].x,
                         b[j].y);
#pragma unroll
        for (int j = 0; j < NGA; j++)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                mma_bf16(acc[mt][j], a[mt][0].z, a[mt][1].z, a[mt][0].w, a[mt][1].w, b[j].z,
                         b[j].w);
    }
}

/* One chunk's products for the first NGA token groups, on wgmma (WG) or mma.sync. */
template <int NGA, bool WG>
static __device__ __forceinline__ void tw_chunk(float (&acc)[2][TW_NG][4], const uint4 (&a)[2][2],
                                                const uint4 *sb, int cc, int lane, int terms) {
    if constexpr (WG)
        tw_chunk_wgmma<NGA>(acc, a, reinterpret_cast<const char *>(sb), cc, terms);
    else
        tw_chunk_mma<NGA>(acc, a, sb, cc, lane, terms);
}

/* Block (token chunk x, K run y = the rank in its cluster of ks, row block z; grouped: z =
 * active-expert slot x row blocks + row block, and the block walks its expert's token
 * chunks; per head: z = head x row blocks + row block). acc[mt][j][i]: m-tile mt (GLU: 0 the gate,
 * 1 the up projection, same rows), token group j; i = 0, 1: row g, tokens 2 tig, 2 tig + 1; i = 2,
 * 3: row g + 8. */
template <bool GLU, bool G, bool WG_ASKED>
__global__ void __launch_bounds__(TW_THREADS, 2)
    tw_kernel(const di_cuda_mm_params p, int ks, int terms, bool xvec, int row_blocks) {
    constexpr bool WG = WG_ASKED && TW_WGMMA;
    /* mma: [group j][slab chunk][term][lane], B fragments; WG: tw_tile's tiles */
    extern __shared__ uint4 sb[];
    constexpr int RO = GLU ? 16 : 32, RB = TW_WARPS * RO; /* output rows per warp, block */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int kw = (int)blockIdx.y;
    const int64_t rb0 = (int64_t)(blockIdx.z % row_blocks) * RB, r0 = rb0 + (int64_t)warp * RO;
    const bool live = r0 < p.rows;
    const void *wdata = p.data, *udata = p.glu_data;
    const float *xb = p.x; /* this block's activations and outputs (a head's, below) */
    float *yb = p.y;
    int64_t t_first = 0, t_end = p.n_tokens;
    const int zs = (int)(blockIdx.z / row_blocks); /* the slot or head of blockIdx.z */
    /* grouped: the routing (active list, offsets) comes from earlier kernels; exits uniform
     * over the cluster (its blocks share blockIdx.z) */
    if constexpr (G) {
        if (!tc_expert<GLU, false>(p, zs, wdata, udata, t_first, t_end)) return;
    } else if (p.n_heads > 1) { /* one product per head (BF16, no GLU): head zs */
        tc_head(p, zs, 2, wdata, xb, yb);
    }
    const int64_t K = p.cols, C = (K + TC_CHUNK - 1) / TC_CHUNK;
    const int64_t c_begin = C * kw / ks, c_end = C * (kw + 1) / ks;

    const char *wrow[2][2];
    tc_lane_rows<2, GLU>(p, r0, g, wdata, udata, 2, wrow);
    const int64_t kl = 8 * tig;
    auto load_a = [&](uint4(&dst)[2][2], int64_t c) {
        const int64_t k = c * TC_CHUNK + kl;
        const bool ok = live && c < c_end && k < K; /* K % 8 == 0: whole vectors */
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                dst[mt][h] = ok ? __ldcs(reinterpret_cast<const uint4 *>(wrow[mt][h] + 2 * k))
                                : make_uint4(0, 0, 0, 0);
    };
    cg::cluster_group cluster = cg::this_cluster();
    float *part = reinterpret_cast<float *>(sb); /* the partial sums, after the K loop */

    /* One pass per token chunk: plain, the block's chunk; grouped, each of its expert's. */
    for (int64_t t0 = t_first + (int64_t)blockIdx.x * TW_TOKENS; t0 < t_end;
         t0 += (int64_t)gridDim.x * TW_TOKENS) {
        const int nt = (int)min((int64_t)TW_TOKENS, t_end - t0);
        uint4 a[2][2];
        load_a(a, c_begin);
        if constexpr (!G) { /* the weights are on their way; now wait for x (PDL) */
            pdl_wait();     /* (a plain block makes one pass) */
            pdl_trigger();
        }

        float acc[2][TW_NG][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int j = 0; j < TW_NG; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[mt][j][i] = 0.0f;

        for (int64_t s0 = c_begin; s0 < c_end; s0 += TW_SLAB) {
            const int sl = (int)min((int64_t)TW_SLAB, c_end - s0);
            __syncthreads(); /* every warp is done with the previous slab's fragments */
            /* Stage: unit (j, cc, ln) is lane ln's B fragment of token group j, chunk cc; this
             * thread's units are threadIdx.x + i TW_THREADS. All their loads are issued before
             * the first split, so the block waits for L2 about once per slab, not once per
             * unit. */
            float xv[TW_SU][8];
#pragma unroll
            for (int i = 0; i < TW_SU; i++) {
                const int u = (int)threadIdx.x + i * TW_THREADS;
                const int ln = u & 31, cc = (u >> 5) % TW_SLAB, j = u / (32 * TW_SLAB);
                const int64_t t = t0 + 8 * j + (ln >> 2), k = (s0 + cc) * TC_CHUNK + 8 * (ln & 3);
                const bool ok = cc < sl && t < t_end && k < K;
                /* grouped with p.x_rows: row t's activations are token x_rows[t]'s */
                const int64_t xt = G && p.x_rows && ok ? (int64_t)p.x_rows[t] : t;
                load_x8(p, xb, xt, k, ok, xvec, xv[i]);
            }
#pragma unroll
            for (int i = 0; i < TW_SU; i++) {
                const int u = (int)threadIdx.x + i * TW_THREADS;
                const int ln = u & 31, cc = (u >> 5) % TW_SLAB, j = u / (32 * TW_SLAB);
                if (cc >= sl || 8 * j >= nt) continue; /* a unit no warp reads */
                if constexpr (WG) { /* token 8 j + (ln >> 2), slots 2 (ln & 3) + {0, 1} */
                    char *dst =
                        reinterpret_cast<char *>(sb) + 256 * j + 16 * (ln >> 2) + 4 * (ln & 3);
                    for (int s = 0; s < terms; s++) {
                        const uint4 b = split_quad(xv[i]);
                        char *k0 = dst + tw_tile(cc, s, 0), *k1 = dst + tw_tile(cc, s, 1);
                        *reinterpret_cast<uint32_t *>(k0) = b.x; /* core 0 of step 0 */
                        *reinterpret_cast<uint32_t *>(k0 + 128) = b.y;
                        *reinterpret_cast<uint32_t *>(k1) = b.z; /* step 1 */
                        *reinterpret_cast<uint32_t *>(k1 + 128) = b.w;
                    }
                } else {
                    uint4 *dst = sb + (j * TW_SLAB + cc) * TW_TERMS * 32 + ln;
                    for (int s = 0; s < terms; s++)
                        dst[s * 32] = split_quad(xv[i]);
                }
            }
            if constexpr (WG) /* the stores, before the tensor cores' reads (async proxy) */
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            __syncthreads();
            for (int cc = 0; cc < sl; cc++) {
                uint4 nx[2][2];
                load_a(nx, s0 + cc + 1); /* the next chunk (maybe the next slab's first) */
                switch ((nt + 7) / 8) {  /* the token groups with tokens (uniform) */
                case 1:
                    tw_chunk<1, WG>(acc, a, sb, cc, lane, terms);
                    break;
                case 2:
                    tw_chunk<2, WG>(acc, a, sb, cc, lane, terms);
                    break;
                case 3:
                    tw_chunk<3, WG>(acc, a, sb, cc, lane, terms);
                    break;
                default:
                    tw_chunk<TW_NG, WG>(acc, a, sb, cc, lane, terms);
                    break;
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    a[mt][0] = nx[mt][0], a[mt][1] = nx[mt][1];
            }
        }

        if (ks == 1) {           /* the whole sum: store (as the GEMV stores) */
            if (!live) continue; /* (the next pass's barriers come after this warp's stores) */
#pragma unroll
            for (int j = 0; j < TW_NG; j++) {
                if (8 * j >= nt) break;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int64_t t = t0 + 8 * j + 2 * tig + (i & 1);
                    if (t >= t_end) continue;
#pragma unroll
                    for (int mt = 0; mt < (GLU ? 1 : 2); mt++) {
                        const int64_t r = r0 + 16 * mt + g + 8 * (i >> 1);
                        if (r >= p.rows) continue;
                        const float val =
                            GLU ? silu_times(acc[0][j][i], acc[1][j][i]) : acc[mt][j][i];
                        store_y(yb + t * p.y_tstride + r, val, p.accumulate);
                    }
                }
            }
            continue;
        }

        /* Partial sums: this block's tile into its own shared memory (the B fragments are no
         * longer needed), [token][row]; GLU: the up rows after the gate's. */
        __syncthreads(); /* every warp is done reading the fragments */
#pragma unroll
        for (int j = 0; j < TW_NG; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const int row = warp * RO + (GLU ? 0 : 16 * mt) + g + 8 * (i >> 1);
                    part[(8 * j + 2 * tig + (i & 1)) * TW_PSTRIDE + (GLU && mt ? RB : 0) + row] =
                        acc[mt][j][i];
                }
        cluster.sync(); /* every K run's partial sums are in place */
        const float *runs[TC_MAX_KS];
#pragma unroll
        for (int k = 0; k < TC_MAX_KS; k++)
            runs[k] = cluster.map_shared_rank(part, k < ks ? k : 0);
        /* Block q takes elements e = q * TW_THREADS + thread, stepping by ks * TW_THREADS, of
         * the tile's RB x nt outputs (row fastest) and adds runs 0 .. ks - 1 in the GEMV's
         * tree order. */
        for (int e = kw * TW_THREADS + threadIdx.x; e < RB * nt; e += ks * TW_THREADS) {
            const int rl = e % RB, tl = e / RB;
            const int64_t r = rb0 + rl, t = t0 + tl;
            if (r >= p.rows) continue;
            float v[TC_MAX_KS];
#pragma unroll
            for (int k = 0; k < TC_MAX_KS; k++)
                v[k] = k < ks ? runs[k][tl * TW_PSTRIDE + rl] : 0.0f;
            float val = tc_tree_sum(v, ks);
            if constexpr (GLU) {
#pragma unroll
                for (int k = 0; k < TC_MAX_KS; k++)
                    v[k] = k < ks ? runs[k][tl * TW_PSTRIDE + RB + rl] : 0.0f;
                val = silu_times(val, tc_tree_sum(v, ks));
            }
            store_y(yb + t * p.y_tstride + r, val, p.accumulate);
        }
        cluster.sync(); /* no block reuses or leaves its shared memory while another reads it */
    }
}

int64_t di_cuda_wide_launches[2]; /* cuda_backend.h: plain, grouped launches (for tests) */
int64_t di_cuda_wgmma_launches;   /* ... of them with WG set */

typedef void (*tw_kernel_fn)(const di_cuda_mm_params, int, int, bool, int);

/* Every instantiation, [wgmma][grouped][glu]. */
static const tw_kernel_fn tw_kernels[2][2][2] = {
    {{tw_kernel<false, false, false>, tw_kernel<true, false, false>},
     {tw_kernel<false, true, false>, tw_kernel<true, true, false>}},
    {{tw_kernel<false, false, true>, tw_kernel<true, false, true>},
     {tw_kernel<false, true, true>, tw_kernel<true, true, true>}}};

/* Can clusters of the most K runs of these blocks run on this device at all? A query error
 * counts as no (the backend then keeps the GEMV, whose sums are the same). */
static bool cluster_fits(tw_kernel_fn k) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = TC_MAX_KS;
    attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, TC_MAX_KS, 1);
    cfg.blockDim = dim3(TW_THREADS);
    cfg.dynamicSmemBytes = TW_SMEM;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, k, &cfg);
    (void)cudaGetLastError();
    return err == cudaSuccess && clusters > 0;
}

/* Writes whether this code has wgmma: which code a device runs (the sm_90a image, or the
 * compute_90 PTX compiled for it) is the driver's choice. */
__global__ void tw_has_wgmma(int *out) {
    *out = TW_WGMMA;
}

cudaError_t di_cuda_tc_wide_setup(bool *usable, bool *wgmma) {
    cudaError_t err = cudaSuccess;
    *usable = true;
    const tw_kernel_fn *k = &tw_kernels[0][0][0];
    for (size_t i = 0; i < sizeof tw_kernels / sizeof *k && err == cudaSuccess; i++) {
        err = cudaFuncSetAttribute(k[i], cudaFuncAttributeMaxDynamicSharedMemorySize, TW_SMEM);
        *usable = *usable && err == cudaSuccess && cluster_fits(k[i]);
    }
    int *flag = nullptr, has = 0;
    if (err == cudaSuccess && (err = cudaMalloc((void **)&flag, sizeof(int))) == cudaSuccess) {
        tw_has_wgmma<<<1, 1>>>(flag);
        err = cudaMemcpy(&has, flag, sizeof(int), cudaMemcpyDeviceToHost);
        cudaFree(flag);
    }
    *wgmma = err == cudaSuccess && has == 1;
    return err;
}

static int64_t tw_block_rows(const di_cuda_mm_params *p) {
    return TW_WARPS * (p->glu_data || p->glu_experts ? 16 : 32);
}

/* Blocks per (slot, K run, row block) of a grouped product: the token chunks of a mean
 * expert, at most tune.tc_wide_x (DI_CUDA_TC_WIDE_X, default 8). A block that walked all its
 * expert's chunks read its weight tile once per chunk, and by the next chunk the other
 * blocks' weights had pushed it out of L2 (a 1024-row prefill's routed gate / up read 3.6
 * times their bytes from DRAM: NOTES.md, nineteenth round); blocks x = 0, 1, ... of a tile
 * are launched next to each other, so they take its chunks at about the same time and read
 * the tile about once. Which block takes a chunk does not change its sums. */
static int64_t tw_grouped_x(const di_cuda_mm_params *p) {
    const int64_t slots = DI_MAX(p->n_heads, 1), mean = (p->n_tokens + slots - 1) / slots;
    return DI_MAX(1, DI_MIN(p->tune.tc_wide_x, (mean + TW_TOKENS - 1) / TW_TOKENS));
}

/* Called after di_cuda_tc_fits (BF16, W x, 16-byte aligned rows of whole vectors; a product
 * per head: every head's weight aligned, no GLU). Grouped products (n_heads active-expert
 * slots) count the mean rows per slot against their own threshold, p->tune.tc_wide_grouped;
 * plain ones and products per head (n_heads heads, each n_tokens rows) tc_wide_min_n. */
bool di_cuda_tc_wide_fits(const di_cuda_mm_params *p) {
    const bool grouped = p->experts != NULL;
    const int64_t slots = DI_MAX(p->n_heads, 1); /* active-expert slots or heads */
    const int64_t row_blocks = (p->rows + tw_block_rows(p) - 1) / tw_block_rows(p);
    const int64_t min_n = grouped ? p->tune.tc_wide_grouped : p->tune.tc_wide_min_n;
    return p->dtype == DI_DTYPE_BF16 && min_n > 0 && di_cuda_rows_per_weight(p) >= min_n &&
           p->tune.tc_terms <= TW_TERMS && row_blocks * slots <= 65535;
}

cudaError_t di_cuda_launch_matmul_tc_wide(const di_cuda_mm_params *p) {
    const bool grouped = p->experts != NULL, glu = p->glu_data || p->glu_experts;
    const bool heads = di_cuda_per_head(p);
    const int ks = tc_ks(p); /* a product per head: from the tiles of all heads */
    const bool xvec = tc_xvec(p);
    const int row_blocks = (int)((p->rows + tw_block_rows(p) - 1) / tw_block_rows(p));
    /* plain: one block per token chunk; grouped: tw_grouped_x(p) per slot, block x walking its
     * expert's chunks x, x + gridDim.x, ...; grid z: the row blocks of each slot or head */
    const int64_t gx = grouped ? tw_grouped_x(p) : (p->n_tokens + TW_TOKENS - 1) / TW_TOKENS;
    const dim3 grid((unsigned)gx, (unsigned)ks, (unsigned)(row_blocks * DI_MAX(p->n_heads, 1)));
    if (heads) di_cuda_tc_head_launches++;
    const bool wg = p->tune.tc_wgmma != 0;
    const tw_kernel_fn k = tw_kernels[wg][grouped][glu];
    di_cuda_wide_launches[grouped ? 1 : 0]++;
    di_cuda_wgmma_launches += wg;
    return di_cuda_launch_cluster(k, grid, dim3(TW_THREADS), (size_t)TW_SMEM, p->stream,
                                  dim3(1, (unsigned)ks, 1), *p, ks, p->tune.tc_terms, xvec,
                                  row_blocks);
}
