/*
 * cuda_tc.cuh -- what the two tensor-core products share: the tensor-core GEMV for a few
 * tokens (cuda_tc_gemv.cu) and the wide product for many (cuda_tc_wide.cu) compute every sum
 * in the same order, so that a token's result never depends on which of them ran. The K
 * order (chunks of TC_CHUNK columns, dealt to `ks` K runs by tc_ks from the weight's shape),
 * the activation split (split_pair) and the mma's operand layout live here, once.
 */
#ifndef DI_CUDA_TC_CUH
#define DI_CUDA_TC_CUH

#include "backend/cuda/cuda_internal.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define TC_CHUNK      32 /* K elements per chunk: two m16n8k16 steps */
#define TC_MAX_KS     8  /* K runs a row's chunks are dealt to */
#define TC_MIN_CHUNKS 4  /* fewest chunks per K run */

/* d += A B for one m16n8k16 step (bf16 inputs, fp32 accumulation). */
static __device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1,
                                                uint32_t a2, uint32_t a3, uint32_t b0,
                                                uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One chunk's two mma steps for one m-tile: w holds this lane's 8 columns of row g, v of row
 * g + 8, b the same 8 columns of its token as bf16 pairs (the k slots are a permutation of
 * the chunk's columns, the same one for A and B, which changes no sum). */
static __device__ __forceinline__ void mma_chunk(float (&d)[4], const uint4 &w, const uint4 &v,
                                                 uint32_t b0, uint32_t b1, uint32_t b2,
                                                 uint32_t b3) {
    mma_bf16(d, w.x, v.x, w.y, v.y, b0, b1);
    mma_bf16(d, w.z, v.z, w.w, v.w, b2, b3);
}

/* Two e4m3 bytes (the low one first) as a bf16 pair, exactly: every e4m3 value (subnormals
 * and NaN included) is a half, every half that an e4m3 byte gives is a bf16. */
static __device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t two) {
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *reinterpret_cast<const uint32_t *>(&b);
}

/* Eight e4m3 bytes (k .. k + 7, in a uint4's x and y) as the mma's eight bf16 values, in the
 * layout a BF16 weight's 16-byte load has. */
static __device__ __forceinline__ uint4 e4m3x8_bf16(const uint4 &raw) {
    return make_uint4(e4m3x2_bf16x2(raw.x), e4m3x2_bf16x2(raw.x >> 16), e4m3x2_bf16x2(raw.y),
                      e4m3x2_bf16x2(raw.y >> 16));
}

/* The bf16 pair (a, b) rounded to nearest, a in the low half; a and b become what is left
 * (exact: x - bf16(x) is a float). Called `terms` times on the same values, it yields the
 * parts hi, mid, lo of the activations. A bf16 widens to the float with its bits on top: one
 * shift or mask each (__low2float / __high2float compiled to two instructions each). */
static __device__ __forceinline__ uint32_t split_pair(float &a, float &b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    const uint32_t u = *reinterpret_cast<const uint32_t *>(&h);
    a = __fsub_rn(a, __uint_as_float(u << 16));
    b = __fsub_rn(b, __uint_as_float(u & 0xffff0000u));
    return u;
}

/* One part of eight activations (a lane's columns of a chunk) as the mma's four registers:
 * the pairs (x0, x1), (x2, x3), (x4, x5), (x6, x7), each left with what remains. */
static __device__ __forceinline__ uint4 split_quad(float (&xv)[8]) {
    uint4 b;
    b.x = split_pair(xv[0], xv[1]);
    b.y = split_pair(xv[2], xv[3]);
    b.z = split_pair(xv[4], xv[5]);
    b.w = split_pair(xv[6], xv[7]);
    return b;
}

/* One int the routing wrote (g_active, g_off, x_rows): from L2 where it is read before the
 * PDL wait (settled: the finished routing kernel's writes have reached L2, but an L1 line of
 * an earlier launch could be stale), else a plain load. */
static __device__ __forceinline__ int32_t tc_routing_ld(const int32_t *a, bool settled) {
    return settled ? __ldcg(a) : *a;
}

/* A grouped launch's active-expert slot, once the routing's kernels are done (PDL): its
 * expert's weights (and GLU's up weights) and its rows, t0 moved by the expert's offset and
 * t_end its end. False, and the caller's block exits, for a slot past the active experts, and
 * with ROWS for an expert with no rows left at t0 (a cluster, whose blocks must stay
 * together, passes ROWS = false). With settled (p.routing_settled, the caller's choice) the
 * routing is read without the PDL wait (tc_routing_ld), and the caller waits later, before
 * it reads x. */
