/*
 * cuda_tc_stream.cu -- a decode batch's grouped BF16 expert products (up to 8 rows per
 * expert) with each warp's weights and activations streamed through a ring in shared memory
 * (cp.async), the sums bitwise tc_kernel's (cuda_tc_gemv.cu). The default for them
 * (DI_CUDA_TC_STREAM=0: tc_kernel). H200, 4-layer V2-Lite model, 64 sequences: the routed gate
 * / up 2.9 -> 3.1 TB/s, the down 2.6 -> 2.8 (Nsight Compute), the step 2.28 -> 2.14 ms of
 * device time (2.01 with a runs target of 512, now the default); batch 1 unchanged (NOTES.md,
 * sixteenth round). Pairs of chunks read as whole lines (below): 64 sequences 2.04 -> 1.83 ms,
 * 8 sequences 1.10 -> 1.03, batch 1 0.58 -> 0.55 (seventeenth round). An expert with more
 * than 8 rows in passes of 16 rows (pass16, below) instead of 8: 27 layers at 64 concurrent,
 * decode steps 10.96 -> 10.62 ms; a MoE layer's down projection (routing settled) requesting
 * its first weights before its PDL wait: batch-1 decode steps 2.74 -> 2.66 ms (twenty-fourth
 * round). Also the plain one-token-group products of 256 MiB of weights or more (the lm_head:
 * 127.6 -> 110.8 us alone at batch 1); every plain product here made a batch-1 step 1 %
 * slower, although each was faster alone (twenty-fifth round).
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
 * With p.x_rows the routed tokens' activations are read in place (row g of the product is
 * token x_rows[g]'s row of x), so a MoE layer's gate / up needs no gather launch before it:
 * the same floats reach the same slots.
 */
#include "backend/cuda/cuda_tc.cuh"

#define TS_STAGES 4 /* chunks a warp's ring holds: two pairs, one in flight, one in use */
/* 16-byte slots per chunk and lane: the weights of rows g and g + 8 of two m-tiles (GLU: the
 * gate's and the up projection's same rows), then the lane's token's 8 activations (fp32) */
#define TS_SLOTS      6
#define TS_PAIR_U4    (2 * TS_SLOTS * 32)                              /* a pair's slots */
#define TS_WARP_BYTES (TS_STAGES * TS_SLOTS * 32 * (int)sizeof(uint4)) /* 12 KiB */
/* A pass of 16 rows (pass16 in ts_kernel): single-chunk stages of 8 slots -- the lane's 4 weight
 * pieces, then its two tokens' activations -- three of them in the same 12 KiB. */
#define TS16_SLOTS  8
#define TS16_STAGES 3
#define TS16_U4     (TS16_SLOTS * 32) /* a stage's slots */
static_assert(TS16_STAGES * TS16_U4 * (int)sizeof(uint4) <= TS_WARP_BYTES,
              "a 16-token pass's stages fit the warp's ring");

int64_t di_cuda_tc_stream_launches;       /* cuda_backend.h: launches of this kernel (for tests) */
int64_t di_cuda_tc_early_launches;        /* ... of them with weights requested before the wait */
int64_t di_cuda_tc_stream_plain_launches; /* ... of plain products (tc_stream_plain_bytes) */
/* Passes of 16 rows made (for tests: one atomic per such pass of a block) */
static __device__ unsigned long long ts16_passes;

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

/* Block: max(4, ks) warps, W = ks / R per row tile (warp = tile x W + kw), a tile being two
 * m-tiles of 16 rows (GLU: 16 gate and 16 up rows); blockIdx.z: the active-expert slot, whose
 * rows the block walks 8 at a time (one token group per pass), or 16 while more than 8 are
 * left (pass16: two groups). Each warp owns TS_WARP_BYTES of the ring. */
