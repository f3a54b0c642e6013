/*
 * cuda_tc_gemv.cu -- y = W x on the tensor cores for BF16 weights, batch-invariant, near the
 * fp32 GEMV's accuracy: the default for BF16 weights of suitable shape and at least
 * DI_CUDA_TC_MIN_ROWS (512) rows (DI_CUDA_TC=0: the SIMT GEMV of cuda_matmul.cu everywhere;
 * smaller weights -- a router -- were faster there at every batch size).
 *
 * Why: the SIMT GEMV is exact but at 8..64 tokens per weight it is bound by fp32 FMA issue;
 * tensor cores do that work at a small fraction of the cost. The usual tensor-core GEMM is
 * not batch-invariant (its tiling and K split change with n); this one is, by construction:
 *
 *   - The weight is the mma's A operand (m16n8k16, 16 rows x 16 k), the tokens its B operand
 *     (8 columns per token group; a missing token is a zero column). Column j of the mma's
 *     result depends only on column j of B, so a token's sums do not depend on the others.
 *   - The K order is a function of the weight's shape only: K is cut into 32-element chunks
 *     (two mma), a row tile's chunks are dealt to ks K runs in contiguous runs (ks from rows
 *     and K, tc_ks), each run walked in order by one warp (or R runs by one warp, in a decode
 *     batch's grouped products: tc_runs), and the ks partial sums are added by a fixed tree
 *     (in registers for a warp's own runs, then in shared memory). n only decides how many
 *     token groups run side by side.
 *   - fp32 activations are split into `terms` bf16 parts (x = hi + mid + lo: exact for normal
 *     floats with 3 terms, 16 significant bits with 2: the default, DI_CUDA_TC_TERMS=3 for
 *     all 24), one mma per part, in that order. Products of bf16 values are exact; with 3
 *     terms the mma's fp32 accumulation is the only rounding that differs from the SIMT
 *     GEMV's fmaf chain, with 2 the activations' rounding to 16 bits too (a relative 2^-17 at
 *     most, where bf16 activations would carry 2^-9), so results agree with the CPU within
 *     the op tests' 1e-5 normalised error (and the model goldens' tolerances), not bitwise.
 *
 * The A fragment is loaded straight from global memory, 16 bytes (8 consecutive k) per lane
 * and row: the mma's k slots are a permutation of the chunk's 32 columns, the same one for A
 * and B (lane tig holds columns 8 tig .. 8 tig + 7 of rows g and g + 8; the first mma takes
 * columns 8 tig + 0..3, the second 8 tig + 4..7), which changes no sum. Activations are read
 * as fp32 (L1 / L2 resident: every row tile reads the same x) and split in registers; in the
 * one-token-group variants the block splits them once into shared memory (stage_xsplit).
 *
 * Modes as the SIMT GEMV's (di_cuda_mm_params): plain (one head), per head (head_matmul not
 * transposed: blockIdx.z a head, whose weight, x and y the block moves to), grouped
 * (matmul_experts: blockIdx.z an active-expert slot), GLU (a warp's two 16-row tiles are the
 * gate's and the up projection's same rows; silu(g) * u in the epilogue) and accumulate
 * (y += W x). Each is bitwise the plain product followed by the separate op, since the
 * products are the same. With batch invariance off (di_backend_cuda_set_batch_invariant) the
 * backend sends products of up to 8 tokens to the SIMT GEMV instead, which streams one
 * token's weights faster.
 *
 * FP8 (F8, DI_CUDA_TC_FP8=1): block-scaled e4m3 weights whose scale blocks hold whole
 * chunks. A lane loads its 8 bytes of rows g and g + 8, converts them exactly to bf16 (every
 * e4m3 value is a bf16), and each chunk's mma sums for a row are added to the row's total
 * times the row's scale of the chunk's column block (fmaf) -- the block scale applied to
 * partial sums, as DeepGEMM applies it, rather than to each weight as the SIMT GEMV does
 * (float(e4m3 * scale) per element): the same product up to the rounding of those sums.
 * The same K order at every n (the GEMV's variants; the wide kernel is BF16's only). Opt-in:
 * on the H200 the V4-Flash slice's prefill went 4.3k -> 5.2k tok/s but its decode 1005 -> 961
 * (the small products, wq_a's 64 tiles, launch too few warps; NOTES.md, twelfth round).
 */
#include "backend/cuda/cuda_tc.cuh"

#define TC_THREADS (32 * TC_MAX_KS)
/* Largest shared-memory copy of a token chunk's split activations (below): 8 tokens of
 * K = 2048 in 3 parts, two blocks per SM. */
