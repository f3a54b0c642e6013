/*
 * cuda_tc_stream.cu -- a decode batch's grouped BF16 expert products (up to 8 rows per
 * expert) with each warp's weights and activations streamed through a ring in shared memory
 * (cp.async), the sums bitwise tc_kernel's (cuda_tc_gemv.cu). The default for them
 * (DI_CUDA_TC_STREAM=0: tc_kernel). H200, 4-layer V2-Lite model, 64 sequences: the routed gate
 * / up 2.9 -> 3.1 TB/s, the down 2.6 -> 2.8 (Nsight Compute), the step 2.28 -> 2.14 ms of
 * device time (2.01 with a runs target of 512, now the default); batch 1 unchanged (NOTES.md,
 * sixteenth round). Pairs of chunks read as whole lines (below): 64 sequences 2.04 -> 1.83 ms,
 * 8 sequences 1.10 -> 1.03, batch 1 0.58 -> 0.55 (seventeenth round).
 *
 * Why: tc_kernel holds the weights it requested in registers (U = 2 chunks ahead of the two
 * it multiplies), so a warp has at most a few KB in flight, and at 128 registers an SM runs
 * 16 warps. Nsight Compute on the H200 (64 sequences, V2-Lite's routed gate / up): 2.35 TB/s
 * under the profiler, 0.78 eligible of 3.8 warps per scheduler, 8.4 cycles between a warp's
 * instructions, about 200 instructions per chunk -- most of them the per-load address
 * arithmetic and predicates, the moves between the two register buffers, and branches
 * around the loads. Here the warp copies the next pair of chunks into its ring of two pair
 * stages with cp.async (zero-filled past the rows, the run or K) while it multiplies the
 * other pair: the bytes in flight no longer cost registers. Each cp.async of the weights
 * covers 4 rows x 128 bytes (both chunks of a pair), whole 128-byte lines: a read of 8 rows
 * x 64 bytes per instruction (each chunk on its own, as the GEMV reads) streamed at 3.2 TB/s
 * on the H200, whole lines at 4.6 (a read-only probe; seventeenth round). So a lane copies
 * pieces that other lanes multiply: warp barriers order the copies and the reads. The tree
 * over a tile's warps adds through the ring too, once every warp is done with it (no static
 * shared memory).
 *
 * The same sums as tc_kernel: the same chunks (tc_ks's K runs, R of them per warp as tc_runs
 * chooses, visited as run_fold adds them), the same weights and activations (the same
 * 16-byte pieces, only through shared memory; rows past the end zero-filled where tc_kernel
 * repeats the last row: their sums are never stored), the same split and mma sequence per
 * chunk, the same tree over the tile's warps. matmul_experts' op test compares it bitwise with the
 * plain product.
 *
 * TMA (ts_kernel<..., true>; the default where the expert tables hold tensor maps,
 * DI_CUDA_TC_TMA=0: the cp.async above). Written after the last GPU run, not yet run (NOTES.md,
 * eighteenth round). The loop above is issue-bound -- 3.3 TB/s where a read probe of the same
 * rows reaches 4.6 -- and about 55 of a chunk's 180 instructions are the copies' (the per-lane
 * offsets and predicates, 8 cp.async per pair); with the boxes a chunk takes 167-176 (SASS,
 * sm_90; the rest is the consumer's). With one tensor map per expert (made with the
 * expert table: dim 0 the K columns, dim 1 the rows), lane 0 issues two box loads per pair
 * instead: m-tile 0's 16 rows x 64 columns (both chunks of the pair, 2 KiB) and m-tile 1's
 * (the next 16 rows; GLU: the up projection's same rows), on one mbarrier per pair stage that
 * expects their 4 KiB. Every lane waits on it (the phase parity of each stage is tracked
 * across token groups), reads, and a warp barrier lets lane 0 refill the stage. The
 * activations stay per-lane cp.async, each lane reading only its own. Rows past the end and
 * columns past K come back as zeros (the map's bounds); a box at a run's odd first chunk or
 * odd end also brings the neighbouring chunk, which the consumer skips.
 *   Shared-memory layout: a box lands with the 128-byte swizzle, row r's 16-byte piece j at
 * 128 r + 16 (j ^ r % 8), so each box starts on a 1024-byte boundary (the ring is aligned at
 * run time). The mma's lane (g, tig) needs piece 4 ch + tig (ch: the chunk within the pair)
 * of rows g and g + 8. Read so, the 8 lanes of one shared-memory phase of a 16-byte load (g =
 * 2i and 2i + 1, tig = 0..3) would find both rows' pieces in one half of the banks: 2-way
 * conflicts. So the mma's A row g holds weight row sig = g ^ 4 (g & 1) (and sig + 8): rows 2i
 * and (2i + 1) ^ 4 differ in bit 2, their pieces (4 ch + tig) ^ sig fill both halves, 8
 * distinct 16-byte bank groups per phase. An output row's sum depends only on its own weight
 * row and the activations, so the permutation moves which lane stores a row (the epilogue
 * uses sig), not its bits.
 *   Fences: the tensor map's acquire before a warp's first box (the host wrote the maps
 * before the launch; cheap, once per warp); the mbarriers' init fence; and after the tree
 * writes the ring through the generic proxy, a proxy fence before the next token group's
 * boxes write it through the async proxy. The mbarriers lie after every warp's ring, outside
 * what the tree writes (its first 8 KiB).
 */