template <bool GLU, int R>
__global__ void __launch_bounds__(32 * TC_MAX_KS, 2)
    ts_kernel(const di_cuda_mm_params p, int ks, int terms) {
    extern __shared__ uint4 ring[];
    constexpr int LOG2_R = tc_log2_runs<R>;
    constexpr int RO = GLU ? 16 : 32; /* output rows per tile */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int W = ks / R, kw = warp % W;
    const int64_t r0 = ((int64_t)blockIdx.x * ((int)(blockDim.x >> 5) / W) + warp / W) * RO;
    const bool live = r0 < p.rows; /* a tile past the end still takes part in the tree */
    const void *wdata = p.data, *udata = p.glu_data;
    int64_t t0 = 0, t_end = p.n_tokens;
    /* With the routing settled (a MoE layer's down projection, after its gate / up), the first
     * pass requests its first weights before the PDL wait, during the previous kernel's tail;
     * its activations (that kernel's output) after it. A plain product (no experts: one token
     * group: the lm_head, or any with DI_CUDA_TC_STREAM_PLAIN=1) has its weight and rows from the
     * start: early too (DI_CUDA_TC_EARLY=0 turns both off). */
    const bool plain = p.experts == nullptr;
    const bool early = (plain || p.routing_settled) && p.tune.tc_early;
    if (!plain &&
        !tc_expert<GLU, true>(p, (int)blockIdx.z, wdata, udata, t0, t_end, nullptr, nullptr, early))
        return;
    bool waiting = early; /* the PDL wait is still ahead (block-uniform) */
    /* Row g of the product's activations: token x_rows[g]'s row where given (the routing's). */
    auto x_row = [&](int64_t gr) -> int64_t {
        return p.x_rows ? (int64_t)tc_routing_ld(p.x_rows + gr, early) : gr;
    };
    /* A pass's first two stages (issue(w, x): the next stage's weights and / or activations;
     * restart: back to the pass's first stage). In the first pass of a block with the routing
     * settled only their weights go before the PDL wait, then their activations as two more
     * groups: the loop's first wait (all but the newest group) covers both weight groups and
     * the first stage's activations, its second wait the second stage's. */
    auto start = [&](auto &&issue, auto &&restart) {
        if (waiting) {
            issue(true, false);
            issue(true, false);
            pdl_wait();
            pdl_trigger();
            waiting = false;
            restart();
            issue(false, true);
            issue(false, true);
        } else {
            issue(true, true);
            issue(true, true);
        }
    };
    const int64_t K = p.cols, C = (K + TC_CHUNK - 1) / TC_CHUNK;
    /* Step q's chunks [first, last) (tc_run_index), in 32 bits and computed where they are
     * needed: the producer's step is not a compile-time constant, and an array indexed by it
     * would live in local memory. tc_ks leaves every run at least one chunk. */
    const int c32 = (int)C;
    auto run_bounds = [&](int q, int &first, int &last) {
        const int kr = tc_run_index<R>(q, kw, W);
        first = c32 * kr / ks, last = c32 * (kr + 1) / ks;
    };
    /* The producer's rows: lane l copies row rho = 4 k + l / 8 of the tile, k = 0 .. 7 (m-tile
     * rho / 16 -- GLU: the gate's 16 rows, then the up projection's same rows -- row rho % 16
     * of it), 16 bytes at column 8 (l % 4) of the pair's chunk (l / 4) % 2. So each of its
     * cp.async covers 4 rows x 128 bytes, whole 128-byte lines: with the GEMV's 8 rows x 64
     * bytes per instruction the H200 streamed the experts at 3.2 TB/s, a read of whole lines
     * 4.6 (NOTES.md, seventeenth round). The pieces land where their consumer lane (row g =
     * rho % 8, column group l % 4) reads them, so lanes read each other's copies: a warp
     * barrier after the wait, and before a stage is refilled. Rows past the end are
     * zero-filled (their sums are never stored). */
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

    /* A token group's sums v added over the tile's W warps by the GEMV's tree, through the
     * ring (every warp calls it, once all are done with the ring: it holds barriers). */
    auto ring_tree = [&](float(&v)[8]) {
        tc_tree_reduce<8>(v, *reinterpret_cast<float(*)[TC_MAX_KS][32][8]>(ring), warp, lane, kw,
                          W);
    };
    /* Stores a token group's sums (v: tc_kernel's epilogue layout -- c0, c1 = row g, tokens
     * 2 tig, 2 tig + 1; c2, c3 = row g + 8 -- for m-tiles 0 and 1) from token tb on. */
    auto store8 = [&](const float(&v)[8], int64_t tb) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t tt = tb + 2 * tig + (i & 1);
            const int row = g + 8 * (i >> 1);
            if (tt >= t_end) continue;
#pragma unroll
            for (int mt = 0; mt < (GLU ? 1 : 2); mt++) {
                const int64_t r = r0 + 16 * mt + row;
                if (r >= p.rows) continue;
                const float val = GLU ? silu_times(v[i], v[4 + i]) : v[4 * mt + i];
                store_y(p.y + tt * p.y_tstride + r, val, p.accumulate);
            }
        }
    };

    /* A pass over 16 of the expert's rows at once (t0 + g and t0 + 8 + g: token groups 0 and
     * 1), for an expert with more than 8 rows left: each weight piece read from the ring
     * serves both groups, where two passes streamed the tile twice (a 64-sequence decode step
     * of V2-Lite gives about one expert in seven 9-16 rows). Per token the same chunks, split,
     * mma sequence and tree as a pass of 8, so the same sums. The ring holds TS16_STAGES
     * single chunks here: a lane copies exactly the pieces it multiplies (rows g, g + 8 of
     * both m-tiles at column 8 tig, its two tokens' activations), 8 rows x 64 bytes per
     * cp.async of the warp -- not the whole lines of the pairs, whose two stages would not
     * fit the activations of 16 tokens. R <= 2 only: with more runs, run_fold's partial sums
     * for two groups would not fit the registers (two passes of 8 there). */
    auto pass16 = [&]() {
        if (threadIdx.x == 0) atomicAdd(&ts16_passes, 1ull);
        const char *xrow2[2];
        bool tok2[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int64_t t = t0 + 8 * j + g;
            tok2[j] = t < t_end;
            xrow2[j] = reinterpret_cast<const char *>(p.x + x_row(tok2[j] ? t : t0) * p.x_tstride +
                                                      8 * tig);
        }
        uint32_t loff[4], lok = 0; /* rows g, g + 8 of m-tile 0, then of m-tile 1 */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int64_t r = r0 + (GLU ? 0 : 16 * (k >> 1)) + g + 8 * (k & 1);
            lok |= (uint32_t)(r < p.rows) << k;
            loff[k] = (uint32_t)((min(r, p.rows - 1) * p.row_stride + 8 * tig) * 2);
        }
        int pq = 0, issued = 0, pc, pend;
        run_bounds(0, pc, pend);
        /* The next chunk into the next stage (its weights w, its activations x, or both), or
         * an empty group once all are requested. */
        auto issue1 = [&](bool w, bool x) {
            if (pq < R) {
                uint4 *stage = wring + (issued % TS16_STAGES) * TS16_U4 + lane;
                const bool ck = pc < cmax;
                const uint32_t woff = ck ? (uint32_t)pc * (TC_CHUNK * 2) : 0u, wm = ck ? lok : 0u;
                if (w)
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        cp_async16<false>(stage + 32 * k, wbase[k >> 1] + (loff[k] + woff),
                                          (int)((wm >> k & 1u) << 4));
                if (x)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const bool xk = ck && tok2[j];
                        const char *xs = xrow2[j] + (xk ? (uint32_t)pc * (TC_CHUNK * 4) : 0u);
                        cp_async16<true>(stage + 32 * (4 + 2 * j), xs, xk ? 16 : 0);
                        cp_async16<true>(stage + 32 * (5 + 2 * j), xs + 16, xk ? 16 : 0);
                    }
                if (++pc >= pend && ++pq < R) run_bounds(pq, pc, pend);
            }
            cp_async_commit();
            issued++;
        };
        start(issue1, [&]() { pq = 0, issued = 0, run_bounds(0, pc, pend); });

        float acc[2][2][4], st[R > 1 ? LOG2_R : 1][2][2][4]; /* [m-tile][token group][4] */
        zero_acc(acc);
        int used = 0;