#define TC_XS_MAX (100 * 1024)

int64_t di_cuda_xs_launches;      /* cuda_backend.h: launches with staged parts (for tests) */
int64_t di_cuda_tc_fp8_launches;  /* cuda_backend.h: FP8 launches (for tests) */
int64_t di_cuda_tc_head_launches; /* cuda_backend.h: launches of a product per head */
int64_t di_cuda_tc_runs_launches; /* cuda_backend.h: grouped launches with R > 1 (for tests) */

/* Split activations in shared memory (xs_v > 0; the one-token-group variants). At a few
 * tokens the GEMV is bound by its warps' instruction chains, not by DRAM (Nsight Compute,
 * o_proj 2048 x 2048 at one token: 2,300 instructions per warp at 7.5 cycles each, 20 % of
 * the DRAM bandwidth; with the weights already in L2 it took as long): and every warp of
 * every row tile loaded its chunk of x and split it into `terms` bf16 parts again, about 70
 * instructions per chunk. Here the block splits its token chunk's activations once -- the
 * same split_pair calls on the same floats, so the same parts -- into
 * xs[(t * terms + s) * xs_v + v], the mma's B registers of token t, part s, columns 8 v ..
 * 8 v + 7 (one 16-byte load per lane and part). xs_v = K / 8 rounded up to 4 mod 8, which
 * puts the two tokens of a quarter warp's loads in different banks. */
static __device__ __forceinline__ void stage_xsplit(const di_cuda_mm_params &p, const float *x,
                                                    uint4 *xs, int64_t t0, int nt, int terms,
                                                    int xs_v) {
    const int V = (int)(p.cols / 8);
    for (int i = threadIdx.x; i < nt * V; i += blockDim.x) {
        const int t = i / V, v = i - t * V;
        const float4 *src =
            reinterpret_cast<const float4 *>(x + (t0 + t) * p.x_tstride + 8 * (int64_t)v);
        const float4 q0 = __ldg(src), q1 = __ldg(src + 1);
        float xv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        for (int s = 0; s < terms; s++)
            xs[(t * terms + s) * xs_v + v] = split_quad(xv);
    }
    __syncthreads();
}

/* Block: max(4, ks) warps, W = ks / R per row tile (warp = tile * W + kw), each taking R of
 * the tile's ks K runs: kw, kw + W, ..., kw + (R - 1) W. A warp's row tile is MT m-tiles of
 * 16 rows (GLU: MT = 2, the gate's and the up projection's same 16 rows); a warp takes RT
 * row tiles one after the other (the block's tile group x RT + rt), its weight loads running
 * on from one run into the next and from one tile into the next, and reduces and stores them
 * at the end; grid y: token chunks of 8 NG (grouped: one, the block walks its expert's
 * chunks); grid z: the active-expert slot (grouped) or the head (a product per head). U
 * chunks of weights are requested before any is used.
 * MT, NG, U, RT and R only choose how much runs side by side, never a sum's order; nor does
 * xs_v (0: each warp loads and splits its activations; else split once per block, above).
 * With R > 1 a warp's runs are added in registers as the tree adds them (run_fold), the
 * tree's last log2 W levels in shared memory as before. R = 2 and 4 are held to 128
 * registers (two blocks per SM; R = 4 spills a few bytes), R = 8 takes 190-196. */