#include "backend/cuda/cuda_tc.cuh"

#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled: the encoder comes from the driver */

#define TS_STAGES 4 /* chunks a warp's ring holds: two pairs, one in flight, one in use */
/* 16-byte slots per chunk and lane: the weights of rows g and g + 8 of two m-tiles (GLU: the
 * gate's and the up projection's same rows), then the lane's token's 8 activations (fp32) */
#define TS_SLOTS      6
#define TS_PAIR_U4    (2 * TS_SLOTS * 32)                              /* a pair's slots */
#define TS_WARP_BYTES (TS_STAGES * TS_SLOTS * 32 * (int)sizeof(uint4)) /* 12 KiB */
/* TMA: a box is 16 rows x 64 columns of one m-tile (both chunks of a pair), 2 KiB; a pair
 * stage holds m-tile 0's box, m-tile 1's, then the lanes' activations (slots [ch][2][32]):
 * the same 6 KiB per stage as the slots above */
#define TS_BOX_ROWS 16
#define TS_BOX_COLS (2 * TC_CHUNK)
#define TS_BOX_U4   (TS_BOX_ROWS * TS_BOX_COLS * 2 / (int)sizeof(uint4)) /* 128 */
#define TS_ALIGN    1024 /* the 128-byte swizzle's period: every box starts on a multiple */
/* A TMA block's dynamic shared memory: the warps' rings (aligned at run time: TS_ALIGN of
 * slack), then two mbarriers (16 bytes) per warp. */
#define TS_TMA_SMEM(warps) ((warps) * (TS_WARP_BYTES + 16) + TS_ALIGN)
static_assert(TS_PAIR_U4 == 2 * TS_BOX_U4 + 2 * 2 * 32, "a TMA stage: two boxes, activations");
static_assert(TS_PAIR_U4 * sizeof(uint4) % TS_ALIGN == 0 &&
                  TS_BOX_U4 * sizeof(uint4) % TS_ALIGN == 0,
              "every box 1024-byte aligned");
static_assert(TC_MAX_KS * 32 * 8 * sizeof(float) <= 4 * TS_WARP_BYTES,
              "the tree fits in the ring of the fewest warps (4)");

int64_t di_cuda_tc_stream_launches; /* cuda_backend.h: launches of this kernel (for tests) */
int64_t di_cuda_tc_tma_launches;    /* ... of them with TMA (cuda_backend.h, for tests) */

/* cp.async of 16 bytes from src to shared dst, of which `bytes` (16 or 0) are read and the
 * rest zero-filled; .cg for the weights (read once: not kept in L1), .ca for activations
 * (read by every warp of the expert). */
template <bool L1>
static __device__ __forceinline__ void cp_async16(uint4 *dst, const void *src, int bytes) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    if constexpr (L1)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes)
                     : "memory");
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes)
                     : "memory");
}

static __device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N> static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* ---------------------------------------------------------------------------------------- */
/* TMA: mbarriers, fences, box loads                                                         */
/* ---------------------------------------------------------------------------------------- */

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* An mbarrier that completes a phase on one arrival (lane 0's expect_tx) and its bytes. */
static __device__ __forceinline__ void mbar_init(uint64_t *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}

/* Lane 0's arrival for a pair: the phase completes once `bytes` more have landed. */
static __device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}