template <bool GLU, bool ROWS, typename T>
static __device__ __forceinline__ bool
tc_expert(const di_cuda_mm_params &p, int slot, const void *&wdata, const void *&udata, T &t0,
          T &t_end, const float **wscale = nullptr, const float **uscale = nullptr,
          bool settled = false) {
    if (!settled) {
        pdl_wait();
        pdl_trigger();
    }
    if (slot >= tc_routing_ld(p.g_active, settled)) return false;
    const int e = tc_routing_ld(p.g_active + 1 + slot, settled);
    wdata = p.experts[e].data;
    if constexpr (GLU) udata = p.glu_experts[e].data;
    if (wscale) *wscale = p.experts[e].scale; /* FP8 weights' block scales */
    if constexpr (GLU)
        if (uscale) *uscale = p.glu_experts[e].scale;
    t0 += tc_routing_ld(p.g_off + e, settled);
    t_end = tc_routing_ld(p.g_off + e + 1, settled);
    return !ROWS || t0 < t_end;
}

/* A product per head (di_cuda_per_head): head h's weight (esz bytes per element), activations
 * and outputs, which the caller's block moves to. */
static __device__ __forceinline__ void tc_head(const di_cuda_mm_params &p, int64_t h, int esz,
                                               const void *&wdata, const float *&x, float *&y) {
    wdata = static_cast<const char *>(p.data) + h * p.head_elem_stride * esz;
    x += h * p.x_hstride;
    y += h * p.y_hstride;
}

/* Can the products' kernels read x with 16-byte loads (every token's row, and every head's in
 * a product per head, 16-byte aligned)? */
static inline bool tc_xvec(const di_cuda_mm_params *p) {
    return ((uintptr_t)p->x & 15u) == 0 && p->x_tstride % 4 == 0 &&
           (!di_cuda_per_head(p) || p->x_hstride % 4 == 0);
}

/* x(t)[k .. k + 8) as floats (zeros unless ok); x: the product's activations (a head's, in
 * a product per head). */
static __device__ __forceinline__ void load_x8(const di_cuda_mm_params &p, const float *x,
                                               int64_t t, int64_t k, bool ok, bool xvec,
                                               float (&xv)[8]) {
    if (!ok) {
#pragma unroll
        for (int e = 0; e < 8; e++)
            xv[e] = 0.0f;
        return;
    }
    const float *xp = x + t * p.x_tstride + k;
    if (xvec) {
        const float4 q0 = __ldg(reinterpret_cast<const float4 *>(xp));
        const float4 q1 = __ldg(reinterpret_cast<const float4 *>(xp) + 1);
        xv[0] = q0.x, xv[1] = q0.y, xv[2] = q0.z, xv[3] = q0.w;
        xv[4] = q1.x, xv[5] = q1.y, xv[6] = q1.z, xv[7] = q1.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            xv[e] = __ldg(xp + e);
    }
}

/* K runs per row: the smallest power of two that spreads the product's 16-row tiles over
 * the target's warps (tune.tc_target, DI_CUDA_TC_TARGET by default; expert weights
 * tune.tc_target_experts, DI_CUDA_TC_TARGET_EXPERTS by default, 0: tc_target; FP8 weights
 * twice as many; the tiles of all heads of a product per head), keeping TC_MIN_CHUNKS chunks
 * per run. From the weight's shape, dtype and kind only, so the products of one weight, at
 * any n and in any kernel, share their K order. An expert weight's grouped products -- the
 * only ones the models run on it -- may take another K order than a plain product of the
 * same weight (V2-Lite's down projection: 4 runs, 8 as a plain product); the op tests that
 * compare them set the experts' target to the plain one's. Run kw takes chunks
 * [C kw / ks, C (kw + 1) / ks). */
static inline int tc_ks(const di_cuda_mm_params *p) {
    /* FP8 (half the bytes per chunk): twice the warps, the same bytes per warp as BF16 */
    const int64_t target = (p->experts && p->tune.tc_target_experts > 0 ? p->tune.tc_target_experts
                                                                        : p->tune.tc_target) *
                           (p->dtype == DI_DTYPE_F8_E4M3 ? 2 : 1);
    const int64_t heads = di_cuda_per_head(p) ? p->n_heads : 1; /* the tiles of every head */
    const int64_t tiles = (p->rows + 15) / 16 * heads, chunks = (p->cols + TC_CHUNK - 1) / TC_CHUNK;
    int ks = 1;
    while (ks < TC_MAX_KS && tiles * ks < target && chunks / (2 * ks) >= TC_MIN_CHUNKS)
        ks *= 2;
    return ks;
}

/* A tile's sums (MT m-tiles x NG token groups x 4 values per lane) as one flat run of N
 * floats, for the helpers below. */
#define TC_SUMS(v) (&(v)[0][0][0])

/* Zeros for a tile's sums. */
template <int MT, int NG> static __device__ __forceinline__ void zero_acc(float (&v)[MT][NG][4]) {
#pragma unroll
    for (int e = 0; e < MT * NG * 4; e++)
        TC_SUMS(v)[e] = 0.0f;
}