template <int MT, int NG, int U, bool PIPE, bool G, bool GLU, int RT, bool F8, int R = 1>
__global__ void __launch_bounds__(TC_THREADS, R == 2 || R == 4 ? 2 : 0)
    tc_kernel(const di_cuda_mm_params p, int ks, int terms, bool xvec, int xs_v) {
    extern __shared__ uint4 xs[]; /* [8][terms][xs_v] when staged (NG == 1) */
    static_assert(!GLU || MT == 2, "GLU pairs a gate tile with an up tile");
    static_assert(R == 1 || R == 2 || R == 4 || R == 8, "R: a power of two up to TC_MAX_KS");
    static_assert(!F8 || R == 1, "FP8 adds its chunks' scaled sums straight into acc");
    constexpr int LOG2_R = tc_log2_runs<R>;
    constexpr int RO = GLU ? 16 : 16 * MT; /* output rows per tile */
    __shared__ float red[TC_MAX_KS][32][4 * MT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int W = ks / R; /* warps per row tile (the launcher keeps R <= ks) */
    const int kw = warp % W, tiles_per_block = (int)(blockDim.x >> 5) / W;
    /* Row tile rt's first row; a tile past the last row still takes part in the barriers. */
    auto tile_r0 = [&](int rt) -> int64_t {
        return (((int64_t)blockIdx.x * RT + rt) * tiles_per_block + warp / W) * RO;
    };
    constexpr int ESZ = F8 ? 1 : 2; /* bytes per weight element */
    const void *wdata = p.data, *udata = p.glu_data;
    const float *wscale = p.scale, *uscale = p.glu_scale; /* F8: the block scales */
    const float *xb = p.x; /* this block's activations and outputs (a head's, below) */
    float *yb = p.y;
    int64_t row_off = p.row_offset; /* F8: the weight's first stored row */
    int64_t t0 = (int64_t)blockIdx.y * 8 * NG, t_end = p.n_tokens;
    if constexpr (G) { /* the routing (active list, offsets) comes from earlier kernels */
        if (!tc_expert<GLU, true>(p, (int)blockIdx.z, wdata, udata, t0, t_end, &wscale, &uscale))
            return;             /* block-uniform */
    } else if (p.n_heads > 1) { /* one product per head: blockIdx.z is head h */
        const int64_t h = blockIdx.z;
        row_off += h * p.head_row_offset_stride; /* F8: its scale rows */
        tc_head(p, h, ESZ, wdata, xb, yb);
    }
    const int64_t K = p.cols, C = (K + TC_CHUNK - 1) / TC_CHUNK;
    /* Step vt = rt R + q walks row tile rt's run q of the warp (tc_run_chunks), computed
     * once (after step R - 1 comes the next tile's step 0). */
    int64_t c_first[R], c_last[R];
    tc_run_chunks<R>(C, ks, kw, W, c_first, c_last);
    const int64_t kl = 8 * tig; /* this lane's first column inside a chunk */

    /* Weights of U chunks from chunk c of row tile rt, whose run ends at chunk ce: m-tile
     * mt's rows g and g + 8 (rows past the end alias the last row; their results are never
     * stored), zeros past the run, the tile or the last tile. */
    uint4 a[U][MT][2];
    auto load_a = [&](uint4(&dst)[U][MT][2], int rt, int64_t c, int64_t ce) {
        const int64_t r0 = tile_r0(rt);
        const bool tile_ok = rt < RT && r0 < p.rows;
        const char *wrow[MT][2];
        tc_lane_rows<MT, GLU>(p, r0, g, wdata, udata, ESZ, wrow);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t k = (c + u) * TC_CHUNK + kl;
            const bool ok = tile_ok && c + u < ce && k < K; /* K % 8 == 0: whole vectors */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if constexpr (F8) { /* 8 bytes: x and y, converted at use */
                        const uint2 q =
                            ok ? __ldcs(reinterpret_cast<const uint2 *>(wrow[mt][h] + k))
                               : make_uint2(0, 0);
                        dst[u][mt][h] = make_uint4(q.x, q.y, 0, 0);
                    } else {
                        dst[u][mt][h] =
                            ok ? __ldcs(reinterpret_cast<const uint4 *>(wrow[mt][h] + 2 * k))
                               : make_uint4(0, 0, 0, 0);
                    }
                }
        }
    };
    /* F8: tile rt's block-scale rows (rows g and g + 8 of each m-tile; GLU's m-tile 1 the up
     * weight's); chunk c's scale column is di_cuda_scale_col(p, c) (the launcher set the
     * chunks per block). */
    const float *srow[MT][2];
    auto scale_rows = [&](int rt) {
        const int64_t r0 = tile_r0(rt);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t r = min(r0 + (GLU ? 0 : 16 * mt) + g + 8 * h, p.rows - 1);
                srow[mt][h] = (GLU && mt == 1 ? uscale : wscale) +
                              ((row_off + r) / p.block_rows) * p.scale_cols;
            }
    };

    for (; t0 < t_end; t0 += 8 * NG) {
        const int nt = (int)min((int64_t)8 * NG, t_end - t0);
        float acc[RT][MT][NG][4];
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < NG; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        acc[rt][mt][j][i] = 0.0f;

        load_a(a, 0, c_first[0], c_last[0]);
        if constexpr (!G) { /* the first weights are on their way; now wait for x (PDL) */
            pdl_wait();     /* (a plain block runs this loop once) */
            pdl_trigger();
        }
        if constexpr (NG == 1)
            if (xs_v) {
                if constexpr (G) __syncthreads(); /* the last chunk's reads are done */
                stage_xsplit(p, xb, xs, t0, nt, terms, xs_v);
            }
        float st[R > 1 ? LOG2_R : 1][MT][NG][4]; /* R > 1: run_fold's partial tree sums */
#pragma unroll
        for (int vt = 0; vt < RT * R; vt++) {
            const int rt = vt / R;
            if (tile_r0(rt) >= p.rows) break; /* this and the later tiles are past the end */
            if constexpr (F8) scale_rows(rt);
            float cur[MT][NG][4]; /* R > 1: this run's sums */
            if constexpr (R > 1) zero_acc(cur);
            const int q = vt % R;
            const int64_t c_end = c_last[q];
            for (int64_t c = c_first[q]; c < c_end; c += U) {
                /* the next U chunks: this run's, or the next step's first */
                const bool more = c + U < c_end;
                const int nrt = more ? rt : (vt + 1) / R;
                const int64_t nc = more ? c + U : c_first[(q + 1) % R];
                const int64_t nce = R == 1 || more ? c_end : c_last[(q + 1) % R];
                /* PIPE: the next U chunks are requested before this U are used */
                uint4 next[PIPE ? U : 1][MT][2];
                if constexpr (PIPE) load_a(next, nrt, nc, nce);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (c + u >= c_end) break;
                    const int64_t k = (c + u) * TC_CHUNK + kl;
                    /* The chunk's weights as bf16 (F8: converted once for every token group
                     * and part) and where its products go: F8 sums each chunk apart (pt) and
                     * adds it to acc times its block scale, as DeepGEMM promotes a block's
                     * partial sums; BF16 straight into acc. */
                    uint4 w[MT][2];
                    float pt[MT][NG][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            w[mt][h] = F8 ? e4m3x8_bf16(a[u][mt][h]) : a[u][mt][h];
#pragma unroll
                        for (int j = 0; j < NG; j++)
#pragma unroll
                            for (int i = 0; i < 4; i++)
                                pt[mt][j][i] = 0.0f;
                    }
                    auto dst = [&](int mt, int j) -> float(&)[4] {
                        if constexpr (F8)
                            return pt[mt][j];
                        else if constexpr (R > 1)
                            return cur[mt][j];
                        else
                            return acc[rt][mt][j];
                    };
#pragma unroll
                    for (int j = 0; j < NG; j++) {
                        if (8 * j >= nt) break;
                        const int64_t t = t0 + 8 * j + g;
                        const bool tok = t < t_end && k < K;
                        /* B: token 8 j + g, columns k .. k + 7 (zero past K or the tokens) */
                        if (NG == 1 && xs_v) { /* the block's split parts */
                            const uint4 *b = xs + (int64_t)(t - t0) * terms * xs_v + k / 8;
#pragma unroll
                            for (int s = 0; s < 3; s++) {
                                if (s >= terms) break;
                                const uint4 q = tok ? b[s * xs_v] : make_uint4(0, 0, 0, 0);
#pragma unroll
                                for (int mt = 0; mt < MT; mt++)
                                    mma_chunk(dst(mt, j), w[mt][0], w[mt][1], q.x, q.y, q.z, q.w);
                            }
                            continue;
                        }
                        float xv[8];
                        load_x8(p, xb, t, k, tok, xvec, xv);
                        for (int s = 0; s < terms; s++) {
                            const uint4 b = split_quad(xv);
#pragma unroll
                            for (int mt = 0; mt < MT; mt++)
                                mma_chunk(dst(mt, j), w[mt][0], w[mt][1], b.x, b.y, b.z, b.w);
                        }
                    }
                    if constexpr (F8) { /* c0, c1: row g; c2, c3: row g + 8 */
                        const int64_t sc = di_cuda_scale_col(p, c + u);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            const float s0 = __ldg(srow[mt][0] + sc), s1 = __ldg(srow[mt][1] + sc);
#pragma unroll
                            for (int j = 0; j < NG; j++)
#pragma unroll
                                for (int i = 0; i < 4; i++)
                                    acc[rt][mt][j][i] =
                                        fmaf(pt[mt][j][i], i < 2 ? s0 : s1, acc[rt][mt][j][i]);
                        }
                    }
                }
                if constexpr (PIPE) {
#pragma unroll
                    for (int u = 0; u < U; u++)
#pragma unroll
                        for (int mt = 0; mt < MT; mt++)
                            a[u][mt][0] = next[u][mt][0], a[u][mt][1] = next[u][mt][1];
                } else {
                    load_a(a, nrt, nc, nce);
                }
            }
            if constexpr (R > 1) run_fold<LOG2_R>(st, cur, q, acc[rt]);
        }

        /* Result (rt, mt, j): c0, c1 = row g, tokens 2 tig, 2 tig + 1; c2, c3 = row g + 8.
         * With ks > 1 the warps' partial sums meet in shared memory first: warp kw adds warp
         * kw + s for s = ks / 2, ..., 1 (a fixed tree), and warp kw = 0 stores. */
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            const int64_t r0 = tile_r0(rt);
            const bool live = r0 < p.rows;
