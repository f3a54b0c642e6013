/*
 * cuda_tc_lean.cu -- the tensor-core GEMV for one token group (up to 8 tokens per weight, or
 * per expert) with the roles of the mma's operands swapped: the tokens are A (16 rows, the
 * upper 8 zero) and the weight is B (8 rows of W per mma). Opt-in (DI_CUDA_TC_LEAN=1): it
 * gives tc_kernel's bits (cuda_tc_gemv.cu; the op tests check it, and pass on the H200), with
 * 4-22 % fewer instructions per product, but it was no faster at one token and 1 % faster at
 * 64 sequences there (NOTES.md, eleventh round): an mma carries 8 rows of W, not 16.
 *
 * Why: at a few tokens the products are bound by their warps' instruction chains, not by
 * DRAM (NOTES.md, tenth round: o_proj at one token ran 2,300 instructions per warp at 7.5
 * cycles each, 20 % of the bandwidth). Two things in tc_kernel's layout cost instructions and
 * warps: with W as A, an mma's A registers interleave rows g and g + 8 ({w.x, v.x, w.y, v.y}),
 * so every mma needs four register moves after the 16-byte loads (SASS: 24 moves per chunk);
 * and an m-tile is 16 rows, so a warp owns 16 rows of its K run. With W as B, a lane's B
 * registers for one k-step are two consecutive words of one row ({w.x, w.y}, then
 * {w.z, w.w}): the loaded registers are used as they are. A warp keeps tc_kernel's rows (16
 * output rows; grouped non-GLU 32) as n-tiles of 8, one split of x serving all of them, and
 * the same K runs (tc_ks, from the weight's shape), so the same order of every sum. (Taken to
 * 8 rows per warp, twice the warps, the split's cost per weight byte doubled: SASS.)
 *
 * The sums: output (token t, row r) accumulates its K run's chunks in order, each chunk part
 * by part (hi, mid, lo), each part in two k-steps (columns 8 tig + 0..3 of every lane, then
 * 8 tig + 4..7: the k-slot permutation of cuda_tc.cuh), as in tc_kernel; the ks runs meet
 * in shared memory by the same tree. What changes is which operand of the mma a value sits
 * in; an mma's output element is C + the sum of the same 16 products either way, which the
 * op tests compare bitwise with tc_kernel (GEMV alone and the wide kernel in a batch).
 *
 * Also shorter: row pointers once per load group (32-bit row arithmetic), the run's end
 * checked once per chunk (a uniform branch), two register buffers alternating (the loop
 * unrolled by two), the parts a template argument.
 */
#include "backend/cuda/cuda_tc.cuh"

#define TCL_THREADS (32 * TC_MAX_KS)

int64_t di_cuda_lean_launches; /* cuda_backend.h: launches of this kernel (for tests) */

/* d += A B for one m16n8k16 step with the tokens' parts as A (rows 8..15 zero: a1 = a3 = 0)
 * and a weight row's two words as B. */
static __device__ __forceinline__ void mma_xa(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                              uint32_t b1) {
    mma_bf16(d, a0, 0u, a2, 0u, b0, b1);
}

/* One chunk: the TERMS parts of token x[t] at columns k .. k + 7 (16-byte aligned; zeros
 * unless ok), each part's two k-steps into every n-tile j (NT of them, row g of each in
 * w[j]). */
template <int NT, int TERMS>
static __device__ __forceinline__ void chunk_mma(float (&acc)[NT][4], const uint4 (&w)[NT],
                                                 const float *xp, bool ok) {
    const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 q0 = ok ? __ldg(reinterpret_cast<const float4 *>(xp)) : z;
    const float4 q1 = ok ? __ldg(reinterpret_cast<const float4 *>(xp) + 1) : z;
    float xv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
    for (int s = 0; s < TERMS; s++) {
        const uint4 q = split_quad(xv); /* pairs of columns 8 tig + 0..1, 2..3, 4..5, 6..7 */
#pragma unroll
        for (int j = 0; j < NT; j++) {
            mma_xa(acc[j], q.x, q.y, w[j].x, w[j].y); /* columns 8 tig + 0..3 */
            mma_xa(acc[j], q.z, q.w, w[j].z, w[j].w); /* columns 8 tig + 4..7 */
        }
    }
}