/* Returns once the phase of parity `parity` has completed (its bytes are visible). */
static __device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}

/* The mbarriers' initialization, visible to the async proxy (the boxes' complete_tx). */
static __device__ __forceinline__ void fence_mbar_init(void) {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* Generic-proxy accesses of shared memory before it, ordered before async-proxy ones after. */
static __device__ __forceinline__ void fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* A tensor map in global memory, written before the launch, acquired for the TMA unit. */
static __device__ __forceinline__ void tmap_acquire(const CUtensorMap *map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(map) : "memory");
}

/* The box of map at (col, row) -- TS_BOX_ROWS rows x TS_BOX_COLS columns, 128-byte swizzled,
 * zeros outside the tensor -- into dst (1024-byte aligned), its bytes counted on bar. */
static __device__ __forceinline__ void tma_box(uint4 *dst, const CUtensorMap *map, int col, int row,
                                               uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_u32(dst)),
                 "l"(map), "r"(col), "r"(row), "r"(smem_u32(bar))
                 : "memory");
}

/* Block: max(4, ks) warps, W = ks / R per row tile (warp = tile x W + kw), a tile being two
 * m-tiles of 16 rows (GLU: 16 gate and 16 up rows); blockIdx.z: the active-expert slot, whose
 * rows the block walks 8 at a time (one token group per pass). Each warp owns
 * TS_WARP_BYTES of the ring. TMA: the weights by box loads (the file's header). */