#pragma unroll
            for (int j = 0; j < NG; j++) {
                if (8 * j >= nt) break; /* uniform over the block */
                float v[4 * MT];        /* m-tile mt's c0..c3 at 4 mt */
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        v[4 * mt + i] = acc[rt][mt][j][i];
                if (W > 1) {
                    tc_tree_reduce<4 * MT>(v, red, warp, lane, kw, W);
                    if (kw != 0) continue;
                }
                if (!live) continue;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int64_t t = t0 + 8 * j + 2 * tig + (i & 1);
                    const int row = g + 8 * (i >> 1);
                    if (t >= t_end) continue;
#pragma unroll
                    for (int mt = 0; mt < (GLU ? 1 : MT); mt++) {
                        const int64_t r = r0 + 16 * mt + row;
                        if (r >= p.rows) continue;
                        const float val = GLU ? silu_times(v[i], v[4 + i]) : v[4 * mt + i];
                        store_y(yb + t * p.y_tstride + r, val, p.accumulate);
                    }
                }
            }
        }
        if constexpr (!G) break; /* one token chunk per block (blockIdx.y) */
    }
}

/* From the weight alone (never from x or n), so that one weight always takes one path. BF16,
 * or with tune.tc_fp8 block-scaled FP8 whose scale blocks hold whole 32-column chunks (each
 * chunk's sum takes one scale per row: V3's and V4's 128 x 128 blocks). One product per
 * head too (head_matmul, not transposed: MLA's W_UV and the W_UK^T copy, deepseek_v3.c; V4's
 * grouped output projection wo_a, FP8 in V4-Flash, so only with tc_fp8), where every head's
 * weight is aligned; the rows counted are all heads' (tc_min_rows). */