/* Block: max(4, ks) warps, ks per row tile (warp = tile * ks + kw). A warp's tile is NT
 * n-tiles of 8 rows (GLU: the first NT / 2 the gate's rows, the others the up projection's
 * same rows), so one split of the activations serves NT n-tiles; it takes RT tiles one after
 * the other. Grid y: token chunks of 8 (grouped: one, the block walks its expert's chunks);
 * grid z: the active-expert slot (grouped). */
template <int NT, int U, bool G, bool GLU, int RT, int TERMS>
__global__ void __launch_bounds__(TCL_THREADS, 2) tcl_kernel(const di_cuda_mm_params p, int ks) {
    static_assert(!GLU || NT % 2 == 0, "GLU pairs gate tiles with up tiles");
    static_assert(RT == 1 || RT == 2, "a group's tile selects acc[0] or acc[RT - 1]");
    constexpr int NO = GLU ? NT / 2 : NT; /* output n-tiles */
    constexpr int RO = 8 * NO;            /* output rows per tile */
    __shared__ float red[TC_MAX_KS][32][2 * NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int kw = warp % ks, tiles_per_block = (int)(blockDim.x >> 5) / ks;
    const void *wdata = p.data, *udata = p.glu_data;
    int t0 = (int)blockIdx.y * 8, t_end = (int)p.n_tokens;
    if constexpr (G) /* the routing (active list, offsets) comes from earlier kernels */
        if (!tc_expert<GLU, true>(p, (int)blockIdx.z, wdata, udata, t0, t_end))
            return; /* block-uniform */
    const int C = (int)((p.cols + TC_CHUNK - 1) / TC_CHUNK);
    const int c_begin = C * kw / ks, nc = C * (kw + 1) / ks - c_begin; /* this warp's run */
    /* The lane's columns of the last chunk exist (K % 8 == 0: whole vectors or none). */
    const bool last_ok = (int64_t)(C - 1) * TC_CHUNK + 8 * tig < p.cols;

    /* Row tile rt's first row (32-bit: rows < 2^31), and whether it exists. */
    const int rbase = ((int)blockIdx.x * RT * tiles_per_block + warp / ks) * RO;
    const int rstep = tiles_per_block * RO, rows = (int)p.rows;
    int live = 0; /* live tiles: a prefix of 0 .. RT - 1 */
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
        live += rbase + rt * rstep < rows;
    /* Groups of U chunks: per live tile ceil(nc / U); group q is tile q / gpt, chunks
     * (q % gpt) U .. + U - 1 of the run. */
    const int gpt = (nc + U - 1) / U, n_groups = live * gpt;
    const int64_t row_bytes = p.row_stride * 2;

    /* Group q's weights: row g of each n-tile (rows past the end alias the last row, never
     * stored), 16 bytes per chunk; zeros past the run, the row's end or the live tiles. */
    auto load = [&](uint4(&w)[U][NT], int q) {
        const int rt = RT == 1 ? 0 : q / gpt, i0 = (q - rt * gpt) * U;
        const int r0 = rbase + rt * rstep;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int r = min(r0 + 8 * (j % NO) + g, rows - 1);
            const char *base = static_cast<const char *>(GLU && j >= NO ? udata : wdata);
            const uint4 *a = reinterpret_cast<const uint4 *>(base + r * row_bytes) +
                             (int64_t)(c_begin + i0) * (TC_CHUNK / 8) + tig;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i = i0 + u;
                const bool ok = q < n_groups && i < nc && (c_begin + i < C - 1 || last_ok);
                w[u][j] = ok ? __ldcs(a + u * (TC_CHUNK / 8)) : make_uint4(0, 0, 0, 0);
            }
        }
    };

    for (; t0 < t_end; t0 += 8) {
        const int t = t0 + g; /* this lane's token (A row g) */
        const bool tok = t < t_end;
        const float *xrow = p.x + (int64_t)t * p.x_tstride + (int64_t)c_begin * TC_CHUNK + 8 * tig;
        float acc[RT][NT][4];
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[rt][j][i] = 0.0f;

        /* Group q's chunks into its tile's sums, in run order (the run's end: uniform). */
        auto compute = [&](const uint4(&w)[U][NT], int q) {
            const int rt = RT == 1 ? 0 : q / gpt, i0 = (q - rt * gpt) * U;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i = i0 + u;
                if (i >= nc) break;
                const bool ok = tok && (c_begin + i < C - 1 || last_ok);
                const float *xp = xrow + (int64_t)i * TC_CHUNK;
                if (RT == 1 || rt == 0)
                    chunk_mma<NT, TERMS>(acc[0], w[u], xp, ok);
                else
                    chunk_mma<NT, TERMS>(acc[RT - 1], w[u], xp, ok);
            }
        };

        uint4 wa[U][NT], wb[U][NT];
        load(wa, 0);
        if constexpr (!G) { /* the first weights are on their way; now wait for x (PDL) */
            pdl_wait();
            pdl_trigger();
        }
        for (int q = 0; q < n_groups; q += 2) { /* two buffers, nothing moved between them */
            load(wb, q + 1);
            compute(wa, q);
            if (q + 1 >= n_groups) break;
            load(wa, q + 2);
            compute(wb, q + 1);
        }

        /* Result (rt, j): c0, c1 = token g, rows 2 tig, 2 tig + 1 of n-tile j (c2, c3: the
         * zero tokens 8..15). The ks runs' partial sums meet in shared memory: warp kw adds
         * warp kw + s for s = ks / 2, ..., 1 (tc_kernel's tree), and warp kw = 0 stores. */
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            float v[2 * NT]; /* n-tile j's c0, c1 at 2 j */
#pragma unroll
            for (int j = 0; j < NT; j++)
                v[2 * j] = acc[rt][j][0], v[2 * j + 1] = acc[rt][j][1];
            if (ks > 1) {
                tc_tree_reduce<2 * NT>(v, red, warp, lane, kw, ks);
                if (kw != 0) continue;
            }
            const int r0 = rbase + rt * rstep;
            if (r0 >= rows || !tok) continue;
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < NO; j++) {
                    const int r = r0 + 8 * j + 2 * tig + i;
                    if (r >= rows) continue;
                    const float val =
                        GLU ? silu_times(v[2 * j + i], v[2 * (j + NO) + i]) : v[2 * j + i];
                    store_y(p.y + (int64_t)t * p.y_tstride + r, val, p.accumulate);
                }
        }
        if constexpr (!G) break; /* one token chunk per block (blockIdx.y) */
    }
}

