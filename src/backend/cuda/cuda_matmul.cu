/*
 * cuda_matmul.cu -- the CUDA matmuls: y = W x (matmul, per-head products) and y = W^T x
 * (matmul_t, W_UK^T q), on F32 / F16 / BF16 / block-scaled FP8 (E4M3) weights.
 *
 * Design stance: decode is memory-bound, so the kernels are GEMVs that stream every weight
 * byte once with 16-byte loads (4 F32, 8 BF16/F16 or 16 FP8 elements per load, several
 * loads in flight per lane) and convert to float in registers; a handful of tokens (TB <= 8)
 * share each loaded weight vector, and larger batches are covered by more token groups.
 *
 * Invariant (batch invariance): the arithmetic of one output element is a fixed function of
 * the weight's shape, never of n, the token group size TB, the rows per warp or the grid:
 *   y = W x:    the row's 16-byte vectors are dealt to KS * 32 "slots" (KS warps of 32 lanes;
 *               KS = 4 for rows of >= 256 vectors, else 1: a function of cols and dtype
 *               only, the threshold fixed per process); slot q = w * 32 + l sums, with fmaf and in
 * order, the products of vectors v = q, q + 32 KS, q + 64 KS, ... (elements in order inside a
 * vector); each warp adds its 32 slot sums by the xor butterfly (offsets 16, 8, 4, 2, 1), and the
 * KS warp sums are added as (w0 + w1) + (w2 + w3). y = W^T x: 16 row slices per 16-byte vector
 * of output columns, each summing its rows in order, added by a fixed pairwise tree. The token
 * count only changes how many such sums run side by side, so a row's result is the same bits
 * alone or in any batch, and the tiling chosen for large n (more token groups of TB = 8) keeps
 * that. BF16 weights of a suitable shape go to the tensor-core product of cuda_tc_gemv.cu
 * instead (batch-invariant by its own K order; di_cuda_launch_matmul decides).
 *
 * FP8: the real weight is e4m3(byte) * scale(block), rounded to float once (the same value
 * the CPU kernels consume); blocks of any shape, partial blocks and row views work, with a
 * single scale lookup per 16-element vector (a shift or a 32-bit division, never a 64-bit
 * one) when block_cols is a multiple of 16. By default the conversion skips the conversion
 * instructions: the byte's 7 low bits placed at float bit 20 read as e4m3 * 2^-120 exactly
 * (normal or subnormal), so one multiply by scale * 2^120 gives the same once-rounded
 * product; NaN bytes and huge scales take the instruction path (DI_CUDA_FP8_CONVERT=cvt
 * forces it; the values are the same). With one scale per vector the kernel converts word
 * by word against every token and requests the next vectors before converting the current
 * ones (DI_CUDA_FP8_PIPE=0: the general path; the same values).
 *
 * Measured on an H200 (NOTES.md): BF16 n = 1 at 82-88 % of the device copy bandwidth; FP8
 * at 32-36 % on the large shapes (was about 20 % with the 64-bit division).
 */
#include "backend/cuda/cuda_internal.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

/* ---------------------------------------------------------------------------------------- */
/* Weight element types: 16-byte raw vectors and their conversion to float                    */
/* ---------------------------------------------------------------------------------------- */

template <di_dtype DT> struct wtype;

template <> struct wtype<DI_DTYPE_F32> {
    static constexpr int ESZ = 4, V = 4;
    typedef uint32_t elem;
    static __device__ __forceinline__ float conv(const uint4 &raw, int e) {
        const uint32_t *u = reinterpret_cast<const uint32_t *>(&raw);
        return __uint_as_float(u[e]);
    }
};

template <> struct wtype<DI_DTYPE_BF16> {
    static constexpr int ESZ = 2, V = 8;
    typedef uint16_t elem;
    static __device__ __forceinline__ float conv(const uint4 &raw, int e) {
        const uint32_t *u = reinterpret_cast<const uint32_t *>(&raw);
        uint32_t w = u[e >> 1];
        return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
    }
};

template <> struct wtype<DI_DTYPE_F16> {
    static constexpr int ESZ = 2, V = 8;
    typedef uint16_t elem;
    static __device__ __forceinline__ float conv(const uint4 &raw, int e) {
        const uint16_t *u = reinterpret_cast<const uint16_t *>(&raw);
        return __half2float(__ushort_as_half(u[e]));
    }
};