bool di_cuda_tc_fits(const di_cuda_mm_params *p) {
    const bool f8 = p->dtype == DI_DTYPE_F8_E4M3 && p->tune.tc_fp8 && p->scale &&
                    p->block_cols % TC_CHUNK == 0 && (!p->glu_data || p->glu_scale);
    const uintptr_t align = f8 ? 7u : 15u; /* 8 or 16 bytes per lane's load */
    const bool heads = di_cuda_per_head(p);
    const int64_t esz = f8 ? 1 : 2;
    return (p->dtype == DI_DTYPE_BF16 || f8) && !p->transposed &&
           (!heads || (!p->glu_data && ((uintptr_t)(p->head_elem_stride * esz) & align) == 0)) &&
           p->rows * (heads ? p->n_heads : 1) >= p->tune.tc_min_rows && p->cols % 8 == 0 &&
           p->row_stride % 8 == 0 && ((uintptr_t)p->data & align) == 0 &&
           (!p->glu_data || ((uintptr_t)p->glu_data & align) == 0);
}

/* xs_v of a launch (0: not staged) and *smem, the bytes of the parts a block stages: its
 * token chunk's rows (8 for a grouped product, whose experts' row counts the host does not
 * know). Staged for one token group per block, x in 16-byte aligned rows, the parts within
 * tune.tc_xs KiB (32 by default) and TC_XS_MAX. H200, 4-layer V2-Lite-shaped model, one
 * token (Nsight Compute; staged with any size): instructions per product -17 to -29 %,
 * lm_head 163 -> 134 us, the shared experts' GLU 14.4 -> 12.9, o_proj 10.2 -> 9.6, the
 * grouped down projection 21.2 -> 19.9; but the grouped gate / up 28 -> 33 us, whose blocks
 * stage 8 rows (100 KB: the host does not know an expert's rows), and at 64 sequences the
 * step's device time 2.65 -> 2.97 ms. Large shared-memory blocks cost the streaming loads
 * more than the split saved. The 32 KiB cap keeps the plain products of one or two tokens
 * (K = 2048: up to two tokens; V4's head, K = 4096: one): batch-1 graph replays 0.614 ->
 * 0.598 ms, 64 sequences unchanged (2.634 ms), the V4-Flash slice 898 -> 915 tok/s (twelfth
 * round, two runs each). */