template <bool GLU, int R, bool TMA>
__global__ void __launch_bounds__(32 * TC_MAX_KS, 2)
    ts_kernel(const di_cuda_mm_params p, int ks, int terms) {
    extern __shared__ uint4 ts_smem[];
    uint4 *ring = ts_smem;
    if constexpr (TMA) /* the boxes' swizzle: stages on 1024-byte boundaries */
        ring += ((0u - smem_u32(ts_smem)) & (TS_ALIGN - 1)) / sizeof(uint4);
    constexpr int LOG2_R = tc_log2_runs<R>;
    constexpr int RO = GLU ? 16 : 32; /* output rows per tile */
    const int lane = threadIdx.x & 31;
    /* TMA: the warp index through a shuffle from lane 0, which ptxas knows to be the same in
     * every lane, so that the box loads' operands can live in uniform registers */
    const int warp = TMA ? __shfl_sync(~0u, (int)(threadIdx.x >> 5), 0) : (int)(threadIdx.x >> 5);
    const int g = lane >> 2, tig = lane & 3;
    /* the weight row (of an m-tile's first 8) in the mma's A row g: g, or with TMA sig =
     * g ^ 4 (g & 1), for the banks (the file's header) */
    const int rg = TMA ? g ^ ((g & 1) << 2) : g;
    const int W = ks / R, kw = warp % W;
    const int64_t r0 = ((int64_t)blockIdx.x * ((int)(blockDim.x >> 5) / W) + warp / W) * RO;
    const bool live = r0 < p.rows; /* a tile past the end still takes part in the tree */
    const void *wdata = p.data, *udata = p.glu_data;
    int64_t t0 = 0, t_end = p.n_tokens;
    if (!tc_expert<GLU, true>(p, (int)blockIdx.z, wdata, udata, t0, t_end)) return;
    const int64_t K = p.cols, C = (K + TC_CHUNK - 1) / TC_CHUNK;
    /* Step q's chunks [first, last) (tc_run_index), in 32 bits and computed where they are
     * needed: the producer's step is not a compile-time constant, and an array indexed by it
     * would live in local memory. tc_ks leaves every run at least one chunk. */
    const int c32 = (int)C;
    auto run_bounds = [&](int q, int &first, int &last) {
        const int kr = tc_run_index<R>(q, kw, W);
        first = c32 * kr / ks, last = c32 * (kr + 1) / ks;
    };
    /* The producer's rows (cp.async): lane l copies row rho = 4 k + l / 8 of the tile, k = 0
     * .. 7 (m-tile rho / 16 -- GLU: the gate's 16 rows, then the up projection's same rows --
     * row rho % 16 of it), 16 bytes at column 8 (l % 4) of the pair's chunk (l / 4) % 2. So
     * each of its cp.async covers 4 rows x 128 bytes, whole 128-byte lines: with the GEMV's 8
     * rows x 64 bytes per instruction the H200 streamed the experts at 3.2 TB/s, a read of
     * whole lines 4.6 (NOTES.md, seventeenth round). The pieces land where their consumer lane
     * (row g = rho % 8, column group l % 4) reads them, so lanes read each other's copies: a
     * warp barrier after the wait, and before a stage is refilled. Rows past the end are
     * zero-filled (their sums are never stored). TMA: none of this (dead code there). */
    const int ch_p = (lane >> 2) & 1, rl = lane >> 3; /* its column group is its tig */
    const char *wbase[2] = {static_cast<const char *>(wdata),
                            static_cast<const char *>(GLU ? udata : wdata)}; /* m-tile 0, 1 */
    uint32_t poff[8], pok = 0; /* byte offsets from wbase (rows clamped), rows in range */
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int64_t r = r0 + (GLU ? 0 : 16 * (k >> 2)) + 4 * (k & 3) + rl;
        pok |= (uint32_t)(r < p.rows) << k;
        poff[k] = (uint32_t)((min(r, p.rows - 1) * p.row_stride + 8 * tig) * 2);
    }
    /* row rho's piece goes to slot 2 mt + h (h = rho % 16 / 8) of consumer lane 4 (rho % 8) +
     * l % 4: with rho % 16 = 4 (k % 4) + l / 8, a constant per k plus this lane's part */
    const int pslot0 = 4 * rl + tig;
    /* chunks c whose columns 8 tig .. of this lane are inside K (K % 8 == 0: whole pieces;
     * for its weight pieces and its activations alike) */
    const int cmax = K > 8 * tig ? (int)((K - 8 * tig + TC_CHUNK - 1) / TC_CHUNK) : 0;
    auto pslot = [](int k) { return (2 * (k >> 2) + ((k & 3) >> 1)) * 32 + 16 * (k & 1); };
    uint4 *wring = ring + (size_t)warp * (TS_WARP_BYTES / sizeof(uint4)); /* the warp's ring */
    /* This lane's activation slots of chunk ch (0, 1) of a pair stage (the second 32 on). */
    auto xslot = [&](uint4 *stage, int ch) {
        return stage + (TMA ? 2 * TS_BOX_U4 + 64 * ch : ch * TS_SLOTS * 32 + 4 * 32) + lane;
    };
    /* TMA: the expert's maps (m-tile 0, 1), the warp's mbarriers (one per pair stage, after
     * every warp's ring), the pairs of earlier token groups (TMA's pair i, counted over the
     * passes, lands in stage i % 2 and completes that barrier's phase i / 2: the counters run
     * on from pass to pass, since a pass may use one stage once more than the other; without
     * TMA they restart at 0), and where lane (g, tig)'s pieces of chunk ch lie in a box (row
     * rg; row rg + 8 is 64 pieces on). */
    const CUtensorMap *tmap[2] = {nullptr, nullptr};
    uint64_t *bars = nullptr;
    int pairs = 0;
    const int wpiece[2] = {8 * rg + (tig ^ rg), 8 * rg + ((4 + tig) ^ rg)};
    if constexpr (TMA) {
        const int ex = p.g_active[1 + blockIdx.z]; /* tc_expert's expert */
        tmap[0] = p.tmaps + ex;
        tmap[1] = GLU ? p.glu_tmaps + ex : tmap[0];
        bars = reinterpret_cast<uint64_t *>(ring + (size_t)(blockDim.x >> 5) *
                                                       (TS_WARP_BYTES / sizeof(uint4))) +
               2 * warp;
        if (lane == 0) {
            mbar_init(bars);
            mbar_init(bars + 1);
            fence_mbar_init();
            tmap_acquire(tmap[0]);
            if (GLU) tmap_acquire(tmap[1]);
        }
        __syncwarp(); /* the other lanes wait on initialized barriers */
    }

    for (; t0 < t_end; t0 += 8) { /* block-uniform */
        const int64_t t = t0 + g; /* this lane's token (the mma's B column g) */
        const bool tok = t < t_end;
        const char *xrow =
            reinterpret_cast<const char *>(p.x + (tok ? t : t0) * p.x_tstride + 8 * tig);
        /* The producer: the next pair of the warp's run pq -- chunks pc .. pe, pe the next
         * even chunk or the run's end, so that a pair's 128 bytes of a row are one line (a
         * run starting at an odd chunk starts with that chunk alone) -- into the next pair
         * stage, chunk c in its slots c % 2; an empty group once every chunk is requested,
         * so that the waits count alike (TMA: no box then, the barrier untouched). */
        int pq = 0, issued = pairs, pc, pend;
        run_bounds(0, pc, pend);
        auto issue = [&]() {
            if (pq < R) {
                const int s = issued & 1;
                uint4 *stage = wring + s * TS_PAIR_U4;
                const int pa = pc & ~1, pe = min(pa + 2, pend), lim = min(pe, cmax);
                if constexpr (TMA) {
                    if (lane == 0) { /* both m-tiles' boxes of the pair, on the stage's barrier */
                        mbar_expect_tx(bars + s, 2 * TS_BOX_U4 * (uint32_t)sizeof(uint4));
                        tma_box(stage, tmap[0], TC_CHUNK * pa, (int)r0, bars + s);
                        tma_box(stage + TS_BOX_U4, tmap[1], TC_CHUNK * pa, (int)r0 + (GLU ? 0 : 16),
                                bars + s);
                    }
                } else {
                    const int cw = pa + ch_p; /* this lane's weight chunk */
                    const bool wk = cw >= pc && cw < lim;
                    const uint32_t woff = wk ? (uint32_t)cw * (TC_CHUNK * 2) : 0u,
                                   wm = wk ? pok : 0u;
                    uint4 *wdst = stage + ch_p * TS_SLOTS * 32 + pslot0;
#pragma unroll
                    for (int k = 0; k < 8; k++)
                        cp_async16<false>(wdst + pslot(k), wbase[k >> 2] + (poff[k] + woff),
                                          (int)((wm >> k & 1u) << 4));
                }
#pragma unroll
                for (int ch = 0; ch < 2; ch++) { /* the lane's own activations */
                    const int cx = pa + ch;
                    const bool xk = tok && cx >= pc && cx < lim;
                    const char *xs = xrow + (xk ? (uint32_t)cx * (TC_CHUNK * 4) : 0u);
                    uint4 *xdst = xslot(stage, ch);
                    cp_async16<true>(xdst, xs, xk ? 16 : 0);
                    cp_async16<true>(xdst + 32, xs + 16, xk ? 16 : 0);
                }
                pc = pe;
                if (pc >= pend && ++pq < R) run_bounds(pq, pc, pend);
            }
            cp_async_commit();
            issued++;
        };
        issue();
        issue();

        float acc[2][1][4], st[R > 1 ? LOG2_R : 1][2][1][4]; /* st: run_fold's partial sums */
        zero_acc(acc);
        int used = pairs;
#pragma unroll
        for (int q = 0; q < R; q++) {
            float cur[2][1][4]; /* R > 1: this run's sums */
            if constexpr (R > 1) zero_acc(cur);
            auto dst = [&](int mt) -> float(&)[4] {
                if constexpr (R > 1)
                    return cur[mt][0];
                else
                    return acc[mt][0];
            };
            /* Chunk ch of a pair stage: the GEMV's split and mma sequence. */
            auto chunk = [&](uint4 *stage, int ch) {
                uint4 w[2][2]; /* rows rg and rg + 8 of m-tiles 0 and 1 */
                if constexpr (TMA) {
                    const uint4 *b = stage + wpiece[ch];
                    w[0][0] = b[0], w[0][1] = b[64], w[1][0] = b[TS_BOX_U4];
                    w[1][1] = b[TS_BOX_U4 + 64];
                } else {
                    const uint4 *src = stage + ch * TS_SLOTS * 32 + lane;
                    w[0][0] = src[0], w[0][1] = src[32], w[1][0] = src[64], w[1][1] = src[96];
                }
                const uint4 *xs = xslot(stage, ch);
                const uint4 xa = xs[0], xc = xs[32];
                float xv[8] = {__uint_as_float(xa.x), __uint_as_float(xa.y), __uint_as_float(xa.z),
                               __uint_as_float(xa.w), __uint_as_float(xc.x), __uint_as_float(xc.y),
                               __uint_as_float(xc.z), __uint_as_float(xc.w)};
#pragma unroll
                for (int s = 0; s < 3; s++) { /* terms: 2 or 3 */
                    if (s >= terms) break;
                    const uint4 b = split_quad(xv);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
                        mma_chunk(dst(mt), w[mt][0], w[mt][1], b.x, b.y, b.z, b.w);
                }
            };
            int first, last;
            run_bounds(q, first, last);
            for (int c = first; c < last;) { /* the producer's pairs */
                const int e = min((c & ~1) + 2, last), s = used & 1;
                cp_async_wait<1>();  /* pair `used` has landed: this lane's copies ... */
                if constexpr (TMA) { /* ... and the stage's boxes */
                    mbar_wait(bars + s, (uint32_t)used >> 1 & 1u);
                } else {
                    __syncwarp(); /* ... and the other lanes' copies */
                }
                uint4 *stage = wring + s * TS_PAIR_U4;
                if (c & 1) {
                    chunk(stage, 1);
                } else {
                    chunk(stage, 0);
                    if (c + 1 < e) chunk(stage, 1);
                }
                c = e;
                used++;
                __syncwarp(); /* every lane has read the stage: refill it */
                issue();
            }
            if constexpr (R > 1) run_fold<LOG2_R>(st, cur, q, acc);
        }
        cp_async_wait<0>(); /* only empty groups are left: the next pass starts clean */
        if constexpr (TMA) pairs = used;

        /* c0, c1 = row rg, tokens 2 tig, 2 tig + 1; c2, c3 = row rg + 8 (tc_kernel's
         * epilogue, rows permuted with TMA) */
        float v[8];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                v[4 * mt + i] = acc[mt][0][i];
        if (W > 1) { /* the tree's sums in the ring, once every warp is done with it */
            __syncthreads();
            tc_tree_reduce<8>(v, *reinterpret_cast<float(*)[TC_MAX_KS][32][8]>(ring), warp, lane,
                              kw, W);
            /* TMA: the tree wrote warp 0's ring through the generic proxy (every warp's
             * accesses before tc_tree_reduce's last barrier); the next pass's boxes write it
             * through the async proxy */
            if constexpr (TMA) fence_proxy_async();
            if (kw != 0) continue;
        }
        if (!live) continue;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t tt = t0 + 2 * tig + (i & 1);
            const int row = rg + 8 * (i >> 1);
            if (tt >= t_end) continue;
#pragma unroll
            for (int mt = 0; mt < (GLU ? 1 : 2); mt++) {
                const int64_t r = r0 + 16 * mt + row;
                if (r >= p.rows) continue;
                const float val = GLU ? silu_times(v[i], v[4 + i]) : v[4 * mt + i];
                store_y(p.y + tt * p.y_tstride + r, val, p.accumulate);
            }
        }
    }
}