/* One launch of tcl_kernel<NT, U, G, GLU, RT, TERMS>. */
template <int NT, int U, bool G, bool GLU, int RT, int TERMS>
static cudaError_t launch_tcl(const di_cuda_mm_params *p, int ks) {
    void (*k)(const di_cuda_mm_params, int) = tcl_kernel<NT, U, G, GLU, RT, TERMS>;
    const int64_t ro = GLU ? 4 * NT : 8 * NT, tiles = (p->rows + ro - 1) / ro; /* RO */
    const int warps = ks > 4 ? ks : 4, per_block = warps / ks * RT;            /* row tiles */
    dim3 grid((unsigned)((tiles + per_block - 1) / per_block),
              p->experts ? 1u : (unsigned)((p->n_tokens + 7) / 8),
              p->experts ? (unsigned)p->n_heads : 1u);
    di_cuda_lean_launches++;
    return di_cuda_launch(k, grid, dim3(32 * warps), 0, p->stream, *p, ks);
}

/* 16 output rows per warp, as tc_kernel's one-token-group variants (plain: two n-tiles, 4
 * chunks per load group; GLU: the gate's and the up projection's two each, 2 chunks); grouped
 * experts 32 rows (non-GLU) or 16 (GLU), 2 chunks, one row tile per warp (two, as tc_rt gives
 * tc_kernel, spilled 60-100 bytes here: the 32 accumulators of each tile). */
template <int TERMS> static cudaError_t launch_lean(const di_cuda_mm_params *p, int ks) {
    const bool glu = p->glu_data || p->glu_experts;
    if (p->experts)
        return glu ? launch_tcl<4, 2, true, true, 1, TERMS>(p, ks)
                   : launch_tcl<4, 2, true, false, 1, TERMS>(p, ks);
    return glu ? launch_tcl<4, 2, false, true, 1, TERMS>(p, ks)
               : launch_tcl<2, 4, false, false, 1, TERMS>(p, ks);
}

/* The one-token-group products of di_cuda_launch_matmul_tc (up to 8 tokens per weight), for
 * activations in 16-byte aligned rows; the K runs ks from tc_ks. */
cudaError_t di_cuda_launch_matmul_tc_lean(const di_cuda_mm_params *p, int ks) {
    return p->tune.tc_terms == 2 ? launch_lean<2>(p, ks) : launch_lean<3>(p, ks);
}