/* A warp's q-th run of a row tile (of 2^LR, visited in bit-reversed order: local runs 0,
 * R/2, R/4, 3R/4, ...) is done, its sums in cur: fold them into st as the tree of
 * tc_tree_reduce adds the tile's runs (level s adds run k + s to run k). A binary counter:
 * st[l] holds, while bit l of q is set, the sum of the 2^l runs visited before the current
 * subtree; each set bit from the bottom adds it in front of the running sum, the first clear
 * bit keeps the running sum there. After the last run (every bit set), out holds the sum of
 * the warp's runs -- what the shared-memory tree had after its levels s >= W. The indices
 * are the unrolled loop's, whatever q is. */
template <int LR, int MT, int NG>
static __device__ __forceinline__ void run_fold(float (&st)[LR][MT][NG][4], float (&cur)[MT][NG][4],
                                                int q, float (&out)[MT][NG][4]) {
    constexpr int N = MT * NG * 4;
    float *c = TC_SUMS(cur);
    bool kept = false;
#pragma unroll
    for (int l = 0; l < LR && !kept; l++) {
        kept = !((q >> l) & 1);
        float *h = TC_SUMS(st[l]);
#pragma unroll
        for (int e = 0; e < N; e++) {
            if (kept)
                h[e] = c[e];
            else
                c[e] = h[e] + c[e];
        }
    }
    if (!kept) /* the last run */
#pragma unroll
        for (int e = 0; e < N; e++)
            TC_SUMS(out)[e] = c[e];
}

/* Where lane (g, tig)'s weight rows start: rows g and g + 8 of each of the MT m-tiles from row
 * r0 (GLU: m-tile 1 is the up weight's same 16 rows; a row past the end aliases the last row,
 * whose results are never stored), esz bytes per element. */
template <int MT, bool GLU>
static __device__ __forceinline__ void tc_lane_rows(const di_cuda_mm_params &p, int64_t r0, int g,
                                                    const void *wdata, const void *udata, int esz,
                                                    const char *(&wrow)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t r = min(r0 + (GLU ? 0 : 16 * mt) + g + 8 * h, p.rows - 1);
            const void *base = GLU && mt == 1 ? udata : wdata;
            wrow[mt][h] = static_cast<const char *>(base) + r * p.row_stride * esz;
        }
}

/* log2 R, for R = 1, 2, 4 or 8 K runs per warp. */
template <int R> constexpr int tc_log2_runs = R == 8 ? 3 : R == 4 ? 2 : R == 2 ? 1 : 0;

/* The K run that step q of warp kw (of the tile's W = ks / R warps, R runs each) walks:
 * kw + W rev(q), rev reversing q's log2 R bits -- the order in which run_fold adds a warp's
 * runs as the tree does. Run kr takes chunks [C kr / ks, C (kr + 1) / ks). */
template <int R> static __device__ __forceinline__ int tc_run_index(int q, int kw, int W) {
    constexpr int LR = tc_log2_runs<R>;
    if constexpr (LR == 0)
        return kw;
    else
        return kw + W * (int)(__brev((unsigned)q) >> (32 - LR));
}

/* The chunks of a warp's R K runs of a tile, step q's [c_first[q], c_last[q]) (tc_run_index). */
template <int R>
static __device__ __forceinline__ void tc_run_chunks(int64_t C, int ks, int kw, int W,
                                                     int64_t (&c_first)[R], int64_t (&c_last)[R]) {
#pragma unroll
    for (int q = 0; q < R; q++) {
        const int64_t kr = tc_run_index<R>(q, kw, W);
        c_first[q] = C * kr / ks, c_last[q] = C * (kr + 1) / ks;
    }
}

/* A tile's ks K runs' partial sums (NV per lane, in v) added in shared memory by the GEMV's
 * fixed tree: warp kw adds warp kw + s for s = ks / 2, ..., 1. Every warp of the block calls
 * it (it holds barriers); afterwards v holds the tile's sums (those the run-0 warp stores). */
template <int NV>
static __device__ __forceinline__ void tc_tree_reduce(float (&v)[NV],
                                                      float (&red)[TC_MAX_KS][32][NV], int warp,
                                                      int lane, int kw, int ks) {
#pragma unroll
    for (int i = 0; i < NV; i++)
        red[warp][lane][i] = v[i];
    __syncthreads();
    for (int s = ks / 2; s >= 1; s /= 2) {
        if (kw < s)
#pragma unroll
            for (int i = 0; i < NV; i++)
                red[warp][lane][i] = red[warp][lane][i] + red[warp + s][lane][i];
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < NV; i++)
        v[i] = red[warp - kw][lane][i];
    __syncthreads(); /* red is written again by the next tile or token group */
}

/* The K runs' partial sums added as the GEMV's shared-memory tree adds them: run kw takes
 * run kw + s for s = ks / 2, ..., 1, and v[0] is the sum. */
static __device__ __forceinline__ float tc_tree_sum(float (&v)[TC_MAX_KS], int ks) {
#pragma unroll
    for (int s = TC_MAX_KS / 2; s >= 1; s /= 2) /* s = ks / 2, ..., 1 (ks a power of two) */
        if (2 * s <= ks)
#pragma unroll
            for (int k = 0; k < s; k++)
                v[k] = v[k] + v[k + s];
    return v[0];
}

#endif