/* dynamic shared memory of a block of `warps` warps */
template <bool TMA> static size_t ts_smem_bytes(int warps) {
    return TMA ? (size_t)TS_TMA_SMEM(warps) : (size_t)warps * TS_WARP_BYTES;
}

template <bool GLU, int R, bool TMA>
static cudaError_t launch_ts(const di_cuda_mm_params *p, int ks) {
    const int warps = ks > 4 ? ks : 4, per_block = warps / (ks / R); /* row tiles */
    const int64_t ro = GLU ? 16 : 32, tiles = (p->rows + ro - 1) / ro;
    dim3 grid((unsigned)((tiles + per_block - 1) / per_block), 1u, (unsigned)p->n_heads);
    di_cuda_tc_stream_launches++;
    if (R > 1) di_cuda_tc_runs_launches++;
    if (TMA) di_cuda_tc_tma_launches++;
    return di_cuda_launch(ts_kernel<GLU, R, TMA>, grid, dim3(32 * warps), ts_smem_bytes<TMA>(warps),
                          p->stream, *p, ks, p->tune.tc_terms);
}

template <bool GLU, bool TMA>
static cudaError_t launch_ts_runs(const di_cuda_mm_params *p, int ks, int r) {
    switch (r) {
    case 8:
        return launch_ts<GLU, 8, TMA>(p, ks);
    case 4:
        return launch_ts<GLU, 4, TMA>(p, ks);
    case 2:
        return launch_ts<GLU, 2, TMA>(p, ks);
    default:
        return launch_ts<GLU, 1, TMA>(p, ks);
    }
}