template <> struct wtype<DI_DTYPE_F8_E4M3> {
    static constexpr int ESZ = 1, V = 16;
    typedef uint8_t elem;
    static __device__ __forceinline__ float conv(const uint4 &raw, int e) {
        const uint8_t *u = reinterpret_cast<const uint8_t *>(&raw);
        __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)u[e], __NV_E4M3);
        return __half2float(__half(h)); /* exact: every e4m3 value is a half */
    }
};

/* Loads the 16-byte vector at element c0 of a row: one load when the row is 16-byte
 * aligned and padded (vec), else element by element (zeros past nvalid). Weights are read
 * once per token group, so the load is marked streaming. */
template <di_dtype DT>
static __device__ __forceinline__ uint4 load_raw(const char *row, int64_t c0, int nvalid,
                                                 bool vec) {
    typedef wtype<DT> T;
    if (vec) return __ldcs(reinterpret_cast<const uint4 *>(row + c0 * T::ESZ));
    /* Packed with compile-time positions only, so the vector stays in registers. */
    const typename T::elem *src = reinterpret_cast<const typename T::elem *>(row) + c0;
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int e = 0; e < T::V; e++) {
        const uint32_t val = e < nvalid ? (uint32_t)src[e] : 0u;
        w[e * T::ESZ / 4] |= val << (8 * ((e * T::ESZ) % 4));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* The float of e4m3 byte BYTE of word w times 2^-120, exactly (normal or subnormal): the
 * byte moved to the top (one byte permute), shifted right 4 with its sign copied, and
 * masked to sign | 7 low bits at bit 20. */
template <int BYTE> static __device__ __forceinline__ float fp8_bits(uint32_t w) {
    const int32_t top = (int32_t)__byte_perm(w, 0u, (BYTE << 12) | 0x444);
    return __int_as_float((top >> 4) & (int32_t)0x87f00000);
}

/* Float values of the vector at element c0 (FP8: times its block scale, one rounding).
 * one_scale: the whole vector lies in one scale block, whose scale s the caller looked up
 * (once per vector for all its rows); else each element finds its own in srow. */
template <di_dtype DT>
static __device__ __forceinline__ void
dequant(const uint4 &raw, int64_t c0, int nvalid, const float *srow, int64_t block_cols,
        bool one_scale, float s, bool bits, float (&f)[wtype<DT>::V]) {
    typedef wtype<DT> T;
    if (DT == DI_DTYPE_F8_E4M3 && one_scale && bits) {
        const uint32_t *u = reinterpret_cast<const uint32_t *>(&raw);
        /* A byte 0x7f / 0xff (NaN) shows as 0x80 after adding 1 to its low 7 bits. */
        uint32_t nan_bytes = 0;
#pragma unroll
        for (int k = 0; k < 4; k++)
            nan_bytes |= ((u[k] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
        if (nan_bytes == 0 && fabsf(s) < 0x1p7f) {
            const float s120 = s * 0x1p120f; /* exact */
#pragma unroll
            for (int k = 0; k < 4; k++) {
                f[4 * k + 0] = __fmul_rn(fp8_bits<0>(u[k]), s120);
                f[4 * k + 1] = __fmul_rn(fp8_bits<1>(u[k]), s120);
                f[4 * k + 2] = __fmul_rn(fp8_bits<2>(u[k]), s120);
                f[4 * k + 3] = __fmul_rn(fp8_bits<3>(u[k]), s120);
            }
            if (nvalid < T::V) {
#pragma unroll
                for (int e = 0; e < T::V; e++)
                    if (e >= nvalid) f[e] = 0.0f;
            }
            return;
        }
    }
#pragma unroll
    for (int e = 0; e < T::V; e++)
        f[e] = T::conv(raw, e);
    if (nvalid < T::V) { /* a row's last vector: whatever lies past `cols` must not count */
#pragma unroll
        for (int e = 0; e < T::V; e++)
            if (e >= nvalid) f[e] = 0.0f;
    }
    if (DT == DI_DTYPE_F8_E4M3) {
        if (one_scale) {
#pragma unroll
            for (int e = 0; e < T::V; e++)
                f[e] = __fmul_rn(f[e], s);
        } else {
#pragma unroll
            for (int e = 0; e < T::V; e++)
                f[e] = e < nvalid ? __fmul_rn(f[e], srow[(c0 + e) / block_cols]) : 0.0f;
        }
    }
}

/* x(t)[c0 .. c0 + V) as floats, zeros past nvalid; 16-byte loads when allowed. */
template <int V>
static __device__ __forceinline__ void load_x(const float *x, int64_t c0, int nvalid, bool xvec,
                                              float (&f)[V]) {
    if (xvec && nvalid == V) {
#pragma unroll
        for (int k = 0; k < V / 4; k++) {
            float4 q = __ldg(reinterpret_cast<const float4 *>(x + c0) + k);
            f[4 * k] = q.x, f[4 * k + 1] = q.y, f[4 * k + 2] = q.z, f[4 * k + 3] = q.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < V; e++)
            f[e] = e < nvalid ? __ldg(x + c0 + e) : 0.0f;
    }
}

static __device__ __forceinline__ const float *scale_row(const di_cuda_mm_params &p,
                                                         int64_t stored_row) {
    return p.scale ? p.scale + (stored_row / p.block_rows) * p.scale_cols : nullptr;
}

/* ---------------------------------------------------------------------------------------- */
/* y = W x                                                                                    */
/* ---------------------------------------------------------------------------------------- */

#define MM_WARPS 4 /* warps per block */
/* Blocks per SM the pipelined FP8 one-token kernel is compiled for: 6 caps it at 80
 * registers without spills (8 would spill), 24 warps per SM instead of 16. */
#define MM_FP8_MIN_BLOCKS 6

/* Warps sharing one row's K range: 4 for rows of at least ksplit_min vectors (default 256),
 * else 1. A function of the shape only (it fixes the summation order). */
static __host__ __device__ int mm_ksplit(int64_t nvec, int64_t ksplit_min) {
    return nvec >= ksplit_min ? 4 : 1;
}

/* The exact float of e4m3 byte BYTE of word w, by the conversion instruction. */
template <int BYTE> static __device__ __forceinline__ float fp8_cvt(uint32_t w) {
    const __half_raw h =
        __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)((w >> (8 * BYTE)) & 0xffu), __NV_E4M3);
    return __half2float(__half(h));
}

/* One 16-byte FP8 vector of each of RB rows (one scale each: block_cols a multiple of 16)
 * against TB tokens, word by word: each 4-byte word of the rows is converted and used at
 * once against the matching 4 floats of every token, so no whole converted vector stays
 * live (fewer registers: more warps and loads in flight). The weights are the general
 * path's once-rounded e4m3 * scale, the products added in element order. Conversion by bit
 * placement (fp8_bits, times scale * 2^120) unless a byte is NaN or a scale too large for
 * that trick; then by the instruction. Elements past nvalid meet x = 0. */
template <int TB, int RB>
static __device__ __forceinline__ void
fp8_vec(const uint4 (&raw)[RB], const float (&s)[RB], bool bits, const float *xb, int64_t x_tstride,
        int64_t c0, int nvalid, bool xvec, int nt, float (&acc)[TB][RB]) {
    uint32_t nan_bytes = 0;
    bool big = false;
#pragma unroll
    for (int j = 0; j < RB; j++) {
        const uint32_t *u = reinterpret_cast<const uint32_t *>(&raw[j]);
#pragma unroll
        for (int k = 0; k < 4; k++)
            nan_bytes |= ((u[k] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
        big |= !(fabsf(s[j]) < 0x1p7f);
    }
    const bool fast = bits && nan_bytes == 0 && !big;
    float sm[RB];
#pragma unroll
    for (int j = 0; j < RB; j++)
        sm[j] = fast ? s[j] * 0x1p120f : s[j]; /* exact */
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float w[RB][4];
#pragma unroll
        for (int j = 0; j < RB; j++) {
            const uint32_t u = reinterpret_cast<const uint32_t *>(&raw[j])[k];
            if (fast) {
                w[j][0] = __fmul_rn(fp8_bits<0>(u), sm[j]);
                w[j][1] = __fmul_rn(fp8_bits<1>(u), sm[j]);
                w[j][2] = __fmul_rn(fp8_bits<2>(u), sm[j]);
                w[j][3] = __fmul_rn(fp8_bits<3>(u), sm[j]);
            } else {
                w[j][0] = __fmul_rn(fp8_cvt<0>(u), sm[j]);
                w[j][1] = __fmul_rn(fp8_cvt<1>(u), sm[j]);
                w[j][2] = __fmul_rn(fp8_cvt<2>(u), sm[j]);
                w[j][3] = __fmul_rn(fp8_cvt<3>(u), sm[j]);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) /* a NaN past the row's end must not count */
                if (4 * k + e >= nvalid) w[j][e] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < TB; i++) {
            if (i >= nt) break;
            const float *x = xb + i * x_tstride + c0 + 4 * k;
            float xf[4];
            if (xvec && nvalid == 16) {
                const float4 q = __ldg(reinterpret_cast<const float4 *>(x));
                xf[0] = q.x, xf[1] = q.y, xf[2] = q.z, xf[3] = q.w;
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    xf[e] = 4 * k + e < nvalid ? __ldg(x + e) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < RB; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[i][j] = fmaf(w[j][e], xf[e], acc[i][j]);
        }
    }
}

/* Loads the U x RB raw vectors of a lane's group starting at vector vb (zeros past nvec). */
template <di_dtype DT, int U, int RB>
static __device__ __forceinline__ void
load_group(uint4 (&raw)[U][RB], const char *const (&wrow)[RB], int64_t vb, int64_t step,
           int64_t nvec, int64_t cols, bool wvec) {
    typedef wtype<DT> T;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t v = vb + step * u;
        const int nvalid = (int)min((int64_t)T::V, cols - v * T::V);
#pragma unroll
        for (int j = 0; j < RB; j++)
            raw[u][j] =
                v < nvec ? load_raw<DT>(wrow[j], v * T::V, nvalid, wvec) : make_uint4(0, 0, 0, 0);
    }
}

/* Block: MM_WARPS warps = MM_WARPS / ks row groups of RB consecutive rows, each row group's
 * K range split over ks warps; all warps take the TB tokens of blockIdx.y; blockIdx.z is the
 * head. U 16-byte vectors per row are loaded before any is used; with PIPE the next U are
 * requested before the current ones are converted (a software pipeline: the loads' latency
 * overlaps the dequantization, at the cost of twice the raw registers). The schedule never
 * changes the arithmetic. */
/* G: grouped mode (p.experts, matmul_experts): a separate instantiation, so that the plain
 * GEMV keeps its one-group body (a loop the compiler cannot bound costs the n = 1 kernel
 * about a fifth of its bandwidth in registers). */
/* GLU (p.glu_data or p.glu_experts set): the row group's first RB / 2 rows are rows of W (the
 * gate), the last RB / 2 the same rows of the second weight (the up projection), and the
 * output is silu(gate . x) * (up . x) -- SwiGLU in the epilogue, each product summed exactly
 * as alone, the activation computed as silu_mul computes it. */
template <di_dtype DT, int TB, int RB, int U, bool PIPE, bool G, bool GLU>
__global__ void __launch_bounds__(MM_WARPS * 32, PIPE &&TB == 1 ? MM_FP8_MIN_BLOCKS : 1)
    gemv_kernel(const di_cuda_mm_params p, bool wvec, bool xvec) {
    typedef wtype<DT> T;
    constexpr int V = T::V;
    constexpr int RO = GLU ? RB / 2 : RB; /* output rows per row group */
    static_assert(!GLU || RB % 2 == 0, "GLU pairs gate and up rows");
    __shared__ float warp_sums[MM_WARPS][TB * RB];
    const int64_t nvec = (p.cols + V - 1) / V;
    const int ks = mm_ksplit(nvec, p.tune.ksplit_min);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kw = warp % ks, group = warp / ks;
    const int64_t r0 = ((int64_t)blockIdx.x * (MM_WARPS / ks) + group) * RO;
    int64_t t0 = (int64_t)blockIdx.y * TB, t_end = p.n_tokens, h = blockIdx.z;
    /* With ks > 1 a block holds one row group, so this exit is block-uniform. */
    if (r0 >= p.rows) return;
    const void *wdata = p.data, *gdata = p.glu_data;
    const float *wscale = p.scale, *gscale = p.glu_scale;
    if constexpr (G) { /* grouped: slot z runs one active expert over its rows (uniform exits) */
        pdl_wait();    /* the routing (active list, offsets) comes from the previous kernels */
        pdl_trigger();
        if (h >= p.g_active[0]) return;
        const int e = p.g_active[1 + h];
        wdata = p.experts[e].data;
        wscale = p.experts[e].scale;
        if constexpr (GLU) {
            gdata = p.glu_experts[e].data;
            gscale = p.glu_experts[e].scale;
        }
        t0 += p.g_off[e];
        t_end = p.g_off[e + 1];
        h = 0;
        if (t0 >= t_end) return;
    }
    const int nr = (int)min((int64_t)RO, p.rows - r0);

    const int64_t hoff = h * p.head_elem_stride * T::ESZ;
    const int64_t roff = p.row_offset + h * p.head_row_offset_stride;
    const char *wrow[RB];
    const float *srow[RB];
#pragma unroll
    for (int j = 0; j < RB; j++) {
        const bool second = GLU && j >= RO; /* the up row of a GLU pair */
        const char *w0 = static_cast<const char *>(second ? gdata : wdata) + hoff;
        const float *sc0 = second ? gscale : wscale;
        int64_t r = r0 + min(j % RO, nr - 1); /* rows past the end alias the last one, unused */
        wrow[j] = w0 + r * p.row_stride * T::ESZ;
        srow[j] = DT == DI_DTYPE_F8_E4M3 && sc0 ? sc0 + ((roff + r) / p.block_rows) * p.scale_cols
                                                : nullptr;
    }
    const bool one_scale = DT == DI_DTYPE_F8_E4M3 && p.block_cols % V == 0;
    /* Grouped mode: the block walks all its expert's token groups (the launch has one
     * group row, so no blocks wait for groups that may not exist); else this runs once. */
    const int64_t t_step = G ? (int64_t)TB : (int64_t)TB * gridDim.y;
    for (; t0 < t_end; t0 += t_step) {
        const int nt = (int)min((int64_t)TB, t_end - t0);
        const float *xb = p.x + h * p.x_hstride + t0 * p.x_tstride;

        float acc[TB][RB];
#pragma unroll
        for (int i = 0; i < TB; i++)
#pragma unroll
            for (int j = 0; j < RB; j++)
                acc[i][j] = 0.0f;

        const int64_t step = 32 * (int64_t)ks; /* vectors between a slot's consecutive vectors */
        const int64_t vfirst = kw * 32 + lane;
        uint4 raw[U][RB];
        load_group<DT, U, RB>(raw, wrow, vfirst, step, nvec, p.cols, wvec);
        if constexpr (!G) { /* the first weights are on their way; now wait for x (PDL) */
            pdl_wait();
            pdl_trigger();
        }
        for (int64_t vb = vfirst; vb < nvec; vb += step * U) {
            uint4 next[U][RB];
            if constexpr (PIPE)
                load_group<DT, U, RB>(next, wrow, vb + step * U, step, nvec, p.cols, wvec);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t v = vb + step * u;
                if (v >= nvec) break;
                const int64_t c0 = v * V;
                const int nvalid = (int)min((int64_t)V, p.cols - c0);
                const int64_t sc = one_scale ? di_cuda_scale_col(p, v) : 0;
                if constexpr (PIPE) { /* FP8, one_scale (the launcher's condition) */
                    float sj[RB];
#pragma unroll
                    for (int j = 0; j < RB; j++)
                        sj[j] = srow[j][sc];
                    fp8_vec<TB, RB>(raw[u], sj, p.tune.fp8_bits, xb, p.x_tstride, c0, nvalid, xvec,
                                    nt, acc);
                } else {
                    float wf[RB][V];
#pragma unroll
                    for (int j = 0; j < RB; j++)
                        dequant<DT>(raw[u][j], c0, nvalid, srow[j], p.block_cols, one_scale,
                                    one_scale ? srow[j][sc] : 1.0f, p.tune.fp8_bits, wf[j]);
#pragma unroll
                    for (int i = 0; i < TB; i++) {
                        if (i >= nt) break;
                        float xf[V];
                        load_x<V>(xb + i * p.x_tstride, c0, nvalid, xvec, xf);
                        /* Elements past nvalid are zero in both, and only the last vector of a
                         * row has them: adding 0 * 0 there changes no bit of a finite sum. */
#pragma unroll
                        for (int j = 0; j < RB; j++)
#pragma unroll
                            for (int e = 0; e < V; e++)
                                acc[i][j] = fmaf(wf[j][e], xf[e], acc[i][j]);
                    }
                }
            }
            if constexpr (PIPE) {
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int j = 0; j < RB; j++)
                        raw[u][j] = next[u][j];
            } else {
                load_group<DT, U, RB>(raw, wrow, vb + step * U, step, nvec, p.cols, wvec);
            }
        }

        /* The fixed butterfly: every lane ends with its warp's total. */
#pragma unroll
        for (int i = 0; i < TB; i++)
#pragma unroll
            for (int j = 0; j < RB; j++)
#pragma unroll
                for (int off = 16; off >= 1; off >>= 1)
                    acc[i][j] += __shfl_xor_sync(0xffffffffu, acc[i][j], off);
        float *y = p.y + h * p.y_hstride + t0 * p.y_tstride + r0;
        if (ks == 1) {
#pragma unroll
            for (int i = 0; i < TB; i++)
#pragma unroll
                for (int j = 0; j < RO; j++)
                    if (lane == i * RO + j && i < nt && j < nr)
                        store_y(y + i * p.y_tstride + j,
                                GLU ? silu_times(acc[i][j], acc[i][j + RO]) : acc[i][j],
                                p.accumulate);
        } else {
            /* ks == 4: the four warp totals, added in a fixed tree. */
#pragma unroll
            for (int i = 0; i < TB; i++)
#pragma unroll
                for (int j = 0; j < RB; j++)
                    if (lane == i * RB + j) warp_sums[warp][i * RB + j] = acc[i][j];
            __syncthreads();
            if (warp == 0) {
                const int k = lane < TB * RB ? lane : 0;
                const float tot =
                    (warp_sums[0][k] + warp_sums[1][k]) + (warp_sums[2][k] + warp_sums[3][k]);
                /* GLU: the lane of (i, j) takes the up total of (i, j + RO) from its lane. */
                const float up = GLU ? __shfl_down_sync(0xffffffffu, tot, RO) : 0.0f;
                const int i = lane / RB, j = lane % RB;
                if (lane < TB * RB && i < nt && j < RO && j < nr)
                    store_y(y + i * p.y_tstride + j, GLU ? silu_times(tot, up) : tot, p.accumulate);
            }
            __syncthreads(); /* warp_sums is written again by the next token group */
        }
        if constexpr (!G) break; /* one token group per block (blockIdx.y) */
    }
}