static int xs_v_for(const di_cuda_mm_params *p, int ng, bool xvec, size_t *smem) {
    *smem = 0;
    if (ng != 1 || !xvec || p->tune.tc_xs <= 0) return 0;
    const int64_t rows = p->experts ? 8 : (p->n_tokens < 8 ? p->n_tokens : 8);
    const int64_t V = p->cols / 8, xs_v = V + (12 - V % 8) % 8; /* = 4 mod 8 */
    const int64_t bytes = rows * p->tune.tc_terms * xs_v * (int64_t)sizeof(uint4);
    if (bytes > TC_XS_MAX || bytes > (int64_t)p->tune.tc_xs * 1024) return 0;
    *smem = (size_t)bytes;
    return (int)xs_v;
}

/* The kernels that may stage x: their shared-memory limit raised once per device. */
template <int MT, int U, bool GLU, int RT, bool F8> static cudaError_t allow_xs(void) {
    cudaError_t err = cudaFuncSetAttribute(tc_kernel<MT, 1, U, true, true, GLU, RT, F8>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, TC_XS_MAX);
    if constexpr (RT == 1) /* plain products too */
        if (err == cudaSuccess)
            err = cudaFuncSetAttribute(tc_kernel<MT, 1, U, true, false, GLU, RT, F8>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, TC_XS_MAX);
    return err;
}

/* Chunks a plain one-token-group warp of one m-tile requests at a time: FP8 chunks are half
 * the bytes, so twice as many, the same bytes in flight as BF16's (U never changes a sum;
 * 123 registers; the two-m-tile variants keep 2: with 4 they took 139-164). */
template <bool F8> static constexpr int TC_U1 = F8 ? 8 : 4;

/* ... and the grouped BF16 kernels with R K runs per warp (tc_runs), GLU or not. */
template <int R> static cudaError_t allow_xs_runs(void) {
    cudaError_t err = cudaFuncSetAttribute(tc_kernel<2, 1, 2, true, true, true, 1, false, R>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, TC_XS_MAX);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(tc_kernel<2, 1, 2, true, true, false, 1, false, R>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, TC_XS_MAX);
    return err;
}

template <bool F8> static cudaError_t allow_xs_all(void) {
    cudaError_t err = allow_xs<1, TC_U1<F8>, false, 1, F8>();
    if (err == cudaSuccess) err = allow_xs<2, 2, true, 1, F8>();
    if (err == cudaSuccess) err = allow_xs<2, 2, false, 1, F8>();
    if (err == cudaSuccess) err = allow_xs<2, 2, true, 2, F8>();
    if (err == cudaSuccess) err = allow_xs<2, 2, false, 2, F8>();
    return err;
}

cudaError_t di_cuda_tc_gemv_setup(void) {
    cudaError_t err = allow_xs_all<false>();
    if (err == cudaSuccess) err = allow_xs_runs<2>();
    if (err == cudaSuccess) err = allow_xs_runs<4>();
    if (err == cudaSuccess) err = allow_xs_runs<8>();
    return err == cudaSuccess ? allow_xs_all<true>() : err;
}

/* One launch of tc_kernel<MT, NG, U, PIPE, grouped or not, GLU, RT, F8, R> (R runs per
 * warp: grouped products only, R <= ks). */
template <int MT, int NG, int U, bool PIPE, bool GLU, int RT, bool F8, int R = 1>
static cudaError_t launch_tc(const di_cuda_mm_params *p, int ks, bool xvec) {
    void (*k)(const di_cuda_mm_params, int, int, bool, int) =
        tc_kernel<MT, NG, U, PIPE, true, GLU, RT, F8, R>;
    if constexpr (RT == 1 && R == 1) /* several row tiles or runs per warp: grouped only */
        if (!p->experts) k = tc_kernel<MT, NG, U, PIPE, false, GLU, RT, F8>;
    size_t smem = 0;
    const int xs_v = PIPE ? xs_v_for(p, NG, xvec, &smem) : 0;
    if (xs_v) di_cuda_xs_launches++;
    if (di_cuda_per_head(p)) di_cuda_tc_head_launches++;
    if (R > 1) di_cuda_tc_runs_launches++;
    const int64_t ro = GLU ? 16 : 16 * MT, tiles = (p->rows + ro - 1) / ro;
    const int warps = ks > 4 ? ks : 4, per_block = warps / (ks / R) * RT; /* row tiles */
    const int64_t tokens_per_block = 8 * NG;
    /* grid z: the active-expert slots (grouped) or the heads (a product per head) */
    dim3 grid((unsigned)((tiles + per_block - 1) / per_block),
              p->experts ? 1u : (unsigned)((p->n_tokens + tokens_per_block - 1) / tokens_per_block),
              (unsigned)DI_MAX(p->n_heads, 1));
    return di_cuda_launch(k, grid, dim3(32 * warps), smem, p->stream, *p, ks, p->tune.tc_terms,
                          xvec, xs_v);
}