cudaError_t di_cuda_launch_matmul_tc_stream(const di_cuda_mm_params *p, int ks, int r) {
    const bool glu = p->glu_experts != nullptr;
    /* TMA where the tables hold the maps (both weights' in GLU mode) */
    const bool tma =
        p->tune.tc_tma && p->dtype == DI_DTYPE_BF16 && p->tmaps && (!glu || p->glu_tmaps);
    if (glu)
        return tma ? launch_ts_runs<true, true>(p, ks, r) : launch_ts_runs<true, false>(p, ks, r);
    return tma ? launch_ts_runs<false, true>(p, ks, r) : launch_ts_runs<false, false>(p, ks, r);
}

template <bool GLU, int R, bool TMA> static cudaError_t allow_ring(void) {
    return cudaFuncSetAttribute(ts_kernel<GLU, R, TMA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)ts_smem_bytes<TMA>(TC_MAX_KS));
}

template <bool TMA> static cudaError_t allow_rings(void) {
    cudaError_t err = allow_ring<true, 1, TMA>();
    if (err == cudaSuccess) err = allow_ring<true, 2, TMA>();
    if (err == cudaSuccess) err = allow_ring<true, 4, TMA>();
    if (err == cudaSuccess) err = allow_ring<true, 8, TMA>();
    if (err == cudaSuccess) err = allow_ring<false, 1, TMA>();
    if (err == cudaSuccess) err = allow_ring<false, 2, TMA>();
    if (err == cudaSuccess) err = allow_ring<false, 4, TMA>();
    if (err == cudaSuccess) err = allow_ring<false, 8, TMA>();
    return err;
}