#pragma unroll
        for (int q = 0; q < R; q++) {
            float cur[2][2][4];
            if constexpr (R > 1) zero_acc(cur);
            float(&dst)[2][2][4] = R > 1 ? cur : acc;
            int first, last;
            run_bounds(q, first, last);
            for (int c = first; c < last; c++) {
                cp_async_wait<TS16_STAGES - 2>(); /* chunk c has landed (the lane's own copies) */
                /* The chunk after next into the stage read last time (its values are in the
                 * sums already; a lane reads only the pieces it copied, so no warp barrier):
                 * two chunks in flight during this one's products. */
                issue1(true, true);
                const uint4 *src = wring + (used % TS16_STAGES) * TS16_U4 + lane;
                const uint4 w[2][2] = {{src[0], src[32]}, {src[64], src[96]}};
                float xv[2][8];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const uint4 xa = src[32 * (4 + 2 * j)], xc = src[32 * (5 + 2 * j)];
                    xv[j][0] = __uint_as_float(xa.x), xv[j][1] = __uint_as_float(xa.y);
                    xv[j][2] = __uint_as_float(xa.z), xv[j][3] = __uint_as_float(xa.w);
                    xv[j][4] = __uint_as_float(xc.x), xv[j][5] = __uint_as_float(xc.y);
                    xv[j][6] = __uint_as_float(xc.z), xv[j][7] = __uint_as_float(xc.w);
                }
#pragma unroll
                for (int s = 0; s < 3; s++) { /* terms: 2 or 3 */
                    if (s >= terms) break;
                    uint4 b[2];
#pragma unroll
                    for (int j = 0; j < 2; j++)
                        b[j] = split_quad(xv[j]);
#pragma unroll
                    for (int j = 0; j < 2; j++)
#pragma unroll
                        for (int mt = 0; mt < 2; mt++)
                            mma_chunk(dst[mt][j], w[mt][0], w[mt][1], b[j].x, b[j].y, b[j].z,
                                      b[j].w);
                }
                used++;
            }
            if constexpr (R > 1) run_fold<LOG2_R>(st, cur, q, acc);
        }
        cp_async_wait<0>(); /* only empty groups are left: the next pass starts clean */
        __syncwarp();       /* and a pass of 8 after this one writes slots other lanes read here */

        float v[2][8];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    v[j][4 * mt + i] = acc[mt][j][i];
        if (W > 1) { /* the tree over the tile's warps for each group */
            __syncthreads();
#pragma unroll
            for (int j = 0; j < 2; j++)
                ring_tree(v[j]);
            if (kw != 0) return;
        }
        if (!live) return;
        store8(v[0], t0);
        store8(v[1], t0 + 8);
    };

    for (int span = 8; t0 < t_end; t0 += span) { /* block-uniform */
        span = 8;
        if constexpr (R <= 2)
            if (t_end - t0 > 8 && p.tune.tc_stream16) {
                span = 16;
                pass16();
                continue;
            }
        const int64_t t = t0 + g; /* this lane's row (the mma's B column g) */
        const bool tok = t < t_end;
        const char *xrow =
            reinterpret_cast<const char *>(p.x + x_row(tok ? t : t0) * p.x_tstride + 8 * tig);
        /* The producer: the next pair of the warp's run pq -- chunks pc .. pe, pe the next
         * even chunk or the run's end, so that a pair's 128 bytes of a row are one line (a
         * run starting at an odd chunk starts with that chunk alone) -- into the next pair
         * stage, chunk c in its slots c % 2 (its weights w, its activations x, or both); an
         * empty group once every chunk is requested, so that the waits count alike. */
        int pq = 0, issued = 0, pc, pend;
        run_bounds(0, pc, pend);
        auto issue = [&](bool w, bool x) {
            if (pq < R) {
                uint4 *stage = wring + (issued % 2) * TS_PAIR_U4;
                const int pa = pc & ~1, pe = min(pa + 2, pend), lim = min(pe, cmax);
                const int cw = pa + ch_p; /* this lane's weight chunk */
                const bool wk = cw >= pc && cw < lim;
                const uint32_t woff = wk ? (uint32_t)cw * (TC_CHUNK * 2) : 0u, wm = wk ? pok : 0u;
                uint4 *wdst = stage + ch_p * TS_SLOTS * 32 + pslot0;
                if (w)
#pragma unroll
                    for (int k = 0; k < 8; k++)
                        cp_async16<false>(wdst + pslot(k), wbase[k >> 2] + (poff[k] + woff),
                                          (int)((wm >> k & 1u) << 4));
                if (x)
#pragma unroll
                    for (int ch = 0; ch < 2; ch++) { /* the lane's own activations */
                        const int cx = pa + ch;
                        const bool xk = tok && cx >= pc && cx < lim;
                        const char *xs = xrow + (xk ? (uint32_t)cx * (TC_CHUNK * 4) : 0u);
                        uint4 *xdst = stage + ch * TS_SLOTS * 32 + lane;
                        cp_async16<true>(xdst + 4 * 32, xs, xk ? 16 : 0);
                        cp_async16<true>(xdst + 5 * 32, xs + 16, xk ? 16 : 0);
                    }
                pc = pe;
                if (pc >= pend && ++pq < R) run_bounds(pq, pc, pend);
            }
            cp_async_commit();
            issued++;
        };
        start(issue, [&]() { pq = 0, issued = 0, run_bounds(0, pc, pend); });

        float acc[2][1][4], st[R > 1 ? LOG2_R : 1][2][1][4]; /* st: run_fold's partial sums */
        zero_acc(acc);
        int used = 0;
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
            /* One chunk from its slots: the GEMV's split and mma sequence. */
            auto chunk = [&](const uint4 *src) {
                const uint4 w[2][2] = {{src[0], src[32]}, {src[64], src[96]}};
                const uint4 xa = src[128], xc = src[160];
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
                const int e = min((c & ~1) + 2, last);
                cp_async_wait<1>(); /* pair `used` has landed: this lane's copies ... */
                __syncwarp();       /* ... and the other lanes' */
                const uint4 *src = wring + (used % 2) * TS_PAIR_U4 + lane;
                if (c & 1) {
                    chunk(src + TS_SLOTS * 32);
                } else {
                    chunk(src);
                    if (c + 1 < e) chunk(src + TS_SLOTS * 32);
                }
                c = e;
                used++;
                __syncwarp(); /* every lane has read the stage: refill it */
                issue(true, true);
            }
            if constexpr (R > 1) run_fold<LOG2_R>(st, cur, q, acc);
        }
        cp_async_wait<0>(); /* only empty groups are left: the next pass starts clean */

        float v[8]; /* store8's layout */
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                v[4 * mt + i] = acc[mt][0][i];
        if (W > 1) { /* the tree's sums in the ring, once every warp is done with it */
            __syncthreads();
            ring_tree(v);
            if (kw != 0) continue;
        }
        if (!live) continue;
        store8(v, t0);
    }
}