/* K runs per warp of a grouped product (1, 2, 4 or 8; at most ks): at tune.tc_runs_min_n
 * tokens per active-expert slot or more, the tile's ks runs on the fewest warps W (a power of
 * two) with W x the weight's 16-row tiles (tc_ks's count; the kernel's non-GLU tiles are two
 * of them) >= tune.tc_runs_target, so R = ks / W; else one run per warp. The
 * sums do not change (run_fold), only how many warps share a tile. At a decode batch of 64
 * sequences (V2-Lite, about 6 rows per expert) fewer, longer warps stream the experts'
 * weights with less of the tree through shared memory; at one token per expert (batch 1)
 * every warp counts, and one run each stays. (With the experts' own target, the default
 * since the twenty-third round of NOTES.md, V2-Lite's expert weights take 8 K runs for the
 * gate / up and 4 for the down projection, which the default runs target spreads one per
 * warp: R = 1 there.) */
static int tc_runs(const di_cuda_mm_params *p, int ks) {
    if (p->tune.tc_runs_min_n <= 0 || di_cuda_rows_per_weight(p) < p->tune.tc_runs_min_n) return 1;
    const int64_t tiles = (p->rows + 15) / 16; /* tc_ks's tiles */
    int w = 1;
    while (w < ks && tiles * w < p->tune.tc_runs_target)
        w *= 2;
    return ks / w;
}

/* Grouped experts with a few tokens each: two row tiles per warp (p->tune.tc_rt = 2, the
 * default), half the blocks, each warp's weight loads running on from its first tile into
 * its second. H200, 4-layer V2-Lite-shaped model: 64 concurrent 15729 -> 16602 output tok/s,
 * batch-1 decode 1157 -> 1187 tok/s; four tiles (160 registers, one block per SM) were
 * slower than one (14352 at 64). Two token groups per pass and one row tile once experts
 * average more than 4 rows (an expert of 9..16 rows, one in six at 64 sequences, read once
 * instead of twice) made no difference there (17180 vs 17126 output tok/s, three runs each)
 * and were dropped. */
/* Does a BF16 grouped product of a few rows per slot (a decode batch: fewer than
 * tc_wide_grouped on average) take the streaming kernel (cuda_tc_stream.cu, passes of 8 or 16
 * rows)? x in 16-byte aligned rows, for its cp.async; an expert's bytes in 32 bits. (Two
 * token groups per pass on tc_kernel, above, made no difference; on the streaming kernel
 * passes of 16 took a 64-sequence step 10.96 -> 10.62 ms, NOTES.md, twenty-fourth round.) */
static bool ts_takes(const di_cuda_mm_params *p, bool xvec) {
    return p->tune.tc_stream && xvec && (uint64_t)p->rows * p->row_stride * 2 <= UINT32_MAX;
}

/* Does the one-token-group GEMV go to the opt-in lean kernel (DI_CUDA_TC_LEAN=1, BF16), whose
 * row and token counts are 32-bit (one head or grouped)? */
static bool lean_takes(const di_cuda_mm_params *p, int64_t n, bool xvec) {
    return n <= 8 && xvec && p->tune.tc_lean && !di_cuda_per_head(p) && p->rows < INT32_MAX &&
           p->n_tokens < INT32_MAX;
}

template <bool GLU, bool F8>
static cudaError_t launch_tc_grouped(const di_cuda_mm_params *p, int ks, bool xvec) {
    if constexpr (!F8) { /* a decode batch: several K runs per warp (tc_runs), one row tile
                          * per warp (the registers of two did not fit) */
        const int r = tc_runs(p, ks);
        if (ts_takes(p, xvec)) return di_cuda_launch_matmul_tc_stream(p, ks, r);
        if (r == 8) return launch_tc<2, 1, 2, true, GLU, 1, F8, 8>(p, ks, xvec);
        if (r == 4) return launch_tc<2, 1, 2, true, GLU, 1, F8, 4>(p, ks, xvec);
        if (r == 2) return launch_tc<2, 1, 2, true, GLU, 1, F8, 2>(p, ks, xvec);
    }
    if (p->tune.tc_rt == 2) return launch_tc<2, 1, 2, true, GLU, 2, F8>(p, ks, xvec);
    return launch_tc<2, 1, 2, true, GLU, 1, F8>(p, ks, xvec);
}