cudaError_t di_cuda_tc_stream_setup(void) {
    cudaError_t err = allow_rings<false>();
    if (err == cudaSuccess) err = allow_rings<true>();
    return err;
}

/* ---------------------------------------------------------------------------------------- */
/* TMA tensor maps (host)                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* Off for the process once the driver could not encode a map (no encoder, or a refusal):
 * the expert tables made after have no maps, and no product looks for them. */
static bool tma_disabled = false;
static PFN_cuTensorMapEncodeTiled_v12000 tma_encoder; /* looked up at the first map */

static void di_cuda_tma_disable(void) {
    tma_disabled = true;
}

/* The boxes' coordinates are 32-bit: a column up to K + 32, a row up to the rows plus a
 * block's tiles past the end (TC_MAX_KS tiles of 32 rows) plus 16; hence the margins. */
bool di_cuda_tma_fits(const di_weight *w) {
    const int64_t stride = w->row_stride * 2; /* bytes */
    return !tma_disabled && w->dtype == DI_DTYPE_BF16 && ((uintptr_t)w->data & 15u) == 0 &&
           w->cols > 0 && w->cols % 8 == 0 && w->cols <= INT32_MAX - 1024 && w->rows > 0 &&
           w->rows <= INT32_MAX - 1024 && w->row_stride >= w->cols && stride % 16 == 0 &&
           stride < ((int64_t)1 << 40);
}

size_t di_cuda_tma_offset(int64_t n) {
    return ((size_t)n * sizeof(di_cuda_expert_ptrs) + 127) / 128 * 128;
}

/* The driver's cuTensorMapEncodeTiled through the runtime (no link against libcuda): the
 * version 12.0 interface. */
bool di_cuda_tma_encode(CUtensorMap *map, const di_weight *w) {
    if (!tma_encoder && !tma_disabled) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess && fn)
            tma_encoder = (PFN_cuTensorMapEncodeTiled_v12000)fn;
        else
            (void)cudaGetLastError();
    }
    if (!tma_encoder || !di_cuda_tma_fits(w)) {
        di_cuda_tma_disable();
        return false;
    }
    /* dim 0: the K columns (contiguous), dim 1: the rows, row_stride apart */
    const cuuint64_t dims[2] = {(cuuint64_t)w->cols, (cuuint64_t)w->rows};
    const cuuint64_t strides[1] = {(cuuint64_t)w->row_stride * 2};
    const cuuint32_t box[2] = {TS_BOX_COLS, TS_BOX_ROWS}, unit[2] = {1, 1};
    /* L2 promotion of 256 bytes: the warp's next pair is the rest of each row's 256 bytes;
     * out-of-bounds fill NONE: zeros past the rows and K */
    const CUresult r =
        tma_encoder(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(w->data), dims,
                    strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        di_cuda_tma_disable();
        return false;
    }
    return true;
}