template <bool GLU, int R> static cudaError_t launch_ts(const di_cuda_mm_params *p, int ks) {
    const int warps = ks > 4 ? ks : 4, per_block = warps / (ks / R); /* row tiles */
    const int64_t ro = GLU ? 16 : 32, tiles = (p->rows + ro - 1) / ro;
    dim3 grid((unsigned)((tiles + per_block - 1) / per_block), 1u, (unsigned)p->n_heads);
    if (p->experts) { /* the counters of grouped products; plain ones have their own */
        di_cuda_tc_stream_launches++;
        if (p->routing_settled && p->tune.tc_early) di_cuda_tc_early_launches++;
        if (R > 1) di_cuda_tc_runs_launches++;
    } else {
        di_cuda_tc_stream_plain_launches++;
    }
    return di_cuda_launch(ts_kernel<GLU, R>, grid, dim3(32 * warps), (size_t)warps * TS_WARP_BYTES,
                          p->stream, *p, ks, p->tune.tc_terms);
}

cudaError_t di_cuda_launch_matmul_tc_stream(const di_cuda_mm_params *p, int ks, int r) {
    const bool glu = p->glu_experts != nullptr || p->glu_data != nullptr; /* grouped or plain */
    switch (r) {
    case 8:
        return glu ? launch_ts<true, 8>(p, ks) : launch_ts<false, 8>(p, ks);
    case 4:
        return glu ? launch_ts<true, 4>(p, ks) : launch_ts<false, 4>(p, ks);
    case 2:
        return glu ? launch_ts<true, 2>(p, ks) : launch_ts<false, 2>(p, ks);
    default:
        return glu ? launch_ts<true, 1>(p, ks) : launch_ts<false, 1>(p, ks);
    }
}

template <bool GLU, int R> static cudaError_t allow_ring(void) {
    return cudaFuncSetAttribute(ts_kernel<GLU, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                TC_MAX_KS * TS_WARP_BYTES);
}

cudaError_t di_cuda_tc_stream_setup(void) {
    cudaError_t err = allow_ring<true, 1>();
    if (err == cudaSuccess) err = allow_ring<true, 2>();
    if (err == cudaSuccess) err = allow_ring<true, 4>();
    if (err == cudaSuccess) err = allow_ring<true, 8>();
    if (err == cudaSuccess) err = allow_ring<false, 1>();
    if (err == cudaSuccess) err = allow_ring<false, 2>();
    if (err == cudaSuccess) err = allow_ring<false, 4>();
    if (err == cudaSuccess) err = allow_ring<false, 8>();
    return err;
}

int64_t di_cuda_tc_stream16_passes(void) {
    unsigned long long n = 0;
    if (cudaMemcpyFromSymbol(&n, ts16_passes, sizeof n) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return (int64_t)n;
}