/* The GEMV's variants for BF16 or FP8 weights (the same choices). */
template <bool F8> static cudaError_t launch_tc_gemv(const di_cuda_mm_params *p) {
    const bool glu = p->glu_data || p->glu_experts;
    const int ks = tc_ks(p);
    const bool heads = di_cuda_per_head(p), xvec = tc_xvec(p);
    const int64_t n = di_cuda_rows_per_weight(p);
    /* Opt-in (DI_CUDA_TC_LEAN=1, BF16): one token group on the swapped-operand kernel. */
    if (!F8 && lean_takes(p, n, xvec)) return di_cuda_launch_matmul_tc_lean(p, ks);
    /* A large plain BF16 product of one token group, not GLU (the lm_head: tc_stream_plain_bytes;
     * every one with tc_stream_plain_all) on the streaming kernel -- whole-line weight reads
     * through shared memory where tc_kernel reads 8 rows x 64 bytes per instruction (3.16 TB/s
     * at most in the seventeenth round's probe), and its first two stages of weights requested
     * before the PDL wait. The same sums. */
    const bool big = !glu && p->rows * p->cols * 2 >= p->tune.tc_stream_plain_bytes;
    if (!F8 && n <= 8 && !p->experts && !heads && (big || p->tune.tc_stream_plain_all) &&
        ts_takes(p, xvec))
        return di_cuda_launch_matmul_tc_stream(p, ks, tc_runs(p, ks));
    /* Token groups of 8 per block as n needs, at most 4 (32 tokens: the registers of two
     * m-tiles). One m-tile per warp for a few tokens (more warps, more loads in flight),
     * two for more (each activation fragment serves twice the weights) and for grouped
     * experts with few tokens each (many small matrices: enough warps either way). One
     * token group: the next weights are requested before the current ones are used (PIPE). */
    if (glu) {
        if (n <= 8 && p->experts) return launch_tc_grouped<true, F8>(p, ks, xvec);
        if (n <= 8) return launch_tc<2, 1, 2, true, true, 1, F8>(p, ks, xvec);
        if (n <= 16) return launch_tc<2, 2, 2, false, true, 1, F8>(p, ks, xvec);
        return launch_tc<2, 4, 2, false, true, 1, F8>(p, ks, xvec);
    }
    if (n <= 8 && p->experts) return launch_tc_grouped<false, F8>(p, ks, xvec);
    if (n <= 8) return launch_tc<1, 1, TC_U1<F8>, true, false, 1, F8>(p, ks, xvec);
    if (n <= 16) return launch_tc<1, 2, 4, false, false, 1, F8>(p, ks, xvec);
    return launch_tc<2, 4, 2, false, false, 1, F8>(p, ks, xvec);
}

bool di_cuda_mm_reads_x_rows(const di_cuda_mm_params *p) {
    if (!p->experts || p->dtype != DI_DTYPE_BF16 || !p->tune.tc) return false;
    const int64_t n = di_cuda_rows_per_weight(p); /* di_cuda_launch_matmul's choices ... */
    if (n < p->tc_min_n || !di_cuda_tc_fits(p)) return false;
    if (di_cuda_tc_wide_fits(p)) return true; /* the wide kernel stages its rows through them */
    if (n > 8) return false;
    const bool xvec = tc_xvec(p); /* ... and launch_tc_gemv's */
    return !lean_takes(p, n, xvec) && ts_takes(p, xvec);
}

cudaError_t di_cuda_launch_matmul_tc(const di_cuda_mm_params *p) {
    if (p->dtype == DI_DTYPE_F8_E4M3) {
        /* FP8 (di_cuda_tc_fits): the GEMV for every n (the wide kernel is BF16's), a chunk's
         * scale column from the chunks per scale block (a shift when a power of two). */
        di_cuda_mm_params q = *p;
        di_cuda_set_scale_step(&q, p->block_cols / TC_CHUNK);
        di_cuda_tc_fp8_launches++;
        return launch_tc_gemv<true>(&q);
    }
    if (di_cuda_tc_wide_fits(p)) return di_cuda_launch_matmul_tc_wide(p);
    return launch_tc_gemv<false>(p);
}