/* ---------------------------------------------------------------------------------------- */
/* y = W^T x                                                                                  */
/* ---------------------------------------------------------------------------------------- */

#define MMT_VECS    8                       /* 16-byte column vectors per block */
#define MMT_SLICES  16                      /* row slices per block */
#define MMT_THREADS (MMT_VECS * MMT_SLICES) /* thread (slice, vector) */
#define MMT_UNROLL  4                       /* rows of a slice loaded before any is used */

/* Block: MMT_VECS 16-byte vectors of output columns for the TB tokens of blockIdx.y and head
 * blockIdx.z. Thread (slice, vector) sums, in order, rows slice, slice + MMT_SLICES, ...;
 * the MMT_SLICES partial sums of an output element are then added by a fixed pairwise tree
 * (slice i + 8, then + 4, + 2, + 1). The order is a function of the row count only, so a
 * result does not depend on n. Splitting the rows over slices gives a short product (W_UK^T:
 * 128 rows of 512 columns per head) enough blocks to fill the device. */
template <di_dtype DT, int TB>
__global__ void __launch_bounds__(MMT_THREADS) gemv_t_kernel(const di_cuda_mm_params p, bool wvec) {
    typedef wtype<DT> T;
    constexpr int V = T::V, NE = MMT_VECS * TB * V; /* outputs of the block */
    __shared__ float part[MMT_SLICES][NE];
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int vl = threadIdx.x % MMT_VECS, slice = threadIdx.x / MMT_VECS;
    const int64_t v = (int64_t)blockIdx.x * MMT_VECS + vl;
    const int64_t t0 = (int64_t)blockIdx.y * TB, h = blockIdx.z;
    const int64_t nvec = (p.cols + V - 1) / V;
    const int64_t c0 = v * V;
    const int nvalid = v < nvec ? (int)min((int64_t)V, p.cols - c0) : 0;
    const int nt = (int)min((int64_t)TB, p.n_tokens - t0);
    const char *w0 = static_cast<const char *>(p.data) + h * p.head_elem_stride * T::ESZ;
    const int64_t roff = p.row_offset + h * p.head_row_offset_stride;
    const bool one_scale = DT == DI_DTYPE_F8_E4M3 && p.block_cols % V == 0;
    const int64_t sc = one_scale ? c0 / p.block_cols : 0; /* the column's scale, once */
    const float *xb = p.x + h * p.x_hstride + t0 * p.x_tstride;

    float acc[TB][V];
#pragma unroll
    for (int i = 0; i < TB; i++)
#pragma unroll
        for (int e = 0; e < V; e++)
            acc[i][e] = 0.0f;

    constexpr int64_t RS = MMT_SLICES;
    for (int64_t rb = slice; nvalid > 0 && rb < p.rows; rb += RS * MMT_UNROLL) {
        uint4 raw[MMT_UNROLL];
#pragma unroll
        for (int u = 0; u < MMT_UNROLL; u++) {
            const int64_t r = rb + RS * u;
            raw[u] = r < p.rows ? load_raw<DT>(w0 + r * p.row_stride * T::ESZ, c0, nvalid, wvec)
                                : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < MMT_UNROLL; u++) {
            const int64_t r = rb + RS * u;
            if (r >= p.rows) break;
            float wf[V];
            const float *srow = DT == DI_DTYPE_F8_E4M3 ? scale_row(p, roff + r) : nullptr;
            dequant<DT>(raw[u], c0, nvalid, srow, p.block_cols, one_scale,
                        one_scale ? srow[sc] : 1.0f, p.tune.fp8_bits, wf);
#pragma unroll
            for (int i = 0; i < TB; i++) {
                if (i >= nt) break;
                const float xv = __ldg(xb + i * p.x_tstride + r);
#pragma unroll
                for (int e = 0; e < V; e++)
                    acc[i][e] = fmaf(wf[e], xv, acc[i][e]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < TB; i++)
#pragma unroll
        for (int e = 0; e < V; e++)
            part[slice][(vl * TB + i) * V + e] = acc[i][e];
    __syncthreads();
    for (int k = threadIdx.x; k < NE; k += MMT_THREADS) {
        float sum[MMT_SLICES];
#pragma unroll
        for (int j = 0; j < MMT_SLICES; j++)
            sum[j] = part[j][k];
#pragma unroll
        for (int w = MMT_SLICES / 2; w >= 1; w /= 2)
#pragma unroll
            for (int j = 0; j < w; j++)
                sum[j] += sum[j + w];
        const int kv = k / (TB * V), i = (k / V) % TB, e = k % V;
        const int64_t c = ((int64_t)blockIdx.x * MMT_VECS + kv) * V + e;
        if (i < nt && c < p.cols) p.y[h * p.y_hstride + (t0 + i) * p.y_tstride + c] = sum[0];
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Launchers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static bool aligned16(const void *ptr) {
    return ((uintptr_t)ptr & 15u) == 0;
}

/* One GEMV launch, in grouped or plain form (gemv_kernel's G). */
template <di_dtype DT, int TB, int RB, int U, bool PIPE>
static cudaError_t launch_gemv(dim3 grid, dim3 block, const di_cuda_mm_params *p, bool wvec,
                               bool xvec) {
    const bool glu = p->glu_data || p->glu_experts;
    void (*k)(const di_cuda_mm_params, bool, bool) =
        p->experts ? (glu ? gemv_kernel<DT, TB, RB, U, PIPE, true, true>
                          : gemv_kernel<DT, TB, RB, U, PIPE, true, false>)
                   : (glu ? gemv_kernel<DT, TB, RB, U, PIPE, false, true>
                          : gemv_kernel<DT, TB, RB, U, PIPE, false, false>);
    return di_cuda_launch(k, grid, block, 0, p->stream, *p, wvec, xvec);
}

template <di_dtype DT> static cudaError_t launch_dtype(const di_cuda_mm_params *pin) {
    typedef wtype<DT> T;
    /* Scale column of a vector (one_scale): a shift when the vectors per scale block are a
     * power of two, else a 32-bit division. */
    di_cuda_mm_params q = *pin;
    const di_cuda_mm_params *p = &q;
    di_cuda_set_scale_step(
        &q, DT == DI_DTYPE_F8_E4M3 && q.block_cols % T::V == 0 ? q.block_cols / T::V : 1);
    /* 16-byte weight loads need every row (of every head) to start on a 16-byte boundary;
     * reading a whole vector past `cols` then stays inside the row's stride. */
    const bool wvec = aligned16(p->data) && (!p->glu_data || aligned16(p->glu_data)) &&
                      (p->row_stride * T::ESZ) % 16 == 0 &&
                      (p->head_elem_stride * T::ESZ) % 16 == 0 && p->row_stride >= p->cols;
    if (p->transposed) {
        /* grouped, GLU and accumulating modes are W x only */
        if (p->experts || p->glu_data || p->glu_experts || p->accumulate)
            return cudaErrorInvalidValue;
        const int64_t nvec = (p->cols + T::V - 1) / T::V;
        /* Tokens per block: each weight vector loaded serves them all (a token's sums do
         * not depend on the grouping). 8 from 8 tokens for 8-element vectors (BF16; FP8's
         * 16 would need 64 KiB of partial sums): at 64 tokens (a decode step of 64
         * sequences, W_UK^T) the blocks of 4 re-read the weights 16 times. */
        const int tb = p->n_tokens == 1 ? 1 : p->n_tokens < 8 || T::V != 8 ? 4 : 8;
        dim3 grid((unsigned)((nvec + MMT_VECS - 1) / MMT_VECS),
                  (unsigned)((p->n_tokens + tb - 1) / tb), (unsigned)p->n_heads);
        void (*k)(const di_cuda_mm_params, bool) =
            tb == 1 ? gemv_t_kernel<DT, 1> : gemv_t_kernel<DT, 4>;
        if constexpr (T::V == 8)
            if (tb == 8) k = gemv_t_kernel<DT, 8>;
        return di_cuda_launch(k, grid, MMT_THREADS, 0, p->stream, *p, wvec);
    }
    const bool xvec = aligned16(p->x) && p->x_tstride % 4 == 0 && p->x_hstride % 4 == 0;
    const int64_t n = di_cuda_rows_per_weight(p), nvec = (p->cols + T::V - 1) / T::V;
    int tb = n == 1 ? 1 : n == 2 ? 2 : n <= 4 ? 4 : 8;
    if (p->tune.max_tb >= 1 && tb > p->tune.max_tb) tb = p->tune.max_tb;
    /* One token: 2 rows x 4 vectors in flight per lane. More tokens: 4 rows per warp, so
     * that each activation vector loaded serves more weights. */
    /* Short rows split over 4 warps at one token (not FP8's pipelined kernel): 4 rows per
     * group, 2 vectors each, the same registers in flight as 2 x 4 (rows of 2048 BF16: 76 %
     * of the copy bandwidth for V2-Lite's lm_head instead of 54 %). */
    const bool fp8_piped = DT == DI_DTYPE_F8_E4M3 && p->tune.fp8_pipe && p->block_cols % T::V == 0;
    const bool short_rows =
        tb == 1 && nvec <= p->tune.short_vec && nvec >= p->tune.ksplit_min && !fp8_piped;
    const int rb = tb == 1 && !short_rows ? 2 : 4;
    const int ro = p->glu_data || p->glu_experts ? rb / 2 : rb; /* output rows per group */
    const int64_t rows_per_block = MM_WARPS / mm_ksplit(nvec, p->tune.ksplit_min) * ro;
    dim3 grid((unsigned)((p->rows + rows_per_block - 1) / rows_per_block),
              p->experts ? 1u : (unsigned)((n + tb - 1) / tb), (unsigned)p->n_heads);
    const dim3 block(MM_WARPS * 32);
    cudaError_t err = cudaSuccess;
    if constexpr (DT == DI_DTYPE_F8_E4M3) {
        const bool pipe = p->tune.fp8_pipe && p->block_cols % T::V == 0;
        /* Pipelined: half the vectors per group, the same raw registers in flight. */
        if (pipe) switch (tb) {
            case 1:
                err = launch_gemv<DT, 1, 2, 2, true>(grid, block, p, wvec, xvec);
                break;
            case 2:
                err = launch_gemv<DT, 2, 4, 1, true>(grid, block, p, wvec, xvec);
                break;
            case 4:
                err = launch_gemv<DT, 4, 4, 1, true>(grid, block, p, wvec, xvec);
                break;
            default:
                err = launch_gemv<DT, 8, 4, 1, true>(grid, block, p, wvec, xvec);
                break;
            }
        if (pipe) return err;
    }
    switch (tb) {
    case 1:
        if (short_rows)
            err = launch_gemv<DT, 1, 4, 2, false>(grid, block, p, wvec, xvec);
        else
            err = launch_gemv<DT, 1, 2, 4, false>(grid, block, p, wvec, xvec);
        break;
    case 2:
        err = launch_gemv<DT, 2, 4, 2, false>(grid, block, p, wvec, xvec);
        break;
    case 4:
        err = launch_gemv<DT, 4, 4, 2, false>(grid, block, p, wvec, xvec);
        break;
    default:
        err = launch_gemv<DT, 8, 4, 2, false>(grid, block, p, wvec, xvec);
        break;
    }
    return err;
}

cudaError_t di_cuda_launch_matmul(const di_cuda_mm_params *p) {
    if (p->n_tokens <= 0 || p->n_heads <= 0 || p->rows <= 0 || p->cols <= 0) return cudaSuccess;
    if (p->x_rows && !di_cuda_mm_reads_x_rows(p)) return cudaErrorInvalidValue;
    if (p->tune.tc && di_cuda_rows_per_weight(p) >= p->tc_min_n && di_cuda_tc_fits(p))
        return di_cuda_launch_matmul_tc(p);
    switch (p->dtype) {
    case DI_DTYPE_F32:
        return launch_dtype<DI_DTYPE_F32>(p);
    case DI_DTYPE_F16:
        return launch_dtype<DI_DTYPE_F16>(p);
    case DI_DTYPE_BF16:
        return launch_dtype<DI_DTYPE_BF16>(p);
    case DI_DTYPE_F8_E4M3:
        return launch_dtype<DI_DTYPE_F8_E4M3>(p);
    default:
        return cudaErrorInvalidValue;
    }
}
